"""Where a rollout waits between the actor that writes it and the learner that reads it: the slots
in shared memory, the queues of their indices, and the other queues and numbers the trainer shares
with its actor processes (:class:`Channels`).

Slots: ``num_storages`` of them, each key one shared tensor with the slot as the leading dimension,
allocated once; a slot's row layout is :class:`distrl.rollout.RolloutLayout`. Every slot index is
always in exactly one place: the free queue, an actor, the full queue or a learner. Actors take
free indices, fill them and put them on the full queue; learners take ``B`` full indices, copy the
batch out and put them back on the free queue. The slots an actor holds are marked with its id in
``owner``, so that the trainer can return them to the free queue when the actor dies
(:meth:`RolloutStorage.release_owned`).

Queues: ``multiprocessing.Queue`` is unsafe against ``SIGKILL``: a blocking ``get`` holds a lock for
as long as it waits, ``put`` hands its item to a feeder thread that writes it later, and every lock
is a named POSIX semaphore (a ``/dev/shm/sem.mp-*`` file). An actor killed while waiting for a free
slot would leave the lock held and every other actor waiting forever; one killed before its feeder
thread ran would lose the slots it had handed in; a whole process group killed leaves its
semaphore files behind. (A queue of several thousand items also kept the process from exiting,
its feeder thread blocked on a full pipe.)

These queues are bare pipes instead. Each item is one ``write`` of at most ``PIPE_BUF`` bytes,
which Linux makes atomic, so a killed writer leaves either the whole item or none of it, and no
lock is ever held between system calls. Reads never block (the read end is non-blocking; waits
are ``poll`` with a timeout), so every wait can check a stop flag. Numbers (the stop flag, the
policy version, heartbeats) are shared tensors, written and read without a lock.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import queue
import select
import struct
import termios
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from distrl.config.host import INDEX_BYTES, pipe_max_bytes
from distrl.rollout import RolloutLayout

PIPE_BUF = select.PIPE_BUF  # writes up to this size are atomic (POSIX: at least 512; Linux: 4096)


class _Pipe:
    def __init__(self, ctx, capacity_bytes: int):
        # Connection objects, not bare fds: spawned children receive them as arguments.
        self._reader, self._writer = ctx.Pipe(duplex=False)
        if capacity_bytes > 65536:
            try:
                fcntl.fcntl(self._writer.fileno(), fcntl.F_SETPIPE_SZ, capacity_bytes)
            except OSError as exc:
                raise OSError(f"cannot size a pipe to {capacity_bytes} bytes "
                              f"(/proc/sys/fs/pipe-max-size is {pipe_max_bytes()}): {exc}") from exc
        os.set_blocking(self._reader.fileno(), False)  # shared by every process holding the fd

    def qsize(self) -> int:
        """Bytes waiting in the pipe."""
        buf = fcntl.ioctl(self._reader.fileno(), termios.FIONREAD, b"\0\0\0\0")
        return struct.unpack("i", buf)[0]

    def _wait(self, deadline: float) -> bool:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        poller = select.poll()
        poller.register(self._reader.fileno(), select.POLLIN)
        return bool(poller.poll(remaining * 1000))

    def close(self) -> None:
        """Close this process's ends."""
        self._reader.close()
        self._writer.close()


class IndexQueue(_Pipe):
    """A queue of integers (slot indices), any number of writers and readers in any processes.

    Each index is an 8-byte record; the pipe is sized to hold ``capacity`` of them, so ``put``
    never blocks while no more than ``capacity`` indices exist.

    Args:
        capacity: the most indices that will ever be in the queue at once.
        ctx: a ``multiprocessing`` context.

    Raises:
        OSError: the pipe cannot be made that large (see :func:`distrl.config.host.max_indices`).
    """

    def __init__(self, capacity: int, ctx):
        super().__init__(ctx, capacity * INDEX_BYTES)

    def put(self, index: int) -> None:
        os.write(self._writer.fileno(), int(index).to_bytes(INDEX_BYTES, "little", signed=True))

    def get(self, timeout: float = 0.0) -> int:
        """The next index, waiting up to ``timeout`` seconds.

        Raises:
            queue.Empty: none arrived in time.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                record = os.read(self._reader.fileno(), INDEX_BYTES)
            except BlockingIOError:  # empty, or another reader took the record poll announced
                record = b""
            if len(record) == INDEX_BYTES:
                return int.from_bytes(record, "little", signed=True)
            if not self._wait(deadline):
                raise queue.Empty

    def get_nowait(self) -> int:
        return self.get(0.0)

    def qsize(self) -> int:
        """Indices waiting in the queue now."""
        return super().qsize() // INDEX_BYTES


class MessageQueue(_Pipe):
    """A queue of small picklable objects, any number of writing processes, one reading process.

    Args:
        ctx: a ``multiprocessing`` context.
        capacity_bytes: the pipe's buffer; ``put`` blocks while it is full.

    ``put`` raises ``ValueError`` for an object whose pickle exceeds ``PIPE_BUF - 4`` bytes
    (atomicity needs one write); callers keep messages short.
    """

    def __init__(self, ctx, capacity_bytes: int = 1 << 18):
        super().__init__(ctx, min(capacity_bytes, pipe_max_bytes()))

    def put(self, obj: Any) -> None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) + 4 > PIPE_BUF:
            raise ValueError(f"message of {len(data)} bytes is over the {PIPE_BUF - 4} a pipe writes atomically")
        os.write(self._writer.fileno(), len(data).to_bytes(4, "little") + data)

    def get(self, timeout: float = 0.0) -> Any:
        """The next object, waiting up to ``timeout`` seconds (one reading process only).

        Raises:
            queue.Empty: none arrived in time.
        """
        deadline = time.monotonic() + timeout
        fd = self._reader.fileno()
        while True:
            try:
                header = os.read(fd, 4)
            except BlockingIOError:
                header = b""
            if len(header) == 4:
                size = int.from_bytes(header, "little")
                data = b""
                while len(data) < size:  # written atomically with its header: all there
                    data += os.read(fd, size - len(data))
                return pickle.loads(data)
            if not self._wait(deadline):
                raise queue.Empty

    def get_nowait(self) -> Any:
        return self.get(0.0)

    def put_nowait(self, obj: Any) -> None:
        """:meth:`put` (the name ``logging.handlers.QueueHandler`` calls)."""
        self.put(obj)


class SharedValue:
    """One number in shared memory, read and written without a lock (an aligned 8-byte word):
    the stop flag and the policy version. Unlike ``multiprocessing.Value``/``Event`` it has no
    named semaphore to leave behind or to be held by a killed process."""

    def __init__(self, value: int = 0):
        self.tensor = torch.tensor([value], dtype=torch.int64).share_memory_()

    @property
    def value(self) -> int:
        return int(self.tensor[0])

    @value.setter
    def value(self, value: int) -> None:
        self.tensor[0] = value

    def set(self) -> None:
        self.tensor[0] = 1

    def is_set(self) -> bool:
        return bool(self.tensor[0])


@dataclass
class Channels:
    """The shared objects between the trainer and its actors (queues of this module and shared
    tensors only, so that a killed process leaves no lock held and nothing in /dev/shm).

    Attributes:
        free_queue, full_queue: slot index queues (those of the :class:`RolloutStorage`).
        owner: ``[N] int32``, the actor holding each slot (the storage's ``owner``).
        episode_queue: finished episodes as ``(actor_id, return, length)``.
        error_queue: an actor's exception as ``(actor_id, traceback text)``.
        log_queue: the actors' log records (:mod:`distrl.engine.logs` writes them to ``actors.log``).
        stop_event: set by the trainer to stop every actor.
        policy_version: learner updates so far.
        heartbeat: ``[num_actors] float64``, each actor's last step as ``time.time()`` (0: none yet).
    """

    free_queue: IndexQueue
    full_queue: IndexQueue
    owner: torch.Tensor
    episode_queue: MessageQueue
    error_queue: MessageQueue
    log_queue: MessageQueue
    stop_event: SharedValue
    policy_version: SharedValue
    heartbeat: torch.Tensor

    @classmethod
    def create(cls, storage: Any, mp_context, num_actors: int, policy_version: int = 0) -> Channels:
        """The channels of a :class:`RolloutStorage` ``storage`` (its slot queues
        and ``owner``) for ``num_actors`` actors, with new message queues and shared values."""
        return cls(storage.free_queue, storage.full_queue, storage.owner, MessageQueue(mp_context),
                   MessageQueue(mp_context), MessageQueue(mp_context), SharedValue(0), SharedValue(policy_version),
                   torch.zeros(num_actors, dtype=torch.float64).share_memory_())

    def close(self) -> None:
        """Close this process's ends of the message queues (the slot queues belong to the storage)."""
        self.episode_queue.close()
        self.error_queue.close()
        self.log_queue.close()


NO_OWNER = -1


def drain(q) -> list:
    """Take every item on queue ``q`` now (a queue of this module)."""
    items = []
    while True:
        try:
            items.append(q.get_nowait())
        except queue.Empty:
            return items


class RolloutStorage:
    """``num_storages`` shared-memory slots and their free/full index queues.

    Args:
        layout: the slot layout.
        num_storages: number of slots N.
        ctx: the ``torch.multiprocessing`` context whose queues the processes share.

    Attributes:
        buffers: ``{key: [N, *spec_shape] tensor}`` in shared memory.
        owner: ``[N] int32`` shared tensor: the id of the actor holding each slot, or ``NO_OWNER``.
        free_queue, full_queue: :class:`IndexQueue` of slot indices.

    Raises:
        OSError: the queues cannot hold ``num_storages`` indices (validation refuses such sizes).
    """

    def __init__(self, layout: RolloutLayout, num_storages: int, ctx):
        self.layout = layout
        self.num_storages = num_storages
        self.free_queue = IndexQueue(num_storages, ctx)
        self.full_queue = IndexQueue(num_storages, ctx)
        self.buffers = {
            key: torch.zeros((num_storages, *shape), dtype=dtype).share_memory_()
            for key, (shape, dtype) in layout.specs().items()
        }
        self.owner = torch.full((num_storages,), NO_OWNER, dtype=torch.int32).share_memory_()
        for index in range(num_storages):
            self.free_queue.put(index)

    def nbytes(self) -> int:
        """Bytes of shared memory held by the slots."""
        return self.layout.nbytes(self.num_storages)

    def gather(self, indices: Sequence[int], device: torch.device) -> dict[str, torch.Tensor]:
        """Copy the slots ``indices`` into a time-major batch on ``device``.

        Time-indexed keys come back as contiguous ``[T+1, B, ...]``, the LSTM state as
        ``[1, B, H]`` (the layout ``nn.LSTM`` takes) and ``policy_version`` as ``[B]``.
        Each slot is one memcpy into a preallocated batch (pinned, then copied
        non-blocking, on CUDA); ``index_select`` is several times slower on uint8 images.
        """
        pin = device.type == "cuda"
        batch = {}
        for key, tensor in self.buffers.items():
            if tensor.dim() >= 2:
                per_slot = tensor.shape[1:]
                value = torch.empty((per_slot[0], len(indices), *per_slot[1:]), dtype=tensor.dtype, pin_memory=pin)
                for j, index in enumerate(indices):
                    value[:, j].copy_(tensor[index])
            else:
                value = tensor[torch.as_tensor(indices, dtype=torch.int64)]
            batch[key] = value.to(device, non_blocking=True) if pin else value
        return batch

    def release_owned(self, actor_id: int) -> list[int]:
        """Return the slots marked as held by ``actor_id`` to the free queue (call it only once
        that actor is dead). Returns their indices."""
        indices = torch.nonzero(self.owner == actor_id).flatten().tolist()
        for index in indices:
            self.owner[index] = NO_OWNER
            self.free_queue.put(index)
        return indices

    def reclaim(self) -> list[int]:
        """After every actor and learner has stopped: move full slots back to free,
        and return the sorted list of all free indices (each exactly once when
        nothing was lost). The indices are put back on the free queue."""
        indices = drain(self.full_queue) + drain(self.free_queue)
        self.owner.fill_(NO_OWNER)
        for index in indices:
            self.free_queue.put(index)
        return sorted(indices)

    def close(self) -> None:
        """Close this process's ends of the queues; the tensors go with the last reference."""
        for q in (self.free_queue, self.full_queue):
            q.close()

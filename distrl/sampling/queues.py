"""Kill-safe queues and shared numbers between the trainer and its actor processes: the slot index
queues of :class:`distrl.sampling.slots.Slots`, the episode, error and log queues, the stop
flag, the policy version and its publication to the actors that wait for it.

``multiprocessing.Queue`` is unsafe against ``SIGKILL``: a blocking ``get`` holds a lock for
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
from typing import Any

import torch

from distrl.config.host import INDEX_BYTES, pipe_max_bytes

PIPE_BUF = select.PIPE_BUF  # writes up to this size are atomic (POSIX: at least 512; Linux: 4096)


class _Pipe:
    def __init__(self, mp_context, capacity_bytes: int):
        # Connection objects, not bare fds: spawned children receive them as arguments.
        self._reader, self._writer = mp_context.Pipe(duplex=False)
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
        mp_context: a ``multiprocessing`` context.

    Raises:
        OSError: the pipe cannot be made that large (see :func:`distrl.config.host.max_indices`).
    """

    def __init__(self, capacity: int, mp_context):
        super().__init__(mp_context, capacity * INDEX_BYTES)

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
        mp_context: a ``multiprocessing`` context.
        capacity_bytes: the pipe's buffer; ``put`` blocks while it is full.

    ``put`` raises ``ValueError`` for an object whose pickle exceeds ``PIPE_BUF - 4`` bytes
    (atomicity needs one write); callers keep messages short.
    """

    def __init__(self, mp_context, capacity_bytes: int = 1 << 18):
        super().__init__(mp_context, min(capacity_bytes, pipe_max_bytes()))

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


class _Wakeup(_Pipe):
    """One waiter's wake-up pipe: :meth:`notify` writes a byte without blocking (a pipe full of
    unread wake-ups, a dead waiter's, is left as it is: one is enough to wake); :meth:`wait` sleeps
    until there is one, then empties the pipe."""

    def __init__(self, mp_context):
        super().__init__(mp_context, 4096)
        os.set_blocking(self._writer.fileno(), False)

    def notify(self) -> None:
        try:
            os.write(self._writer.fileno(), b"\x01")
        except BlockingIOError:  # full of wake-ups nobody read: enough to wake its reader
            pass

    def wait(self, deadline: float) -> bool:
        """Sleep until a wake-up arrives or ``deadline`` (``time.monotonic()``) passes; whether one came."""
        if not self._wait(deadline):
            return False
        try:
            os.read(self._reader.fileno(), 4096)
        except BlockingIOError:  # emptied already
            pass
        return True


class PolicyVersion(SharedValue):
    """The policy version (the learner's updates so far) in shared memory, and its publication: a
    wake-up pipe per waiting actor (synchronous collection), so that such an actor sleeps until the
    learner publishes new weights instead of polling the number (:meth:`wait_past`).

    :meth:`publish` sets the number, then wakes every waiter. A waiter reads the number, and only
    while it is not yet past the version sleeps on its pipe, so a wake-up is never missed. As every
    queue here, no lock is held between system calls (a killed actor leaves nothing held).

    Args:
        mp_context: a ``multiprocessing`` context.
        num_waiters: the actors that may wait (actor ids ``0..num_waiters-1``); 0 with asynchronous
            collection, where nobody waits and publishing is setting the number.
        value: the version to start at.
    """

    def __init__(self, mp_context, num_waiters: int, value: int = 0):
        super().__init__(value)
        self.wakeups = [_Wakeup(mp_context) for _ in range(num_waiters)]

    def publish(self, value: int) -> None:
        """Set the version to ``value`` and wake every actor waiting for it."""
        self.value = value
        for wakeup in self.wakeups:
            wakeup.notify()

    def wait_past(self, version: int, actor_id: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until the version is past ``version``; whether it is.

        Raises:
            IndexError: ``actor_id`` has no wake-up pipe (collection is not synchronous).
        """
        wakeup = self.wakeups[actor_id]
        deadline = time.monotonic() + timeout
        while self.value <= version:
            if not wakeup.wait(deadline):
                return self.value > version
        return True

    def close(self) -> None:
        """Close this process's ends of the wake-up pipes."""
        for wakeup in self.wakeups:
            wakeup.close()


def drain(q) -> list:
    """Take every item on queue ``q`` now (a queue of this module)."""
    items = []
    while True:
        try:
            items.append(q.get_nowait())
        except queue.Empty:
            return items

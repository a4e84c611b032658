"""How a learner thread takes its batches: ``B`` full slots from the full queue, copied into one
``[T+1, B]`` batch and freed (:class:`BatchSource`, optionally one batch ahead in a thread of its own)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from distrl.sampling.slots import Slots

POLL_SECONDS = 0.5  # the longest a learner's wait goes without looking at its stop event


def take_full_slots(slots: Slots, held: list[int], batch_size: int, stopped: Callable[[], bool],
                    activity: dict, name: str) -> None:
    """Wait until ``held`` has ``batch_size`` full slot indices (or ``stopped()`` is true)."""
    while len(held) < batch_size and not stopped():
        activity[name] = f"waiting for full slots ({len(held)} of {batch_size} held)"
        try:
            held.append(slots.full_queue.get(timeout=POLL_SECONDS))
        except queue.Empty:
            continue


def get_batch(slots: Slots, held: list[int], device: torch.device) -> dict[str, torch.Tensor]:
    """Copy the slots ``held`` into a ``[T+1, B]`` batch on ``device`` and free them."""
    batch = slots.gather(held, device)
    for index in held:
        slots.free_queue.put(index)
    held.clear()
    return batch


@dataclass
class TimedBatch:
    """A learner's next batch (:meth:`BatchSource.next`): ``tensors`` as :func:`get_batch` gives them;
    ``wait`` the seconds the learner thread waited for it; ``gather`` the seconds its copy took
    (in the learner thread, or beside the previous update with prefetching)."""

    tensors: dict[str, torch.Tensor]
    wait: float
    gather: float


class BatchSource:
    """A learner thread's batches: ``batch_size`` full slots taken from the full queue
    (:func:`take_full_slots`), copied into one ``[T+1, B]`` batch on ``device`` and freed at once
    (:func:`get_batch`).

    With ``prefetch`` (``train.prefetch``) a thread of its own takes and copies the next batch while
    the learner learns from the current one, so the copy leaves the update's critical path; a batch
    then waits up to one update longer, and the policy lag grows by up to one update. On CUDA that
    thread copies on a stream of its own and hands a batch over once its copy has finished. Without
    ``prefetch``, :meth:`next` takes and copies in the caller's thread.

    Args:
        slots: the rollout slots.
        batch_size: B, the slots of a batch.
        device: the learner's device.
        stop: the learner's stop event; once it is set every wait ends within ``POLL_SECONDS``.
        activity: the stall report's map of thread name to what it is doing; the prefetching thread
            writes under ``"<name> prefetch"``.
        name: the learner thread's name.
        prefetch: take and copy the next batch in a thread of its own.

    Raises:
        Exception: whatever the prefetching thread raised, from :meth:`next` in the learner thread.
    """

    def __init__(self, slots: Slots, batch_size: int, device: torch.device, stop: threading.Event,
                 activity: dict, name: str, prefetch: bool = False):
        self.slots, self.batch_size, self.device, self.stop = slots, batch_size, device, stop
        self.activity, self.name = activity, name
        self.held: list[int] = []  # slots taken and not yet freed
        self._closed = threading.Event()
        self._ready: queue.Queue[TimedBatch] = queue.Queue(maxsize=1)
        self._error: BaseException | None = None
        self._stream = torch.cuda.Stream(device) if prefetch and device.type == "cuda" else None
        self._thread = None
        if prefetch:
            self._thread = threading.Thread(target=self._prefetch, name=f"{name}-prefetch", daemon=True)
            self._thread.start()

    def next(self) -> TimedBatch | None:
        """The next batch; None once ``stop`` is set.

        Raises:
            Exception: the prefetching thread's exception, if it raised one.
        """
        if self._thread is None:
            return self._take_and_copy(self.name)
        start = time.perf_counter()
        self.activity[self.name] = "waiting for the prefetched batch"
        while not self._stopped():
            if self._error is not None:
                raise self._error
            try:
                batch = self._ready.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            if self._stream is not None:  # the learner's stream reads the batch the prefetch stream wrote
                current = torch.cuda.current_stream(self.device)
                for tensor in batch.tensors.values():
                    tensor.record_stream(current)
            batch.wait = time.perf_counter() - start
            return batch
        return None

    def close(self) -> None:
        """Stop the prefetching thread (within ``POLL_SECONDS``, ``stop`` set or not) and free every
        slot taken and not yet copied."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join()
        for index in self.held:
            self.slots.free_queue.put(index)
        self.held.clear()

    def _stopped(self) -> bool:
        return self.stop.is_set() or self._closed.is_set()

    def _take_and_copy(self, name: str) -> TimedBatch | None:
        start = time.perf_counter()
        take_full_slots(self.slots, self.held, self.batch_size, self._stopped, self.activity, name)
        if self._stopped():
            return None
        copy_start = time.perf_counter()
        self.activity[name] = "copying a batch"
        if self._stream is None:
            tensors = get_batch(self.slots, self.held, self.device)
        else:
            with torch.cuda.stream(self._stream):
                tensors = get_batch(self.slots, self.held, self.device)
            self._stream.synchronize()
        return TimedBatch(tensors, copy_start - start, time.perf_counter() - copy_start)

    def _prefetch(self) -> None:
        """The prefetching thread: take and copy batches, one ahead of the learner."""
        name = f"{self.name} prefetch"
        try:
            while not self._stopped():
                batch = self._take_and_copy(name)
                if batch is not None:
                    self.activity[name] = "holding the next batch"
                while batch is not None and not self._stopped():
                    try:
                        self._ready.put(batch, timeout=POLL_SECONDS)
                        batch = None
                    except queue.Full:
                        continue
        except BaseException as exc:  # raised by next() in the learner thread
            self._error = exc
        self.activity[name] = "stopped"

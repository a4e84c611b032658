"""The queues between the trainer, its actors and its learner threads, in one process and its
children: what a killed writer leaves, how many slots a run may have, that thousands of them come
and go cleanly, and how a learner thread takes its batches from them."""

import multiprocessing
import os
import queue
import signal
import threading
import time

import pytest
import torch

from distrl.config.host import max_indices
from distrl.learning.batches import BatchSource
from distrl.nn.distributions import ActionSpace
from distrl.rollout import RolloutLayout
from distrl.sampling.queues import PIPE_BUF, IndexQueue, MessageQueue, PolicyVersion, SharedValue, drain
from distrl.sampling.slots import Slots

CTX = multiprocessing.get_context("fork")  # children that run no torch code: fork is fast


def _put_forever(q, start: int) -> None:
    i = start
    while True:
        q.put(i)
        i += 1


def test_a_writer_killed_mid_put_leaves_whole_records_and_no_lock():
    """SIGKILLed while it writes as fast as it can, an index writer leaves only whole records; a
    message writer too; and the queues still work for everyone else."""
    indices, messages = IndexQueue(1 << 14, CTX), MessageQueue(CTX, capacity_bytes=1 << 16)
    writers = [CTX.Process(target=_put_forever, args=(indices, 0)),
               CTX.Process(target=_put_forever, args=(messages, 10**9))]
    for p in writers:
        p.start()
    time.sleep(0.3)
    for p in writers:
        os.kill(p.pid, signal.SIGKILL)
        p.join()
    # every index the writer got in is there once, in order, each a whole 8-byte record
    got = drain(indices)
    assert got == list(range(len(got))) and len(got) > 100
    got = drain(messages)
    assert got == list(range(10**9, 10**9 + len(got))) and len(got) > 100
    indices.put(7)
    messages.put(("after", 1))
    assert indices.get(timeout=1) == 7 and messages.get(timeout=1) == ("after", 1)


def test_waits_time_out_and_oversized_messages_are_refused():
    q = IndexQueue(4, CTX)
    start = time.monotonic()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.2)
    assert 0.15 < time.monotonic() - start < 2
    m = MessageQueue(CTX)
    with pytest.raises(ValueError, match="atomically"):
        m.put("x" * PIPE_BUF)
    with pytest.raises(queue.Empty):
        m.get_nowait()


def test_thousands_of_slots_are_allocated_accounted_for_and_released():
    """A queue holds every slot index at once (a run with 6,000 slots once never exited, its
    multiprocessing.Queue's feeder thread blocked on a full pipe)."""
    assert max_indices() >= 6000
    layout = RolloutLayout(num_steps=20, obs_shape=(4,), obs_dtype=torch.float32,
                           action_space=ActionSpace("discrete", (2,)))
    slots = Slots(layout, 6000, CTX)
    assert slots.free_queue.qsize() == 6000
    taken = [slots.free_queue.get() for _ in range(100)]
    for index in taken[:50]:
        slots.full_queue.put(index)
    slots.owner[taken[50:]] = 3  # held by actor 3, which died
    assert sorted(slots.release_owned(3)) == sorted(taken[50:])
    assert slots.reclaim() == list(range(6000))  # every index once
    slots.close()


def test_a_shared_value_is_seen_by_a_child():
    flag = SharedValue(0)
    child = CTX.Process(target=flag.set)
    child.start()
    child.join()
    assert flag.is_set() and flag.value == 1


@pytest.mark.parametrize("prefetch", [False, True], ids=["in_the_learner", "prefetched"])
def test_a_learners_batches_are_its_full_slots_in_order_each_freed_once(prefetch):
    """``BatchSource`` (``train.prefetch``): B slots in the order the full queue gave them, copied and
    freed; with prefetching the next batch is copied while this one is used. A stop ends every wait,
    and afterwards every slot is free once and no thread is left."""
    layout = RolloutLayout(num_steps=3, obs_shape=(2,), obs_dtype=torch.float32,
                           action_space=ActionSpace("discrete", (2,)))
    slots = Slots(layout, 8, CTX)
    for index in range(8):
        slots.tensors["env_id"][index] = 100 + index
    order = [5, 2, 7, 0, 3, 6]  # three batches of two, filled by actors in this order
    assert sorted(drain(slots.free_queue)) == list(range(8))
    for index in order:
        slots.full_queue.put(index)
    slots.free_queue.put(4)
    stop = threading.Event()
    activity: dict = {}
    source = BatchSource(slots, 2, torch.device("cpu"), stop, activity, "learner", prefetch=prefetch)
    batches = [source.next() for _ in range(3)]
    assert [b.tensors["env_id"].tolist() for b in batches] == [[105, 102], [107, 100], [103, 106]]
    assert all(b.tensors["obs"].shape == (4, 2, 2) and b.wait >= 0 and b.gather > 0 for b in batches)
    slots.full_queue.put(1)  # half a batch: the next call waits for the other half
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    assert source.next() is None
    assert time.monotonic() - started < 3
    source.close()
    assert sorted(drain(slots.free_queue)) == list(range(8))  # slot 1 too, taken and never copied
    assert not any(t.name == "learner-prefetch" for t in threading.enumerate())
    assert ("learner prefetch" in activity) == prefetch

    # closed with the stop event clear (the learner's budget is consumed), no full slot coming
    source = BatchSource(slots, 2, torch.device("cpu"), threading.Event(), activity, "learner", prefetch=prefetch)
    closing = threading.Thread(target=source.close, daemon=True)
    closing.start()
    closing.join(timeout=3)
    assert not closing.is_alive()
    assert not any(t.name == "learner-prefetch" for t in threading.enumerate())
    slots.close()


def test_a_prefetching_threads_error_is_raised_in_the_learner_thread():
    """A slot index that no slots holds (a corrupt queue) fails the copy in the prefetching thread;
    the learner thread's ``next`` raises it, so the run stops with the cause."""
    layout = RolloutLayout(num_steps=3, obs_shape=(2,), obs_dtype=torch.float32,
                           action_space=ActionSpace("discrete", (2,)))
    slots = Slots(layout, 4, CTX)
    slots.full_queue.put(99)
    source = BatchSource(slots, 1, torch.device("cpu"), threading.Event(), {}, "learner", prefetch=True)
    with pytest.raises(IndexError):
        source.next()
    source.close()
    slots.close()



def _wait_for_version(version, seconds):
    seconds[0] = float(version.wait_past(0, 1, timeout=10))
    seconds[1] = time.monotonic()


def test_a_waiting_actor_wakes_when_the_version_is_published_and_a_dead_ones_pipe_never_blocks():
    """Synchronous collection's barrier (PolicyVersion): an actor process asleep on its pipe wakes at
    the publication, not at a poll; a wait times out with False; publications nobody reads (a dead
    actor's pipe full) never block the learner."""
    version = PolicyVersion(CTX, num_waiters=2)
    assert not version.wait_past(0, 0, timeout=0.1)
    woke = torch.zeros(2, dtype=torch.float64).share_memory_()
    child = CTX.Process(target=_wait_for_version, args=(version, woke))
    child.start()
    time.sleep(0.5)
    assert child.is_alive()  # asleep: the version is 0
    published = time.monotonic()
    version.publish(1)
    child.join(timeout=5)
    assert woke[0] == 1.0 and woke[1] - published < 0.2
    start = time.monotonic()
    for value in range(2, 20_000):  # actor 0 never reads: its pipe fills
        version.publish(value)
    assert time.monotonic() - start < 10 and version.value == 19_999
    assert version.wait_past(5, 0, timeout=0) and version.wait_past(19_998, 1, timeout=0)
    version.close()


def test_an_undeclared_batch_key_is_refused_with_its_name():
    """A key a learner adds to a batch without declaring it (distrl.rollout.KEYS) stops the split into
    minibatches with its name; it was once dropped from minibatches of steps without a word."""
    from distrl.learning.plan import Steps, Unrolls
    from distrl.rollout import UndeclaredKeyError

    batch = {"action": torch.zeros(4, 2, dtype=torch.int64), "obs": torch.zeros(4, 2, 3),
             "my_quantity": torch.zeros(3, 2)}
    for minibatches in (Steps(2), Unrolls(2)):
        with pytest.raises(UndeclaredKeyError, match="'my_quantity' is not declared"):
            minibatches.split(batch, torch.Generator())
    del batch["my_quantity"]
    assert [m["obs"].shape for m in Steps(2).split(batch, torch.Generator())] == [(1, 3, 3), (1, 3, 3)]

"""A learner thread (step 2 of :mod:`distrl.learning`): the loop over batches
(:meth:`distrl.learning.batches.BatchSource.next`) and updates
(:meth:`distrl.learning.learner.Learner.update`), what it reports (:class:`LearnerStats`), and, with
several ranks, the exchanges between updates."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from distrl.learning.batches import BatchSource, TimedBatch
from distrl.learning.learner import Learner
from distrl.sampling.queues import PolicyVersion
from distrl.sampling.slots import Slots

log = logging.getLogger(__name__)


@dataclass
class LearnerStats:
    """What the learner threads report, read by the trainer's schedule loop (the update count
    itself is :attr:`Learner.updates`).

    ``policy_lag``: learner updates between acting and learning, mean over the last batch;
    ``last``: the last update's losses (:meth:`Learner.update`);
    ``seconds``: wall time the learner threads spent, summed over threads and updates, in
    ``wait`` (for full slots: the actors are behind; with ``train.prefetch``, for the prefetched
    batch), ``gather`` (copying B slots into a batch on the learner's device; with
    ``train.prefetch`` that runs beside the update and is not part of the learner thread's time),
    ``step`` (the optimizer steps: forward, V-trace, backward, clip, step) and ``publish`` (the new
    weights to the actors), updated with :attr:`Learner.updates`;
    ``nonfinite_updates``: updates skipped for a non-finite loss or gradient;
    ``activity``: per learner thread name, what it is doing (for the stall report; a prefetching
    thread's under ``"<name> prefetch"``).
    """

    last: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=lambda: dict.fromkeys(("wait", "gather", "step", "publish"), 0.0))
    policy_lag: float = 0.0
    nonfinite_updates: int = 0
    activity: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True)
class LearnerThreadOptions:
    """A learner thread's settings (:func:`run_learner_thread`; :meth:`for_run` reads them from a run).

    Attributes:
        batch_size: B, the slots of a batch.
        prefetch: the next batch taken and copied beside the update (``train.prefetch``;
            :class:`distrl.learning.batches.BatchSource`).
        max_nonfinite_updates: skipped non-finite updates in a row that stop the run
            (``train.max_nonfinite_updates``).
        check_interval: with several ranks, updates between comparisons of their weights
            (``distributed.check_interval``).
        exchange_interval: with several ranks, updates between sends of finished episodes to rank 0.
    """

    batch_size: int
    prefetch: bool = False
    max_nonfinite_updates: int = 10
    check_interval: int = 100
    exchange_interval: int = 8

    @classmethod
    def for_run(cls, cfg) -> LearnerThreadOptions:
        """A train config's (``batch_size``, ``train.prefetch``, ``train.max_nonfinite_updates``,
        ``distributed.check_interval``)."""
        return cls(int(cfg.batch_size), bool(cfg.train.prefetch), int(cfg.train.max_nonfinite_updates),
                   int(cfg.distributed.check_interval))


class NonFiniteError(RuntimeError):
    """Too many learner updates in a row had a non-finite loss or gradient."""


def run_learner_thread(learner: Learner, *, slots: Slots, stats: LearnerStats, policy_version: PolicyVersion,
                       stop: threading.Event, errors: list, options: LearnerThreadOptions) -> None:
    """Loop: take ``B`` full slots, get the batch, update and publish the new policy version to the
    actors (``policy_version``), until the schedule's budget of agent steps (``num_train_steps``) is
    consumed.

    Every wait polls ``stop``, so the thread never blocks forever. An exception is appended to
    ``errors`` and sets ``stop``; ``options.max_nonfinite_updates`` skipped updates in a row raise
    :class:`NonFiniteError` that way. With several ranks (``learner.ranks``) the update count is the
    same on every rank, the weights are compared across ranks every ``options.check_interval``
    updates and finished episodes go to rank 0 every ``options.exchange_interval`` updates; that
    exchange also carries the ranks' stop requests (:attr:`Ranks.stop_requested`), and after one
    every rank's thread returns at the same update, as at the end of the budget. ``options.prefetch``:
    the next batch is taken and copied beside the update (:class:`BatchSource`).
    """
    ranks = learner.ranks
    name = threading.current_thread().name
    source = BatchSource(slots, options.batch_size, learner.device, stop, stats.activity, name, options.prefetch)
    nonfinite_in_a_row = 0
    try:
        while not stop.is_set():
            consumed = learner.position.agent_steps >= learner.schedule.num_train_steps
            if consumed or ranks.group_stopped.is_set():
                stats.activity[name] = ("done: the budget is consumed" if consumed
                                        else f"done: rank {ranks.stopped_by} stopped the ranks")
                if ranks.enabled:  # every rank is here at the same update
                    _exchange(learner, stop, check=True)
                return
            batch = source.next()
            if batch is None:
                return
            stats.activity[name] = "updating"
            losses = _learn(learner, batch, stats, policy_version, stop)
            if ranks.enabled:
                updates = learner.updates
                _exchange(learner, stop, episodes=updates % options.exchange_interval == 0,
                          check=updates % options.check_interval == 0)
            nonfinite_in_a_row = 0 if losses["finite"] else nonfinite_in_a_row + 1
            if nonfinite_in_a_row:
                _skipped(learner, stats, losses, nonfinite_in_a_row, options.max_nonfinite_updates)
    except Exception as exc:  # reported by the trainer, which stops everything
        errors.append(exc)
        stop.set()
    finally:
        source.close()


def _learn(learner: Learner, batch: TimedBatch, stats: LearnerStats, policy_version: PolicyVersion,
           stop: threading.Event) -> dict:
    """One update on ``batch``; the policy version and the stats follow it in the same moment."""
    start = time.perf_counter()
    with learner.lock:  # a checkpoint, and the trainer's timing, see the weights and the counter of one moment
        lag = learner.updates - batch.tensors["policy_version"].float().mean().item()
        losses = dict(learner.update(batch.tensors, stop))
        losses.setdefault("finite", True)
        policy_version.publish(learner.position.policy_version)
        publish_seconds = losses.pop("publish_seconds", 0.0)
        with stats.lock:
            stats.policy_lag = lag
            stats.last = {k: v for k, v in losses.items() if k != "finite"}
            seconds = stats.seconds
            seconds["wait"] += batch.wait
            seconds["gather"] += batch.gather
            seconds["step"] += time.perf_counter() - start - publish_seconds
            seconds["publish"] += publish_seconds
    return losses


def _exchange(learner: Learner, stop: threading.Event, episodes: bool = True, check: bool = False) -> None:
    """With several ranks: send finished episodes to rank 0; compare the weights across ranks."""
    if episodes:
        learner.ranks.exchange_episodes(stop)
    if check:
        with learner.lock:
            net = learner.networks.learner  # the weights and the running statistics (distrl.nn.normalization)
            learner.ranks.check_identical([*net.parameters(), *net.buffers()], stop)


def _skipped(learner: Learner, stats: LearnerStats, losses: dict, in_a_row: int, most: int) -> None:
    """Count a skipped non-finite update; raise :class:`NonFiniteError` after ``most`` in a row."""
    with stats.lock:
        stats.nonfinite_updates += 1
    log.warning("update %d skipped: non-finite loss %s or gradient norm %s (%d in a row)",
                learner.updates, losses["total"], losses["grad_norm"], in_a_row)
    if in_a_row >= most:
        raise NonFiniteError(
            f"{in_a_row} updates in a row had a non-finite loss or gradient "
            f"(train.max_nonfinite_updates={most}); the weights are those before the first of them")

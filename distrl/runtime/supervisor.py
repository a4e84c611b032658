"""Starting, watching and stopping a run's workers: actor processes and learner threads.

Processes come from an explicit ``spawn`` context (never the global start method: a Hydra
sweep runs several jobs in one process). Every wait polls a stop signal, so Ctrl-C, the end of
the budget or a failure always ends in the same orderly stop. A dead actor is restarted.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import contextmanager
from typing import NamedTuple

from distrl.learning.distributed import CollectiveFailed
from distrl.learning.learner import Learner
from distrl.learning.thread import LearnerStats, LearnerThreadOptions, run_learner_thread
from distrl.sampling.actor import STOP_SIGNALS, run_actor
from distrl.sampling.context import ActorContext
from distrl.sampling.queues import drain
from distrl.sampling.slots import Channels, Slots

log = logging.getLogger(__name__)

ACTOR_JOIN_SECONDS = 5.0


class TrainingError(RuntimeError):
    """Training stopped because a part of it failed; the message says which and why."""


class ActorFailure(TrainingError):
    """Actors died more often than the restart budget allows; the learner state is intact."""


class Stalled(TrainingError):
    """No agent step was consumed for ``train.stall_timeout`` seconds."""


class LearnerFailure(TrainingError):
    """A learner thread raised; its update may be half-applied."""


class RankLost(TrainingError):
    """Another rank died, stopped or did not answer within ``distributed.timeout``. This rank's
    weights and optimizer state are intact: a collective fails before the optimizer step it
    feeds (with ``agent.num_epochs`` > 1, after the update's earlier epochs)."""


class RestartBudget(NamedTuple):
    """How many actor restarts a run allows: at most ``most`` within any ``window`` seconds
    (``train.max_actor_restarts``, ``train.actor_restart_window``)."""

    most: int = 10
    window: float = 600.0


class Workers:
    """The actor processes and learner threads of one run.

    A dead actor (killed, out of memory, or its env raised) is restarted with fresh env seeds
    after the slots it held go back to the free queue; more than ``max_restarts`` restarts within
    ``restart_window`` seconds stop the run instead (an env that fails every time must not loop).

    Args:
        mp_context: the ``torch.multiprocessing`` context that starts the actors.
        slots: the rollout slots.
        channels: queues, stop flag, policy version and heartbeats shared with the actors.
        learner: the learner the threads call.
        stats: the counters the learner threads advance.
        restarts: the restart budget (:class:`RestartBudget`).
        reseed: ``reseed(actor_id, restart)`` gives the env seed of a restarted actor.
        target: the actor process's function, ``target(actor_id, context)`` (:func:`run_actor`).
    """

    def __init__(self, mp_context, slots: Slots, channels: Channels, learner: Learner,
                 stats: LearnerStats, restarts: RestartBudget = RestartBudget(),
                 reseed: Callable[[int, int], int] | None = None, target: Callable = run_actor):
        self.mp_context = mp_context
        self.target = target
        self.slots = slots
        self.channels = channels
        self.learner = learner
        self.stats = stats
        self.max_restarts, self.restart_window = restarts
        self.reseed = reseed
        self.learner_stop = threading.Event()
        self.learner_errors: list[BaseException] = []
        self.contexts: list[ActorContext] = []
        self.actors: list = []
        self.learner_threads: list[threading.Thread] = []
        self.restarts = 0  # in the whole run
        self.restart_times: deque[float] = deque()
        self.restarts_of: dict[int, int] = {}
        self.causes: dict[int, str] = {}  # actor id -> the last line of its exception

    def start(self, actor_contexts: list[ActorContext], num_learners: int, options: LearnerThreadOptions) -> None:
        """Start one process per actor context and ``num_learners`` learner threads with ``options``
        (:class:`distrl.learning.thread.LearnerThreadOptions`), which stop when the learner's schedule
        has consumed its budget of agent steps."""
        self.contexts = list(actor_contexts)
        for actor_id, ctx in enumerate(self.contexts):
            self.actors.append(self._spawn(actor_id, ctx))
        for i in range(num_learners):
            thread = threading.Thread(
                target=run_learner_thread, name=f"distrl-learner-{i}", daemon=True, args=(self.learner,),
                kwargs=dict(slots=self.slots, stats=self.stats, policy_version=self.channels.policy_version,
                            stop=self.learner_stop, errors=self.learner_errors, options=options),
            )
            thread.start()
            self.learner_threads.append(thread)

    def _spawn(self, actor_id: int, ctx: ActorContext):
        process = self.mp_context.Process(target=self.target, args=(actor_id, ctx), name=f"distrl-actor-{actor_id}",
                                          daemon=True)
        with handling_signals(STOP_SIGNALS, signal.SIG_IGN):  # the child starts with them ignored
            process.start()
        return process

    def wait(self, seconds: float) -> None:
        """Sleep up to ``seconds``; returns early when a learner thread stops everything."""
        self.learner_stop.wait(seconds)

    def check(self) -> None:
        """Restart dead actors; raise if the restart budget is spent or a learner raised.

        Raises:
            ActorFailure: an actor needed more than ``max_restarts`` restarts within
                ``restart_window`` seconds; names it and its last cause.
            RankLost: the learner's collective with the other ranks failed.
            LearnerFailure: with the learner's exception, any other.
        """
        for actor_id, trace in drain(self.channels.reports.errors):
            self.causes[actor_id] = trace.strip().splitlines()[-1]
            log.error("actor %d raised:\n%s", actor_id, trace)
        for actor_id, process in enumerate(self.actors):
            if process.is_alive() or self.channels.stop_event.is_set():
                continue
            process.join()
            code = process.exitcode
            cause = self.causes.pop(actor_id, None) or (
                f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}")
            self._restart(actor_id, cause)
        if self.learner_errors:
            exc = self.learner_errors[0]
            if isinstance(exc, CollectiveFailed):
                raise RankLost(str(exc)) from exc
            raise LearnerFailure(f"learner raised {type(exc).__name__}: {exc}") from exc

    def lost_rank(self) -> CollectiveFailed | None:
        """The learners' failed collective with the other ranks, if that is what stopped them."""
        if self.learner_errors and isinstance(self.learner_errors[0], CollectiveFailed):
            return self.learner_errors[0]
        return None

    def _restart(self, actor_id: int, cause: str) -> None:
        freed = self.slots.release_owned(actor_id)
        now = time.monotonic()
        while self.restart_times and self.restart_times[0] < now - self.restart_window:
            self.restart_times.popleft()
        if len(self.restart_times) >= self.max_restarts:
            raise ActorFailure(
                f"actor {actor_id} died ({cause}) after {len(self.restart_times)} actor restarts within "
                f"{self.restart_window:.0f} s (train.max_actor_restarts={self.max_restarts}, "
                f"train.actor_restart_window={self.restart_window:g})")
        self.restart_times.append(now)
        self.restarts += 1
        restart = self.restarts_of[actor_id] = self.restarts_of.get(actor_id, 0) + 1
        ctx = self.contexts[actor_id]
        if self.reseed is not None:
            envs = dataclasses.replace(ctx.envs, seed=self.reseed(actor_id, restart))
            ctx = self.contexts[actor_id] = dataclasses.replace(ctx, envs=envs)
        self.channels.reports.heartbeat[actor_id] = 0.0
        self.actors[actor_id] = self._spawn(actor_id, ctx)
        log.warning("actor %d died (%s): restarted (restart %d of the run), env seed %d; %d slot(s) it held "
                    "returned", actor_id, cause, self.restarts, ctx.envs.seed, len(freed))

    def report(self) -> list[str]:
        """Where everything is, one line each: actors (alive, last heartbeat), queues, learners."""
        now = time.time()
        lines = []
        for actor_id, process in enumerate(self.actors):
            beat = float(self.channels.reports.heartbeat[actor_id])
            last = f"last step {now - beat:.1f} s ago" if beat else "no step yet"
            state = "alive" if process.is_alive() else f"dead (exit code {process.exitcode})"
            held = int((self.slots.owner == actor_id).sum())
            lines.append(f"actor {actor_id} (pid {process.pid}): {state}, {last}, holds {held} slot(s)")
        lines.append(f"slots: {self.slots.free_queue.qsize()} free, {self.slots.full_queue.qsize()} full "
                     f"waiting for a learner, of {self.slots.num_slots}")
        for thread in self.learner_threads:
            what = self.stats.activity.get(thread.name, "not started")
            lines.append(f"{thread.name}: {'alive' if thread.is_alive() else 'stopped'}, {what}")
            prefetching = self.stats.activity.get(f"{thread.name} prefetch")
            if prefetching is not None:
                lines.append(f"{thread.name}'s prefetching thread: {prefetching}")
        return lines

    def stop(self, learners_finish: float = 0.0) -> list[int]:
        """Stop the learners, then the actors (terminated if they do not stop in time), and account
        for the slots.

        Args:
            learners_finish: seconds the learner threads get to end by themselves first, with the
                actors still running (several ranks, after a consumed budget or a stop request: every
                rank's learner makes its last collectives and returns at the same update; a rank
                that stopped its learner in the middle of one would leave the others' half done, and
                gloo aborts a process whose peer closes a connection under a collective).

        Returns:
            Every slot index found free afterwards, sorted (each exactly once when none was lost).
        """
        deadline = time.monotonic() + learners_finish
        for thread in self.learner_threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self.channels.stop_event.set()
        self.learner_stop.set()
        for thread in self.learner_threads:
            thread.join()
        deadline = time.monotonic() + ACTOR_JOIN_SECONDS
        for process in self.actors:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
        for actor_id, process in enumerate(self.actors):
            if process.is_alive():
                log.warning("actor %s did not stop in %.0f s: killing it", process.name, ACTOR_JOIN_SECONDS)
                process.kill()  # SIGTERM is ignored by actors
                process.join()
            self.slots.release_owned(actor_id)
        free = self.slots.reclaim()
        lost = self.slots.num_slots - len(free)
        if lost or len(set(free)) != len(free):
            log.warning("slot accounting: %d of %d slots not returned", lost, self.slots.num_slots)
        return free

    def close(self) -> None:
        """Release the queues (after :meth:`stop`)."""
        self.slots.close()
        self.channels.close()


@contextmanager
def handling_signals(signals, handler):
    """Within the block, ``signals`` go to ``handler`` (a function or ``signal.SIG_IGN``); the
    previous handlers come back after it. Only the main thread may set handlers: elsewhere the
    block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, previous in before.items():
            signal.signal(sig, previous)


class Watchdog:
    """Raises :class:`Stalled` once no agent step was consumed for ``stall_timeout`` seconds
    (``train.stall_timeout``), after logging where every actor and learner thread is
    (:meth:`Workers.report`)."""

    def __init__(self, workers: Workers, stall_timeout: float, steps: int):
        self.workers, self.stall_timeout = workers, stall_timeout
        self.moved_at, self.steps = time.monotonic(), steps

    def check(self, steps: int) -> None:
        """Called every tick with the agent steps consumed so far.

        Raises:
            Stalled: ``steps`` has not moved for ``stall_timeout`` seconds.
        """
        if steps != self.steps:
            self.moved_at, self.steps = time.monotonic(), steps
            return
        seconds = time.monotonic() - self.moved_at
        if seconds <= self.stall_timeout:
            return
        log.error("no agent step consumed for %.0f s (train.stall_timeout=%g); where everything is:",
                  seconds, self.stall_timeout)
        for line in self.workers.report():
            log.error("  %s", line)
        raise Stalled(f"stalled: no agent step consumed for {seconds:.0f} s at {steps} agent "
                      f"steps (train.stall_timeout={self.stall_timeout:g}); train.log says where "
                      f"each actor and learner was")

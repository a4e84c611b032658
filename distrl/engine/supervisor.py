"""Starting, watching and stopping a run's workers: actor processes and learner threads.

Processes come from an explicit ``spawn`` context (never the global start method: a Hydra
sweep runs several jobs in one process). Every wait polls a stop signal, so Ctrl-C, the end of
the budget or a dead actor always ends in the same orderly stop.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
import time

from distrl.engine.actor import ActorContext, Channels, run_actor
from distrl.engine.learner import Learner, LearnerStats, run_learner_thread
from distrl.engine.storage import RolloutStorage, drain

log = logging.getLogger(__name__)

ACTOR_JOIN_SECONDS = 5.0


class TrainingError(RuntimeError):
    """Training stopped because a part of it failed; the message says which and why."""


class ActorFailure(TrainingError):
    """An actor process raised or died; the learner state is intact."""


class LearnerFailure(TrainingError):
    """A learner thread raised; its update may be half-applied."""


class Workers:
    """The actor processes and learner threads of one run.

    Args:
        mp_context: the ``torch.multiprocessing`` context the storage's queues belong to.
        storage: the rollout slots.
        channels: queues, stop event and policy version shared with the actors.
        learner: the learner the threads call.
        stats: the counters the learner threads advance.
    """

    def __init__(self, mp_context, storage: RolloutStorage, channels: Channels, learner: Learner,
                 stats: LearnerStats):
        self.mp_context = mp_context
        self.storage = storage
        self.channels = channels
        self.learner = learner
        self.stats = stats
        self.learner_stop = threading.Event()
        self.learner_errors: list[BaseException] = []
        self.actors: list = []
        self.learner_threads: list[threading.Thread] = []

    def start(self, actor_contexts: list[ActorContext], num_learners: int, batch_size: int,
              num_train_steps: int) -> None:
        """Start one process per actor context and ``num_learners`` learner threads, which stop
        at ``num_train_steps`` agent steps."""
        for actor_id, ctx in enumerate(actor_contexts):
            process = self.mp_context.Process(target=run_actor, args=(actor_id, ctx),
                                              name=f"distrl-actor-{actor_id}", daemon=True)
            process.start()
            self.actors.append(process)
        for i in range(num_learners):
            thread = threading.Thread(
                target=run_learner_thread, name=f"distrl-learner-{i}", daemon=True, args=(self.learner,),
                kwargs=dict(storage=self.storage, stats=self.stats, batch_size=batch_size,
                            num_train_steps=num_train_steps, policy_version=self.channels.policy_version,
                            stop=self.learner_stop, errors=self.learner_errors),
            )
            thread.start()
            self.learner_threads.append(thread)

    def wait(self, seconds: float) -> None:
        """Sleep up to ``seconds``; returns early when a learner thread stops everything."""
        self.learner_stop.wait(seconds)

    def check(self) -> None:
        """Raise if an actor raised or died, or a learner raised.

        Raises:
            ActorFailure: with the actor's id and its exception or exit status.
            LearnerFailure: with the learner's exception.
        """
        try:
            actor_id, trace = self.channels.error_queue.get_nowait()
        except queue.Empty:
            pass
        else:
            cause = trace.strip().splitlines()[-1]
            log.error("actor %d raised:\n%s", actor_id, trace)
            raise ActorFailure(f"actor {actor_id} raised: {cause}")
        for actor_id, process in enumerate(self.actors):
            if not process.is_alive():
                code = process.exitcode
                why = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
                raise ActorFailure(f"actor {actor_id} (pid {process.pid}) died unexpectedly ({why})")
        if self.learner_errors:
            exc = self.learner_errors[0]
            raise LearnerFailure(f"learner raised {type(exc).__name__}: {exc}") from exc

    def stop(self) -> list[int]:
        """Stop the learners, then the actors (terminated if they do not stop in time), and account
        for the slots.

        Returns:
            Every slot index found free afterwards, sorted (each exactly once when none was lost).
        """
        self.channels.stop_event.set()
        self.learner_stop.set()
        for thread in self.learner_threads:
            thread.join()
        deadline = time.monotonic() + ACTOR_JOIN_SECONDS
        for process in self.actors:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
        for process in self.actors:
            if process.is_alive():
                log.warning("actor %s did not stop in %.0f s: terminating it", process.name, ACTOR_JOIN_SECONDS)
                process.terminate()
                process.join(timeout=2.0)
            if process.is_alive():
                process.kill()
                process.join()
        free = self.storage.reclaim()
        lost = self.storage.num_storages - len(free)
        if lost or len(set(free)) != len(free):
            log.warning("storage accounting: %d of %d slots not returned", lost, self.storage.num_storages)
        return free

    def close(self) -> None:
        """Release the queues (after :meth:`stop`)."""
        self.storage.close()
        for q in (self.channels.episode_queue, self.channels.error_queue):
            drain(q)
            q.close()
            q.join_thread()

"""How a run stops (:class:`Shutdown`, a part of :class:`distrl.engine.trainer.DistributedTrainer`):
the workers and the evaluation stopped, then a checkpoint, and after a finished run the final
evaluation and another checkpoint; a second Ctrl-C or SIGTERM meanwhile is logged, nothing else."""

from __future__ import annotations

import logging
import signal
import threading
from collections import deque

from distrl.engine.supervisor import TrainingError, handling_signals

log = logging.getLogger(__name__)

# Set while a trainer of this process stops (from the first line of its shutdown to the next run):
# a sweep job's interrupt watcher (distrl.cli.sweeps) stops signalling then.
SHUTTING_DOWN = threading.Event()


def _already_stopping(signum, frame) -> None:
    """Signal handler during shutdown: a second Ctrl-C or SIGTERM is logged, nothing else."""
    log.warning("%s: already stopping; the checkpoint is being written", signal.Signals(signum).name)


class Shutdown:
    """The stop of :class:`distrl.engine.trainer.DistributedTrainer` (whose attributes it reads:
    ``evaluations``, ``ranks``, ``workers``, ``actor_logs``, ``telemetry``, ``num_storages``,
    ``cfg``, ``run_dir``, and the methods of ``Checkpointing`` and ``Reporting``)."""

    def _shutdown(self, outcome: str) -> None:
        """Stop the workers and the evaluation, then save (and, after a finished run, evaluate the
        final weights and save again)."""
        SHUTTING_DOWN.set()
        failure = None
        # a second Ctrl-C or SIGTERM is logged and must not skip the checkpoint
        with handling_signals((signal.SIGINT, signal.SIGTERM), _already_stopping):
            self.evaluations.stop()
            finish = 0.0
            if self.ranks.enabled and outcome in ("done", "interrupted"):
                # The ranks' learners stop together, after the same update and their last collectives
                # (a rank that left one half done would make gloo abort the others): at the end of the
                # budget by themselves, after an interrupt at the next episode exchange.
                if outcome == "interrupted":
                    self.ranks.stop_requested.set()
                finish = self.ranks.timeout
            free = self.workers.stop(learners_finish=finish)
            if free != list(range(self.num_storages)):  # each slot index exactly once: none lost, none twice
                log.warning("rollout slots at shutdown: %d of %d indices returned (%d distinct): a slot was lost "
                            "or handed out twice", len(free), self.num_storages, len(set(free)))
            self.actor_logs.stop()
            # the other ranks' episodes of the learners' last exchange
            self._log_episodes(list(self.ranks.incoming), self.position.agent_steps, deque())
            self.ranks.incoming.clear()
            try:
                if outcome != "failed":  # after a learner error the optimizer state may be half-updated
                    failure = self._save_or_warn()
                if failure is None and outcome == "done" and self.cfg.train.num_eval_episodes > 0 \
                        and self.ranks.is_main:
                    self._final_eval()
                    failure = self._save_or_warn()
            finally:
                self.telemetry.close()
                self.workers.close()
            position = self.position
            log.info("training %s at %d agent steps (%d frames), %d updates", outcome, position.agent_steps,
                     position.frames, position.updates)
        if failure is not None and outcome == "done":
            raise TrainingError(f"the final checkpoint could not be written in {self.run_dir / 'checkpoints'}: "
                                f"{failure}")

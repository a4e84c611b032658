"""One :meth:`distrl.runtime.trainer.Trainer.train` call, start to stop (:class:`TrainingLoop`): the
slots and the actor processes and learner threads started (:class:`distrl.runtime.supervisor.Workers`),
the schedule loop (every tick: the workers checked, the episodes logged, and log, evaluate and save
when due), and the shutdown (the workers and the evaluation stopped, a checkpoint, and after a
finished run the final evaluation and another checkpoint)."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import deque
from pathlib import Path
from typing import Protocol

import torch.multiprocessing as mp
from omegaconf import DictConfig, OmegaConf

from distrl.config.placement import Placement
from distrl.envs import EnvSpec, env_seed
from distrl.intrinsic import IntrinsicReward
from distrl.learning.distributed import Ranks
from distrl.learning.learner import Learner
from distrl.learning.schedule import Every, Throughput
from distrl.learning.thread import LearnerStats, LearnerThreadOptions
from distrl.nn.actor_learner import ActorLearner
from distrl.rollout import RolloutLayout
from distrl.runtime.checkpointer import Checkpointer
from distrl.runtime.evaluator import EvalResult, Evaluations
from distrl.runtime.reporter import DORMANT_LOG_INTERVALS, Reporter, announce, flatten
from distrl.runtime.supervisor import (
    ActorFailure,
    RankLost,
    RestartBudget,
    Stalled,
    TrainingError,
    Watchdog,
    Workers,
    handling_signals,
)
from distrl.sampling import logs
from distrl.sampling.actor import actor_contexts
from distrl.sampling.slots import Channels, Slots
from distrl.utils.telemetry import NullTelemetry, Telemetry, WandbSink

log = logging.getLogger(__name__)

TICK_SECONDS = 0.25

# Set while a training loop of this process stops (from the first line of its shutdown to the next run):
# a sweep job's interrupt watcher (distrl.cli.sweeps) stops signalling then.
SHUTTING_DOWN = threading.Event()


class RunParts(Protocol):
    """What a training loop runs: the parts :class:`distrl.runtime.trainer.Trainer` built (the trainer
    itself has them): the run's ``cfg``, ``placement`` and env ``spec``; the network's copies
    (``networks``, the actor and learner copies), the ``learner``, its statistics (``stats``) and the
    ``intrinsic`` module (or None); the ``checkpointer`` (it keeps when the run last evaluated and
    saved); this process's ``ranks``; the ``run_dir``; whether to show the console ``progress`` bar;
    the ``env`` node evaluations use (``eval_env``); and ``save_requested``, set to ask for a
    checkpoint at the next tick (SIGUSR1)."""

    cfg: DictConfig
    placement: Placement
    spec: EnvSpec
    networks: ActorLearner
    learner: Learner
    stats: LearnerStats
    intrinsic: IntrinsicReward | None
    checkpointer: Checkpointer
    ranks: Ranks
    run_dir: Path
    progress: bool
    eval_env: DictConfig
    save_requested: threading.Event


class TrainingLoop:
    """One train() call of a run: the parts :class:`distrl.runtime.trainer.Trainer` built
    (:class:`RunParts`), run until the budget is consumed or a stop."""

    def __init__(self, parts: RunParts):
        self.cfg, self.placement, self.spec, self.networks = parts.cfg, parts.placement, parts.spec, parts.networks
        self.learner, self.stats, self.intrinsic = parts.learner, parts.stats, parts.intrinsic
        self.checkpointer, self.ranks, self.run_dir = parts.checkpointer, parts.ranks, Path(parts.run_dir)
        self.progress, self.eval_env, self.save_requested = parts.progress, parts.eval_env, parts.save_requested

    def run(self) -> None:
        """Start the actors and learner threads, run the schedule until the budget is consumed (or a
        stop), and shut down (see :meth:`distrl.runtime.trainer.Trainer.train` for what it raises)."""
        cfg, p, train = self.cfg, self.placement, self.cfg.train
        SHUTTING_DOWN.clear()
        self.ranks.clear_stop()
        announce(cfg, p, self.spec, self.networks, self.ranks, self.run_dir)
        mp_context = mp.get_context("spawn")
        slots = Slots(RolloutLayout.for_run(cfg, self.spec), self.placement.num_slots, mp_context)
        log.debug("slots: %d, %.1f MiB shared memory", self.placement.num_slots, slots.nbytes() / 2**20)
        hparams = flatten(OmegaConf.to_container(cfg, resolve=True))
        hparams["distributed.world_size"] = self.ranks.world_size
        self.telemetry = Telemetry(
            self.run_dir, train.num_train_steps, self.learner.position.agent_steps, self.spec.frameskip,
            hparams=hparams, progress=self.progress, wandb=WandbSink.start(self.run_dir, cfg),
        ) if self.ranks.is_main else NullTelemetry()
        channels = Channels.create(slots, mp_context, p.actors.count, self.learner.position.policy_version,
                                   sync=bool(train.get("sync", False)))
        self.actor_logs = logs.ActorLogWriter(channels.reports.logs, self.run_dir / "actors.log")
        self.actor_logs.start()
        first_actor = self.ranks.rank * p.actors.count
        self.workers = Workers(
            mp_context, slots, channels, self.learner, self.stats,
            RestartBudget(train.max_actor_restarts, train.actor_restart_window),
            reseed=lambda actor_id, restart: env_seed(cfg.seed, first_actor + actor_id, p.actors.envs_per_actor,
                                                      restart, p.actors.count * self.ranks.world_size))
        self.reporter = Reporter(self.telemetry, channels, self.learner, self.stats, self.workers,
                                 self.spec.frameskip, cfg.env.get("success_above"))
        self.evaluations = Evaluations(self.networks.learner, self.eval_env, train.num_eval_episodes, cfg.seed,
                                       p.actors.precision, bool(train.get("eval_deterministic", False)))
        outcome = "failed"
        try:
            contexts = actor_contexts(cfg, p, self.networks.actor, slots, channels, first_actor=first_actor,
                                      bonus=self.intrinsic.actor_bonus if self.intrinsic is not None else None)
            self.workers.start(contexts, cfg.num_learners, LearnerThreadOptions.for_run(cfg))
            self._schedule()
            outcome = "done"
        except (KeyboardInterrupt, SystemExit) as stop:  # SystemExit: e.g. submitit's, at a SLURM time limit
            outcome = "interrupted"
            log.warning("%s: stopping actors and learners",
                        "interrupted" if isinstance(stop, KeyboardInterrupt) else "exit requested")
            raise
        except ActorFailure:
            outcome = "stopped after actor failures"
            raise
        except Stalled:
            outcome = "stalled"
            raise
        except RankLost:
            outcome = "stopped after a lost rank"  # its weights are intact: rank 0 saves them
            raise
        finally:
            self._shutdown(outcome)

    # ----------------------------------------------------------------- schedule
    def _schedule(self) -> None:
        """Every tick: check the workers, log episodes, and log, evaluate and save when due, until
        the budget is consumed."""
        train, reporter = self.cfg.train, self.reporter
        recent_returns: deque[float] = deque(maxlen=100)
        logs_due = Every(train.log_interval, self.learner.position.agent_steps)
        dormant_due = Every(DORMANT_LOG_INTERVALS * train.log_interval, self.learner.position.agent_steps)
        last_log = (time.perf_counter(), self.learner.position.agent_steps, reporter.learner_time())
        meter = Throughput(self.learner.position.agent_steps)
        watchdog = Watchdog(self.workers, train.stall_timeout, self.learner.position.agent_steps)
        while True:
            self.workers.wait(TICK_SECONDS)
            self.workers.check()
            steps = self.learner.position.agent_steps
            watchdog.check(steps)
            reporter.log_episodes(reporter.finished_episodes(), steps, recent_returns)
            done = steps >= train.num_train_steps
            if logs_due.due(steps) or done:
                logs_due.ran(steps)
                dormant = dormant_due.due(steps) or done
                if dormant:
                    dormant_due.ran(steps)
                last_log = reporter.log_training(steps, last_log, recent_returns, dormant)
            self._evaluate_when_due(steps, done)
            if (self.checkpointer.saves.due(steps) or self.save_requested.is_set()) and not done:
                self.save_requested.clear()
                self.checkpointer.save_or_warn()
            self.telemetry.progress(steps, meter.add(steps), recent_returns[-1] if recent_returns else None)
            if done:
                break
            if self.ranks.group_stopped.is_set() and not self.ranks.stop_requested.is_set():
                log.warning("rank %s was stopped: this rank stops with it", self.ranks.stopped_by)
                raise KeyboardInterrupt
        finished = self.evaluations.finished(wait=True)
        if finished:
            self._evaluated(*finished)

    def _evaluate_when_due(self, steps: int, done: bool) -> None:
        """Log an evaluation that finished; start the next one when it is due (rank 0, one at a time).
        An evaluation counts as run (the checkpoint's ``last_eval_step``) once it finishes: one that a
        stop cuts short is run again, at once, by the resumed run."""
        finished = self.evaluations.finished()
        if finished:
            self._evaluated(*finished)
        if (not self.evaluations.busy and self.cfg.train.num_eval_episodes > 0
                and self.checkpointer.evals.due(steps) and not done and self.ranks.is_main):
            self.evaluations.start(self.checkpointer.state(), steps)

    def _evaluated(self, result: EvalResult, snapshot: dict, step: int) -> None:
        """An evaluation of ``snapshot``'s weights (taken at ``step`` agent steps) finished: log it,
        count it as run, keep a new best as best.pt."""
        self.reporter.log_eval(result, step)
        self.checkpointer.evaluated(step, snapshot, result.mean_return if result.returns else None)

    # ----------------------------------------------------------------- shutdown
    def _shutdown(self, outcome: str) -> None:
        """Stop the workers and the evaluation, then save (and, after a finished run, evaluate the
        final weights and save again); a second Ctrl-C or SIGTERM meanwhile is logged, nothing else.

        Raises:
            RankLost: interrupted (e.g. by the launcher, after another rank died), the learners'
                collective with the other ranks failed while they stopped; saved as after any lost rank.
        """
        SHUTTING_DOWN.set()
        failure = None
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
            # A rank that died makes the launcher terminate the others, which may come before this
            # rank's own failed collective is seen: either way it is a lost rank.
            lost = self.workers.lost_rank() if self.ranks.enabled and outcome == "interrupted" else None
            if lost is not None:
                outcome = "stopped after a lost rank"
            if free != list(range(self.placement.num_slots)):  # each slot index exactly once: none lost, none twice
                log.warning("rollout slots at shutdown: %d of %d indices returned (%d distinct): a slot was lost "
                            "or handed out twice", len(free), self.placement.num_slots, len(set(free)))
            self.actor_logs.stop()
            # the other ranks' episodes of the learners' last exchange
            self.reporter.log_episodes(list(self.ranks.incoming), self.learner.position.agent_steps, deque())
            self.ranks.incoming.clear()
            try:
                if outcome != "failed":  # after a learner error the optimizer state may be half-updated
                    failure = self.checkpointer.save_or_warn()
                if failure is None and outcome == "done" and self.cfg.train.num_eval_episodes > 0 \
                        and self.ranks.is_main:
                    step, snapshot = self.learner.position.agent_steps, self.checkpointer.state()
                    self._evaluated(*self.evaluations.run(snapshot, step), step)
                    failure = self.checkpointer.save_or_warn()
            finally:
                self.telemetry.close()
                self.workers.close()
            position = self.learner.position
            log.info("training %s at %d agent steps (%d frames), %d updates", outcome, position.agent_steps,
                     position.frames, position.updates)
        if lost is not None:
            raise RankLost(str(lost)) from lost
        if failure is not None and outcome == "done":
            raise TrainingError(f"the final checkpoint could not be written in {self.run_dir / 'checkpoints'}: "
                                f"{failure}")




def _already_stopping(signum, frame) -> None:
    """Signal handler during shutdown: a second Ctrl-C or SIGTERM is logged, nothing else."""
    log.warning("%s: already stopping; the checkpoint is being written", signal.Signals(signum).name)

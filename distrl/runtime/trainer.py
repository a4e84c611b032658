"""``Trainer``: builds a run, runs its schedule (log, evaluate, save) while the workers
train, and shuts it down.

The trainer process holds the learner threads, the schedule loop and, while one runs, an
evaluation thread (:class:`distrl.runtime.evaluator.Evaluations`); actor processes are started and
watched by :mod:`distrl.runtime.supervisor`. Where the run is follows from the learner's update
count alone (:class:`distrl.learning.schedule.Schedule`).
"""

from __future__ import annotations

import copy
import logging
import os
import random
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp
from omegaconf import DictConfig, OmegaConf

from distrl.config.validation import Validated
from distrl.envs import env_seed, eval_seed
from distrl.intrinsic import intrinsic_for_run, needs_value_head
from distrl.learning.distributed import Ranks
from distrl.learning.learner import Learner, LearnerStats, make_optimizer
from distrl.learning.schedule import Every, Position, Schedule, Throughput
from distrl.nn.actor_learner import ActorLearner
from distrl.rollout import RolloutLayout
from distrl.runtime.checkpointer import Checkpointer, load_initial_weights
from distrl.runtime.evaluator import EvalResult, Evaluations, evaluate
from distrl.runtime.preflight import validate
from distrl.runtime.reporter import DORMANT_LOG_INTERVALS, Reporter, announce, flatten
from distrl.runtime.rundir import default_run_dir
from distrl.runtime.supervisor import (
    ActorFailure,
    LearnerFailure,
    RankLost,
    Stalled,
    TrainingError,
    Watchdog,
    Workers,
    handling_signals,
)
from distrl.sampling import logs
from distrl.sampling.actor import actor_contexts
from distrl.sampling.slots import Channels, Slots
from distrl.utils import checkpoint
from distrl.utils.runlock import RunLock
from distrl.utils.telemetry import NullTelemetry, Telemetry, WandbSink

__all__ = ["ActorFailure", "Trainer", "LearnerFailure", "RankLost", "Stalled", "TrainingError"]

log = logging.getLogger(__name__)

TICK_SECONDS = 0.25

# Set while a trainer of this process stops (from the first line of its shutdown to the next run):
# a sweep job's interrupt watcher (distrl.cli.sweeps) stops signalling then.
SHUTTING_DOWN = threading.Event()


class Trainer:
    """Actor-learner training of one run (the agent's loss is ``cfg.agent``'s, :mod:`distrl.learning.losses`).

    Hsuanwu's ``Trainer(cfgs, train_env, test_env)`` is
    :class:`distrl.compat.hsuanwu.Trainer`, which builds this.

    Args:
        cfg: a train config (:func:`distrl.compose_config`, or Hydra's ``compose("train")`` after
            ``hydra.initialize_config_module("distrl.conf")``).
        run_dir: the run directory (checkpoints, TensorBoard, metrics.jsonl, train.log); None: the
            running Hydra app's output directory, else ``outputs/<date>/<time>[_tag]``.
        progress: show the console progress bar; None: when stderr is a terminal (elsewhere,
            e.g. in a log file, the periodic log lines stand in for it).
        ranks: this process's rank among several (:func:`distrl.learning.distributed.from_environment`);
            None: one rank. Rank 0 alone saves, evaluates and writes metrics.
        validated: what :func:`distrl.config.validation.validate` returned for ``cfg`` (the command
            validates first); None: ``cfg`` is validated here.
        eval_env: the ``env`` node evaluations use; None: ``cfg.env``.
        learner_class: builds the learner, with :class:`distrl.learning.learner.Learner`'s arguments
            (the seeds' adapter, :mod:`distrl.compat.rllte`, gives a subclass with a user's ``update``
            and ``loss``).

    With ``cfg.resume`` (``auto``: ``run_dir/checkpoints/latest.pt`` if there is one) the run
    continues from that checkpoint: weights, optimizer, the update count (hence the schedule) and
    RNG; ``train.num_train_steps`` stays the total, not an addition.

    Raises:
        ConfigError: a bad config value, or an environment that cannot be created.
        distrl.utils.checkpoint.CheckpointError: the checkpoint to resume from is unusable or does not fit.
    """

    def __init__(self, cfg: DictConfig, run_dir: str | os.PathLike | None = None, progress: bool | None = None,
                 ranks: Ranks | None = None, validated: Validated | None = None, eval_env: DictConfig | None = None,
                 learner_class: Callable[..., Learner] = Learner):
        self.placement, self.spec = validated or validate(cfg)
        self.cfg = cfg
        self.eval_env = cfg.env if eval_env is None else eval_env
        self.ranks = ranks or Ranks()
        self.run_dir = Path(run_dir) if run_dir is not None else default_run_dir(cfg.tag)
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.device = self.placement.device

        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed)
        random.seed(cfg.seed)
        self.policy = ActorLearner(self.spec.obs_shape, self.spec.action_space, cfg.model,
                                              intrinsic_value=needs_value_head(cfg.intrinsic),
                                              return_norm=bool(cfg.agent.get("normalize_returns", False)))
        self.intrinsic = intrinsic_for_run(cfg, self.spec, self.placement.stepping)
        if cfg.train.init_model_path:
            path = str(checkpoint.checkpoint_file(cfg.train.init_model_path))
            load_initial_weights(self.policy, self.intrinsic, cfg, path)
        self.policy.to(self.device)
        self.policy.share_actor(actor_precision=self.placement.actor_precision)
        if self.intrinsic is not None:
            self.intrinsic.to(self.device)
        self.schedule = Schedule.for_run(cfg, self.ranks.world_size, self.spec.frameskip)
        self.optimizer = make_optimizer(self.policy, cfg.agent)
        self.learner = learner_class(self.policy, self.optimizer, self.schedule, cfg.agent, self.device,
                               compile=cfg.train.th_compile, ranks=self.ranks, intrinsic=self.intrinsic,
                               pretraining=cfg.train.pretraining, precision=self.placement.precision,
                               compile_mode=cfg.train.compile_mode)
        self.stats = LearnerStats()
        self.checkpointer = Checkpointer(self.policy, self.optimizer, self.intrinsic, self.learner, cfg, self.spec,
                                         self.placement, self.ranks, self.run_dir)
        self.save_requested = threading.Event()
        # one live run per run directory (rank 0 holds it for a group of ranks); before any checkpoint is read
        self.run_lock = RunLock(self.run_dir)
        if self.ranks.is_main:
            self.run_lock.acquire()
        try:
            self.resumed_from = checkpoint.find_resume_checkpoint(cfg.resume, self.run_dir)
            if self.resumed_from:
                self.checkpointer.resume(self.resumed_from, self.schedule.updates_at)
        except BaseException:
            self.run_lock.release()
            raise
        if self.ranks.enabled:  # every rank starts from rank 0's weights
            self.ranks.broadcast_parameters(self.policy.learner)
            self.policy.publish()

    @property
    def num_slots(self) -> int:
        return self.placement.num_storages

    @property
    def position(self) -> Position:
        """Where the run is now (from the learner's update count)."""
        return self.learner.position

    @property
    def counters(self) -> dict[str, Any]:
        """The run's counters now: ``agent_steps``, ``updates``, ``last_eval_step``,
        ``last_save_step``, ``best_eval_return``."""
        position = self.position
        return {"agent_steps": position.agent_steps, "updates": position.updates,
                **self.checkpointer.run_state().as_dict()}

    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write a checkpoint of the run now: :meth:`distrl.runtime.checkpointer.Checkpointer.save`."""
        return self.checkpointer.save(path)

    def request_save(self) -> None:
        """Ask the running :meth:`train` for a checkpoint at its next tick (safe from a signal handler:
        ``distrl train`` calls it on SIGUSR1)."""
        self.save_requested.set()

    def test(self, num_episodes: int = 10, deterministic: bool = False, seed: int | None = None) -> EvalResult:
        """Play ``num_episodes`` evaluation episodes with the current weights, on envs of their own.

        Returns:
            The returns (raw game score) and lengths (agent steps) of the episodes.
        """
        with self.learner.lock:
            model = copy.deepcopy(self.policy.learner).cpu()
        seed = eval_seed(self.cfg.seed, self.position.agent_steps) if seed is None else seed
        return evaluate(model, self.eval_env, num_episodes, seed, deterministic,
                        precision=self.placement.actor_precision)

    # ----------------------------------------------------------------- main entry
    def train(self) -> dict[str, Any]:
        """Run until ``train.num_train_steps`` agent steps are consumed, then save and evaluate.

        Returns:
            :attr:`counters`.

        Raises:
            KeyboardInterrupt: after a clean shutdown and a checkpoint, on Ctrl-C (or SIGTERM
                from the command line).
            TrainingError: actors died more often than ``train.max_actor_restarts`` allows
                (:class:`ActorFailure`), no agent step was consumed for ``train.stall_timeout``
                seconds (:class:`Stalled`), another rank was lost (:class:`RankLost`), a learner
                raised (:class:`LearnerFailure`), or the final checkpoint could not be written (the
                message says why). Workers are stopped first, and a checkpoint saved except after a
                learner failure.
        """
        if self.ranks.is_main:
            self.run_lock.acquire()  # held since __init__, unless an earlier train() gave it up
        try:
            return self._train()
        finally:
            self.run_lock.release()

    def _train(self) -> dict[str, Any]:
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with logs.run_logging(self.run_dir, cfg.log_level):
            OmegaConf.save(cfg, self.run_dir / "config.yaml", resolve=True)
            if self.position.agent_steps >= cfg.train.num_train_steps:
                log.info("nothing to do: the run is at %d of %d agent steps", self.position.agent_steps,
                         cfg.train.num_train_steps)
                return self.counters
            threads_before = torch.get_num_threads()
            torch.set_num_threads(self.placement.learner_threads)
            try:
                with logs.above_the_bar(self.progress):
                    self._run()
            finally:
                torch.set_num_threads(threads_before)
        return self.counters

    def _run(self) -> None:
        cfg, p, train = self.cfg, self.placement, self.cfg.train
        SHUTTING_DOWN.clear()
        self.ranks.clear_stop()
        announce(cfg, p, self.spec, self.policy, self.ranks, self.run_dir)
        mp_context = mp.get_context("spawn")
        slots = Slots(RolloutLayout.for_run(cfg, self.spec), self.num_slots, mp_context)
        log.debug("slots: %d, %.1f MiB shared memory", self.num_slots, slots.nbytes() / 2**20)
        hparams = flatten(OmegaConf.to_container(cfg, resolve=True))
        hparams["distributed.world_size"] = self.ranks.world_size
        self.telemetry = Telemetry(
            self.run_dir, train.num_train_steps, self.position.agent_steps, self.spec.frameskip,
            hparams=hparams, progress=self.progress, wandb=WandbSink.start(self.run_dir, cfg),
        ) if self.ranks.is_main else NullTelemetry()
        channels = Channels.create(slots, mp_context, p.num_actors, self.position.policy_version)
        self.actor_logs = logs.ActorLogWriter(channels.log_queue, self.run_dir / "actors.log")
        self.actor_logs.start()
        first_actor = self.ranks.rank * p.num_actors
        self.workers = Workers(
            mp_context, slots, channels, self.learner, self.stats, max_restarts=train.max_actor_restarts,
            restart_window=train.actor_restart_window,
            reseed=lambda actor_id, restart: env_seed(cfg.seed, first_actor + actor_id, p.envs_per_actor, restart,
                                                      p.num_actors * self.ranks.world_size))
        self.reporter = Reporter(self.telemetry, channels, self.ranks, self.learner, self.stats, self.workers,
                                 self.policy, self.spec.frameskip)
        self.evaluations = Evaluations(self.policy.learner, self.eval_env, train.num_eval_episodes, cfg.seed,
                                       p.actor_precision, bool(train.get("eval_deterministic", False)))
        outcome = "failed"
        try:
            contexts = actor_contexts(cfg, p, self.policy.actor, slots, channels, first_actor=first_actor,
                                      bonus=self.intrinsic.actor_bonus if self.intrinsic is not None else None)
            self.workers.start(contexts, cfg.num_learners, cfg.batch_size, train.max_nonfinite_updates,
                               cfg.distributed.check_interval, train.prefetch)
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
        logs_due = Every(train.log_interval, self.position.agent_steps)
        dormant_due = Every(DORMANT_LOG_INTERVALS * train.log_interval, self.position.agent_steps)
        last_log = (time.perf_counter(), self.position.agent_steps, reporter.learner_time())
        meter = Throughput(self.position.agent_steps)
        watchdog = Watchdog(self.workers, train.stall_timeout, self.position.agent_steps)
        while True:
            self.workers.wait(TICK_SECONDS)
            self.workers.check()
            steps = self.position.agent_steps
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
        final weights and save again); a second Ctrl-C or SIGTERM meanwhile is logged, nothing else."""
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
            if free != list(range(self.num_slots)):  # each slot index exactly once: none lost, none twice
                log.warning("rollout slots at shutdown: %d of %d indices returned (%d distinct): a slot was lost "
                            "or handed out twice", len(free), self.num_slots, len(set(free)))
            self.actor_logs.stop()
            # the other ranks' episodes of the learners' last exchange
            self.reporter.log_episodes(list(self.ranks.incoming), self.position.agent_steps, deque())
            self.ranks.incoming.clear()
            try:
                if outcome != "failed":  # after a learner error the optimizer state may be half-updated
                    failure = self.checkpointer.save_or_warn()
                if failure is None and outcome == "done" and self.cfg.train.num_eval_episodes > 0 \
                        and self.ranks.is_main:
                    step, snapshot = self.position.agent_steps, self.checkpointer.state()
                    self._evaluated(*self.evaluations.run(snapshot, step), step)
                    failure = self.checkpointer.save_or_warn()
            finally:
                self.telemetry.close()
                self.workers.close()
            position = self.position
            log.info("training %s at %d agent steps (%d frames), %d updates", outcome, position.agent_steps,
                     position.frames, position.updates)
        if failure is not None and outcome == "done":
            raise TrainingError(f"the final checkpoint could not be written in {self.run_dir / 'checkpoints'}: "
                                f"{failure}")


def _already_stopping(signum, frame) -> None:
    """Signal handler during shutdown: a second Ctrl-C or SIGTERM is logged, nothing else."""
    log.warning("%s: already stopping; the checkpoint is being written", signal.Signals(signum).name)

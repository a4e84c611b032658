"""``DistributedTrainer``: builds a run, runs its schedule (log, evaluate, save) while the workers
train, and shuts it down.

The trainer process holds the learner threads, the schedule loop and, while one runs, an
evaluation thread (:class:`distrl.engine.evaluator.Evaluations`); actor processes are started and
watched by :mod:`distrl.engine.supervisor`. Where the run is follows from the learner's update
count alone (:class:`distrl.engine.schedule.Schedule`).
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
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp
from omegaconf import DictConfig, OmegaConf

import distrl
from distrl import checkpoint, logs
from distrl.checkpoint import RunState
from distrl.distributed import Ranks
from distrl.engine.actor import actor_contexts
from distrl.engine.evaluator import EvalResult, Evaluations, evaluate
from distrl.engine.learner import Learner, LearnerStats, make_optimizer
from distrl.engine.schedule import Every, Position, Schedule, Throughput
from distrl.engine.shared import Channels
from distrl.engine.storage import RolloutLayout, RolloutStorage, drain
from distrl.engine.supervisor import (
    ActorFailure,
    LearnerFailure,
    RankLost,
    Stalled,
    TrainingError,
    Workers,
    handling_signals,
)
from distrl.envs import env_seed, eval_seed
from distrl.intrinsic import make_intrinsic, needs_value_head
from distrl.nn.dormant import dormant_fractions
from distrl.policy import DistributedActorLearner
from distrl.runlock import RunLock
from distrl.telemetry import NullTelemetry, Telemetry, WandbSink
from distrl.validation import Validated, validate

__all__ = ["ActorFailure", "DistributedTrainer", "LearnerFailure", "RankLost", "Stalled", "TrainingError"]

log = logging.getLogger(__name__)

TICK_SECONDS = 0.25
DORMANT_LOG_INTERVALS = 5  # the dormant units are measured with every 5th log record
DORMANT_OBSERVATIONS = 256  # on this many observations of the last batch: 0.14 s on one busy core (Nature CNN)


class DistributedTrainer:
    """IMPALA training of one run.

    Two shapes: distrl's ``DistributedTrainer(cfg, run_dir)`` and Hsuanwu's
    ``DistributedTrainer(cfgs, train_env, test_env=None)``: an argument in ``run_dir``'s place that is
    not a path is the training env, one in ``progress``'s place that is not a bool the test env.

    Args:
        cfg: a train config (:func:`distrl.compose_config`, or Hydra's ``compose("train")`` after
            ``hydra.initialize_config_module("distrl.conf")``).
        run_dir: the run directory (checkpoints, TensorBoard, metrics.jsonl, train.log); None: the
            running Hydra app's output directory, else ``outputs/<date>/<time>[_tag]``.
        progress: show the console progress bar; None: when stderr is a terminal (elsewhere,
            e.g. in a log file, the periodic log lines stand in for it).
        train_env, test_env: envs as Python objects (:mod:`distrl.envs.objects`: a Gymnasium id, a
            ``gymnasium.make`` env or vector env, or a picklable env factory) that replace
            ``cfg.env`` for training and for evaluation; None: ``cfg.env``.
        ranks: this process's rank among several (:func:`distrl.distributed.from_environment`);
            None: one rank. Rank 0 alone saves, evaluates and writes metrics.
        validated: what :func:`distrl.validation.validate` returned for ``cfg`` (the command
            validates first); None: ``cfg`` is validated here.

    With ``cfg.resume`` (``auto``: ``run_dir/checkpoints/latest.pt`` if there is one) the run
    continues from that checkpoint: weights, optimizer, the update count (hence the schedule) and
    RNG; ``train.num_train_steps`` stays the total, not an addition.

    Raises:
        ConfigError: a bad config value, or an environment that cannot be created.
        checkpoint.CheckpointError: the checkpoint to resume from is unusable or does not fit.
    """

    def __init__(self, cfg: DictConfig, run_dir: Any = None, progress: Any = None,
                 ranks: Ranks | None = None, validated: Validated | None = None, *, train_env: Any = None,
                 test_env: Any = None, eval_env: DictConfig | None = None):
        if run_dir is not None and not isinstance(run_dir, (str, os.PathLike)):  # Hsuanwu's (cfgs, train_env, ...)
            train_env, run_dir = run_dir, None
        if progress is not None and not isinstance(progress, bool):  # Hsuanwu's test_env
            test_env, progress = progress, None
        if train_env is not None or test_env is not None:
            cfg, eval_env = _with_env_objects(cfg, train_env, test_env)
            validated = None
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
        self.policy = DistributedActorLearner.from_config(self.spec.obs_shape, self.spec.num_actions, cfg.model,
                                                          intrinsic_value=needs_value_head(cfg.intrinsic))
        self.intrinsic = make_intrinsic(self.spec.obs_shape, cfg.intrinsic, newest_frame_only=cfg.env.kind == "atari",
                                        discount=cfg.agent.discount)
        if cfg.train.init_model_path:
            self._initial_weights(str(checkpoint.checkpoint_file(cfg.train.init_model_path)))
        self.policy.to(self.device)
        self.policy.freeze(actor_precision=self.placement.actor_precision)
        if self.intrinsic is not None:
            self.intrinsic.to(self.device)
        self.schedule = Schedule.for_run(cfg, self.ranks.world_size, self.spec.frameskip)
        self.optimizer = make_optimizer(self.policy, cfg.agent)
        self.learner = Learner(self.policy, self.optimizer, self.schedule, cfg.agent, self.device,
                               compile=cfg.train.th_compile, ranks=self.ranks, intrinsic=self.intrinsic,
                               pretraining=cfg.train.pretraining, precision=self.placement.precision)
        self.stats = LearnerStats()
        self.evals = Every(cfg.train.eval_interval)
        self.saves = Every(cfg.train.save_interval)
        self.best_eval_return = -float("inf")
        self.free_indices: list[int] = []
        self.save_requested = threading.Event()
        # one live run per run directory (rank 0 holds it for a group of ranks); before any checkpoint is read
        self.run_lock = RunLock(self.run_dir)
        if self.ranks.is_main:
            self.run_lock.acquire()
        try:
            self.resumed_from = checkpoint.find_resume_checkpoint(cfg.resume, self.run_dir)
            if self.resumed_from:
                self._resume(checkpoint.load_checkpoint(self.resumed_from))
        except BaseException:
            self.run_lock.release()
            raise
        if self.ranks.enabled:  # every rank starts from rank 0's weights
            self.ranks.broadcast_parameters(self.policy.learner)
            self.policy.publish()

    @property
    def num_storages(self) -> int:
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
        return {"agent_steps": position.agent_steps, "updates": position.updates, **self._run_state().as_dict()}

    def _run_state(self) -> RunState:
        return RunState(self.evals.last, self.saves.last, self.best_eval_return)

    def _initial_weights(self, path: str) -> None:
        """``train.init_model_path`` (a file, or a run directory's latest checkpoint): the policy's
        weights and, when the file holds a module of this run's ``intrinsic.name`` (a pretraining
        run's checkpoint), the intrinsic module's state. The optimizer and the counters start fresh."""
        self.policy.load(path)
        log.info("initial weights from %s", path)
        if self.intrinsic is None:
            return
        try:
            saved = checkpoint.load_checkpoint(path)
        except checkpoint.CheckpointError:  # a bare state_dict: no module in it
            return
        if "intrinsic" in saved and saved["config"].get("intrinsic", {}).get("name") == self.cfg.intrinsic.name:
            self.intrinsic.load_checkpoint_state(saved["intrinsic"])
            log.info("intrinsic module (%s) from %s", self.cfg.intrinsic.name, path)

    def _resume(self, saved: dict[str, Any]) -> None:
        mismatch = checkpoint.incompatibility(saved, self.cfg, self.spec.obs_shape, self.spec.num_actions)
        if mismatch:
            raise checkpoint.CheckpointError(f"cannot resume from {self.resumed_from}: {mismatch}")
        self.policy.learner.load_state_dict(saved["model"])
        self.policy.publish()
        self.optimizer.load_state_dict(saved["optimizer"])
        if self.intrinsic is not None:
            self.intrinsic.load_checkpoint_state(saved["intrinsic"])
        # Agent steps are global and the checkpoint may come from another number of ranks (or T x B):
        # the update count is the one that consumes its agent steps here.
        self.learner.updates = self.schedule.updates_at(saved["agent_steps"])
        run = RunState.from_checkpoint(saved)
        self.evals.ran(run.last_eval_step)
        self.saves.ran(run.last_save_step)
        self.best_eval_return = run.best_eval_return
        checkpoint.set_rng_state(saved["rng"])
        log.info("resumed at %d agent steps, %d updates, from %s", self.position.agent_steps,
                 self.learner.updates, self.resumed_from)

    # ----------------------------------------------------------------- checkpoints
    def checkpoint_state(self) -> dict[str, Any]:
        """A consistent snapshot of the run (see :mod:`distrl.checkpoint`), tensors on the CPU:
        weights, optimizer and counters of one moment (between two updates)."""
        with self.learner.lock:
            model_state = {k: v.detach().cpu().clone() for k, v in self.policy.learner.state_dict().items()}
            optimizer_state = _to_cpu(copy.deepcopy(self.optimizer.state_dict()))
            intrinsic = _to_cpu(copy.deepcopy(self.intrinsic.checkpoint_state())) if self.intrinsic else None
            position = self.position
        return {
            "distrl_version": distrl.__version__,
            "model": model_state,
            "optimizer": optimizer_state,
            "agent_steps": position.agent_steps,
            "updates": position.updates,
            **self._run_state().as_dict(),
            "frames": position.frames,
            "config": OmegaConf.to_container(self.cfg, resolve=True),
            "rng": checkpoint.rng_state(),
            "obs_shape": list(self.spec.obs_shape),
            "num_actions": self.spec.num_actions,
            "pretraining": bool(self.cfg.train.pretraining),
            "precision": self.placement.precision,
            **({"intrinsic": intrinsic} if intrinsic is not None else {}),
        }

    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write a checkpoint of the run now (atomically: a kill leaves the previous file intact).

        Args:
            path: a file to write; None: ``run_dir/checkpoints/step_<agent steps>.pt``, also
                linked as ``latest.pt``, keeping the newest ``train.keep_checkpoints``.

        Returns:
            The path written.

        Raises:
            checkpoint.CheckpointSaveError: the file could not be written (the previous one is intact).
        """
        if path is not None:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            checkpoint.save_file(self.checkpoint_state(), path)
            return path
        self.saves.ran(self.position.agent_steps)
        path = checkpoint.save_checkpoint(self.checkpoint_state(), self.run_dir / "checkpoints",
                                          keep=self.cfg.train.keep_checkpoints)
        log.info("checkpoint %s", path)
        return path

    def request_save(self) -> None:
        """Ask the running :meth:`train` for a checkpoint at its next tick (safe from a signal handler:
        ``distrl train`` calls it on SIGUSR1)."""
        self.save_requested.set()

    def _save_or_warn(self) -> str | None:
        """:meth:`save` on rank 0; a failed write (a full disk) is logged in one line and training
        goes on, retrying at the next interval. Returns why it failed, or None (also on other ranks)."""
        if not self.ranks.is_main:
            return None
        try:
            self.save()
            return None
        except checkpoint.CheckpointSaveError as exc:
            log.error("checkpoint not saved, training goes on (the previous one is intact): %s", exc)
            return str(exc)

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

    def _announce(self) -> None:
        cfg, p = self.cfg, self.placement
        log.info("run directory %s", self.run_dir.resolve())
        log.info("%s: observations %s, %d actions | %d actor(s) x %d envs, T=%d, B=%d | learner on %s, "
                 "%d thread(s) | %s", cfg.env.id, self.spec.obs_shape, self.spec.num_actions, p.num_actors,
                 p.envs_per_actor, cfg.num_steps, cfg.batch_size, self.device, p.learner_threads,
                 self.policy.describe())
        log.info("precision: learner %s (%s), actors %s", p.precision, p.precision_reason, p.actor_precision)
        log.debug("%s", self.policy.learner)
        if self.ranks.enabled:
            log.info("rank %d of %d (local %d of %d, cores %s): gradients averaged over the ranks, effective "
                     "batch B x ranks = %d", self.ranks.rank, self.ranks.world_size, self.ranks.local_rank,
                     self.ranks.local_world_size, sorted(os.sched_getaffinity(0)),
                     cfg.batch_size * self.ranks.world_size)
        log.info("training to %d agent steps (%d frames); Ctrl-C stops and saves a checkpoint",
                 cfg.train.num_train_steps, cfg.train.num_train_steps * self.spec.frameskip)

    def _run(self) -> None:
        cfg, p, train = self.cfg, self.placement, self.cfg.train
        SHUTTING_DOWN.clear()
        self.ranks.clear_stop()
        self._announce()
        mp_context = mp.get_context("spawn")
        storage = RolloutStorage(RolloutLayout.for_run(cfg, self.spec), self.num_storages, mp_context)
        log.debug("storages: %d slots, %.1f MiB shared memory", self.num_storages, storage.nbytes() / 2**20)
        hparams = _flatten(OmegaConf.to_container(cfg, resolve=True))
        hparams["distributed.world_size"] = self.ranks.world_size
        self.telemetry = Telemetry(
            self.run_dir, train.num_train_steps, self.position.agent_steps, self.spec.frameskip,
            hparams=hparams, progress=self.progress, wandb=WandbSink.start(self.run_dir, cfg),
        ) if self.ranks.is_main else NullTelemetry()
        self.channels = Channels.create(storage, mp_context, p.num_actors, self.position.policy_version)
        self.actor_logs = logs.ActorLogWriter(self.channels.log_queue, self.run_dir / "actors.log")
        self.actor_logs.start()
        first_actor = self.ranks.rank * p.num_actors
        self.workers = Workers(
            mp_context, storage, self.channels, self.learner, self.stats, max_restarts=train.max_actor_restarts,
            restart_window=train.actor_restart_window,
            reseed=lambda actor_id, restart: env_seed(cfg.seed, first_actor + actor_id, p.envs_per_actor, restart,
                                                      p.num_actors * self.ranks.world_size))
        self.evaluations = Evaluations(self.policy.learner, self.eval_env, train.num_eval_episodes, cfg.seed,
                                       p.actor_precision)
        outcome = "failed"
        try:
            contexts = actor_contexts(cfg, p, self.policy.actor, storage, self.channels, first_actor=first_actor)
            self.workers.start(contexts, cfg.num_learners, cfg.batch_size, train.max_nonfinite_updates,
                               cfg.distributed.check_interval)
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
        train = self.cfg.train
        recent_returns: deque[float] = deque(maxlen=100)
        logs_due = Every(train.log_interval, self.position.agent_steps)
        dormant_due = Every(DORMANT_LOG_INTERVALS * train.log_interval, self.position.agent_steps)
        last_log = (time.perf_counter(), self.position.agent_steps, self._learner_time())
        meter = Throughput(self.position.agent_steps)
        progress_at = (time.monotonic(), self.position.agent_steps)
        while True:
            self.workers.wait(TICK_SECONDS)
            self.workers.check()
            steps = self.position.agent_steps
            progress_at = self._check_progress(progress_at, steps)
            self._log_episodes(self._finished_episodes(), steps, recent_returns)
            done = steps >= train.num_train_steps
            if logs_due.due(steps) or done:
                logs_due.ran(steps)
                dormant = dormant_due.due(steps) or done
                if dormant:
                    dormant_due.ran(steps)
                last_log = self._log_training(steps, last_log, recent_returns, dormant)
            self._evaluate_when_due(steps, done)
            if (self.saves.due(steps) or self.save_requested.is_set()) and not done:
                self.save_requested.clear()
                self._save_or_warn()
            self.telemetry.progress(steps, meter.add(steps), recent_returns[-1] if recent_returns else None)
            if done:
                break
            if self.ranks.group_stopped.is_set() and not self.ranks.stop_requested.is_set():
                log.warning("rank %s was stopped: this rank stops with it", self.ranks.stopped_by)
                raise KeyboardInterrupt
        finished = self.evaluations.finished(wait=True)
        if finished:
            self._log_eval(*finished)

    def _check_progress(self, progress_at: tuple[float, int], steps: int) -> tuple[float, int]:
        """The moment agent steps last moved; raise :class:`Stalled` after ``train.stall_timeout``
        seconds without."""
        if steps != progress_at[1]:
            return time.monotonic(), steps
        seconds = time.monotonic() - progress_at[0]
        if seconds <= self.cfg.train.stall_timeout:
            return progress_at
        log.error("no agent step consumed for %.0f s (train.stall_timeout=%g); where everything is:",
                  seconds, self.cfg.train.stall_timeout)
        for line in self.workers.report():
            log.error("  %s", line)
        raise Stalled(f"stalled: no agent step consumed for {seconds:.0f} s at {steps} agent "
                      f"steps (train.stall_timeout={self.cfg.train.stall_timeout:g}); train.log says where "
                      f"each actor and learner was")

    def _finished_episodes(self) -> list[tuple[float, int]]:
        """Episodes finished since the last tick, ``(raw return, length)``: this rank's actors' and, on
        rank 0, the other ranks' (which the learners' collectives bring, :mod:`distrl.distributed`)."""
        episodes = [(r, n) for _, r, n in drain(self.channels.episode_queue)]
        if not self.ranks.is_main:
            self.ranks.outgoing.extend(episodes)
            episodes = []
        while self.ranks.incoming:
            episodes.append(self.ranks.incoming.popleft())
        return episodes

    def _log_episodes(self, episodes: list[tuple[float, int]], steps: int, recent_returns: deque) -> None:
        """Log finished episodes ``(raw return, length in agent steps)`` at ``steps`` agent steps and
        append their returns to ``recent_returns`` (the progress line's window)."""
        for episode_return, episode_length in episodes:
            recent_returns.append(episode_return)
            self.telemetry.log({"charts/episodic_return": episode_return,
                                "charts/episodic_length": episode_length}, steps)

    def _learner_time(self) -> tuple[int, dict[str, float]]:
        """``(updates, LearnerStats.seconds)`` of one moment."""
        with self.learner.lock, self.stats.lock:
            return self.learner.updates, dict(self.stats.seconds)

    def _log_training(self, steps: int, last_log: tuple, recent_returns: deque, dormant: bool = False) -> tuple:
        """Log SPS (over the whole log interval since ``last_log``), the learner's losses and where its
        time went (ms per update), with ``dormant`` the share of dormant units of each encoder layer
        (``dormant/<layer>``, :func:`distrl.nn.dormant.dormant_fractions` on up to
        ``DORMANT_OBSERVATIONS`` observations of the learner's last batch, under its lock: the weights
        of one moment); returns this moment as the next ``last_log``."""
        timed = self._learner_time()  # may wait for an update to end: the clock is read after it, so that
        now = time.perf_counter()     # SPS's interval is the one between the log records' times
        (then, steps_then, (updates_then, seconds_then)), (updates, seconds) = last_log, timed
        sps = (steps - steps_then) / (now - then)
        scalars = {"charts/SPS": sps, "charts/FPS": sps * self.spec.frameskip,
                   "charts/policy_lag": self.stats.policy_lag, "charts/actor_restarts": self.workers.restarts,
                   "losses/nonfinite_updates": self.stats.nonfinite_updates}
        last = dict(self.stats.last)
        charts = ("learning_rate", "entropy_cost", "intrinsic_reward", "intrinsic_reward_raw", "intrinsic_coef")
        for name, value in last.items():  # an update override (distrl.api) may add metrics of its own
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                key = "losses/intrinsic" if name == "intrinsic_loss" else f"losses/{name}"
                scalars["charts/" + name if name in charts else key] = value
        if dormant:
            scalars.update(self._dormant_scalars())
        if updates > updates_then:
            scalars.update({f"perf/learner_{name}_ms": 1000 * (seconds[name] - seconds_then[name])
                            / (updates - updates_then) for name in seconds})
        else:  # no update since: the next log line measures from the same moment
            timed = (updates_then, seconds_then)
        self.telemetry.log(scalars, steps)
        mean_return = f"{np.mean(recent_returns):.2f}" if recent_returns else "n/a"
        log.info("steps=%d frames=%d SPS=%.0f return(mean of last %d)=%s loss=%s lag=%.1f", steps,
                 steps * self.spec.frameskip, sps, len(recent_returns), mean_return,
                 f"{last['total']:.3f}" if "total" in last else "n/a", self.stats.policy_lag)
        return now, steps, timed

    def _dormant_scalars(self) -> dict[str, float]:
        with self.learner.lock:
            obs = self.learner.last_obs
            if obs is None:
                return {}
            obs = obs[:-1].flatten(0, 1)  # the T x B observations of the loss
            obs = obs[::max(1, len(obs) // DORMANT_OBSERVATIONS)][:DORMANT_OBSERVATIONS]
            fractions = dormant_fractions(self.policy.learner.encoder, obs)
        return {f"dormant/{name}": value for name, value in fractions.items()}

    def _evaluate_when_due(self, steps: int, done: bool) -> None:
        """Log an evaluation that finished; start the next one when it is due (rank 0, one at a time)."""
        finished = self.evaluations.finished()
        if finished:
            self._log_eval(*finished)
        if (not self.evaluations.busy and self.cfg.train.num_eval_episodes > 0 and self.evals.due(steps)
                and not done and self.ranks.is_main):
            self.evals.ran(steps)
            self.evaluations.start(self.checkpoint_state(), steps)

    def _log_eval(self, result: EvalResult, snapshot: dict, step: int) -> None:
        """Log an evaluation of ``snapshot``'s weights (taken at ``step``); a new best is saved as best.pt."""
        if not result.returns:
            return
        self.telemetry.log({"eval/mean_return": result.mean_return, "eval/std_return": result.std_return}, step)
        log.info("eval at %d steps: return %.2f +- %.2f over %d episodes", step, result.mean_return,
                 result.std_return, len(result.returns))
        if result.mean_return > self.best_eval_return:
            self.best_eval_return = result.mean_return
            # best.pt is the snapshot the evaluation started from: weights, optimizer, counters and
            # RNG of one moment, with the return it scored.
            try:
                checkpoint.save_best({**snapshot, "best_eval_return": result.mean_return},
                                     self.run_dir / "checkpoints")
            except checkpoint.CheckpointSaveError as exc:
                log.error("best.pt not saved, training goes on: %s", exc)

    # ----------------------------------------------------------------- shutdown
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
            self.free_indices = self.workers.stop(learners_finish=finish)
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

    def _final_eval(self) -> None:
        """Evaluate the final weights (the checkpoint is already safe); the caller saves the result."""
        step = self.position.agent_steps
        self.evals.ran(step)
        snapshot = self.checkpoint_state()
        self._log_eval(*self.evaluations.run(snapshot, step), step)


def _with_env_objects(cfg: DictConfig, train_env: Any, test_env: Any) -> tuple[DictConfig, DictConfig | None]:
    """``cfg`` with its ``env`` node (and, for a vector env, ``envs_per_actor``) made for ``train_env``
    (if given), and the ``env`` node of ``test_env`` for evaluation (None: the training env). Only
    the env changes: the model and agent values stay ``cfg``'s (validation says if the model does
    not fit the env)."""
    from distrl.api import env_node

    cfg = copy.deepcopy(cfg)
    if train_env is not None:
        node, num_envs = env_node(train_env, "train_env")
        OmegaConf.set_struct(cfg, False)
        cfg.env = node
        if num_envs is not None:
            cfg.envs_per_actor = num_envs
        OmegaConf.set_struct(cfg, True)
    return cfg, None if test_env is None else env_node(test_env, "test_env")[0]


def default_run_dir(tag: str = "") -> Path:
    """The running Hydra app's output directory, else ``outputs/<date>/<time>[_tag]`` (as
    ``distrl train`` names one)."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path("outputs") / (time.strftime("%Y-%m-%d/%H-%M-%S") + (f"_{tag}" if tag else ""))


# Set while a trainer of this process stops (from the first line of its shutdown to the next run):
# a sweep job's interrupt watcher (distrl.sweeps) stops signalling then.
SHUTTING_DOWN = threading.Event()


def _already_stopping(signum, frame) -> None:
    """Signal handler during shutdown: a second Ctrl-C or SIGTERM is logged, nothing else."""
    log.warning("%s: already stopping; the checkpoint is being written", signal.Signals(signum).name)


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat

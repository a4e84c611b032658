"""``DistributedTrainer``: builds a run, runs its schedule (log, evaluate, save) while the workers
train, and shuts it down.

The trainer process holds the learner threads, the schedule loop and, while one runs, an
evaluation thread; actor processes are started and watched by :mod:`distrl.engine.supervisor`.
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
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp
from omegaconf import DictConfig, OmegaConf
from tqdm.contrib.logging import logging_redirect_tqdm

import distrl
from distrl import checkpoint
from distrl.checkpoint import RunState
from distrl.config import env_creation_error, slots_memory_error, validate
from distrl.distributed import Ranks
from distrl.engine.actor import Channels, actor_contexts, env_seed
from distrl.engine.evaluator import EvalResult, eval_seed, evaluate
from distrl.engine.learner import Learner, LearnerStats, make_optimizer, make_scheduler
from distrl.engine.placement import plan
from distrl.engine.schedule import Every, Throughput
from distrl.engine.storage import RolloutLayout, RolloutStorage, drain
from distrl.engine.supervisor import ActorFailure, LearnerFailure, Stalled, TrainingError, Workers, handling_signals
from distrl.envs import env_spec
from distrl.policy import DistributedActorLearner
from distrl.telemetry import NullTelemetry, Telemetry

__all__ = ["ActorFailure", "DistributedTrainer", "LearnerFailure", "Stalled", "TrainingError"]

log = logging.getLogger(__name__)

TICK_SECONDS = 0.25


class DistributedTrainer:
    """IMPALA training of one run.

    Args:
        cfg: a train config (:func:`distrl.compose_config`); it is validated here too.
        run_dir: the run directory (checkpoints, TensorBoard, metrics.jsonl, train.log).
        progress: show the console progress bar; None: when stderr is a terminal (elsewhere,
            e.g. in a log file, the periodic log lines stand in for it).
        ranks: this process's rank among several (:func:`distrl.distributed.from_environment`);
            None: one rank. Rank 0 alone saves, evaluates and writes metrics.

    With ``cfg.resume`` (``auto``: ``run_dir/checkpoints/latest.pt`` if there is one) the run
    continues from that checkpoint: weights, optimizer, schedule, counters and RNG;
    ``train.num_train_steps`` stays the total, not an addition.

    Raises:
        ConfigError: a bad config value, or an environment that cannot be created.
        checkpoint.CheckpointError: the checkpoint to resume from is unusable or does not fit.
    """

    def __init__(self, cfg: DictConfig, run_dir: str | os.PathLike, progress: bool | None = None,
                 ranks: Ranks | None = None):
        validate(cfg)
        self.cfg = cfg
        self.ranks = ranks or Ranks()
        self.run_dir = Path(run_dir)
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.placement = plan(cfg)
        self.device = self.placement.device
        try:
            self.spec = env_spec(cfg.env)
        except Exception as exc:
            raise env_creation_error(cfg.env.id, exc) from exc

        error = slots_memory_error(RolloutLayout.for_run(cfg, self.spec).nbytes(self.num_storages),
                                   self.num_storages)
        if error:
            raise error

        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed)
        random.seed(cfg.seed)
        self.policy = DistributedActorLearner(self.spec.obs_shape, self.spec.num_actions, cfg.model)
        if cfg.train.init_model_path:
            self.policy.load(cfg.train.init_model_path)
            log.info("initial weights from %s", cfg.train.init_model_path)
        self.policy.to(self.device)
        self.policy.freeze()
        self.steps_per_update = cfg.num_steps * cfg.batch_size * self.ranks.world_size  # global agent steps
        self.optimizer = make_optimizer(self.policy, cfg.agent)
        self.scheduler = make_scheduler(self.optimizer, self.steps_per_update, cfg.train.num_train_steps,
                                        cfg.agent.lr_warmup_steps)
        self.learner = Learner(self.policy, self.optimizer, self.scheduler, cfg.agent, self.device,
                               compile=cfg.train.th_compile, ranks=self.ranks)
        self.stats = LearnerStats()
        self.evals = Every(cfg.train.eval_interval)
        self.saves = Every(cfg.train.save_interval)
        self.best_eval_return = -float("inf")
        self.free_indices: list[int] = []
        self.save_requested = threading.Event()
        self.resumed_from = checkpoint.find_resume_checkpoint(cfg.resume, self.run_dir)
        if self.resumed_from:
            self._resume(checkpoint.load_checkpoint(self.resumed_from))
        if self.ranks.enabled:  # every rank starts from rank 0's weights
            self.ranks.broadcast_parameters(self.policy.learner)
            self.policy.publish()

    @property
    def num_storages(self) -> int:
        return self.placement.num_storages

    @property
    def state(self) -> RunState:
        """The run's counters now."""
        return RunState(self.stats.agent_steps, self.stats.updates, self.evals.last, self.saves.last,
                        self.best_eval_return)

    @property
    def counters(self) -> dict[str, Any]:
        """:attr:`state` as a dict."""
        return self.state.as_dict()

    def _resume(self, saved: dict[str, Any]) -> None:
        mismatch = checkpoint.incompatibility(saved, self.cfg, self.spec.obs_shape, self.spec.num_actions)
        if mismatch:
            raise checkpoint.CheckpointError(f"cannot resume from {self.resumed_from}: {mismatch}")
        self.policy.learner.load_state_dict(saved["model"])
        self.policy.publish()
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        run = RunState.from_checkpoint(saved)
        self.stats.agent_steps, self.stats.updates = run.agent_steps, run.updates
        self.evals.ran(run.last_eval_step)
        self.saves.ran(run.last_save_step)
        self.best_eval_return = run.best_eval_return
        # The schedule's position is in agent steps of this run's total budget (a checkpoint of N
        # ranks made its updates of T x B x N agent steps; here each is T x B x world_size).
        position = run.agent_steps // self.steps_per_update
        self.scheduler.last_epoch = position
        for group, base_lr in zip(self.optimizer.param_groups, self.scheduler.base_lrs, strict=True):
            group["lr"] = base_lr * self.scheduler.lr_lambdas[0](position)
        checkpoint.set_rng_state(saved["rng"])
        log.info("resumed at %d agent steps, %d updates, from %s", run.agent_steps, run.updates, self.resumed_from)

    # ----------------------------------------------------------------- checkpoints
    def checkpoint_state(self) -> dict[str, Any]:
        """A consistent snapshot of the run (see :mod:`distrl.checkpoint`), tensors on the CPU:
        weights, optimizer, schedule and counters of one moment (between two updates)."""
        with self.learner.lock, self.stats.lock:
            model_state = {k: v.detach().cpu().clone() for k, v in self.policy.learner.state_dict().items()}
            optimizer_state = _to_cpu(copy.deepcopy(self.optimizer.state_dict()))
            scheduler_state = copy.deepcopy(self.scheduler.state_dict())
            run = self.state
        return {
            "distrl_version": distrl.__version__,
            "model": model_state,
            "optimizer": optimizer_state,
            "scheduler": scheduler_state,
            **run.as_dict(),
            "frames": run.agent_steps * self.spec.frameskip,
            "config": OmegaConf.to_container(self.cfg, resolve=True),
            "rng": checkpoint.rng_state(),
            "obs_shape": list(self.spec.obs_shape),
            "num_actions": self.spec.num_actions,
        }

    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write a checkpoint of the run now (atomically: a kill leaves the previous file intact).

        Args:
            path: a file to write; None: ``run_dir/checkpoints/step_<agent steps>.pt``, also
                linked as ``latest.pt``, keeping the newest ``train.keep_checkpoints``.

        Returns:
            The path written.
        """
        if path is not None:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            checkpoint.save_file(self.checkpoint_state(), path)
            return path
        self.saves.ran(self.stats.agent_steps)
        path = checkpoint.save_checkpoint(self.checkpoint_state(), self.run_dir / "checkpoints",
                                          keep=self.cfg.train.keep_checkpoints)
        log.info("checkpoint %s", path)
        return path

    def request_save(self) -> None:
        """Ask the running :meth:`train` for a checkpoint at its next tick (safe from a signal handler:
        ``distrl train`` calls it on SIGUSR1)."""
        self.save_requested.set()

    def _save_or_warn(self) -> bool:
        """:meth:`save` on rank 0; a failed write (a full disk) is logged in one line and training
        goes on, retrying at the next interval. Returns whether it saved (True on other ranks)."""
        if not self.ranks.is_main:
            return True
        try:
            self.save()
            return True
        except checkpoint.CheckpointSaveError as exc:
            log.error("checkpoint not saved, training goes on (the previous one is intact): %s", exc)
            return False

    def test(self, num_episodes: int = 10, deterministic: bool = False, seed: int | None = None) -> EvalResult:
        """Play ``num_episodes`` evaluation episodes with the current weights, on envs of their own.

        Returns:
            The returns (raw game score) and lengths (agent steps) of the episodes.
        """
        with self.learner.lock:
            model = copy.deepcopy(self.policy.learner).cpu()
        seed = eval_seed(self.cfg.seed, self.stats.agent_steps) if seed is None else seed
        return evaluate(model, self.cfg.env, num_episodes, seed, deterministic)

    # ----------------------------------------------------------------- main entry
    def train(self) -> dict[str, Any]:
        """Run until ``train.num_train_steps`` agent steps are consumed, then save and evaluate.

        Returns:
            The counters (:class:`distrl.checkpoint.RunState` as a dict).

        Raises:
            KeyboardInterrupt: after a clean shutdown and a checkpoint, on Ctrl-C (or SIGTERM
                from the command line).
            TrainingError: actors died more often than ``train.max_actor_restarts`` allows
                (:class:`ActorFailure`), no agent step was consumed for ``train.stall_timeout``
                seconds (:class:`Stalled`), a learner raised (:class:`LearnerFailure`), or the final
                checkpoint could not be written. Workers are stopped first, and a checkpoint saved
                except after a learner failure.
        """
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with _run_logging(self.run_dir, cfg.log_level):
            OmegaConf.save(cfg, self.run_dir / "config.yaml", resolve=True)
            if self.stats.agent_steps >= cfg.train.num_train_steps:
                log.info("nothing to do: the run is at %d of %d agent steps", self.stats.agent_steps,
                         cfg.train.num_train_steps)
                return self.counters
            threads_before = torch.get_num_threads()
            torch.set_num_threads(self.placement.learner_threads)
            try:
                with _log_above_the_bar(self.progress):
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
                 self.policy.summary())
        log.debug("%s", self.policy.learner)
        if self.ranks.enabled:
            log.info("rank %d of %d (local %d of %d, cores %s): gradients averaged over the ranks, effective "
                     "batch B x ranks = %d", self.ranks.rank, self.ranks.world_size, self.ranks.local_rank,
                     self.ranks.local_world_size, sorted(os.sched_getaffinity(0)),
                     cfg.batch_size * self.ranks.world_size)
        log.info("training to %d agent steps (%d frames); Ctrl-C stops and saves a checkpoint",
                 cfg.train.num_train_steps, cfg.train.num_train_steps * self.spec.frameskip)

    def _run(self) -> None:
        cfg = self.cfg
        self._announce()
        mp_context = mp.get_context("spawn")
        storage = RolloutStorage(RolloutLayout.for_run(cfg, self.spec), self.num_storages, mp_context)
        log.debug("storages: %d slots, %.1f MiB shared memory", self.num_storages, storage.nbytes() / 2**20)
        hparams = _flatten(OmegaConf.to_container(cfg, resolve=True))
        hparams["distributed.world_size"] = self.ranks.world_size
        self.telemetry = Telemetry(
            self.run_dir, cfg.train.num_train_steps, self.stats.agent_steps, self.spec.frameskip,
            hparams=hparams, progress=self.progress,
        ) if self.ranks.is_main else NullTelemetry()
        p, train = self.placement, cfg.train
        self.channels = Channels.create(storage, mp_context, p.num_actors, self.stats.updates)
        self.workers = Workers(
            mp_context, storage, self.channels, self.learner, self.stats, max_restarts=train.max_actor_restarts,
            restart_window=train.actor_restart_window,
            reseed=lambda actor_id, restart: env_seed(cfg.seed, self.ranks.rank * p.num_actors + actor_id,
                                                      p.envs_per_actor, restart, p.num_actors * self.ranks.world_size))
        self.eval_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="distrl-eval")
        self.eval_stop = False
        outcome = "failed"
        try:
            contexts = actor_contexts(cfg, self.placement, self.policy.actor, storage, self.channels,
                                      log_file=str(self.run_dir / "actors.log"),
                                      first_actor=self.ranks.rank * p.num_actors)
            self.workers.start(contexts, cfg.num_learners, cfg.batch_size, train.num_train_steps,
                               train.max_nonfinite_updates, cfg.distributed.check_interval)
            self._schedule()
            outcome = "done"
        except KeyboardInterrupt:
            outcome = "interrupted"
            log.warning("interrupted: stopping actors and learners")
            raise
        except ActorFailure:
            outcome = "stopped after actor failures"
            raise
        except Stalled:
            outcome = "stalled"
            raise
        finally:
            self._shutdown(outcome)

    # ----------------------------------------------------------------- schedule
    def _schedule(self) -> None:
        train = self.cfg.train
        recent_returns: deque[float] = deque(maxlen=100)
        logs = Every(train.log_interval, self.stats.agent_steps)
        last_log = (time.perf_counter(), self.stats.agent_steps)
        learner_time_at = self._learner_time()
        meter = Throughput(self.stats.agent_steps)
        eval_future: Future | None = None
        eval_step = 0
        progress_at = (time.monotonic(), self.stats.agent_steps)
        while True:
            self.workers.wait(TICK_SECONDS)
            self.workers.check()
            steps = self.stats.agent_steps
            if steps != progress_at[1]:
                progress_at = (time.monotonic(), steps)
            elif time.monotonic() - progress_at[0] > train.stall_timeout:
                self._stalled(time.monotonic() - progress_at[0])
            episodes = [(r, n) for _, r, n in drain(self.channels.episode_queue)]
            if not self.ranks.is_main:
                self.ranks.outgoing.extend(episodes)  # rank 0 logs them (distrl.distributed)
                episodes = []
            while self.ranks.incoming:
                episodes.append(self.ranks.incoming.popleft())
            self._log_episodes(episodes, steps, recent_returns)
            done = steps >= train.num_train_steps
            if logs.due(steps) or done:
                logs.ran(steps)
                now = time.perf_counter()
                sps = (steps - last_log[1]) / (now - last_log[0])  # over the whole log interval
                last_log = (now, steps)
                learner_ms, learner_time_at = self._learner_ms(learner_time_at)
                self._log_training(steps, sps, learner_ms, recent_returns)

            if eval_future is not None and eval_future.done():
                self._log_eval(eval_future.result(), eval_step)
                eval_future = None
            if (eval_future is None and train.num_eval_episodes > 0 and self.evals.due(steps) and not done
                    and self.ranks.is_main):
                self.evals.ran(steps)
                eval_step = steps
                eval_future = self._start_eval(steps)
            if (self.saves.due(steps) or self.save_requested.is_set()) and not done:
                self.save_requested.clear()
                self._save_or_warn()
            self.telemetry.progress(steps, meter.add(steps), recent_returns[-1] if recent_returns else None)
            if done:
                break
        if eval_future is not None:
            self._log_eval(eval_future.result(), eval_step)

    def _log_episodes(self, episodes: list[tuple[float, int]], steps: int, recent_returns: deque) -> None:
        """Log finished episodes ``(raw return, length in agent steps)`` at ``steps`` agent steps and
        append their returns to ``recent_returns`` (the progress line's window)."""
        for episode_return, episode_length in episodes:
            recent_returns.append(episode_return)
            self.telemetry.log({"charts/episodic_return": episode_return,
                                "charts/episodic_length": episode_length}, steps)

    def _stalled(self, seconds: float) -> None:
        log.error("no agent step consumed for %.0f s (train.stall_timeout=%g); where everything is:",
                  seconds, self.cfg.train.stall_timeout)
        for line in self.workers.report():
            log.error("  %s", line)
        raise Stalled(f"stalled: no agent step consumed for {seconds:.0f} s at {self.stats.agent_steps} agent "
                      f"steps (train.stall_timeout={self.cfg.train.stall_timeout:g}); train.log says where "
                      f"each actor and learner was")

    def _log_training(self, steps: int, sps: float, learner_ms: dict[str, float], recent_returns: deque) -> None:
        scalars = {"charts/SPS": sps, "charts/FPS": sps * self.spec.frameskip,
                   "charts/policy_lag": self.stats.policy_lag, "charts/actor_restarts": self.workers.restarts,
                   "losses/nonfinite_updates": self.stats.nonfinite_updates}
        last = dict(self.stats.last)
        if last:
            scalars["charts/learning_rate"] = last["learning_rate"]
            scalars["charts/entropy_cost"] = last["entropy_cost"]
            for name in ("total", "policy", "value", "entropy", "grad_norm"):
                scalars[f"losses/{name}"] = last[name]
        scalars.update({f"perf/learner_{name}_ms": ms for name, ms in learner_ms.items()})
        self.telemetry.log(scalars, steps)
        mean_return = f"{np.mean(recent_returns):.2f}" if recent_returns else "n/a"
        log.info("steps=%d frames=%d SPS=%.0f return(mean of last %d)=%s loss=%s lag=%.1f", steps,
                 steps * self.spec.frameskip, sps, len(recent_returns), mean_return,
                 f"{last['total']:.3f}" if last else "n/a", self.stats.policy_lag)

    def _learner_time(self) -> tuple[int, dict[str, float]]:
        """``(updates, LearnerStats.seconds)`` of this moment."""
        with self.stats.lock:
            return self.stats.updates, dict(self.stats.seconds)

    def _learner_ms(self, since: tuple[int, dict[str, float]]) -> tuple[dict[str, float], tuple]:
        """Milliseconds per update in each of ``LearnerStats.seconds``' parts since the moment
        ``since`` (from :meth:`_learner_time`; empty if no update ran since), and this moment."""
        (updates_before, before), (updates, now) = since, self._learner_time()
        if updates == updates_before:
            return {}, since
        return {name: 1000 * (now[name] - before[name]) / (updates - updates_before) for name in now}, (updates, now)

    def _start_eval(self, step: int) -> Future:
        return self.eval_pool.submit(self._evaluate, self.checkpoint_state(), step)

    def _evaluate(self, snapshot: dict, step: int) -> tuple[EvalResult, dict]:
        """Evaluate the weights of ``snapshot`` (a :meth:`checkpoint_state` taken at ``step``)."""
        model = copy.deepcopy(self.policy.learner).cpu()
        model.load_state_dict(snapshot["model"])
        result = evaluate(model, self.cfg.env, self.cfg.train.num_eval_episodes, eval_seed(self.cfg.seed, step),
                          stop=lambda: self.eval_stop)
        return result, snapshot

    def _log_eval(self, outcome: tuple[EvalResult, dict], step: int) -> None:
        result, snapshot = outcome
        if not result.returns:
            return
        self.telemetry.log({"eval/mean_return": result.mean_return, "eval/std_return": result.std_return}, step)
        log.info("eval at %d steps: return %.2f +- %.2f over %d episodes", step, result.mean_return,
                 result.std_return, len(result.returns))
        if result.mean_return > self.best_eval_return:
            self.best_eval_return = result.mean_return
            # best.pt is the snapshot the evaluation started from: weights, optimizer, schedule,
            # counters and RNG of one moment, with the return it scored.
            try:
                checkpoint.save_best({**snapshot, "best_eval_return": result.mean_return},
                                     self.run_dir / "checkpoints")
            except checkpoint.CheckpointSaveError as exc:
                log.error("best.pt not saved, training goes on: %s", exc)

    # ----------------------------------------------------------------- shutdown
    def _shutdown(self, outcome: str) -> None:
        saved = True
        # a second Ctrl-C or SIGTERM is logged and must not skip the checkpoint
        with handling_signals((signal.SIGINT, signal.SIGTERM), _already_stopping):
            self.eval_stop = True
            self.free_indices = self.workers.stop()
            # the other ranks' episodes of the learners' last exchange
            self._log_episodes(list(self.ranks.incoming), self.stats.agent_steps, deque())
            self.ranks.incoming.clear()
            self.eval_pool.shutdown(wait=True)
            try:
                if outcome != "failed":  # after a learner error the optimizer state may be half-updated
                    saved = self._save_or_warn()
                if saved and outcome == "done" and self.cfg.train.num_eval_episodes > 0 and self.ranks.is_main:
                    self._final_eval()
                    saved = self._save_or_warn()
            finally:
                self.telemetry.close()
                self.workers.close()
            log.info("training %s at %d agent steps (%d frames), %d updates", outcome, self.stats.agent_steps,
                     self.stats.agent_steps * self.spec.frameskip, self.stats.updates)
        if not saved and outcome == "done":
            raise TrainingError(f"the final checkpoint could not be written in {self.run_dir / 'checkpoints'} "
                                f"(train.log names the error)")

    def _final_eval(self) -> None:
        """Evaluate the final weights (the checkpoint is already safe); the caller saves the result."""
        self.eval_stop = False
        step = self.stats.agent_steps
        self.evals.ran(step)
        self._log_eval(self._evaluate(self.checkpoint_state(), step), step)


def _already_stopping(signum, frame) -> None:
    """Signal handler during shutdown: a second Ctrl-C or SIGTERM is logged, nothing else."""
    log.warning("%s: already stopping; the checkpoint is being written", signal.Signals(signum).name)


@contextmanager
def _run_logging(run_dir: Path, level: str):
    """Outside a Hydra command (the Python API), log like one: ``distrl`` messages at ``level`` to the
    console (when nothing else prints them) and to ``run_dir/train.log``."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        yield
        return
    logger = logging.getLogger("distrl")
    fmt = logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    handlers: list[logging.Handler] = [logging.FileHandler(run_dir / "train.log")]
    if not logging.getLogger().handlers:
        handlers.append(logging.StreamHandler())
    level_before = logger.level
    logger.setLevel(level)
    for handler in handlers:
        handler.setFormatter(fmt)
        logger.addHandler(handler)
    try:
        yield
    finally:
        for handler in handlers:
            logger.removeHandler(handler)
            handler.close()
        logger.setLevel(level_before)


def _log_above_the_bar(progress: bool):
    """While the progress bar shows, console log lines are printed above it (tqdm.write), not glued to it."""
    if not progress:
        return nullcontext()
    console = [lg for lg in (logging.getLogger(), logging.getLogger("distrl"))
               if any(type(h) is logging.StreamHandler and h.stream in (sys.stdout, sys.stderr) for h in lg.handlers)]
    return logging_redirect_tqdm(loggers=console) if console else nullcontext()


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

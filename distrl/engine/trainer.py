"""``DistributedTrainer``: builds everything, starts and supervises the processes,
runs the schedule (log, evaluate, save) and shuts down.

Processes come from an explicit ``spawn`` context (never the global start
method: a Hydra sweep runs several jobs in one process). The trainer process
holds the learner threads, the schedule loop and, while one runs, an
evaluation thread. Every wait polls a stop signal, so Ctrl-C, the end of the
budget or a dead actor always ends in the same orderly shutdown.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import queue
import random
import signal
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp
from omegaconf import DictConfig, OmegaConf

import distrl
from distrl import checkpoint
from distrl.config import (
    actor_cpu_affinity,
    actor_env_config,
    env_creation_error,
    resolve_device,
    resolve_learner_threads,
    resolve_num_actors,
    resolve_num_storages,
)
from distrl.engine.actor import ActorContext, run_actor
from distrl.engine.evaluator import EvalResult, evaluate
from distrl.engine.learner import Learner, LearnerStats, make_optimizer, make_scheduler, run_learner_thread
from distrl.engine.storage import RolloutStorage, drain, rollout_specs
from distrl.envs import env_spec
from distrl.policy import DistributedActorLearner
from distrl.telemetry import Telemetry

log = logging.getLogger(__name__)

TICK_SECONDS = 0.25
ACTOR_JOIN_SECONDS = 5.0


class TrainingError(RuntimeError):
    """Training stopped because a part of it failed; the message says which and why."""


class ActorFailure(TrainingError):
    """An actor process raised or died; the learner state is intact."""


class LearnerFailure(TrainingError):
    """A learner thread raised; its update may be half-applied."""


class DistributedTrainer:
    """IMPALA training of one run.

    Args:
        cfg: a validated train config (see :func:`distrl.config.validate`).
        run_dir: the run directory (checkpoints, TensorBoard, metrics.jsonl).
        progress: show the console progress bar.
        resume_state: a loaded checkpoint to continue from (weights, optimizer, scheduler,
            counters, RNG); ``train.num_train_steps`` stays the total, not an addition.

    Raises:
        checkpoint.CheckpointError: ``resume_state`` does not fit this config (names the mismatch).
        ConfigError: the environment cannot be created.

    Attributes after :meth:`train`: ``counters`` (agent_steps, updates, ...),
    ``free_indices`` (every slot index found free after shutdown, sorted).
    """

    def __init__(self, cfg: DictConfig, run_dir: str | os.PathLike, progress: bool = True,
                 resume_state: dict | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.progress = progress
        self.device = resolve_device(cfg.device)
        self.num_actors = resolve_num_actors(cfg)
        self.num_storages = resolve_num_storages(cfg)
        self.steps_per_update = cfg.num_steps * cfg.batch_size
        try:
            self.spec = env_spec(cfg.env)
        except Exception as exc:
            raise env_creation_error(cfg.env.id, exc) from exc
        self.ctx = mp.get_context("spawn")

        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed)
        random.seed(cfg.seed)
        self.policy = DistributedActorLearner(self.spec.obs_shape, self.spec.num_actions, cfg.model)
        if cfg.train.init_model_path:
            self.policy.load(cfg.train.init_model_path)
            log.info("initial weights from %s", cfg.train.init_model_path)
        self.policy.to(self.device)
        self.policy.freeze()
        self.optimizer = make_optimizer(self.policy, cfg.agent)
        self.scheduler = make_scheduler(self.optimizer, self.steps_per_update, cfg.train.num_train_steps)
        self.learner = Learner(self.policy, self.optimizer, self.scheduler, cfg.agent, self.device,
                               compile=cfg.train.th_compile)
        self.stats = LearnerStats()  # agent steps and updates, advanced by the learner threads
        self.marks: dict[str, Any] = {"last_eval_step": 0, "last_save_step": 0, "best_eval_return": -math.inf}
        self.free_indices: list[int] = []
        if resume_state is not None:
            self._resume(resume_state)

    def _resume(self, state: dict[str, Any]) -> None:
        mismatch = checkpoint.incompatibility(state, self.cfg, self.spec.obs_shape, self.spec.num_actions)
        if mismatch:
            raise checkpoint.CheckpointError(f"cannot resume: {mismatch}")
        self.policy.learner.load_state_dict(state["model"])
        self.policy.publish()
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.stats.agent_steps, self.stats.updates = state["agent_steps"], state["updates"]
        for key in self.marks:
            self.marks[key] = state[key]
        # The schedule's position is in agent steps of this run's total budget.
        for group, base_lr in zip(self.optimizer.param_groups, self.scheduler.base_lrs, strict=True):
            group["lr"] = base_lr * self.scheduler.lr_lambdas[0](self.stats.updates)
        checkpoint.set_rng_state(state["rng"])
        log.info("resumed at %d agent steps, %d updates", self.stats.agent_steps, self.stats.updates)

    @property
    def counters(self) -> dict[str, Any]:
        """``agent_steps``, ``updates``, ``last_eval_step``, ``last_save_step``, ``best_eval_return``."""
        return {"agent_steps": self.stats.agent_steps, "updates": self.stats.updates, **self.marks}

    # ----------------------------------------------------------------- checkpoints
    def checkpoint_state(self, model_state: dict | None = None) -> dict[str, Any]:
        """A consistent snapshot of the run (see :mod:`distrl.checkpoint`), tensors on the CPU."""
        with self.learner.lock:
            if model_state is None:
                model_state = {k: v.detach().cpu().clone() for k, v in self.policy.learner.state_dict().items()}
            optimizer_state = _to_cpu(copy.deepcopy(self.optimizer.state_dict()))
            scheduler_state = copy.deepcopy(self.scheduler.state_dict())
            counters = self.counters
        return {
            "distrl_version": distrl.__version__,
            "model": model_state,
            "optimizer": optimizer_state,
            "scheduler": scheduler_state,
            **counters,
            "frames": counters["agent_steps"] * self.spec.frameskip,
            "config": OmegaConf.to_container(self.cfg, resolve=True),
            "rng": checkpoint.rng_state(),
            "obs_shape": list(self.spec.obs_shape),
            "num_actions": self.spec.num_actions,
        }

    def save(self) -> Path:
        """Write a checkpoint at the current agent step (atomic, rotated)."""
        self.marks["last_save_step"] = self.stats.agent_steps
        path = checkpoint.save_checkpoint(self.checkpoint_state(), self.run_dir / "checkpoints",
                                          keep=self.cfg.train.keep_checkpoints)
        log.info("checkpoint %s", path)
        return path

    # ----------------------------------------------------------------- main entry
    def train(self) -> dict[str, Any]:
        """Run until ``train.num_train_steps`` agent steps are consumed.

        Returns:
            The counters (agent_steps, updates, best_eval_return, ...).

        Raises:
            KeyboardInterrupt: after a clean shutdown and a checkpoint, on Ctrl-C.
            TrainingError: an actor died or raised, or a learner raised; the others
                were stopped first (and, for an actor failure, a checkpoint saved).
        """
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, self.run_dir / "config.yaml", resolve=True)
        if self.stats.agent_steps >= cfg.train.num_train_steps:
            log.info("nothing to do: the run is at %d of %d agent steps", self.stats.agent_steps,
                     cfg.train.num_train_steps)
            return self.counters
        threads_before = torch.get_num_threads()
        learner_threads = resolve_learner_threads(cfg)
        torch.set_num_threads(learner_threads)
        log.info("%s", self.policy.describe())
        log.info(
            "env=%s obs=%s actions=%d | actors=%d x %d envs | T=%d B=%d | learners=%d on %s (%d threads)",
            cfg.env.id, self.spec.obs_shape, self.spec.num_actions, self.num_actors, cfg.envs_per_actor,
            cfg.num_steps, cfg.batch_size, cfg.num_learners, self.device, learner_threads,
        )

        specs = rollout_specs(
            cfg.num_steps, self.spec.obs_shape,
            torch.uint8 if self.spec.obs_dtype == np.uint8 else torch.float32,
            self.spec.num_actions, (1, cfg.model.feature_dim) if cfg.model.use_lstm else None,
        )
        self.storage = RolloutStorage(specs, self.num_storages, self.ctx)
        log.info("storages: %d slots, %.1f MiB shared memory", self.num_storages, self.storage.nbytes() / 2**20)
        self.telemetry = Telemetry(
            self.run_dir, cfg.train.num_train_steps, self.stats.agent_steps, self.spec.frameskip,
            hparams=_flatten(OmegaConf.to_container(cfg, resolve=True)), progress=self.progress,
        )
        self.stop_event = self.ctx.Event()
        self.episode_queue = self.ctx.Queue()
        self.error_queue = self.ctx.Queue()
        self.policy_version = self.ctx.Value("q", self.stats.updates)
        self.learner_stop = threading.Event()
        self.learner_errors: list[BaseException] = []
        self.actors: list = []
        self.learner_threads: list[threading.Thread] = []
        self.eval_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="distrl-eval")
        self.eval_stop = threading.Event()

        outcome = "failed"
        try:
            self._start()
            self._schedule()
            outcome = "done"
        except KeyboardInterrupt:
            outcome = "interrupted"
            log.warning("interrupted: stopping actors and learners")
            raise
        except ActorFailure:
            outcome = "stopped after an actor failure"
            raise
        finally:
            self._shutdown(outcome)
            torch.set_num_threads(threads_before)
        return self.counters

    # ----------------------------------------------------------------- processes
    def _start(self) -> None:
        cfg = self.cfg
        env_cfg = actor_env_config(cfg)
        affinity = actor_cpu_affinity(cfg)
        for actor_id in range(self.num_actors):
            ctx = ActorContext(
                env_cfg=env_cfg, num_steps=cfg.num_steps, num_envs=cfg.envs_per_actor,
                seed=cfg.seed * 100_003 + actor_id * cfg.envs_per_actor, model=self.policy.actor,
                buffers=self.storage.buffers, free_queue=self.storage.free_queue,
                full_queue=self.storage.full_queue, episode_queue=self.episode_queue,
                error_queue=self.error_queue, stop_event=self.stop_event,
                policy_version=self.policy_version, parent_pid=os.getpid(), log_level=cfg.log_level,
                log_file=str(self.run_dir / "actors.log"), cpu_affinity=affinity[actor_id],
            )
            process = self.ctx.Process(target=run_actor, args=(actor_id, ctx), name=f"distrl-actor-{actor_id}",
                                       daemon=True)
            process.start()
            self.actors.append(process)
        for i in range(cfg.num_learners):
            thread = threading.Thread(
                target=run_learner_thread, name=f"distrl-learner-{i}", daemon=True,
                args=(self.learner, self.storage, cfg.batch_size, self.steps_per_update,
                      cfg.train.num_train_steps, self.stats, self.policy_version, self.learner_stop,
                      self.learner_errors),
            )
            thread.start()
            self.learner_threads.append(thread)

    def _check_health(self) -> None:
        try:
            actor_id, trace = self.error_queue.get_nowait()
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

    # ----------------------------------------------------------------- schedule
    def _schedule(self) -> None:
        cfg = self.cfg.train
        recent_returns: deque[float] = deque(maxlen=100)
        last_time, last_steps = time.perf_counter(), self.stats.agent_steps
        sps = 0.0
        next_log = last_steps + cfg.log_interval
        eval_future: Future | None = None
        eval_step = 0
        while True:
            self.learner_stop.wait(TICK_SECONDS)
            self._check_health()
            steps = self.stats.agent_steps
            for _, episode_return, episode_length in drain(self.episode_queue):
                recent_returns.append(episode_return)
                self.telemetry.log({"charts/episodic_return": episode_return,
                                    "charts/episodic_length": episode_length}, steps)

            if steps >= next_log or steps >= cfg.num_train_steps:
                now = time.perf_counter()
                if now > last_time and steps > last_steps:
                    sps = (steps - last_steps) / (now - last_time)
                last_time, last_steps = now, steps
                next_log = steps + cfg.log_interval
                self._log_training(steps, sps, recent_returns)

            if eval_future is not None and eval_future.done():
                self._log_eval(eval_future.result(), eval_step)
                eval_future = None
            if (eval_future is None and cfg.num_eval_episodes > 0
                    and steps - self.marks["last_eval_step"] >= cfg.eval_interval
                    and steps < cfg.num_train_steps):
                eval_step = self.marks["last_eval_step"] = steps
                eval_future = self._start_eval()
            if steps - self.marks["last_save_step"] >= cfg.save_interval and steps < cfg.num_train_steps:
                self.save()
            self.telemetry.progress(steps, sps, recent_returns[-1] if recent_returns else None)
            if steps >= cfg.num_train_steps:
                break
        if eval_future is not None:
            self._log_eval(eval_future.result(), eval_step)

    def _log_training(self, steps: int, sps: float, recent_returns: deque) -> None:
        scalars = {"charts/SPS": sps, "charts/FPS": sps * self.spec.frameskip,
                   "charts/policy_lag": self.stats.policy_lag}
        last = dict(self.stats.last)
        if last:
            scalars["charts/learning_rate"] = last["learning_rate"]
            for name in ("total", "policy", "value", "entropy", "grad_norm"):
                scalars[f"losses/{name}"] = last[name]
        self.telemetry.log(scalars, steps)
        mean_return = f"{np.mean(recent_returns):.2f}" if recent_returns else "n/a"
        log.info("steps=%d frames=%d SPS=%.0f return(mean of last %d)=%s loss=%s lag=%.1f", steps,
                 steps * self.spec.frameskip, sps, len(recent_returns), mean_return,
                 f"{last['total']:.3f}" if last else "n/a", self.stats.policy_lag)

    def _start_eval(self) -> Future:
        with self.learner.lock:
            model = copy.deepcopy(self.policy.learner).cpu()
        seed = self.cfg.seed * 100_003 + 50_000 + self.marks["last_eval_step"] % 10_000
        return self.eval_pool.submit(self._evaluate, model, seed)

    def _evaluate(self, model, seed: int) -> tuple[EvalResult, dict]:
        result = evaluate(model, self.cfg.env, self.cfg.train.num_eval_episodes, seed, stop=self.eval_stop.is_set)
        return result, {k: v.clone() for k, v in model.state_dict().items()}

    def _log_eval(self, outcome: tuple[EvalResult, dict], step: int) -> None:
        result, model_state = outcome
        if not result.returns:
            return
        self.telemetry.log({"eval/mean_return": result.mean_return, "eval/std_return": result.std_return}, step)
        log.info("eval at %d steps: return %.2f +- %.2f over %d episodes", step, result.mean_return,
                 result.std_return, len(result.returns))
        if result.mean_return > self.marks["best_eval_return"]:
            self.marks["best_eval_return"] = result.mean_return
            state = self.checkpoint_state(model_state)
            state["agent_steps"], state["frames"] = step, step * self.spec.frameskip
            checkpoint.save_best(state, self.run_dir / "checkpoints")

    # ----------------------------------------------------------------- shutdown
    def _shutdown(self, outcome: str) -> None:
        self.stop_event.set()
        self.learner_stop.set()
        self.eval_stop.set()
        for thread in self.learner_threads:
            thread.join()
        self._stop_actors()
        self.eval_pool.shutdown(wait=True)
        self.free_indices = self.storage.reclaim()
        lost = self.num_storages - len(self.free_indices)
        if lost or len(set(self.free_indices)) != len(self.free_indices):
            log.warning("storage accounting: %d of %d slots not returned", lost, self.num_storages)
        try:
            if outcome != "failed":  # after a learner error the optimizer state may be half-updated
                self.save()
            if outcome == "done" and self.cfg.train.num_eval_episodes > 0:
                self._final_eval()
        finally:
            self._close()
        log.info("training %s at %d agent steps (%d frames), %d updates", outcome, self.counters["agent_steps"],
                 self.counters["agent_steps"] * self.spec.frameskip, self.counters["updates"])

    def _final_eval(self) -> None:
        """Evaluate the final weights (the checkpoint is already safe), then save the result with them."""
        self.eval_stop.clear()
        model = copy.deepcopy(self.policy.learner).cpu()
        self.marks["last_eval_step"] = self.stats.agent_steps
        self._log_eval(self._evaluate(model, self.cfg.seed * 100_003 + 77_777), self.stats.agent_steps)
        self.save()

    def _close(self) -> None:
        self.telemetry.close()
        self.storage.close()
        for q in (self.episode_queue, self.error_queue):
            drain(q)
            q.close()
            q.join_thread()

    def _stop_actors(self) -> None:
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

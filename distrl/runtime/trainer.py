"""``Trainer``: builds a run (the network's two copies, the optimizer, the learner, the
checkpointer; resuming from a checkpoint) and trains it, one :class:`distrl.runtime.loop.TrainingLoop`
per :meth:`Trainer.train` call.

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
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from distrl.config.validation import Validated
from distrl.envs import eval_seed
from distrl.intrinsic import intrinsic_for_run, needs_value_head
from distrl.learning.distributed import Ranks
from distrl.learning.learner import make_learner, make_optimizer
from distrl.learning.schedule import Position, Schedule
from distrl.learning.split import torch_threads
from distrl.learning.step import StepOptions
from distrl.learning.thread import LearnerStats
from distrl.nn.actor_learner import ActorLearner
from distrl.runtime.checkpointer import Checkpointer, load_initial_weights
from distrl.runtime.evaluator import EvalResult, evaluate
from distrl.runtime.loop import TrainingLoop
from distrl.runtime.preflight import validate
from distrl.runtime.rundir import default_run_dir
from distrl.runtime.supervisor import (
    ActorFailure,
    LearnerFailure,
    RankLost,
    Stalled,
    TrainingError,
)
from distrl.sampling import logs
from distrl.utils import checkpoint
from distrl.utils.runlock import RunLock

__all__ = ["ActorFailure", "Trainer", "LearnerFailure", "RankLost", "Stalled", "TrainingError"]

log = logging.getLogger(__name__)


class Trainer:
    """Actor-learner training of one run (the agent's loss is ``cfg.agent``'s, :mod:`distrl.learning.losses`).

    Hsuanwu's ``DistributedTrainer(cfgs, train_env, test_env)`` is
    :class:`distrl.compat.hsuanwu.DistributedTrainer`, which builds this. :meth:`train` runs a
    :class:`distrl.runtime.loop.TrainingLoop`; the trainer's parts are the network's two copies
    (:class:`distrl.nn.actor_learner.ActorLearner`), the optimizer, the learner and the
    :class:`distrl.runtime.checkpointer.Checkpointer`.

    Args:
        cfg: a train config (:func:`distrl.compose_config`, or Hydra's ``compose("train")`` after
            ``hydra.initialize_config_module("distrl.conf")``).
        run_dir: the run directory (checkpoints, TensorBoard, metrics.jsonl, train.log); None: the
            running Hydra app's output directory, else ``outputs/<date>/<time>[_tag]``.
        progress: show the console progress bar; None: when stderr is a terminal (elsewhere,
            e.g. in a log file, the periodic log lines stand in for it).
        ranks: this process's rank among several (:func:`distrl.learning.distributed.from_environment`);
            None: one rank. Rank 0 alone saves, evaluates and writes metrics.
        validated: what :func:`distrl.runtime.preflight.validate` returned for ``cfg`` (the command
            validates first); None: ``cfg`` is validated here.
        eval_env: the ``env`` node evaluations use; None: ``cfg.env``.

    With ``cfg.resume`` (``auto``: ``run_dir/checkpoints/latest.pt`` if there is one) the run
    continues from that checkpoint: weights, optimizer, the update count (hence the schedule) and
    RNG; ``train.num_train_steps`` stays the total, not an addition.

    Raises:
        ConfigError: a bad config value, or an environment that cannot be created.
        distrl.utils.checkpoint.CheckpointError: the checkpoint to resume from is unusable or does not fit.
    """

    def __init__(self, cfg: DictConfig, run_dir: str | os.PathLike | None = None, progress: bool | None = None,
                 ranks: Ranks | None = None, validated: Validated | None = None, eval_env: DictConfig | None = None):
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
        self.networks = ActorLearner(self.spec.obs_shape, self.spec.action_space, cfg.model,
                                intrinsic_value=needs_value_head(cfg.intrinsic),
                                return_norm=bool(cfg.agent.get("normalize_rewards", False)),
                                value_norm=bool(cfg.agent.get("normalize_values", False)))
        self.intrinsic = intrinsic_for_run(cfg, self.spec, self.placement.stepping)
        if cfg.train.init_model_path:
            path = str(checkpoint.checkpoint_file(cfg.train.init_model_path))
            load_initial_weights(self.networks, self.intrinsic, cfg, path)
        self.networks.to(self.device)
        self.networks.share_actor(actor_precision=self.placement.actors.precision)
        if self.intrinsic is not None:
            self.intrinsic.to(self.device)
        self.schedule = Schedule.for_run(cfg, self.ranks.world_size, self.spec.frameskip)
        self.optimizer = make_optimizer(self.networks, cfg.agent)
        self.learner = make_learner(self.networks, self.optimizer, self.schedule, cfg.agent,
                                    StepOptions.for_run(cfg, self.placement), ranks=self.ranks,
                                    intrinsic=self.intrinsic, pretraining=cfg.train.pretraining)
        self.stats = LearnerStats()
        self.checkpointer = Checkpointer(self.learner, cfg, self.spec, self.placement, self.run_dir)
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
            self.ranks.broadcast_parameters(self.networks.learner)
            self.networks.publish()

    @property
    def num_slots(self) -> int:
        return self.placement.num_slots

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
            model = copy.deepcopy(self.networks.learner).cpu()
        seed = eval_seed(self.cfg.seed, self.position.agent_steps) if seed is None else seed
        return evaluate(model, self.eval_env, num_episodes, seed, deterministic,
                        precision=self.placement.actors.precision)

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
            # a learner that cannot split (a loss of its own) keeps its torch threads
            torch.set_num_threads(torch_threads(self.learner.optimizer_step.split, self.placement.learner_threads))
            try:
                with logs.above_the_bar(self.progress):
                    TrainingLoop(self).run()
            finally:
                torch.set_num_threads(threads_before)
        return self.counters

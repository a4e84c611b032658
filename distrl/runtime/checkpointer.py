"""A run's checkpoints: what one holds, how a run resumes from one, how it is written
(:class:`Checkpointer`, one part of :class:`distrl.runtime.trainer.Trainer`).

A checkpoint (:mod:`distrl.utils.checkpoint` writes and reads the files) is a consistent snapshot
of the run, taken between two learner updates: the learner's weights, the optimizer's state, the
intrinsic module's, the counters (agent steps, updates, the last evaluation and save, the best
evaluation return), the resolved config and the RNG states. Plain tensors and containers only: a
checkpoint loads with ``torch.load(weights_only=True)`` whatever modules distrl has moved since.
"""

from __future__ import annotations

import copy
import logging
import os
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from distrl.config.validation import EnvSpec, Placement
from distrl.intrinsic import IntrinsicReward
from distrl.learning.distributed import Ranks
from distrl.learning.learner import Learner
from distrl.learning.schedule import Every
from distrl.nn.actor_learner import ActorLearner
from distrl.utils import checkpoint
from distrl.utils.checkpoint import RunState
from distrl.version import __version__

log = logging.getLogger(__name__)


class Checkpointer:
    """Writes and reads the checkpoints of one run, and keeps what they hold beside the learner's
    update count: when the run last evaluated (``evals``) and saved (``saves``), and its best
    evaluation return (``best_eval_return``).

    Args:
        learner: the run's learner: its lock and update count (:attr:`Learner.position`), and what a
            checkpoint holds of it: the network copies (the actor/learner pair), the optimizer, the
            intrinsic module (or None); its ranks (rank 0 alone writes files).
        cfg, spec, placement: the run's config, env spec and placement (saved with the weights).
        run_dir: checkpoints go to ``run_dir/checkpoints``.
    """

    def __init__(self, learner: Learner, cfg: DictConfig, spec: EnvSpec, placement: Placement, run_dir: Path):
        self.learner = learner
        self.networks: ActorLearner = learner.networks
        self.optimizer: torch.optim.Optimizer = learner.optimizer_step.optimizer
        self.intrinsic: IntrinsicReward | None = learner.intrinsic
        self.ranks: Ranks = learner.ranks
        self.cfg, self.spec, self.placement, self.run_dir = cfg, spec, placement, run_dir
        self.evals = Every(cfg.train.eval_interval)
        self.saves = Every(cfg.train.save_interval)
        self.best_eval_return = -float("inf")

    def run_state(self) -> RunState:
        return RunState(self.evals.last, self.saves.last, self.best_eval_return)

    def resume(self, path: Path, updates_at: Any) -> None:
        """Continue from the checkpoint at ``path``: weights (published to the actors' copy), optimizer,
        intrinsic module, counters and RNG; ``updates_at(agent_steps)`` is the update count that
        consumes the checkpoint's agent steps in this run (it may come from another number of ranks,
        or another T x B).

        Raises:
            checkpoint.CheckpointError: the file is unusable or does not fit this run.
        """
        saved = checkpoint.load_checkpoint(path)
        mismatch = checkpoint.incompatibility(saved, self.cfg, self.spec.obs_shape, self.spec.action_space.as_dict())
        if mismatch:
            raise checkpoint.CheckpointError(f"cannot resume from {path}: {mismatch}")
        self.networks.learner.load_state_dict(saved["model"])
        self.networks.publish()
        self.optimizer.load_state_dict(saved["optimizer"])
        if self.intrinsic is not None:
            self.intrinsic.load_checkpoint_state(saved["intrinsic"])
        self.learner.resume_at(updates_at(saved["agent_steps"]))
        run = RunState.from_checkpoint(saved)
        self.evals.ran(run.last_eval_step)
        self.saves.ran(run.last_save_step)
        self.best_eval_return = run.best_eval_return
        checkpoint.set_rng_state(saved["rng"])
        log.info("resumed at %d agent steps, %d updates, from %s", self.learner.position.agent_steps,
                 self.learner.updates, path)

    def state(self) -> dict[str, Any]:
        """A consistent snapshot of the run (see :mod:`distrl.utils.checkpoint`), tensors on the CPU:
        weights, optimizer and counters of one moment (between two updates)."""
        with self.learner.lock:
            model_state = {k: v.detach().cpu().clone() for k, v in self.networks.learner.state_dict().items()}
            optimizer_state = _to_cpu(copy.deepcopy(self.optimizer.state_dict()))
            intrinsic = _to_cpu(copy.deepcopy(self.intrinsic.checkpoint_state())) if self.intrinsic else None
            position = self.learner.position
        space = self.spec.action_space
        return {
            "distrl_version": __version__,
            "model": model_state,
            "optimizer": optimizer_state,
            "agent_steps": position.agent_steps,
            "updates": position.updates,
            **self.run_state().as_dict(),
            "frames": position.frames,
            "config": OmegaConf.to_container(self.cfg, resolve=True),
            "rng": checkpoint.rng_state(),
            "obs_shape": list(self.spec.obs_shape),
            "action_space": space.as_dict(),
            **({"num_actions": space.nvec[0]} if space.is_discrete else {}),
            "pretraining": bool(self.cfg.train.pretraining),
            "precision": self.placement.precision,
            "actor_precision": self.placement.actors.precision,  # that of the run's evaluations (distrl eval's default)
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
            checkpoint.save_file(self.state(), path)
            return path
        self.saves.ran(self.learner.position.agent_steps)
        path = checkpoint.save_checkpoint(self.state(), self.run_dir / "checkpoints",
                                          keep=self.cfg.train.keep_checkpoints)
        log.info("checkpoint %s", path)
        return path

    def save_or_warn(self) -> str | None:
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

    def evaluated(self, step: int, snapshot: dict[str, Any], mean_return: float | None) -> None:
        """Count an evaluation of ``snapshot`` (:meth:`state` at ``step`` agent steps) as run; a new
        best ``mean_return`` saves the snapshot as ``best.pt`` (its weights, optimizer, counters and
        RNG of one moment, with the return it scored). None: an evaluation with no episode."""
        self.evals.ran(step)
        if mean_return is None or mean_return <= self.best_eval_return:
            return
        self.best_eval_return = mean_return
        try:
            checkpoint.save_best({**snapshot, "best_eval_return": mean_return}, self.run_dir / "checkpoints")
        except checkpoint.CheckpointSaveError as exc:
            log.error("best.pt not saved, training goes on: %s", exc)


def load_initial_weights(networks: ActorLearner, intrinsic: IntrinsicReward | None, cfg: DictConfig,
                         path: str) -> None:
    """``train.init_model_path`` (a file, or a run directory's latest checkpoint): the policy's
    weights and, when the file holds a module of this run's ``intrinsic.name`` (a pretraining run's
    checkpoint), the intrinsic module's state. The optimizer and the counters start fresh."""
    networks.load(path)
    log.info("initial weights from %s", path)
    if intrinsic is None:
        return
    try:
        saved = checkpoint.load_checkpoint(path)
    except checkpoint.CheckpointError:  # a bare state_dict: no module in it
        return
    if "intrinsic" in saved and saved["config"].get("intrinsic", {}).get("name") == cfg.intrinsic.name:
        intrinsic.load_checkpoint_state(saved["intrinsic"])
        log.info("intrinsic module (%s) from %s", cfg.intrinsic.name, path)


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj

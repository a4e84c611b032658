"""The trainer's checkpoints: what one holds, how a run resumes from one, how it is written
(:class:`Checkpointing`, a part of :class:`distrl.engine.trainer.DistributedTrainer`).

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
from omegaconf import OmegaConf

from distrl.utils import checkpoint
from distrl.utils.checkpoint import RunState
from distrl.version import __version__

log = logging.getLogger(__name__)


class Checkpointing:
    """The checkpoint methods of :class:`distrl.engine.trainer.DistributedTrainer` (whose attributes
    they read: ``policy``, ``optimizer``, ``intrinsic``, ``learner``, ``schedule``, ``evals``,
    ``saves``, ``best_eval_return``, ``cfg``, ``spec``, ``placement``, ``ranks``, ``run_dir``)."""

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
        mismatch = checkpoint.incompatibility(saved, self.cfg, self.spec.obs_shape, self.spec.action_space.as_dict())
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


    def checkpoint_state(self) -> dict[str, Any]:
        """A consistent snapshot of the run (see :mod:`distrl.utils.checkpoint`), tensors on the CPU:
        weights, optimizer and counters of one moment (between two updates)."""
        with self.learner.lock:
            model_state = {k: v.detach().cpu().clone() for k, v in self.policy.learner.state_dict().items()}
            optimizer_state = _to_cpu(copy.deepcopy(self.optimizer.state_dict()))
            intrinsic = _to_cpu(copy.deepcopy(self.intrinsic.checkpoint_state())) if self.intrinsic else None
            position = self.position
        return {
            "distrl_version": __version__,
            "model": model_state,
            "optimizer": optimizer_state,
            "agent_steps": position.agent_steps,
            "updates": position.updates,
            **self._run_state().as_dict(),
            "frames": position.frames,
            "config": OmegaConf.to_container(self.cfg, resolve=True),
            "rng": checkpoint.rng_state(),
            "obs_shape": list(self.spec.obs_shape),
            "action_space": self.spec.action_space.as_dict(),
            **({"num_actions": self.spec.action_space.nvec[0]} if self.spec.action_space.is_discrete else {}),
            "pretraining": bool(self.cfg.train.pretraining),
            "precision": self.placement.precision,
            "actor_precision": self.placement.actor_precision,  # that of the run's evaluations (distrl eval's default)
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



def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj

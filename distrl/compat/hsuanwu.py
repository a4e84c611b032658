"""Hsuanwu's ``DistributedTrainer(cfgs, train_env, test_env)``: distrl's trainer
(:class:`distrl.runtime.trainer.Trainer`) with its envs given as Python objects."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from distrl.compat.env_objects import with_env_objects
from distrl.runtime import trainer

__all__ = ["DistributedTrainer"]


class DistributedTrainer(trainer.Trainer):
    """Hsuanwu's ``DistributedTrainer(cfgs, train_env, test_env=None)``, and distrl's
    ``DistributedTrainer(cfg, run_dir=...)`` with the run directory as a keyword.

    Args:
        cfgs: a train config (:func:`distrl.compose_config`, or Hydra's ``compose("train")`` after
            ``hydra.initialize_config_module("distrl.conf")``).
        train_env, test_env: envs as Python objects (:mod:`distrl.compat.env_objects`: a Gymnasium
            id, a ``gymnasium.make`` env or vector env, or a picklable env factory) that replace
            ``cfgs.env`` for training and for evaluation; None: ``cfgs.env``.
        **kwargs: the keywords of :class:`distrl.runtime.trainer.Trainer` (``run_dir``,
            ``progress``, ``ranks``, ``validated``).

    Raises:
        ConfigError: a bad config value, or an environment that cannot be created.
        EnvObjectError: an env that cannot be rebuilt in the actor processes.
    """

    def __init__(self, cfgs: DictConfig, train_env: Any = None, test_env: Any = None, **kwargs: Any):
        if train_env is not None or test_env is not None:
            cfgs, eval_env = with_env_objects(cfgs, train_env, test_env)
            kwargs = {**kwargs, "validated": None, "eval_env": eval_env}
        super().__init__(cfgs, **kwargs)

"""distrl: distributed IMPALA training (Espeholt et al. 2018) configured by Hydra.

The Python API, distrl's own::

    from distrl import DistributedTrainer, compose_config
    cfg = compose_config(["experiment=cartpole", "train.num_train_steps=100000"])
    trainer = DistributedTrainer(cfg, run_dir="outputs/api-run")
    trainer.train()

and the seeds' shapes (:mod:`distrl.api`, docs/api.md): rllte's ``DistributedAgent``, ``IMPALA`` and
``DistributedActorLearner``, Hsuanwu's ``DistributedTrainer(cfgs, train_env, test_env)``, rlpack's
``SimulatorDistributed``.
"""

__version__ = "0.1.0"

# The config schemas live in Hydra's ConfigStore: registered on import, so that a config composed
# with Hydra's own API (hydra.initialize_config_module("distrl.conf") and compose("train", ...)) finds
# them; importing distrl.conf imports this package first.
from distrl.config import register_configs as _register_configs  # noqa: E402

_register_configs()

__all__ = ["IMPALA", "DistributedActorLearner", "DistributedAgent", "DistributedTrainer", "SimulatorDistributed",
           "compose_config"]


def __getattr__(name: str):
    # Imported on first use, so that `distrl --help` and config errors stay fast (no torch import).
    if name == "DistributedTrainer":
        from distrl.engine.trainer import DistributedTrainer

        return DistributedTrainer
    if name == "DistributedActorLearner":
        from distrl.policy import DistributedActorLearner

        return DistributedActorLearner
    if name in ("DistributedAgent", "IMPALA", "SimulatorDistributed"):
        from distrl import api

        return getattr(api, name)
    if name == "compose_config":
        from distrl.config import compose_config

        return compose_config
    raise AttributeError(f"module 'distrl' has no attribute {name!r}")

"""distrl: distributed actor-learner training (IMPALA, Espeholt et al. 2018; APPO) configured by Hydra.

The Python API, distrl's own::

    from distrl import ConfigError, Trainer, compose_config
    cfg = compose_config(["experiment=cartpole", "train.num_train_steps=100000"])
    trainer = Trainer(cfg, run_dir="outputs/api-run")
    trainer.train()

and the seeds' shapes (:mod:`distrl.compat`, docs/api.md): rllte's ``DistributedAgent``, ``IMPALA``
and ``DistributedActorLearner``, Hsuanwu's ``DistributedTrainer(cfgs, train_env, test_env)``,
rlpack's ``SimulatorDistributed``.

The package, by role (each imports only the ones below it): ``cli`` and ``compat`` (entry points)
-> ``runtime`` (what runs a run: the trainer and its parts, the supervisor, evaluation) ->
``learning`` (batches, the learner, ranks) -> ``sampling`` (the actors, the slots and their queues)
-> ``config`` (schema, composition, validation, the host) -> ``nn``, ``intrinsic``,
``envs`` -> ``rollout``, ``utils``. One rollout reads ``sampling`` then ``learning`` in the order
their package docstrings give.
"""

from distrl.config.schema import register_configs as _register_configs
from distrl.version import __version__

# The config schemas live in Hydra's ConfigStore: registered on import, so that a config composed
# with Hydra's own API (hydra.initialize_config_module("distrl.conf") and compose("train", ...)) finds
# them; importing distrl.conf imports this package first.
_register_configs()

__all__ = ["IMPALA", "ConfigError", "DistributedActorLearner", "DistributedAgent", "DistributedTrainer",
           "SimulatorDistributed", "Trainer", "__version__", "compose_config"]

# name -> (module, attribute): imported on first use (PEP 562), so that `distrl --help`, shell
# completion and config errors answer without importing torch
_LAZY = {
    "DistributedTrainer": ("distrl.compat.hsuanwu", "DistributedTrainer"),
    "DistributedActorLearner": ("distrl.compat.rllte", "DistributedActorLearner"),
    "DistributedAgent": ("distrl.compat.rllte", "DistributedAgent"),
    "IMPALA": ("distrl.compat.rllte", "IMPALA"),
    "SimulatorDistributed": ("distrl.compat.rlpack", "SimulatorDistributed"),
    "Trainer": ("distrl.runtime.trainer", "Trainer"),
    "compose_config": ("distrl.runtime.preflight", "compose_config"),
    "ConfigError": ("distrl.config.schema", "ConfigError"),
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'distrl' has no attribute {name!r}")
    import importlib

    module, attribute = _LAZY[name]
    return getattr(importlib.import_module(module), attribute)

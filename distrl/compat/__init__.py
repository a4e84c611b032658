"""The seeds' Python shapes at the edge of distrl: each builds distrl's config and core objects.

- :mod:`distrl.compat.rllte`: rllte's ``DistributedAgent``, ``IMPALA`` and ``DistributedActorLearner``;
- :mod:`distrl.compat.hsuanwu`: Hsuanwu's ``DistributedTrainer(cfgs, train_env, test_env)``;
- :mod:`distrl.compat.rlpack`: rlpack's ``SimulatorDistributed``;
- :mod:`distrl.compat.env_objects`: envs passed as Python objects, turned into env config values.

docs/api.md maps each argument to distrl's keys.
"""

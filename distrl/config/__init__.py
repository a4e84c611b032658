"""Configuration: what a run is made of, checked before any process starts. Nothing here builds an
env or starts a process (:mod:`distrl.runtime.preflight` probes the env once and runs the checks).

- :mod:`distrl.config.schema`: the typed schema of the config tree (Hydra's ConfigStore), ``ConfigError``;
- :mod:`distrl.config.compose`: composing ``conf/`` as ``distrl`` does;
- :mod:`distrl.config.checks`: one bad value, one line; the env node's, an eval config's and bf16's checks;
- :mod:`distrl.config.validation`: every value of a train config a type cannot express that needs no env;
- :mod:`distrl.config.fits`: the config against the env's spec it is given (encoder, actions, intrinsic
  module, the slots' memory);
- :mod:`distrl.config.host`: what this machine offers (cores, memory, devices, bf16, pipe sizes);
- :mod:`distrl.config.placement`: the ``auto`` sizes resolved for this machine.
"""

"""Configuration: what a run is made of, checked before any process starts.

- :mod:`distrl.config.schema`: the typed schema of the config tree (Hydra's ConfigStore), ``ConfigError``;
- :mod:`distrl.config.compose`: composing ``conf/`` as ``distrl`` does, then validation;
- :mod:`distrl.config.validation`: every value a type cannot express, checked with one clear error;
- :mod:`distrl.config.host`: what this machine offers (cores, memory, devices, bf16, pipe sizes);
- :mod:`distrl.config.placement`: the ``auto`` sizes resolved for this machine.
"""

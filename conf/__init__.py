"""distrl's Hydra configs, importable as ``distrl.conf`` (``hydra.initialize_config_module("distrl.conf")``)."""

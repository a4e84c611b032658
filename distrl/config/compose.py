"""Composing a config as ``distrl`` does: Hydra's composition of ``conf/`` with the typed schema,
then validation."""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from distrl.config.schema import config_dir, register_configs
from distrl.config.validation import validate, validate_eval


def compose_config(overrides: list[str] | tuple[str, ...] = (), config_name: str = "train",
                   check: bool = True) -> DictConfig:
    """The config ``distrl train`` (or ``distrl eval``, ``config_name="eval"``) would run with these
    command-line overrides, composed by Hydra from ``conf/`` and, if ``check``, validated.

    Example: ``compose_config(["experiment=cartpole", "train.num_train_steps=100000"])``.

    Raises:
        ConfigError: a bad value (the same one-line message as the command's; see
            :func:`distrl.config.validation.validate`).
        hydra.errors.ConfigCompositionException: an unknown key or group option, or a value of
            the wrong type.
    """
    register_configs()
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose(config_name, overrides=list(overrides))
    if check:
        (validate if config_name == "train" else validate_eval)(cfg)
    return cfg

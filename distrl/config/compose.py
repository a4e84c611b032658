"""Composing a config as ``distrl`` does: Hydra's composition of ``conf/`` with the typed schema
(validation is :mod:`distrl.config.validation`'s; both together: :func:`distrl.compose_config`)."""

from __future__ import annotations

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from distrl.config.schema import config_dir, register_configs


def compose(overrides: list[str] | tuple[str, ...] = (), config_name: str = "train") -> DictConfig:
    """The config ``distrl train`` (or ``distrl eval``, ``config_name="eval"``) would run with these
    command-line overrides, composed by Hydra from ``conf/``, not validated.

    Raises:
        hydra.errors.ConfigCompositionException: an unknown key or group option, or a value of
            the wrong type.
    """
    register_configs()
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return hydra_compose(config_name, overrides=list(overrides))

"""What runs before any process starts: a composed config checked (:mod:`distrl.config.validation`)
and the env probed once (:func:`distrl.envs.env_spec` builds one env to learn its spaces), so that a
bad value or an env distrl cannot model ends the command in one line with nothing started.

:func:`compose_config` is ``distrl train``'s (or ``distrl eval``'s) config for a list of overrides,
checked as the command checks it: the Python API's entry (``distrl.compose_config``).
"""

from __future__ import annotations

from omegaconf import DictConfig

from distrl.config.checks import env_spec_error, validate_eval
from distrl.config.compose import compose_or_refuse
from distrl.config.fits import validate_with_spec
from distrl.config.schema import ConfigError
from distrl.config.validation import Validated, validate_config
from distrl.envs import SpaceError, env_spec

__all__ = ["ConfigError", "Validated", "compose_config", "validate"]


def validate(cfg: DictConfig) -> Validated:
    """Check every value of a composed train config, probing its env once (once per command: the
    trainer takes the result instead of checking again).

    Returns:
        The placement and the env spec the checks resolved.

    Raises:
        ConfigError: the first bad value, naming its key and what is allowed; an env whose spaces
            distrl cannot model or that cannot be created.
    """
    placement = validate_config(cfg)
    try:
        spec = env_spec(cfg.env)
    except SpaceError as exc:
        raise env_spec_error(cfg.env.id, exc) from None
    except Exception as exc:
        raise env_spec_error(cfg.env.id, exc) from exc
    validate_with_spec(cfg, placement, spec)
    return Validated(placement, spec)


def compose_config(overrides: list[str] | tuple[str, ...] = (), config_name: str = "train",
                   check: bool = True) -> DictConfig:
    """The config ``distrl train`` (or ``distrl eval``, ``config_name="eval"``) would run with these
    command-line overrides, composed by Hydra from ``conf/`` (:func:`distrl.config.compose.compose_or_refuse`)
    and, if ``check``, validated (:func:`validate`, or :func:`distrl.config.checks.validate_eval`).

    Example: ``compose_config(["experiment=cartpole", "train.num_train_steps=100000"])``.

    Raises:
        ConfigError: every refusal of the command's config, with the one line the command prints after
            ``distrl train: error:``: an override that does not parse, an unknown key or group option,
            a value of the wrong type or a bad value.
    """
    cfg = compose_or_refuse(overrides, config_name)
    if check:
        (validate if config_name == "train" else validate_eval)(cfg)
    return cfg

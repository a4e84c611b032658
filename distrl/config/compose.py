"""Composing a config as ``distrl`` does: Hydra's composition of ``conf/`` with the typed schema
(validation is :mod:`distrl.config.validation`'s; both together: :func:`distrl.compose_config`).

:func:`compose` raises Hydra's own exceptions; :func:`compose_or_refuse` turns each into the one-line
:class:`~distrl.config.schema.ConfigError` that ``distrl train`` prints (and ``distrl.compose_config``
raises): the key or group option named, what is allowed, and the nearest name for a typo.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from distrl.config.schema import RENAMED, ConfigError, config_dir, register_configs, renamed_message

GROUPS = ("env", "model", "agent", "intrinsic", "logger", "experiment")  # the groups a user chooses from


def compose(overrides: list[str] | tuple[str, ...] = (), config_name: str = "train") -> DictConfig:
    """The config ``distrl train`` (or ``distrl eval``, ``config_name="eval"``) would run with these
    command-line overrides, composed by Hydra from ``conf/``, not validated.

    Raises:
        hydra.errors.ConfigCompositionException: an unknown key or group option, or a value of
            the wrong type.
        hydra.errors.OverrideParseException: an override that does not parse.
    """
    register_configs()
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return hydra_compose(config_name, overrides=list(overrides))


def compose_or_refuse(overrides: list[str] | tuple[str, ...] = (), config_name: str = "train") -> DictConfig:
    """:func:`compose`, with Hydra's refusals as one line each.

    Raises:
        ConfigError: an override that does not parse; an unknown key (``agnet is not a key of distrl
            train (did you mean agent?) ...``); an unknown group option (with the group's options); a
            value of the wrong type; ``+key`` for a key that exists.
    """
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException

    command = "train" if config_name == "train" else "eval"
    try:
        return compose(overrides, config_name)
    except OverrideParseException as exc:
        raise _unparsable(overrides, exc) from None
    except MissingConfigException as exc:
        found = re.search(r"Could not find '([^/']+)/([^']*)'", str(exc))
        if not found:
            raise ConfigError(first_line(exc)) from None
        group, option = found.groups()
        options = group_options(group)
        raise ConfigError(f"{group}={option} is not allowed: use one of {', '.join(options)}"
                          f"{did_you_mean(option, options)}") from None
    except ConfigCompositionException as exc:
        raise ConfigError(_composition_message(command, config_name, exc)) from None


def parse_overrides(overrides: list[str] | tuple[str, ...]) -> list:
    """``overrides`` as Hydra's override parser reads them (``hydra.core.override_parser.types.Override``).

    Raises:
        ConfigError: one does not parse (``cannot parse the overrides ...``, with the parser's first line).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        return OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException as exc:
        raise _unparsable(overrides, exc) from None


def _unparsable(overrides: list[str] | tuple[str, ...], exc: Exception) -> ConfigError:
    return ConfigError(f"cannot parse the overrides {' '.join(overrides)}: {first_line(exc)}")


def group_options(group: str) -> list[str]:
    """The options of config group ``group`` a user may choose (``conf/<group>/*.yaml``, no schema)."""
    return sorted(p.stem for p in Path(config_dir(), group).glob("*.yaml") if not p.stem.endswith("_schema"))


def did_you_mean(name: str, candidates: list[str]) -> str:
    """`` (did you mean X?)`` for the candidate nearest ``name`` (difflib's ratio >= 0.75), else ``""``."""
    near = difflib.get_close_matches(name, candidates, n=1, cutoff=0.75)
    return f" (did you mean {near[0]}?)" if near else ""


def config_keys(config_name: str) -> list[str]:
    """Every key of the default config of ``config_name`` (dotted, nodes too) and the group names."""
    def walk(node, prefix: str):
        for key, value in node.items():
            path = f"{prefix}{key}"
            yield path
            if isinstance(value, dict):
                yield from walk(value, f"{path}.")

    cfg = OmegaConf.to_container(compose([], config_name), resolve=False)
    groups = list(GROUPS) if config_name == "train" else []
    return sorted(set(walk(cfg, "")) | set(groups))


def _composition_message(command: str, config_name: str, exc: Exception) -> str:
    text = str(exc)
    unknown = re.search(r"Could not override '([^']+)'", text)
    if unknown:
        key = unknown.group(1)
        if key in RENAMED:
            return renamed_message(key)
        return (f"{key} is not a key of distrl {command}{did_you_mean(key, config_keys(config_name))}: "
                f"`distrl {command} --help` lists the keys")
    present = re.search(r"An item is already at '([^']+)'", text)
    if present:
        key = present.group(1)
        return f"+{key} adds a key, and {key} is one already: give {key}=VALUE"
    merging = re.search(r"Error merging override (\S+)", text)
    if merging and exc.__cause__ is not None:
        cause = first_line(exc.__cause__)
        key = merging.group(1).split("=", 1)[0].lstrip("+~")
        if re.search(r"could not be converted to|Value '.*' is not a valid", cause):
            return f"{merging.group(1)} is not allowed: {cause}"
        return f"{merging.group(1)} is not allowed: {cause} (key {key})"
    return first_line(exc)


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (its type's name if it has none)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]

"""How a command ends on bad input: one ``distrl <command>: error: ...`` line, exit code 2, and no run
directory left behind.

:func:`precheck` composes the command's overrides before Hydra's app runs, so that Hydra's own
composition errors (an unknown key, an unknown group option, a value of the wrong type, an override
that does not parse) end the command the same way as distrl's validation (:func:`checked`) does.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

from distrl.config.schema import ConfigError, config_dir


def fail(command: str, message: str, code: int = 2, remove_run_dir: bool = False) -> None:
    """Print one ``distrl <command>: error: ...`` line and exit with ``code``; with ``remove_run_dir``
    (bad input) first remove the run directory Hydra made, when it holds only Hydra's files."""
    if remove_run_dir:
        remove_hydra_run_dir()
    print(f"distrl {command}: error: {message}", file=sys.stderr)
    sys.exit(code)


def checked(command: str, cfg, validate):
    """``validate(cfg)``'s result; a :class:`~distrl.config.ConfigError` ends the command with one
    line and exit code 2, after removing the run directory Hydra made for it (when it holds only
    Hydra's files)."""
    try:
        return validate(cfg)
    except ConfigError as exc:
        fail(command, str(exc), remove_run_dir=True)


def remove_hydra_run_dir() -> None:
    """Remove this job's run directory if it holds only Hydra's files (``.hydra/`` and an empty
    ``train.log`` or ``eval.log``), and the folders above it that this leaves empty (``outputs/<date>``,
    ``outputs``), up to the working directory."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    path = Path(HydraConfig.get().runtime.output_dir)
    if remove_if_only_hydra(path):
        for parent in path.parents:  # outputs/<date>, then outputs, while empty, never the working directory
            if parent == Path.cwd() or not parent.is_dir() or any(parent.iterdir()):
                break
            parent.rmdir()


def remove_if_only_hydra(path: str | Path) -> bool:
    """Remove ``path`` if it holds only Hydra's files (``.hydra/`` and empty ``*.log`` files); whether it did."""
    path = Path(path)
    if not path.is_dir():
        return False
    entries = list(path.iterdir())
    if any(e.name != ".hydra" and not (e.suffix == ".log" and e.stat().st_size == 0) for e in entries):
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


def precheck(command: str, args: list[str]) -> None:
    """Compose ``distrl <command>``'s config with the command line's overrides ``args`` (a sweep once
    per value of each swept key; Hydra's own ``hydra.*`` keys and flags left to Hydra) and end the
    command with one line and exit code 2 when Hydra refuses them.

    The message names the key or group and what is allowed: the options of ``conf/<group>/`` (never
    the typed schemas behind them), or ``--help`` for the keys.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType
    from hydra.errors import OverrideParseException

    given = [a for a in args if not a.startswith("-") and not a.lstrip("+~").startswith("hydra")]
    try:
        parsed = OverridesParser.create().parse_overrides(given)
    except OverrideParseException as exc:
        fail(command, f"cannot parse the overrides {' '.join(given)}: {_first_line(exc)}")
    plain, swept = [], []
    for override in parsed:
        if not override.is_sweep_override():
            plain.append(override.input_line)
        elif override.value_type != ValueType.INTERVAL_SWEEP:  # an Optuna interval is the sweeper's
            values = list(override.sweep_string_iterator())[:MAX_SWEEP_VALUES]
            swept.append([f"{override.get_key_element()}={value}" for value in values])
    firsts = [values[0] for values in swept if values]
    # every value of each swept key once, beside the first value of the others
    trials = [[*plain, *firsts]] + [[*plain, *firsts[:k], value, *firsts[k + 1:]]
                                    for k, values in enumerate(swept) for value in values[1:]]
    for overrides in trials:
        _compose(command, overrides)


MAX_SWEEP_VALUES = 50  # the values of a swept key checked before the sweep starts


def _compose(command: str, overrides: list[str]) -> None:
    from hydra.errors import ConfigCompositionException, MissingConfigException

    from distrl.config.compose import compose

    try:
        compose(overrides, config_name="train" if command == "train" else "eval")
    except MissingConfigException as exc:
        found = re.search(r"Could not find '([^/']+)/([^']*)'", str(exc))
        if not found:
            fail(command, _first_line(exc))
        group, option = found.groups()
        fail(command, f"{group}={option} is not allowed: use one of {', '.join(group_options(group))}")
    except ConfigCompositionException as exc:
        fail(command, _composition_message(command, exc))


def group_options(group: str) -> list[str]:
    """The options of config group ``group`` a user may choose (``conf/<group>/*.yaml``, no schema)."""
    return sorted(p.stem for p in Path(config_dir(), group).glob("*.yaml") if not p.stem.endswith("_schema"))


def _composition_message(command: str, exc: Exception) -> str:
    text = str(exc)
    unknown = re.search(r"Could not override '([^']+)'", text)
    if unknown:
        return f"{unknown.group(1)} is not a key of distrl {command}: `distrl {command} --help` lists the keys"
    present = re.search(r"An item is already at '([^']+)'", text)
    if present:
        key = present.group(1)
        return f"+{key} adds a key, and {key} is one already: give {key}=VALUE"
    merging = re.search(r"Error merging override (\S+)", text)
    if merging and exc.__cause__ is not None:
        cause = _first_line(exc.__cause__)
        key = merging.group(1).split("=", 1)[0].lstrip("+~")
        if re.search(r"could not be converted to|Value '.*' is not a valid", cause):
            return f"{merging.group(1)} is not allowed: {cause}"
        return f"{merging.group(1)} is not allowed: {cause} (key {key})"
    return _first_line(exc)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]

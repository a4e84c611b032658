"""How a command ends on bad input: one ``distrl <command>: error: ...`` line, exit code 2, and no run
directory left behind.

:func:`precheck` composes the command's overrides before Hydra's app runs, so that Hydra's own
composition errors (an unknown key, an unknown group option, a value of the wrong type, an override
that does not parse) end the command the same way as distrl's validation (:func:`checked`) does.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from distrl.config.compose import compose_or_refuse, parse_overrides
from distrl.config.schema import ConfigError


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


def hydra_args(command: str, args: list[str]) -> argparse.Namespace:
    """``args`` as Hydra's own argument parser reads them (``--cfg job``, ``-p agent``, ``--info defaults``,
    the overrides), with the combinations Hydra refuses refused here in one line and exit code 2.

    ``--package`` without ``--cfg`` is refused too: Hydra would ignore it and start the run the user
    meant to look at."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()
    parser.prog = f"distrl {command}"

    def refuse(message: str) -> None:  # argparse's own refusals (a bad choice, an unknown flag), in one line
        fail(command, message)

    parser.error = refuse
    parsed = parser.parse_args(args)
    if parsed.resolve and parsed.cfg is None and not parsed.help:
        fail(command, "--resolve is used with --cfg (or --help): e.g. distrl "
                      f"{command} --cfg job --resolve")
    if parsed.package is not None and parsed.cfg is None and not parsed.help:
        fail(command, f"--package {parsed.package} shows a part of the config with --cfg: e.g. distrl {command} "
                      f"--cfg job --package {parsed.package}")
    shown = [flag for flag, given in (("--run", parsed.run), ("--multirun", parsed.multirun),
                                      ("--cfg", parsed.cfg is not None), ("--info", parsed.info is not None))
             if given]
    if len(shown) > 1:
        fail(command, f"{' and '.join(shown)} together: give one of --run, --multirun, --cfg and --info")
    return parsed


def precheck(command: str, parsed: argparse.Namespace) -> None:
    """Compose ``distrl <command>``'s config with the overrides of its command line as Hydra read it
    (:func:`hydra_args`) (a sweep once per value of each swept key; Hydra's own ``hydra.*`` keys left to
    Hydra) and end the command with one line and exit code 2 when Hydra refuses them.

    The message names the key or group and what is allowed: the options of ``conf/<group>/`` (never
    the typed schemas behind them), or ``--help`` for the keys, with the nearest name for a typo.
    With ``--config-name``, ``--config-path``, ``--config-dir`` or ``--experimental-rerun`` the
    config is not distrl's own, and only the flags are checked (by :func:`hydra_args`).
    """
    from hydra.core.override_parser.types import ValueType

    if any((parsed.config_name, parsed.config_path, parsed.config_dir, parsed.experimental_rerun)):
        return
    given = [a for a in parsed.overrides if not a.lstrip("+~").startswith("hydra")]
    try:
        overrides = parse_overrides(given)
    except ConfigError as exc:
        fail(command, str(exc))
    plain, swept = [], []
    for override in overrides:
        if not override.is_sweep_override():
            plain.append(override.input_line)
        elif override.value_type != ValueType.INTERVAL_SWEEP:  # an Optuna interval is the sweeper's
            values = list(override.sweep_string_iterator())[:MAX_SWEEP_VALUES]
            swept.append([f"{override.get_key_element()}={value}" for value in values])
    firsts = [values[0] for values in swept if values]
    # every value of each swept key once, beside the first value of the others
    trials = [[*plain, *firsts]] + [[*plain, *firsts[:k], value, *firsts[k + 1:]]
                                    for k, values in enumerate(swept) for value in values[1:]]
    for trial in trials:
        try:
            compose_or_refuse(trial, config_name="train" if command == "train" else "eval")
        except ConfigError as exc:
            fail(command, str(exc))


MAX_SWEEP_VALUES = 50  # the values of a swept key checked before the sweep starts

"""Shared by the command mains: where the Hydra configs live, how a command reports a bad config, and the
SIGTERM stop."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from omegaconf import DictConfig

from distrl.config import ConfigError

log = logging.getLogger("distrl")


class Terminated(KeyboardInterrupt):
    """SIGTERM (e.g. a cluster preemption): the same orderly stop as Ctrl-C, exit code 143."""


def config_dir() -> str:
    """``conf/``: packaged beside the code in a wheel, else the repository root's."""
    packaged = Path(__file__).resolve().parent / "conf"
    if (packaged / "train.yaml").is_file():
        return str(packaged)
    return str(Path(__file__).resolve().parent.parent / "conf")


def fail(command: str, message: str, code: int = 2) -> None:
    """Print one ``distrl <command>: error: ...`` line and exit with ``code``."""
    print(f"distrl {command}: error: {message}", file=sys.stderr)
    sys.exit(code)


def checked(command: str, cfg: DictConfig, validate) -> None:
    """Run ``validate(cfg)``; a :class:`ConfigError` ends the command with one line and exit code 2."""
    try:
        validate(cfg)
    except ConfigError as exc:
        fail(command, str(exc))

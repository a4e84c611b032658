"""How a command ends on bad input: one ``distrl <command>: error: ...`` line and exit code 2."""

from __future__ import annotations

import sys

from distrl.config.schema import ConfigError


def fail(command: str, message: str, code: int = 2) -> None:
    """Print one ``distrl <command>: error: ...`` line and exit with ``code``."""
    print(f"distrl {command}: error: {message}", file=sys.stderr)
    sys.exit(code)


def checked(command: str, cfg, validate):
    """``validate(cfg)``'s result; a :class:`~distrl.config.ConfigError` ends the command with one
    line and exit code 2."""
    try:
        return validate(cfg)
    except ConfigError as exc:
        fail(command, str(exc))

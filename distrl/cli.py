"""``distrl {train,eval}``: picks the command and hands the rest of argv to its Hydra main."""

from __future__ import annotations

import sys

from distrl.hydra_app import Terminated

USAGE = """usage: distrl <command> [hydra overrides] [-m] [--help]

commands:
  train   IMPALA training (conf/train.yaml), e.g. distrl train env=atari env.id=ALE/Breakout-v5
  eval    score a checkpoint (conf/eval.yaml), e.g. distrl eval ckpt=outputs/<run>/checkpoints/latest.pt

'distrl train --help' lists the config groups and every key."""


def main(argv: list[str] | None = None) -> int:
    """Run ``distrl``; returns the exit code (130 after Ctrl-C, 143 after SIGTERM)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "train":
        from distrl.train import main as command_main
    elif command == "eval":
        from distrl.evaluate import main as command_main
    else:
        print(f"distrl: unknown command {command!r}; allowed: train, eval\n\n{USAGE}", file=sys.stderr)
        return 2
    sys.argv = [f"distrl-{command}", *rest]
    try:
        command_main()
    except Terminated:
        print("distrl: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("distrl: interrupted", file=sys.stderr)
        return 130
    return 0

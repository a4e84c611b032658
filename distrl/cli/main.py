"""``distrl {train,eval}``: picks the command and hands the rest of argv to its Hydra main.

The commands' modules (and torch with them) are imported once a command is chosen, so that
``distrl --help`` and shell completion answer at once."""

from __future__ import annotations

import sys

from distrl.utils.signals import Terminated

USAGE = """usage: distrl <command> [key=value ...] [group=option ...] [-m] [--help] [Hydra's flags]

commands:
  train   actor-learner training (conf/train.yaml; agent=appo or impala), e.g. distrl train env.id=ALE/Breakout-v5
  eval    score a checkpoint (conf/eval.yaml), e.g. distrl eval ckpt=outputs/<run>/checkpoints/latest.pt

'distrl train --help' lists the config groups and every key with its default; 'distrl train
--hydra-help' Hydra's own flags (--cfg job, --info defaults, ...); 'distrl --version' the version."""


def command_help(command: str, overrides: list[str]) -> int:
    """Print the config groups a user may choose from and the composed config (with ``overrides``)."""
    from omegaconf import OmegaConf

    from distrl.config.compose import GROUPS, compose_or_refuse, group_options
    from distrl.config.schema import ConfigError

    name = "train" if command == "train" else "eval"
    lines = [f"usage: distrl {command} [key=value ...] [group=option ...] [-m]", ""]
    if command == "train":
        lines.append("config groups (group=option):")
        for group in GROUPS:
            lines.append(f"  {group + ':':12s} {', '.join(group_options(group))}")
        lines.append("")
    try:
        cfg = compose_or_refuse([o for o in overrides if not o.lstrip("+~").startswith("hydra")], config_name=name)
    except ConfigError as exc:
        print(f"distrl {command}: error: {exc}", file=sys.stderr)
        return 2
    lines += [f"keys, with {'these overrides' if overrides else 'the defaults'} (conf/{name}.yaml):", "",
              OmegaConf.to_yaml(cfg).rstrip(), "",
              "-m runs a Hydra multirun sweep (e.g. -m seed=1,2,3); --hydra-help lists Hydra's own options."]
    try:
        print("\n".join(lines))
    except BrokenPipeError:  # e.g. piped into head
        pass
    return 0


COMMANDS = ("train", "eval")


def shell_completion(argv: list[str]) -> int:
    """Hydra's shell completion for ``distrl train`` and ``distrl eval``: groups, options and keys.

    ``distrl [train|eval] --shell-completion install=bash`` (or ``-sc install=bash``; zsh takes the
    same script after ``bashcompinit``) prints Hydra's completion script for the ``distrl``
    command. At each TAB, bash runs ``distrl -sc query=bash`` with the line in ``COMP_LINE``: the
    subcommand is completed here, the rest by the subcommand's Hydra app (its config: train.yaml
    or eval.yaml), which sees the line without the subcommand."""
    import os

    action = None
    for i, arg in enumerate(argv):
        if arg.startswith("--shell-completion="):
            action = arg.split("=", 1)[1]
        elif arg in ("-sc", "--shell-completion") and i + 1 < len(argv):
            action = argv[i + 1]
    if action is None:
        print("distrl: --shell-completion needs install=bash, install=zsh, uninstall=bash or query=bash",
              file=sys.stderr)
        return 2
    line = os.environ.get("COMP_LINE", "")
    words = line.split()
    command = next((a for a in argv if a in COMMANDS), None)
    if action.startswith("query="):
        typing_command = len(words) < 2 or (len(words) == 2 and not line.endswith(" "))
        if typing_command:  # the subcommand itself
            typed = words[1] if len(words) == 2 else ""
            print(" ".join(c for c in COMMANDS if c.startswith(typed)))
            return 0
        command = words[1]
        if command not in COMMANDS:
            return 0
        # the subcommand's app completes the rest; it strips one word (the app's name) first
        os.environ["COMP_LINE"] = "distrl " + line.split(command, 1)[1].lstrip()
    elif command is None:
        command = "train"  # install/uninstall: the script is the same for both subcommands
    if command == "train":
        from distrl.cli.train import main as command_main
    else:
        from distrl.cli.evaluate import main as command_main
    sys.argv = ["distrl", "--shell-completion", action]  # the script registers completion for 'distrl'
    if not action.startswith("query="):
        command_main()
        return 0
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        command_main()
    words = [word for word in out.getvalue().split() if "_schema" not in word]  # not options a user picks
    if command == "eval":  # Hydra offers every group of conf/; eval composes none of them
        from distrl.config.compose import GROUPS

        words = [word for word in words if not any(word.startswith((f"{g}=", f"{g}.")) for g in GROUPS)
                 or word.startswith("env.")]
    print(" ".join(words))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``distrl``; returns the exit code (130 after Ctrl-C, 143 after SIGTERM)."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-sc", "--shell-completion") or a.startswith("--shell-completion=") for a in argv):
        return shell_completion(argv)  # before the command: bash asks 'distrl -sc query=bash'
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] in ("--version", "-V"):
        from distrl.version import __version__

        print(f"distrl {__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    if command not in ("train", "eval"):
        print(f"distrl: unknown command {command!r}; allowed: train, eval\n\n{USAGE}", file=sys.stderr)
        return 2
    from distrl.cli.exits import hydra_args, precheck

    parsed = hydra_args(command, rest)  # as Hydra reads it: flags, their values and the overrides
    if parsed.help:
        return command_help(command, parsed.overrides)
    precheck(command, parsed)  # Hydra's composition errors as one line, before Hydra makes a run directory
    if command == "train":
        from distrl.cli.train import main as command_main
    else:
        from distrl.cli.evaluate import main as command_main
    sys.argv = [f"distrl-{command}", *rest]
    try:
        command_main()
    except Terminated:
        print("distrl: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("distrl: interrupted", file=sys.stderr)
        return 130
    from distrl.cli.sweeps import SweepCheck

    if SweepCheck.interrupted:  # a sweep of jobs side by side, each stopped with its checkpoint
        print("distrl: interrupted", file=sys.stderr)
        return 130
    return 0

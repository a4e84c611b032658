"""How the ``distrl`` command fails: one line on stderr, exit code 2, nothing started.

The messages themselves are test_config.py's and test_checkpoints.py's (in one process); here each
way a command can fail goes once through the real command. The commands start all at once, so
that their interpreters' start-up overlaps."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, DistrlProcess, Finished, finish_all

from distrl.cli import main as cli
from distrl.utils.runlock import RunLock

OLD_CHECKPOINT = REPO / "tests" / "data" / "cartpole-751cbb7.pt"

# case -> (args, the start of the one line it prints, or a text in it)
CASES = {
    "validation": (["train", "num_actors=0"], "distrl train: error: num_actors=0 is not allowed"),
    "unknown-key": (["train", "no_such_key=1"],
                    "distrl train: error: no_such_key is not a key of distrl train: `distrl train --help` lists"),
    "added-unknown-key": (["train", "+no_such_key=1"], "distrl train: error: no_such_key is not a key"),
    "unknown-option": (["train", "agent=ppo"],
                       "distrl train: error: agent=ppo is not allowed: use one of appo, appo_minigrid, appo_mujoco, "
                       "impala"),
    "wrong-type": (["train", "seed=abc"], "distrl train: error: seed=abc is not allowed: Value 'abc'"),
    "unparsable": (["train", "seed=["], "distrl train: error: cannot parse the overrides seed=["),
    "swept-value": (["train", "-m", "seed=1,2", "agent.lr=1e-3,x"], "distrl train: error: agent.lr=x is not allowed"),
    "refused-space": (["train", "experiment=mujoco", "env.id=Blackjack-v1"],
                      "distrl train: error: env.id='Blackjack-v1' is not allowed: observation space Tuple"),
    "eval-unknown-key": (["eval", "no_such_key=1"], "distrl eval: error: no_such_key is not a key of distrl eval"),
    "resume-mismatch": (["train", "experiment=cartpole", "env.id=Acrobot-v1", f"resume={OLD_CHECKPOINT}"],
                        "distrl train: error: cannot resume from"),
    "eval-without-ckpt": (["eval"], "distrl eval: error: ckpt is missing"),
    "eval-bad-ckpt": (["eval", f"ckpt={REPO / 'README.md'}"], f"distrl eval: error: {REPO / 'README.md'}"),
    "live-run-dir": (["train", "experiment=cartpole"], "distrl train: error: "),  # this test process holds it
}


@pytest.fixture(scope="module")
def failed(tmp_path_factory) -> tuple[Path, dict[str, Finished]]:
    """Every case's command, run at once; the run directories are under the path returned."""
    root = tmp_path_factory.mktemp("cli")
    live = RunLock(root / "live-run-dir")  # as a live run's trainer holds its run directory
    live.acquire()
    try:
        procs = {case: DistrlProcess([*args, f"hydra.run.dir={root / case}", f"hydra.sweep.dir={root / 'multirun'}"])
                 for case, (args, _) in CASES.items()}
        return root, dict(zip(procs, finish_all(list(procs.values()), timeout=120), strict=True))
    finally:
        live.release()


@pytest.mark.parametrize("case", CASES)
def test_a_bad_command_fails_with_one_line_and_starts_nothing(case, failed):
    root, results = failed
    done, (_, expected) = results[case], CASES[case]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert "Traceback" not in done.stderr
    assert not done.children
    assert done.returncode == 2, done.stderr[-3000:]
    assert lines == [lines[0]] and lines[0].startswith(expected), done.stderr
    assert not (root / case / "checkpoints").exists()
    if case not in ("resume-mismatch", "live-run-dir"):  # refused before any work: no run directory
        assert not (root / case).exists() and not (root / "multirun").exists()
    if case == "resume-mismatch":
        assert "env.id='CartPole-v1' in the checkpoint, env.id='Acrobot-v1' here" in lines[0]
    if case == "live-run-dir":  # refused at once, naming the live run; nothing written into its directory
        assert lines[0] == (f"distrl train: error: {root / case} is the run directory of a live run (host "
                            f"{socket.gethostname()}, pid {os.getpid()}); stop it first, or give this run another "
                            f"hydra.run.dir")
        assert not (root / case / "metrics.jsonl").exists()


def test_help_lists_only_what_a_user_may_choose(capsys):
    assert cli.main(["train", "experiment=cartpole", "--help"]) == 0
    out = capsys.readouterr().out
    assert "experiment:  cartpole, image_cue, image_cue_memory, minigrid, mujoco, sparse_chain" in out
    assert "env:         atari, gym, image_cue, image_cue_memory, minigrid, mujoco, sparse_chain" in out
    assert "intrinsic:   e3b, none, re3, rnd" in out
    assert "_schema" not in out
    assert "id: CartPole-v1" in out and "lr: 0.005" in out  # the composed keys, with the preset


COMPLETE = """
eval "$(distrl train --shell-completion install=bash)"
for line in "distrl tr" "distrl train model=" "distrl train agent.entropy_c" "distrl train -m seed=1,2 intrinsic=" \
            "distrl eval ck" "distrl train train.init_model_path=./con"; do
  COMP_LINE="$line"; COMP_POINT=${#COMP_LINE}; read -ra COMP_WORDS <<< "$COMP_LINE"
  COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
  hydra_bash_completion
  echo "$line => ${COMPREPLY[*]}"
done
"""


@pytest.mark.long
def test_bash_completes_commands_groups_options_and_keys():
    """The way bash calls it: the installed script's function, with COMP_LINE/COMP_WORDS as bash sets
    them at a TAB, running the real ``distrl`` command."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", COMPLETE], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    got = dict(line.split(" => ") for line in done.stdout.splitlines())
    assert got["distrl tr"] == "train"
    assert got["distrl train model="].split() == ["model=impala_resnet", "model=minigrid_cnn", "model=mlp",
                                                  "model=nature_cnn"]
    assert got["distrl train agent.entropy_c"] == "agent.entropy_cost="
    assert got["distrl train -m seed=1,2 intrinsic="].split() == ["intrinsic=e3b", "intrinsic=none", "intrinsic=re3",
                                                                  "intrinsic=rnd"]
    assert got["distrl eval ck"] == "ckpt="
    assert got["distrl train train.init_model_path=./con"] == "train.init_model_path=./conf"  # paths, too
    installed = subprocess.run(["distrl", "-sc", "install=zsh"], capture_output=True, text=True, env=env, timeout=60)
    assert installed.returncode == 0 and "complete -o nospace -o default -F hydra_bash_completion distrl" in \
        installed.stdout


def test_no_command_or_an_unknown_one_prints_the_usage(capsys):
    assert cli.main([]) == 2 and "usage: distrl <command>" in capsys.readouterr().out
    assert cli.main(["--help"]) == 0
    assert cli.main(["fly"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'fly'; allowed: train, eval" in err and "usage:" in err

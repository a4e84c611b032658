"""How the ``distrl`` command fails: one line on stderr, exit code 2, nothing started.

The messages themselves are test_config.py's and test_checkpoints.py's (in one process); here each
way a command can fail goes once through the real command. The commands start all at once, so
that their interpreters' start-up overlaps."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO, DistrlProcess, Finished, finish_all

from distrl import cli

OLD_CHECKPOINT = REPO / "tests" / "data" / "cartpole-751cbb7.pt"

# case -> (args, the start of the one line it prints, or a text in it)
CASES = {
    "validation": (["train", "num_actors=0"], "distrl train: error: num_actors=0 is not allowed"),
    "unknown-key": (["train", "no_such_key=1"], "no_such_key"),
    "resume-mismatch": (["train", "experiment=cartpole", "env.id=Acrobot-v1", f"resume={OLD_CHECKPOINT}"],
                        "distrl train: error: cannot resume from"),
    "eval-without-ckpt": (["eval"], "distrl eval: error: ckpt is missing"),
    "eval-bad-ckpt": (["eval", f"ckpt={REPO / 'README.md'}"], f"distrl eval: error: {REPO / 'README.md'}"),
}


@pytest.fixture(scope="module")
def failed(tmp_path_factory) -> tuple[Path, dict[str, Finished]]:
    """Every case's command, run at once; the run directories are under the path returned."""
    root = tmp_path_factory.mktemp("cli")
    procs = {case: DistrlProcess([*args, f"hydra.run.dir={root / case}"]) for case, (args, _) in CASES.items()}
    return root, dict(zip(procs, finish_all(list(procs.values()), timeout=120), strict=True))


@pytest.mark.parametrize("case", CASES)
def test_a_bad_command_fails_with_one_line_and_starts_nothing(case, failed):
    root, results = failed
    done, (_, expected) = results[case], CASES[case]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert "Traceback" not in done.stderr
    assert not done.children
    if case == "unknown-key":  # Hydra's own error (exit code 1), before distrl sees the config
        assert done.returncode != 0 and expected in done.stderr
        return
    assert done.returncode == 2, done.stderr[-3000:]
    assert lines == [lines[0]] and lines[0].startswith(expected), done.stderr
    assert not (root / case / "checkpoints").exists()
    if case == "resume-mismatch":
        assert "env.id='CartPole-v1' in the checkpoint, env.id='Acrobot-v1' here" in lines[0]


def test_help_lists_only_what_a_user_may_choose(capsys):
    assert cli.main(["train", "experiment=cartpole", "--help"]) == 0
    out = capsys.readouterr().out
    assert "experiment:  cartpole, image_cue, image_cue_memory, minigrid, sparse_chain" in out
    assert "env:         atari, gym, image_cue, image_cue_memory, minigrid, sparse_chain" in out
    assert "intrinsic:   none, re3, rnd" in out
    assert "_schema" not in out
    assert "id: CartPole-v1" in out and "lr: 0.005" in out  # the composed keys, with the preset
    assert cli.main(["train", "--shell-completion", "install=bash"]) == 2
    err = capsys.readouterr().err
    assert "not offered" in err and "Traceback" not in err


def test_no_command_or_an_unknown_one_prints_the_usage(capsys):
    assert cli.main([]) == 2 and "usage: distrl <command>" in capsys.readouterr().out
    assert cli.main(["--help"]) == 0
    assert cli.main(["fly"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'fly'; allowed: train, eval" in err and "usage:" in err

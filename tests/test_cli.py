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
                       "appo_mujoco_1m, impala"),
    "wrong-type": (["train", "seed=abc"], "distrl train: error: seed=abc is not allowed: Value 'abc'"),
    "unparsable": (["train", "seed=["], "distrl train: error: cannot parse the overrides seed=["),
    "swept-value": (["train", "-m", "seed=1,2", "agent.lr=1e-3,x"], "distrl train: error: agent.lr=x is not allowed"),
    "refused-space": (["train", "experiment=mujoco", "env.id=Blackjack-v1"],
                      "distrl train: error: env.id='Blackjack-v1' is not allowed: observation space Tuple"),
    "box-plain": (["train", "env=gym", "env.id=Pendulum-v1", "model=mlp"],
                  "distrl train: error: env.id='Pendulum-v1' has Box(1) actions, and agent.reward_clip=1.0 with "
                  "model.normalize_obs=false is the Atari protocol, which does not learn continuous control: add "
                  "experiment=mujoco"),
    "box-without-mlp": (["train", "env=mujoco", "env.id=Pendulum-v1"],
                        "distrl train: error: model.encoder='nature_cnn' is not allowed: "),
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


# Hydra's own flags, a value as a separate word, through the real command: args -> a text its stdout holds
HYDRA_FLAGS = {
    "cfg-job": (["train", "--cfg", "job"], "  id: ALE/Pong-v5\n"),
    "c-job-preset": (["train", "-c", "job", "experiment=mujoco"], "  id: HalfCheetah-v5\n"),
    "cfg-hydra": (["train", "--cfg", "hydra"], "hydra:\n  run:\n    dir: outputs/"),
    "cfg-hydra-resolve-tag": (["train", "--cfg", "hydra", "--resolve", "tag=x"], "_x\n"),
    "cfg-all-resolve": (["train", "--cfg", "all", "--resolve"], "  id: ALE/Pong-v5\n"),
    "p-agent": (["train", "--cfg", "job", "-p", "agent"], "# @package agent\nname: appo\n"),
    "p-env-sf-keys": (["train", "-c", "job", "-p", "env", "experiment=mujoco", "env.id=Hopper-v4",
                       "env.clip_actions=false", "agent.shuffle_minibatches=false", "model.init_fn=torch_default"],
                      "id: Hopper-v4\nmax_episode_steps: null\nspec: null\nfactory: null\nsuccess_above: null\n"
                      "clip_actions: false\n"),
    "package-agent": (["train", "--cfg", "job", "--package", "agent", "agent=impala"], "name: impala\n"),
    "info": (["train", "--info"], "Defaults List"),
    "info-defaults": (["train", "--info", "defaults"], "Defaults List"),
    "help-overrides": (["train", "experiment=cartpole", "--help"], "id: CartPole-v1"),
    "version": (["--version"], "distrl "),
    "eval-cfg-job": (["eval", "--cfg", "job"], "ckpt: ???"),
    "eval-c-job": (["eval", "-c", "job", "num_episodes=3"], "num_episodes: 3"),
    "eval-cfg-hydra": (["eval", "--cfg", "hydra"], "    dir: outputs/eval/"),
    "eval-cfg-all-resolve": (["eval", "--cfg", "all", "--resolve"], "num_episodes: 10"),
    "eval-p-env": (["eval", "--cfg", "job", "-p", "env"], "# @package env\nrepeat_action_probability: null"),
    "eval-package-env": (["eval", "--cfg", "job", "--package", "env"], "noop_max: null"),
    "eval-info": (["eval", "--info"], "Defaults List"),
    "eval-info-defaults": (["eval", "--info", "defaults"], "Defaults List"),
    "eval-help-overrides": (["eval", "num_episodes=7", "--help"], "num_episodes: 7"),
}
# ... and what Hydra (or distrl) refuses: args -> the one line on stderr
HYDRA_REFUSALS = {
    "multirun-cfg": (["train", "-m", "seed=1,2", "--cfg", "job"],
                     "distrl train: error: --multirun and --cfg together: give one of"),
    "multirun-info": (["train", "-m", "seed=1,2", "--info"], "distrl train: error: --multirun and --info together"),
    "resolve-alone": (["train", "--resolve"], "distrl train: error: --resolve is used with --cfg"),
    "package-alone": (["train", "-p", "agent"], "distrl train: error: --package agent shows a part of the config"),
    "bad-cfg": (["train", "--cfg", "everything"], "distrl train: error: argument --cfg/-c: invalid choice"),
    "eval-multirun-cfg": (["eval", "-m", "seed=1,2", "--cfg", "job"], "distrl eval: error: --multirun and --cfg"),
    "eval-unknown-flag": (["eval", "--frobnicate"], "distrl eval: error: unrecognized arguments: --frobnicate"),
    "typo-key": (["train", "agnet=impala"], "distrl train: error: agnet is not a key of distrl train (did you mean "
                                            "agent?)"),
    "typo-option": (["train", "agent=imapla"], "distrl train: error: agent=imapla is not allowed: use one of appo, "
                                               "appo_minigrid, appo_mujoco, appo_mujoco_1m, impala "
                                               "(did you mean impala?)"),
    # a renamed key: one line naming the new name (distrl.config.schema.RENAMED), a sweep's too
    "renamed-key": (["train", "-m", "num_storages=12,16"], "distrl train: error: num_storages is now num_slots: give "
                                                          "num_slots=VALUE"),
}


@pytest.fixture(scope="module")
def hydra_flags(tmp_path_factory) -> tuple[Path, dict[str, Finished]]:
    """Every flag case and refusal, run at once from an empty working directory."""
    cwd = tmp_path_factory.mktemp("flags")
    cases = {**HYDRA_FLAGS, **HYDRA_REFUSALS}
    procs = {case: DistrlProcess(args, cwd=cwd) for case, (args, _) in cases.items()}
    return cwd, dict(zip(procs, finish_all(list(procs.values()), timeout=120), strict=True))


@pytest.mark.parametrize("case", HYDRA_FLAGS)
def test_hydras_flags_take_their_value_as_the_next_word(case, hydra_flags):
    cwd, results = hydra_flags
    done, (_, shown) = results[case], HYDRA_FLAGS[case]
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr[-3000:]
    assert shown in done.stdout, done.stdout[-3000:]
    assert not list(cwd.iterdir())  # nothing run, nothing written


@pytest.mark.parametrize("case", HYDRA_REFUSALS)
def test_flag_combinations_hydra_refuses_end_in_one_line(case, hydra_flags):
    cwd, results = hydra_flags
    done, (_, expected) = results[case], HYDRA_REFUSALS[case]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith(expected), done.stderr[-3000:]
    assert not done.stdout.strip() and not list(cwd.iterdir())


def test_the_api_raises_the_commands_line(failed, hydra_flags):
    """distrl.compose_config raises distrl.ConfigError with the very line the command printed after
    ``distrl <command>: error:``, for each of the command's refusals of a config."""
    import distrl

    printed = {case: done.stderr.strip() for results in (failed[1], hydra_flags[1]) for case, done in results.items()}
    cases = {case: CASES[case][0] for case in ("validation", "unknown-key", "added-unknown-key", "unknown-option",
                                                "wrong-type", "unparsable", "refused-space", "box-plain",
                                                "box-without-mlp", "eval-unknown-key", "eval-without-ckpt")}
    cases |= {case: HYDRA_REFUSALS[case][0] for case in ("typo-key", "typo-option")}
    for case, (command, *overrides) in cases.items():
        with pytest.raises(distrl.ConfigError) as raised:
            distrl.compose_config(overrides, config_name=command)
        assert f"distrl {command}: error: {raised.value}" == printed[case], case


def test_help_lists_only_what_a_user_may_choose(capsys):
    assert cli.main(["train", "experiment=cartpole", "--help"]) == 0
    out = capsys.readouterr().out
    assert ("experiment:  cartpole, image_cue, image_cue_memory, minigrid, minigrid_rlexplore, mujoco, mujoco_1m, "
            "sparse_chain") in out
    assert "env:         atari, gym, image_cue, image_cue_memory, minigrid, mujoco, sparse_chain" in out
    assert "intrinsic:   e3b, none, re3, rnd" in out
    assert "_schema" not in out
    assert "id: CartPole-v1" in out and "lr: 0.005" in out  # the composed keys, with the preset


COMPLETE = """
eval "$(distrl train --shell-completion install=bash)"
for line in "distrl tr" "distrl train model=" "distrl train agent.entropy_c" "distrl train -m seed=1,2 intrinsic=" \
            "distrl eval ck" "distrl eval e" "distrl train train.init_model_path=./con"; do
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
    assert got["distrl eval e"] == "env."  # eval's keys only (train's env=, experiment=: eval composes no group)
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

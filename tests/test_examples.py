"""The scripts in examples/ (one per seed's API), each run as a user runs it, on a small budget."""

import ast
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, metrics
from omegaconf import OmegaConf

EXAMPLES = REPO / "examples"


def config(run_dir):
    return OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"))


def run_example(name: str, args: list[str], cwd) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.long
def test_rllte_example_trains_and_prints_its_evaluation(tmp_path):
    done = run_example("rllte_impala.py", ["4000"], tmp_path)
    result = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert {"episode_rewards", "episode_lengths", "returns", "lengths", "mean_return", "std_return"} <= set(result)
    assert len(result["returns"]) == 10
    (run_dir,) = (tmp_path / "outputs").glob("*/*_impala_cartpole")
    assert max(r["agent_steps"] for r in metrics(run_dir)) >= 4000


@pytest.mark.long
def test_hsuanwu_example_composes_cfgs_with_hydra_and_tests_and_saves(tmp_path):
    done = run_example("hsuanwu_trainer.py", ["experiment=cartpole", "num_actors=1", "train.num_train_steps=3000"],
                       tmp_path)
    assert re.search(r"test: return \d+\.\d \+- \d+\.\d over 10 episodes", done.stdout), done.stdout
    saved = re.search(r"saved (\S+\.pt)", done.stdout).group(1)
    assert (tmp_path / saved).is_file() or (tmp_path / saved).resolve().is_file()


@pytest.mark.long
def test_rllte_example_on_a_box_env_trains_and_evaluates_with_the_gaussians_mean(tmp_path):
    done = run_example("rllte_impala_mujoco.py", ["4096", "Hopper-v5"], tmp_path)
    result = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert len(result["returns"]) == 10
    (run_dir,) = (tmp_path / "outputs").glob("*/*_impala_mujoco")
    cfg = config(run_dir)
    assert (cfg["agent"]["name"], cfg["model"]["normalize_obs"], cfg["train"]["eval_deterministic"]) == (
        "impala", True, True)
    assert max(r["agent_steps"] for r in metrics(run_dir)) >= 4096


@pytest.mark.long
def test_hsuanwu_example_trains_a_mujoco_task(tmp_path):
    done = subprocess.run([sys.executable, str(EXAMPLES / "hsuanwu_trainer.py"), "experiment=mujoco", "num_actors=1",
                           "train.num_train_steps=4096", "train.eval_interval=4096", "train.num_eval_episodes=2"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "ENV_ID": "Hopper-v5"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"test: return -?\d+\.\d \+- \d+\.\d over 10 episodes", done.stdout), done.stdout


@pytest.mark.long
def test_rlpack_example_runs_two_ranks(tmp_path):
    run_example("rlpack_simulator.py", ["4000"], tmp_path)
    run_dir = tmp_path / "outputs" / "rlpack-cartpole"
    assert (run_dir / "checkpoints" / "latest.pt").exists()
    log = (run_dir / "train.log").read_text()
    assert "rank 0 of 2" in log and "training done" in log

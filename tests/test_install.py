"""A non-editable install (a built wheel) finds its configs and runs from another directory."""

import os
import subprocess
import sys

import pytest
from conftest import REPO, TINY_CARTPOLE, run_distrl

from distrl.utils.checkpoint import load_checkpoint


@pytest.mark.long  # over 10 s end to end (12-20 s on 2 cores): the second tier
def test_wheel_install_runs_from_another_directory(tmp_path):
    wheel_dir, site = tmp_path / "wheel", tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheel_dir), str(REPO)], check=True, cwd=tmp_path, capture_output=True)
    wheels = list(wheel_dir.glob("distrl-*.whl"))
    assert len(wheels) == 1
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                    str(wheels[0])], check=True, capture_output=True)
    env = {"PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import distrl; print(distrl.__file__)"], cwd=tmp_path,
                           env={**os.environ, **env}, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(site)), where
    groups = {p.parent.relative_to(REPO / "conf") for p in (REPO / "conf").rglob("*.yaml")}
    assert {"env", "agent", "model", "experiment", "intrinsic", "logger", "hydra/launcher"} <= {str(g) for g in groups}
    for group in groups:  # every config group (and the top-level configs) is in the wheel
        assert sorted(p.name for p in (site / "distrl" / "conf" / group).glob("*.yaml")) == sorted(
            p.name for p in (REPO / "conf" / group).glob("*.yaml")), group

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    composed = subprocess.run(  # Hsuanwu's way: Hydra's own API, nothing of distrl's called first
        [sys.executable, "-c", "from hydra import compose, initialize_config_module\n"
         "with initialize_config_module('distrl.conf', version_base='1.3'):\n"
         "    print(compose('train', overrides=['experiment=cartpole']).env.id)"],
        cwd=elsewhere, env={**os.environ, **env}, capture_output=True, text=True)
    assert composed.returncode == 0 and composed.stdout.strip() == "CartPole-v1", composed.stderr[-2000:]
    done = run_distrl(["train", *TINY_CARTPOLE, "train.num_train_steps=500", "train.num_eval_episodes=1"],
                      cwd=elsewhere, env=env, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = list((elsewhere / "outputs").glob("*/*/checkpoints/latest.pt"))
    assert len(runs) == 1
    assert load_checkpoint(runs[0])["agent_steps"] >= 500

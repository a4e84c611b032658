"""``distrl train`` end to end through the real command on real envs."""

import json
import signal
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY_CARTPOLE, TINY_PONG, DistrlProcess, compose_train, run_distrl
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from distrl.checkpoint import load_checkpoint


def scalars(run_dir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return acc


def check_run(run_dir: Path, num_train_steps: int) -> None:
    latest = run_dir / "checkpoints" / "latest.pt"
    state = torch.load(latest, weights_only=True)
    assert state["agent_steps"] >= num_train_steps
    assert state["config"]["train"]["num_train_steps"] == num_train_steps
    assert {"model", "optimizer", "scheduler", "rng", "distrl_version", "updates"} <= set(state)
    assert (run_dir / "config.yaml").is_file()

    acc = scalars(run_dir)
    tags = set(acc.Tags()["scalars"])
    assert {"losses/total", "charts/SPS", "charts/learning_rate", "charts/policy_lag"} <= tags
    assert tags & {"charts/episodic_return", "eval/mean_return"}
    losses = acc.Scalars("losses/total")
    steps = [e.step for e in losses]
    # one point per log, the last at the end (a second learner may finish one more update after it)
    assert steps == sorted(set(steps)) and num_train_steps <= steps[-1] <= state["agent_steps"]

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all({"agent_steps", "frames", "time"} <= set(r) for r in records)
    # where the learner's time went, per update: every update computes and publishes, so those take time
    timed = [r for r in records if "perf/learner_step_ms" in r]
    assert timed
    for r in timed:
        ms = {name: r[f"perf/learner_{name}_ms"] for name in ("wait", "gather", "step", "publish")}
        assert all(value >= 0 for value in ms.values()) and ms["step"] > 0 and ms["publish"] > 0, ms
    assert {"perf/learner_wait_ms", "perf/learner_step_ms"} <= tags
    # SPS is the agent steps between two log lines over the seconds between them
    logged = [r for r in records if "charts/SPS" in r]
    assert logged  # (a short, fast run may log once: its first tick can already be past the budget)
    for before, after in zip(logged, logged[1:], strict=False):
        rate = (after["agent_steps"] - before["agent_steps"]) / (after["time"] - before["time"])
        assert after["charts/SPS"] == pytest.approx(rate, rel=0.5)


@pytest.mark.parametrize("overrides", [
    TINY_PONG, TINY_CARTPOLE, TINY_CARTPOLE + ["model.use_lstm=true"], TINY_CARTPOLE + ["env.max_episode_steps=30"],
    TINY_PONG + ["env.backend=gymnasium", "train.num_train_steps=800"],
    TINY_PONG + ["model=impala_resnet", "train.num_train_steps=800"],
    TINY_CARTPOLE + ["train.th_compile=true", "train.num_train_steps=1000"],
    # the fewest slots validation accepts (2 x 2 envs + 4 x 2), async stepping and two learners: no hang
    TINY_PONG + ["env.async_step=true", "num_learners=2", "num_storages=12", "train.num_train_steps=800"],
    TINY_CARTPOLE + ["num_learners=2", "num_storages=12"],  # issue #9 saw 128 steps, then a hang, with 5
    TINY_PONG + ["model.last_action_reward=true", "env.async_step=true", "train.num_train_steps=800"],
], ids=["pong", "cartpole", "cartpole-lstm", "cartpole-time-limit", "pong-gymnasium-backend", "pong-impala-resnet",
        "cartpole-compiled", "pong-fewest-slots", "cartpole-two-learners-fewest-slots", "pong-last-action-reward"])
def test_train_end_to_end(overrides, tmp_path):
    run_dir = tmp_path / "run"
    done = run_distrl(["train", *overrides, f"hydra.run.dir={run_dir}"], timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(done.children) >= 2  # the actors really ran as processes
    assert done.alive_children() == []
    steps = int([o.split("=")[1] for o in overrides if o.startswith("train.num_train_steps=")][-1])  # the last wins
    check_run(run_dir, steps)
    state = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    if "env=atari" in overrides:
        assert state["frames"] == 4 * state["agent_steps"] and state["obs_shape"] == [4, 84, 84]
        tags = set(scalars(run_dir).Tags()["scalars"])
        assert "charts/FPS" in tags


def test_storage_slots_all_come_back(tmp_path):
    """After a run, every slot index is back on the free queue: none lost, none twice."""
    from distrl.engine.trainer import DistributedTrainer

    cfg = compose_train(TINY_CARTPOLE + ["train.num_eval_episodes=0"])
    trainer = DistributedTrainer(cfg, tmp_path, progress=False)
    counters = trainer.train()
    assert counters["agent_steps"] >= 3000
    assert trainer.free_indices == list(range(trainer.num_storages))


def test_ctrl_c_stops_everything(tmp_path):
    run_dir = tmp_path / "run"
    proc = DistrlProcess(["train", *TINY_PONG, "train.num_train_steps=10000000", f"hydra.run.dir={run_dir}"])
    metrics = run_dir / "metrics.jsonl"
    assert proc.wait_for(lambda: metrics.exists() and "losses/total" in metrics.read_text(), timeout=120)
    assert len(proc.poll_children()) >= 2
    start = time.monotonic()
    proc.signal(signal.SIGINT)
    done = proc.finish(timeout=30)
    assert done.returncode == 130, done.stderr[-3000:]
    assert time.monotonic() - start < 20
    assert done.alive_children() == []
    assert load_checkpoint(run_dir / "checkpoints" / "latest.pt")["agent_steps"] > 0


def test_the_first_lines_say_where_what_how_big_and_how_to_stop(tmp_path):
    """Outside a terminal (a log file, SLURM) there is no progress bar: plain lines only."""
    run_dir = tmp_path / "run"
    # long enough for several log intervals to pass between the trainer's ticks (0.25 s)
    done = run_distrl(["train", *TINY_CARTPOLE, "train.num_train_steps=20000", f"hydra.run.dir={run_dir}"])
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    head = "\n".join(lines[:4])
    assert f"run directory {run_dir}" in head
    assert "CartPole-v1" in head and "2 actor(s) x 2 envs, T=20, B=4" in head and "parameters" in head
    assert "Ctrl-C stops and saves a checkpoint" in head
    assert "\r" not in done.stdout and "\r" not in done.stderr
    assert "step/s" not in done.stderr  # no tqdm bar
    assert sum("steps=" in line and "SPS=" in line for line in lines) >= 2  # the periodic plain lines


def test_multirun_gives_one_complete_run_per_job(tmp_path):
    sweep = tmp_path / "sweep"
    done = run_distrl(["train", "-m", "seed=1,2", *TINY_CARTPOLE, "train.num_train_steps=1000",
                       "train.num_eval_episodes=1", f"hydra.sweep.dir={sweep}"], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.alive_children() == []
    for job, seed in (("0", 1), ("1", 2)):
        state = load_checkpoint(sweep / job / "checkpoints" / "latest.pt")
        assert state["config"]["seed"] == seed
        check_run(sweep / job, 1000)


def test_linear_entropy_schedule_decays_with_the_learning_rate(tmp_path):
    """``agent.entropy_schedule=linear``: every update's entropy cost is ``agent.entropy_cost`` times
    the learning rate's decay factor, so it falls to near 0 by the end of the run."""
    run_dir = tmp_path / "run"
    done = run_distrl(["train", *TINY_CARTPOLE, "agent.entropy_schedule=linear", "train.num_train_steps=12000",
                       "train.num_eval_episodes=0", f"hydra.run.dir={run_dir}"], timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    agent = load_checkpoint(run_dir / "checkpoints" / "latest.pt")["config"]["agent"]
    acc = scalars(run_dir)
    costs = [e.value for e in acc.Scalars("charts/entropy_cost")]
    rates = [e.value for e in acc.Scalars("charts/learning_rate")]
    assert len(costs) == len(rates) >= 3
    for cost, rate in zip(costs, rates, strict=True):
        assert cost / agent["entropy_cost"] == pytest.approx(rate / agent["lr"], rel=1e-4)
    assert costs == sorted(costs, reverse=True) and costs[-1] < 0.3 * agent["entropy_cost"] < costs[0]


def test_an_entropy_schedule_of_points_holds_then_falls_to_the_last_factor(tmp_path):
    """``agent.entropy_schedule=[[2000,1.0],[4000,0.1]]``: the preset's cost (0.001) up to 2k agent
    steps, a linear fall to a tenth of it by 4k, then 0.0001 to the end, as TensorBoard logs it."""
    run_dir = tmp_path / "run"
    done = run_distrl(["train", *TINY_CARTPOLE, "agent.entropy_schedule=[[2000,1.0],[4000,0.1]]",
                       "train.num_train_steps=6000", "train.num_eval_episodes=0", f"hydra.run.dir={run_dir}"],
                      timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert load_checkpoint(run_dir / "checkpoints" / "latest.pt")["config"]["agent"]["entropy_cost"] == 0.001
    # Logged on the trainer's 0.25 s tick, so how many points fall on the ramp depends on the speed;
    # the ramp's arithmetic is test_learner.py's.
    logged = [(e.step, e.value) for e in scalars(run_dir).Scalars("charts/entropy_cost")]
    costs = [cost for _, cost in logged]
    assert costs == sorted(costs, reverse=True), logged
    assert all(cost == pytest.approx(0.001, rel=1e-5) for step, cost in logged if step <= 2000), logged
    assert all(0.0001 * (1 - 1e-5) <= cost <= 0.001 * (1 + 1e-5) for cost in costs), logged
    assert costs[-1] == pytest.approx(0.0001, rel=1e-5), logged

"""Checkpoints you can trust: eval from the path alone, resume, auto-resume, bad files, kills."""

import json
import re
import signal
import time

import imageio.v2 as imageio
import pytest
import torch
from conftest import TINY_CARTPOLE, TINY_PONG, DistrlProcess, compose_train, run_distrl

from distrl.checkpoint import load_checkpoint

N = 2048


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("cartpole") / "run"
    done = run_distrl(["train", *TINY_CARTPOLE, f"train.num_train_steps={N}", "train.eval_interval=1000",
                       f"hydra.run.dir={run_dir}"])
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


def test_checkpoint_layout_and_contents(cartpole_run):
    ckpts = cartpole_run / "checkpoints"
    assert {"latest.pt", "best.pt"} <= {p.name for p in ckpts.iterdir()}
    assert all(re.fullmatch(r"step_\d{12}\.pt", p.name) for p in ckpts.glob("step_*"))
    state = torch.load(ckpts / "latest.pt", weights_only=True)
    for key in ("model", "optimizer", "scheduler", "agent_steps", "updates", "last_eval_step", "last_save_step",
                "best_eval_return", "config", "rng", "distrl_version"):
        assert key in state, key
    assert state["agent_steps"] >= N and state["config"]["env"]["id"] == "CartPole-v1"
    assert isinstance(state["rng"]["torch"], torch.Tensor)


def test_eval_prints_episodes_and_writes_results(cartpole_run, tmp_path):
    out = tmp_path / "eval"
    done = run_distrl(["eval", f"ckpt={cartpole_run}/checkpoints/latest.pt", "num_episodes=3", "seed=5",
                       f"hydra.run.dir={out}"], timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [(float(r), int(n)) for r, n in re.findall(r"episode \d+: return (\S+), length (\d+)", done.stdout)]
    results = json.loads((out / "results.json").read_text())
    assert len(printed) == 3 == results["n_episodes"]
    assert printed == list(zip(results["returns"], results["lengths"], strict=True))
    assert results["mean_return"] == pytest.approx(sum(r for r, _ in printed) / 3)
    assert results["env_id"] == "CartPole-v1" and results["agent_steps"] >= N
    assert results["deterministic"] is False and results["checkpoint"].endswith("latest.pt")


def test_eval_video_is_a_real_mp4(tmp_path):
    run_dir = tmp_path / "pong"
    done = run_distrl(["train", *TINY_PONG, "train.num_train_steps=500", "train.num_eval_episodes=0",
                       f"hydra.run.dir={run_dir}"])
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "eval"
    done = run_distrl(["eval", f"ckpt={run_dir}/checkpoints/latest.pt", "num_episodes=1", "video=true",
                       "env.max_episode_steps=60", "deterministic=true", f"hydra.run.dir={out}"], timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    reader = imageio.get_reader(out / "video.mp4")
    frames = [frame for frame in reader]
    assert len(frames) == results["lengths"][0] + 1  # the reset frame, then one per agent step
    assert frames[0].shape == (210, 160, 3)


def test_resume_continues_weights_optimizer_schedule_and_counters(cartpole_run, tmp_path):
    from distrl.engine.trainer import DistributedTrainer

    latest = cartpole_run / "checkpoints" / "latest.pt"
    state = load_checkpoint(latest)
    cfg = compose_train(TINY_CARTPOLE + [f"train.num_train_steps={2 * N}", "train.num_eval_episodes=0",
                                         f"resume={latest}"])
    trainer = DistributedTrainer(cfg, tmp_path / "resumed", progress=False)
    steps_per_update = cfg.num_steps * cfg.batch_size
    assert state["updates"] * steps_per_update == state["agent_steps"]
    expected_lr = cfg.agent.lr * (1 - state["agent_steps"] / (2 * N))
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(expected_lr)
    saved = state["optimizer"]["state"]
    for index, values in trainer.optimizer.state_dict()["state"].items():
        torch.testing.assert_close(values["square_avg"], saved[index]["square_avg"])
    for name, value in trainer.policy.learner.state_dict().items():
        torch.testing.assert_close(value, state["model"][name])
    assert trainer.counters["agent_steps"] == state["agent_steps"]

    counters = trainer.train()
    assert counters["agent_steps"] >= 2 * N and counters["updates"] > state["updates"]
    final = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "latest.pt")
    assert final["agent_steps"] >= 2 * N and final["agent_steps"] < 2 * N + 2 * steps_per_update
    records = [json.loads(line) for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert min(r["agent_steps"] for r in records) >= state["agent_steps"]  # TensorBoard steps do not restart
    assert all(r["agent_steps"] > state["agent_steps"] for r in records if "losses/total" in r)
    first_lr = next(r["charts/learning_rate"] for r in records if "charts/learning_rate" in r)
    assert first_lr <= expected_lr + 1e-12


def test_rerunning_in_the_same_run_dir_resumes(tmp_path):
    run_dir = tmp_path / "run"
    common = ["train", *TINY_CARTPOLE, "train.num_eval_episodes=0", f"hydra.run.dir={run_dir}"]
    assert run_distrl([*common, "train.num_train_steps=1000"]).returncode == 0
    first = load_checkpoint(run_dir / "checkpoints" / "latest.pt")["agent_steps"]
    done = run_distrl([*common, "train.num_train_steps=2000"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resumed at {first} agent steps" in done.stdout
    assert load_checkpoint(run_dir / "checkpoints" / "latest.pt")["agent_steps"] >= 2000
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["agent_steps"] for r in records if "losses/total" in r]
    assert losses == sorted(losses) and losses[-1] >= 2000  # the second run's steps continue the first's

    done = run_distrl([*common, "train.num_train_steps=600", "resume=false"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert load_checkpoint(run_dir / "checkpoints" / "latest.pt")["agent_steps"] < 1000


def test_resume_with_another_env_names_the_mismatch(cartpole_run, tmp_path):
    done = run_distrl(["train", *TINY_CARTPOLE, "env.id=Acrobot-v1", f"resume={cartpole_run}",
                       f"hydra.run.dir={tmp_path}/run"], timeout=60)
    assert done.returncode == 2
    assert "cannot resume" in done.stderr
    assert "env.id='CartPole-v1' in the checkpoint, env.id='Acrobot-v1' here" in done.stderr
    assert "Traceback" not in done.stderr and not done.children


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_eval_without_ckpt_says_so(tmp_path):
    done = run_distrl(["eval", f"hydra.run.dir={tmp_path}/eval"], timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "ckpt is missing" in done.stderr


@pytest.mark.parametrize("case", ["missing", "directory", "truncated", "not_distrl", "pickled"])
def test_bad_checkpoints_are_refused(case, cartpole_run, tmp_path):
    marker = tmp_path / "EXECUTED"
    path = tmp_path / "ckpt.pt"
    if case == "directory":
        path = tmp_path
    elif case == "truncated":
        data = (cartpole_run / "checkpoints" / "latest.pt").read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif case == "not_distrl":
        torch.save({"weights": torch.zeros(3)}, path)
    elif case == "pickled":
        torch.save({"distrl_version": "0.1.0", "model": {}, "config": {}, "agent_steps": 0,
                    "payload": _Evil(str(marker))}, path)
    done = run_distrl(["eval", f"ckpt={path}", f"hydra.run.dir={tmp_path}/eval"], timeout=60)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"distrl eval: error: {path}"), done.stderr
    assert "Traceback" not in done.stderr
    assert not marker.exists()  # nothing from the file was executed


def test_sigkill_during_frequent_saves_leaves_a_loadable_latest(tmp_path):
    run_dir = tmp_path / "run"
    proc = DistrlProcess(["train", *TINY_PONG, "train.num_train_steps=10000000", "train.save_interval=80",
                          "train.keep_checkpoints=3", "train.num_eval_episodes=0", f"hydra.run.dir={run_dir}"])
    ckpts = run_dir / "checkpoints"
    assert proc.wait_for(lambda: len(list(ckpts.glob("step_*.pt"))) >= 3, timeout=120)
    time.sleep(1.3)
    proc.signal(signal.SIGKILL)
    proc.finish(timeout=30)
    state = load_checkpoint(ckpts / "latest.pt")
    assert state["agent_steps"] > 0
    assert len(list(ckpts.glob("step_*.pt"))) <= 3 + 1  # rotation keeps 3 (+1 being written at the kill)
    for child in proc.children:  # actors notice their parent is gone
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                import psutil

                if psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"child {child} outlived its SIGKILLed parent")


def test_init_model_path_loads_weights_only(cartpole_run, tmp_path):
    from distrl.engine.trainer import DistributedTrainer

    path = cartpole_run / "checkpoints" / "latest.pt"
    state = load_checkpoint(path)
    cfg = compose_train(TINY_CARTPOLE + [f"train.init_model_path={path}"])
    trainer = DistributedTrainer(cfg, tmp_path / "finetune", progress=False)
    for name, value in trainer.policy.learner.state_dict().items():
        torch.testing.assert_close(value, state["model"][name])
    for name, value in trainer.policy.actor.state_dict().items():  # published to the actors too
        torch.testing.assert_close(value, state["model"][name])
    assert trainer.counters["agent_steps"] == 0 and trainer.counters["updates"] == 0
    assert trainer.optimizer.state_dict()["state"] == {}
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(cfg.agent.lr)


def test_resume_from_best_continues_from_the_best_evaluation(cartpole_run, tmp_path):
    from distrl.engine.trainer import DistributedTrainer

    best = cartpole_run / "checkpoints" / "best.pt"
    state = load_checkpoint(best)
    assert state["best_eval_return"] > -float("inf")
    # one moment: the counters match the weights' updates, and the last save lies before it
    assert state["agent_steps"] == state["updates"] * state["config"]["num_steps"] * state["config"]["batch_size"]
    assert state["last_save_step"] <= state["agent_steps"]
    assert state["scheduler"]["last_epoch"] == state["updates"]
    cfg = compose_train(TINY_CARTPOLE + [f"resume={best}", "train.num_eval_episodes=0",
                                         f"train.num_train_steps={state['agent_steps'] + 400}"])
    trainer = DistributedTrainer(cfg, tmp_path / "from-best", progress=False)
    assert trainer.counters["agent_steps"] == state["agent_steps"]
    assert trainer.counters["best_eval_return"] == state["best_eval_return"]
    for name, value in trainer.policy.actor.state_dict().items():  # the actors start with the best weights
        torch.testing.assert_close(value, state["model"][name])
    counters = trainer.train()
    assert counters["agent_steps"] >= state["agent_steps"] + 400
    latest = load_checkpoint(tmp_path / "from-best" / "checkpoints" / "latest.pt")
    assert latest["agent_steps"] == counters["agent_steps"]

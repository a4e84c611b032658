"""``distrl train`` end to end on real envs: through the real command (Pong), and through the trainer
in this process (CartPole with an LSTM; in the long tier, Pong on Gymnasium's wrappers with the
IMPALA ResNet).

Each run combines settings that once hung or broke apart, so that one run checks several."""

from pathlib import Path

import pytest
import torch
from conftest import TINY_CARTPOLE, TINY_PONG, compose_train, metrics, run_distrl
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from distrl.config.host import resolve_precision
from distrl.runtime.trainer import Trainer
from distrl.utils.checkpoint import load_checkpoint


def scalars(run_dir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return acc


def check_run(run_dir: Path, num_train_steps: int) -> None:
    latest = run_dir / "checkpoints" / "latest.pt"
    state = torch.load(latest, weights_only=True)
    assert state["agent_steps"] >= num_train_steps
    assert state["config"]["train"]["num_train_steps"] == num_train_steps
    assert {"model", "optimizer", "rng", "distrl_version", "updates"} <= set(state)
    assert (run_dir / "config.yaml").is_file()

    acc = scalars(run_dir)
    tags = set(acc.Tags()["scalars"])
    assert {"losses/total", "charts/SPS", "charts/learning_rate", "charts/policy_lag"} <= tags
    assert tags & {"charts/episodic_return", "eval/mean_return"}
    losses = acc.Scalars("losses/total")
    steps = [e.step for e in losses]
    # one point per log, the last at the end (a second learner may finish one more update after it)
    assert steps == sorted(set(steps)) and num_train_steps <= steps[-1] <= state["agent_steps"]

    logged = metrics(run_dir)
    assert all({"agent_steps", "frames", "time"} <= set(r) for r in logged)
    # where the learner's time went, per update: every update computes and publishes, so those take time
    timed = [r for r in logged if "perf/learner_step_ms" in r]
    assert timed
    for r in timed:
        ms = {name: r[f"perf/learner_{name}_ms"] for name in ("wait", "gather", "step", "publish")}
        assert all(value >= 0 for value in ms.values()) and ms["step"] > 0 and ms["publish"] > 0, ms
    assert {"perf/learner_wait_ms", "perf/learner_step_ms"} <= tags
    # the encoder's dormant units, with every 5th log record and the last: a share per activation layer
    dormant = [r for r in logged if any(key.startswith("dormant/") for key in r)]
    assert dormant and dormant[-1]["agent_steps"] >= num_train_steps
    shares = {key: value for key, value in dormant[-1].items() if key.startswith("dormant/")}
    assert len(shares) >= 2 and all(0.0 <= value <= 1.0 for value in shares.values()), shares
    assert set(shares) <= tags
    # and the approximate rank of its output features beside them (at most the 256 observations measured)
    assert 1 <= dormant[-1]["rank/features"] <= 256 and "rank/features" in tags
    # SPS is the agent steps between two log lines over the seconds between them
    sps = [r for r in logged if "charts/SPS" in r]
    assert sps  # (a short, fast run may log once: its first tick can already be past the budget)
    for before, after in zip(sps, sps[1:], strict=False):
        rate = (after["agent_steps"] - before["agent_steps"]) / (after["time"] - before["time"])
        assert after["charts/SPS"] == pytest.approx(rate, rel=0.5)


def test_pong_through_the_command(pong_run):
    """The shared Pong run (conftest.PONG_RUN): the previous action and reward as inputs, async
    stepping, two learners and the fewest slots validation accepts (2 x 2 envs + 4 x 2): no hang,
    and a complete run directory. Outside a terminal the first lines say where, what, how big and
    how to stop, and the progress is plain lines, not a bar."""
    run_dir, done = pong_run.run_dir, pong_run.done
    assert len(done.children) >= 2  # the actors really ran as processes
    assert done.alive_children() == []
    check_run(run_dir, pong_run.steps)
    state = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    assert state["frames"] == 4 * state["agent_steps"] and state["obs_shape"] == [4, 84, 84]
    assert "charts/FPS" in set(scalars(run_dir).Tags()["scalars"])

    lines = done.stdout.splitlines()
    head = "\n".join(lines[:4])
    assert f"run directory {run_dir}" in head
    assert "ALE/Pong-v5" in head and "2 actor(s) x 2 envs, T=20, B=4" in head and "parameters" in head
    assert "Ctrl-C stops and saves a checkpoint" in head
    precision, why = resolve_precision("auto", torch.device("cpu"))  # the first lines say which arithmetic runs
    assert f"precision: learner {precision} ({why}), actors {precision}" in head
    assert "\r" not in done.stdout and "\r" not in done.stderr
    assert "step/s" not in done.stderr  # no tqdm bar
    assert sum("steps=" in line and "SPS=" in line for line in lines) >= 2  # the periodic plain lines


def _train_here(overrides: list[str], run_dir: Path) -> tuple[Trainer, dict]:
    trainer = Trainer(compose_train(overrides), run_dir, progress=False)
    return trainer, trainer.train()


def test_cartpole_lstm_two_prefetching_learners_time_limit_and_a_linear_entropy_cost(tmp_path):
    """In this process: an LSTM core in bf16 (on any CPU), 30-step episodes, two learners on the fewest
    slots (issue #9 saw 128 steps, then a hang, with 5), each copying its next batch beside its update
    (``train.prefetch``) and running its network in 2 parts on 2 threads (``learner_split``; the
    LSTM's states split with their unrolls), and ``agent.entropy_schedule=linear``: every update's
    entropy cost is ``agent.entropy_cost`` times the learning rate's decay factor, so it falls to
    near 0 by the end. Afterwards every slot index is back on the free queue: none lost, none twice."""
    steps = 8000
    trainer, counters = _train_here(
        [*TINY_CARTPOLE, "model.use_lstm=true", "precision=bf16", "env.max_episode_steps=30", "num_learners=2",
         "num_slots=12", "train.prefetch=true", "learner_split=2", "learner_threads=2",
         "agent.entropy_schedule=linear", f"train.num_train_steps={steps}", "train.num_eval_episodes=0"], tmp_path)
    assert counters["agent_steps"] >= steps
    check_run(tmp_path, steps)
    assert "rollout slots at shutdown" not in (tmp_path / "train.log").read_text()  # every slot came back once
    lengths = [r["charts/episodic_length"] for r in metrics(tmp_path) if "charts/episodic_length" in r]
    assert lengths and max(lengths) <= 30

    agent = load_checkpoint(tmp_path / "checkpoints" / "latest.pt")["config"]["agent"]
    acc = scalars(tmp_path)
    costs = [e.value for e in acc.Scalars("charts/entropy_cost")]
    rates = [e.value for e in acc.Scalars("charts/learning_rate")]
    assert len(costs) == len(rates) >= 3
    for cost, rate in zip(costs, rates, strict=True):
        assert cost / agent["entropy_cost"] == pytest.approx(rate / agent["lr"], rel=1e-4)
    assert costs == sorted(costs, reverse=True) and costs[-1] < 0.3 * agent["entropy_cost"] < costs[0]


@pytest.mark.long
def test_pong_on_gymnasium_wrappers_with_the_impala_resnet(tmp_path):
    """In this process: ``env.backend=gymnasium`` (Gymnasium's Atari wrappers instead of ale-py's
    vector env) and the IMPALA ResNet, evaluated once."""
    steps = 800
    _, counters = _train_here([*TINY_PONG, "env.backend=gymnasium", "model=impala_resnet",
                               f"train.num_train_steps={steps}", f"train.eval_interval={steps}"], tmp_path)
    assert counters["agent_steps"] >= steps
    check_run(tmp_path, steps)
    state = load_checkpoint(tmp_path / "checkpoints" / "latest.pt")
    assert state["frames"] == 4 * state["agent_steps"] and state["obs_shape"] == [4, 84, 84]
    assert any("eval/mean_return" in r for r in metrics(tmp_path))


@pytest.mark.long
def test_cartpole_compiled(tmp_path):
    """``train.th_compile=true``: the learner network and the agent's loss through ``torch.compile``
    (inductor; about 20 s of compiling), through the real command."""
    run_dir = tmp_path / "run"
    done = run_distrl(["train", *TINY_CARTPOLE, "train.th_compile=true", "train.num_train_steps=1000",
                       f"hydra.run.dir={run_dir}"], timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.alive_children() == []
    check_run(run_dir, 1000)


@pytest.mark.long
def test_multirun_gives_one_complete_run_per_job(tmp_path):
    sweep = tmp_path / "sweep"
    done = run_distrl(["train", "-m", "seed=1,2", *TINY_CARTPOLE, "num_actors=1", "train.num_train_steps=400",
                       "train.num_eval_episodes=1", f"hydra.sweep.dir={sweep}"], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.alive_children() == []
    for job, seed in (("0", 1), ("1", 2)):
        state = load_checkpoint(sweep / job / "checkpoints" / "latest.pt")
        assert state["config"]["seed"] == seed
        check_run(sweep / job, 400)

"""Several ranks on loopback (gloo): resume across rank counts; in the long tier, two ranks through
the built-in launcher, torchrun, two launches at once and a lost rank."""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil
import pytest
from conftest import TINY_CARTPOLE, TINY_PONG, DistrlProcess, assert_actor_holds, compose_train, metrics, run_distrl
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from distrl.runtime.trainer import Trainer
from distrl.utils.checkpoint import load_checkpoint

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
# one actor per rank: two ranks share the 2 cores of a small machine
CARTPOLE = [*TINY_CARTPOLE, "num_actors=1", "env.max_episode_steps=20", "train.num_train_steps=12000"]
TWO_RANKS = [*CARTPOLE, "train.num_train_steps=5000", "train.num_eval_episodes=0"]


def _episodes(run_dir) -> list[dict]:
    return [r for r in metrics(run_dir) if "charts/episodic_length" in r]


@pytest.mark.long
def test_two_ranks_train_one_run_with_identical_weights(tmp_path):
    run_dir = tmp_path / "run"
    if len(os.sched_getaffinity(0)) < 2:  # one core: two ranks are refused before any process starts
        done = run_distrl(["train", *TWO_RANKS, "distributed.nproc_per_node=2", f"hydra.run.dir={run_dir}"])
        assert done.returncode == 2 and not done.children, done.stderr[-3000:]
        assert "distributed.nproc_per_node=2 is not allowed: at most the 1 cores" in done.stderr
        assert not (run_dir / "checkpoints").exists() and not (run_dir / "metrics.jsonl").exists()
        return
    # check_interval=1: the ranks compare their weights after every update (a difference ends the run)
    done = run_distrl(["train", *TWO_RANKS, "distributed.nproc_per_node=2", "distributed.check_interval=1",
                       f"hydra.run.dir={run_dir}"], timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.alive_children() == []
    state = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    # agent steps are global: every update consumed T x B on each of the 2 ranks
    assert state["agent_steps"] == state["updates"] * 20 * 4 * 2 >= 5000
    log = (run_dir / "train.log").read_text()
    assert "rank 0 of 2" in log and "effective batch B x ranks = 8" in log
    # both ranks' episodes reach rank 0's logs: their lengths add up to about the agent steps of both
    # (20-step episodes; one rank's alone would be half; the last moments' episodes may be missing)
    lengths = sum(r["charts/episodic_length"] for r in _episodes(run_dir))
    assert lengths > 0.8 * state["agent_steps"]
    tb = EventAccumulator(str(run_dir / "tb"))
    tb.Reload()
    assert len(tb.Scalars("charts/episodic_return")) == len(_episodes(run_dir))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # one run directory

    # a checkpoint of 2 ranks continues on 1: counters, schedule position, weights
    cfg = compose_train([*TWO_RANKS, "train.num_train_steps=10000", f"resume={run_dir}"])
    trainer = Trainer(cfg, tmp_path / "one", progress=False)
    assert trainer.counters["agent_steps"] == state["agent_steps"]
    assert trainer.position.updates == state["agent_steps"] // (20 * 4)  # T x B of one rank
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(cfg.agent.lr * (1 - state["agent_steps"] / 10000))
    assert_actor_holds(trainer.networks.actor.state_dict(), state["model"])


@pytest.mark.long
def test_two_ranks_keep_one_set_of_observation_return_and_value_statistics(tmp_path):
    """experiment=mujoco on two ranks, collecting synchronously: each rank's batch moments are summed
    across ranks before the statistics are updated; the weights and the statistics are compared after
    every update."""
    run_dir = tmp_path / "run"  # two cores, as CI has (on one, the test above checks the refusal)
    done = run_distrl(["train", "experiment=mujoco", "env.id=Pendulum-v1", "num_actors=1", "envs_per_actor=8",
                       "train.sync=true", "agent.normalize_values=true", "agent.normalize_rewards=true",
                       "num_steps=16", "batch_size=8", "agent.num_minibatches=4", "agent.num_epochs=2",
                       "train.num_train_steps=4096", "train.num_eval_episodes=0", "distributed.nproc_per_node=2",
                       "distributed.check_interval=1", f"hydra.run.dir={run_dir}"], timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    state = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    # both ranks' T steps of every update reached the statistics: 2 x 16 x 8 per update
    assert state["model"]["obs_norm.count"].item() == pytest.approx(state["updates"] * 2 * 16 * 8, abs=1)
    assert state["model"]["return_norm.count"].item() == pytest.approx(state["updates"] * 2 * 16 * 8, abs=1)
    assert state["model"]["value_norm.count"].item() == state["updates"] * 2 * 16 * 8 + 1  # its prior: one sample


@pytest.mark.long
def test_torchrun_starts_the_ranks_of_pong(tmp_path):
    run_dir = tmp_path / "run"
    done = run_distrl(["--standalone", "--nproc-per-node=2", "-m", "distrl", "train", *TINY_PONG, "num_actors=1",
                       "train.num_train_steps=1200", f"hydra.run.dir={run_dir}"], timeout=240, launcher=TORCHRUN)
    assert done.returncode == 0, done.stderr[-3000:]
    state = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    assert state["agent_steps"] == state["updates"] * 20 * 4 * 2 >= 1200
    assert done.alive_children() == []


@pytest.mark.long
def test_two_launches_at_once_do_not_collide(tmp_path):
    procs = [DistrlProcess(["train", *CARTPOLE, "distributed.nproc_per_node=2", f"hydra.run.dir={tmp_path}/{i}"])
             for i in range(2)]
    for i, proc in enumerate(procs):
        done = proc.finish(timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        assert load_checkpoint(tmp_path / str(i) / "checkpoints" / "latest.pt")["agent_steps"] >= 12000


def _rank_process(proc: DistrlProcess, rank: int):
    for child in proc.poll_children():
        try:
            if child.environ().get("RANK") == str(rank) and "distrl" in " ".join(child.cmdline()):
                return child
        except psutil.NoSuchProcess:
            continue
    return None


@pytest.mark.long
def test_a_lost_rank_stops_the_others_and_a_restart_resumes(tmp_path):
    # without restarts: the other rank is stopped, saves, and the command names the rank
    # The launcher terminates the survivor soon after: that SIGTERM may come before or after the
    # survivor's own collective fails; "terminated" sends it first.
    for survivor in ("left", "terminated"):
        run_dir = tmp_path / survivor
        proc = DistrlProcess(["train", *CARTPOLE, "train.num_train_steps=10000000", "train.save_interval=100000000",
                              "distributed.nproc_per_node=2", f"hydra.run.dir={run_dir}"])
        assert proc.wait_for(lambda: (run_dir / "metrics.jsonl").exists()  # noqa: B023
                             and "losses/total" in (run_dir / "metrics.jsonl").read_text(), timeout=120)  # noqa: B023
        victim, other = _rank_process(proc, 1), _rank_process(proc, 0)
        assert victim is not None and other is not None
        if survivor == "terminated":
            other.send_signal(signal.SIGTERM)
        victim.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        done = proc.finish(timeout=90)
        assert time.monotonic() - killed_at < 60
        assert done.returncode == 1, done.stderr[-3000:]
        assert "rank 1 failed" in done.stderr.strip().splitlines()[-1], done.stderr[-3000:]
        assert "a collective failed (another rank died or stopped)" in done.stderr, done.stderr[-3000:]
        assert f"a checkpoint was saved in {run_dir}/checkpoints" in done.stderr
        assert "training stopped after a lost rank at" in (run_dir / "train.log").read_text()
        state = load_checkpoint(run_dir / "checkpoints" / "latest.pt")  # rank 0's weights, intact
        assert state["agent_steps"] == state["updates"] * 20 * 4 * 2 > 0
        assert done.alive_children() == []

    # with distributed.max_restarts=1: the group starts again and continues from latest.pt
    run_dir = tmp_path / "restart"
    proc = DistrlProcess(["train", *CARTPOLE, "train.num_train_steps=30000", "train.save_interval=2000",
                          "distributed.nproc_per_node=2", "distributed.max_restarts=1", f"hydra.run.dir={run_dir}"])
    latest = run_dir / "checkpoints" / "latest.pt"
    assert proc.wait_for(latest.exists, timeout=120)
    victim = _rank_process(proc, 1)
    assert victim is not None
    victim.send_signal(signal.SIGKILL)
    done = proc.finish(timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed at" in (run_dir / "train.log").read_text()
    assert load_checkpoint(latest)["agent_steps"] >= 30000
    assert done.alive_children() == []



@pytest.mark.long
def test_ctrl_c_stops_the_ranks_together_and_saves(tmp_path):
    # Stopped in the middle of the ranks' collectives, a rank used to abort (SIGABRT, gloo's
    # "Connection closed by peer") in 2 of 3 tries; now the ranks stop after the same update.
    for target in ("all", 1):
        run_dir = tmp_path / str(target)
        proc = DistrlProcess(["train", *CARTPOLE, "train.num_train_steps=10000000", "train.save_interval=100000000",
                              "train.num_eval_episodes=0", "distributed.nproc_per_node=2", f"hydra.run.dir={run_dir}"])
        assert proc.wait_for(lambda: (run_dir / "metrics.jsonl").exists()  # noqa: B023
                             and "losses/total" in (run_dir / "metrics.jsonl").read_text(), timeout=120)  # noqa: B023
        if target == "all":
            proc.signal(signal.SIGINT)  # Ctrl-C: the terminal's process group, the launcher and both ranks
        else:
            victim = _rank_process(proc, target)
            assert victim is not None
            victim.send_signal(signal.SIGINT)  # one rank alone: the other stops with it
        done = proc.finish(timeout=60)
        assert done.returncode == 130, done.stderr[-3000:]
        assert "IoException" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
        state = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
        assert state["agent_steps"] == state["updates"] * 20 * 4 * 2 > 0
        log = (run_dir / "train.log").read_text()
        assert "training interrupted at" in log
        if target != "all":
            assert "rank 1 was stopped: this rank stops with it" in log
            assert "a rank was interrupted; the ranks stopped together" in done.stderr
        assert done.alive_children() == []

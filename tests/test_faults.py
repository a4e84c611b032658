"""Faults a long run meets: dead actors, hangs, signals, preemption, impossible sizes, bad numbers,
full disks, typos. Each drives the real ``distrl`` command (or the trainer, where a fault is injected)."""

from __future__ import annotations

import errno
import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY_CARTPOLE, TINY_PONG, DistrlProcess, compose_train, run_distrl

from distrl.checkpoint import load_checkpoint

TESTS_DIR = str(Path(__file__).resolve().parent)


def _actors(proc: DistrlProcess) -> list:
    return [p for p in proc.poll_children() if "multiprocessing" in " ".join(p.cmdline())
            and "resource_tracker" not in " ".join(p.cmdline())]


def _trained(run_dir: Path) -> bool:
    metrics = run_dir / "metrics.jsonl"
    return metrics.exists() and "losses/total" in metrics.read_text()


def _consistent(state: dict) -> bool:
    cfg = state["config"]
    return state["agent_steps"] == state["updates"] * cfg["num_steps"] * cfg["batch_size"]


def test_a_killed_actor_is_restarted_and_the_run_finishes_with_every_slot(tmp_path):
    run_dir = tmp_path / "run"
    # synchronous stepping (as with a CPU learner) on any machine, so that pin_actors=auto pins
    proc = DistrlProcess(["train", *TINY_PONG, "env.async_step=false", "train.num_train_steps=6000",
                          "train.num_eval_episodes=0", f"hydra.run.dir={run_dir}"])
    assert proc.wait_for(lambda: _trained(run_dir), timeout=120)
    actors = _actors(proc)
    assert len(actors) == 2
    # pin_actors=auto with synchronous stepping: each actor on one core of its own (while there are enough)
    allowed = sorted(os.sched_getaffinity(0))
    cores = sorted(p.cpu_affinity() for p in actors)
    assert all(len(c) == 1 and c[0] in allowed for c in cores)
    assert len(allowed) < 2 or cores[0] != cores[1]
    actors[0].send_signal(signal.SIGKILL)
    done = proc.finish(timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    log = (run_dir / "train.log").read_text()
    assert "actor 0 died (killed by SIGKILL): restarted" in log
    assert "slots not returned" not in log
    assert load_checkpoint(run_dir / "checkpoints" / "latest.pt")["agent_steps"] >= 6000
    restarts = [json.loads(line).get("charts/actor_restarts") for line in (run_dir / "metrics.jsonl").open()]
    assert max(r for r in restarts if r is not None) == 1
    assert done.alive_children() == []


def _failing_run(env_id: str, run_dir: Path, *overrides: str):
    """CartPole's settings on a test env of failing_env.py, until it fails: the result and its last line."""
    done = run_distrl(["train", *TINY_CARTPOLE, f"env.id=failing_env:{env_id}", "train.num_train_steps=1000000",
                       *overrides, f"hydra.run.dir={run_dir}"], env={"PYTHONPATH": TESTS_DIR}, timeout=180)
    assert done.returncode == 1, done.stderr[-3000:]
    return done, done.stderr.strip().splitlines()[-1]


def test_an_env_that_always_fails_stops_after_the_restart_budget(tmp_path):
    run_dir = tmp_path / "run"
    done, last = _failing_run("FailsAfterSteps-v0", run_dir, "train.max_actor_restarts=2")
    assert "after 2 actor restarts" in last and "the emulator broke at step" in last, done.stderr[-3000:]
    assert "train.max_actor_restarts=2" in last
    log = (run_dir / "train.log").read_text()
    assert log.count("restarted (restart") == 2
    assert done.alive_children() == []
    state = load_checkpoint(run_dir / "checkpoints" / "latest.pt")  # a consistent checkpoint to resume from
    assert _consistent(state)


def test_a_hung_env_trips_the_stall_watchdog(tmp_path):
    run_dir = tmp_path / "run"
    # the watchdog's clock starts before the actors are up: 10 s leaves a slow, busy machine time to
    # spawn them and take its first steps (4 s did not on a 2-core EPYC beside a training run)
    done, last = _failing_run("HangsAfterSteps-v0", run_dir, "train.stall_timeout=10")
    assert "stalled: no agent step consumed for" in last and "train.stall_timeout=10" in last, done.stderr[-3000:]
    log = (run_dir / "train.log").read_text()
    assert "actor 0 (pid" in log and "last step" in log and "free" in log
    assert "distrl-learner-0: alive, waiting for full slots" in log
    assert "did not stop in" in log  # the hung actors were killed
    assert _consistent(load_checkpoint(run_dir / "checkpoints" / "latest.pt"))
    assert done.alive_children() == []


def test_thousands_of_slots_exit_cleanly(tmp_path):
    done = run_distrl(["train", *TINY_CARTPOLE, "num_storages=6000", "train.num_train_steps=500",
                       "train.num_eval_episodes=0", f"hydra.run.dir={tmp_path}/run"], timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "slots not returned" not in (tmp_path / "run" / "train.log").read_text()


@pytest.mark.parametrize("override, key", [
    ("num_actors=100000", "num_actors=100000 is not allowed"),
    ("num_storages=100000000", "num_storages=100000000 is not allowed: at most"),
])
def test_impossible_sizes_are_refused_before_anything_starts(override, key, tmp_path):
    done = run_distrl(["train", *TINY_PONG, override, f"hydra.run.dir={tmp_path}/run"], timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip().splitlines()[-1]]  # one line
    assert key in done.stderr
    assert not done.children


def test_slots_larger_than_shared_memory_are_refused(tmp_path):
    # 130,000 Pong slots of T=200: about 2.2 TB
    done = run_distrl(["train", "num_steps=200", "num_storages=130000", f"hydra.run.dir={tmp_path}/run"], timeout=60)
    assert done.returncode == 2
    assert "num_storages=130000 is not allowed: the slots need" in done.stderr and "GiB" in done.stderr
    assert not done.children


def test_sigterm_leaves_no_slot_behind_and_sigkill_nothing_in_dev_shm(tmp_path):
    before = set(os.listdir("/dev/shm"))
    run_dir = tmp_path / "run"
    proc = DistrlProcess(["train", *TINY_PONG, "train.num_train_steps=10000000", f"hydra.run.dir={run_dir}"])
    assert proc.wait_for(lambda: _trained(run_dir), timeout=120)
    proc.signal(signal.SIGTERM)
    done = proc.finish(timeout=30)
    assert done.returncode == 143, done.stderr[-3000:]
    assert "slots not returned" not in (run_dir / "train.log").read_text()
    assert load_checkpoint(run_dir / "checkpoints" / "latest.pt")["agent_steps"] > 0
    assert done.alive_children() == []

    proc = DistrlProcess(["train", *TINY_PONG, "train.num_train_steps=10000000", f"hydra.run.dir={tmp_path}/k"])
    assert proc.wait_for(lambda: _trained(tmp_path / "k"), timeout=120)
    proc.signal(signal.SIGKILL)
    proc.finish(timeout=30)
    time.sleep(1)
    assert set(os.listdir("/dev/shm")) - before == set()


def test_ctrl_c_twice_still_writes_the_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    proc = DistrlProcess(["train", *TINY_PONG, "train.num_train_steps=10000000", "train.save_interval=100000000",
                          f"hydra.run.dir={run_dir}"])
    assert proc.wait_for(lambda: _trained(run_dir), timeout=120)
    proc.signal(signal.SIGINT)
    time.sleep(0.3)
    proc.signal(signal.SIGINT)
    done = proc.finish(timeout=30)
    assert done.returncode == 130, done.stderr[-3000:]
    assert "already stopping" in done.stdout + done.stderr
    assert _consistent(load_checkpoint(run_dir / "checkpoints" / "latest.pt"))
    assert done.alive_children() == []


def test_sigusr1_saves_and_training_goes_on(tmp_path):
    run_dir = tmp_path / "run"
    proc = DistrlProcess(["train", *TINY_CARTPOLE, "train.num_train_steps=20000", "train.save_interval=100000000",
                          "train.num_eval_episodes=0", f"hydra.run.dir={run_dir}"])
    assert proc.wait_for(lambda: _trained(run_dir), timeout=120)
    proc.signal(signal.SIGUSR1)  # the whole group, as `scancel --signal=USR1` does: actors ignore it
    latest = run_dir / "checkpoints" / "latest.pt"
    assert proc.wait_for(latest.exists, timeout=30)
    saved_at = load_checkpoint(latest)["agent_steps"]
    done = proc.finish(timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert 0 < saved_at < 20000 <= load_checkpoint(latest)["agent_steps"]
    assert "died" not in (run_dir / "train.log").read_text()


def test_nan_rewards_skip_updates_then_stop_and_no_checkpoint_holds_nan(tmp_path):
    run_dir = tmp_path / "run"
    _, last = _failing_run("NanRewardsAfterSteps-v0", run_dir, "train.max_nonfinite_updates=3",
                           "train.save_interval=500", "train.keep_checkpoints=100")
    assert "3 updates in a row had a non-finite loss or gradient" in last
    log = (run_dir / "train.log").read_text()
    # a batch of slots filled before the rewards turned NaN is finite and resets the count, so how
    # many are skipped in all depends on timing; the last three in a row are what stopped the run
    assert log.count("skipped: non-finite loss") >= 3 and "(3 in a row)" in log
    files = sorted((run_dir / "checkpoints").glob("step_*.pt"))
    assert files  # saved while the rewards were finite (4 envs x 10,000 steps each)
    for path in files:
        state = load_checkpoint(path)
        assert all(torch.isfinite(v).all() for v in state["model"].values()), path


def test_a_failed_save_keeps_the_last_checkpoint_and_training_goes_on(tmp_path, monkeypatch):
    """A full disk, injected: the write fails with ENOSPC after part of the file is written."""
    from distrl.engine.trainer import DistributedTrainer, TrainingError

    cfg = compose_train(TINY_CARTPOLE + ["train.num_eval_episodes=0", "train.save_interval=500"])
    trainer = DistributedTrainer(cfg, tmp_path, progress=False)
    first = trainer.save()
    real_save = torch.save

    def disk_full(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(TrainingError, match="the final checkpoint could not be written"):
        trainer.train()
    assert trainer.stats.agent_steps >= 3000  # training went on to its budget
    directory = tmp_path / "checkpoints"
    assert sorted(p.name for p in directory.iterdir()) == sorted([first.name, "latest.pt"])  # no temp file
    assert load_checkpoint(directory / "latest.pt")["agent_steps"] == 0
    log = (tmp_path / "train.log").read_text()
    assert "checkpoint not saved, training goes on" in log and "No space left on device" in log
    monkeypatch.setattr(torch, "save", real_save)
    trainer.save()  # the disk has room again
    assert load_checkpoint(directory / "latest.pt")["agent_steps"] >= 3000


def test_metrics_that_cannot_be_written_do_not_end_the_run(tmp_path):
    run_dir = tmp_path / "run"
    proc = DistrlProcess(["train", *TINY_CARTPOLE, "train.num_train_steps=20000", "train.num_eval_episodes=0",
                          f"hydra.run.dir={run_dir}"])
    assert proc.wait_for(lambda: _trained(run_dir), timeout=120)
    for path in (run_dir / "tb").iterdir():  # the TensorBoard directory goes away under the writer
        path.unlink()
    (run_dir / "tb").rmdir()
    done = proc.finish(timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert load_checkpoint(run_dir / "checkpoints" / "latest.pt")["agent_steps"] >= 20000
    assert "metrics: cannot write" in (run_dir / "train.log").read_text()
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("override, message", [
    ("+foo=1", "foo is not a key of this config"),
    ("+train.num_train_step=2000", "train.num_train_step is not a key of this config (did you mean "
                                   "train.num_train_steps?)"),
    ("+agent.lr_decay=0.5", "agent.lr_decay is not a key"),
])
def test_keys_added_with_plus_are_refused(override, message, tmp_path):
    done = run_distrl(["train", *TINY_CARTPOLE, override, f"hydra.run.dir={tmp_path}/run"], timeout=60)
    assert done.returncode == 2
    assert message in done.stderr
    assert not done.children

"""Faults a long run meets: dead actors, hangs, signals, bad numbers, full disks. Signals go to the
real ``distrl`` command; faults inside the run go to the trainer in this process where that shows
the same (an env of failing_env.py, a ``torch.save`` that fails).

Impossible sizes and keys added with ``+`` are test_config.py's; metrics that cannot be written,
test_logs.py's; a kill in the middle of a save, test_checkpoints.py's. The stall watchdog (its
timeout alone is 10 s) and the restart budget (three actor starts) are in the long tier."""

from __future__ import annotations

import errno
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
import torch
from conftest import TINY_CARTPOLE, DistrlProcess, compose_train, run_distrl

from distrl import runs
from distrl.runtime import supervisor
from distrl.runtime.trainer import Stalled, Trainer, TrainingError
from distrl.utils.checkpoint import load_checkpoint

TESTS_DIR = str(Path(__file__).resolve().parent)


def _actors(proc: DistrlProcess) -> list:
    return [p for p in proc.poll_children() if "multiprocessing" in " ".join(p.cmdline())
            and "resource_tracker" not in " ".join(p.cmdline())]


def _records(run_dir: Path) -> list[dict]:
    return runs.metrics(run_dir) if (run_dir / "metrics.jsonl").exists() else []


def _trained(run_dir: Path) -> bool:
    return any("losses/total" in r for r in _records(run_dir))


def _consistent(state: dict) -> bool:
    cfg = state["config"]
    return state["agent_steps"] == state["updates"] * cfg["num_steps"] * cfg["batch_size"]


def _children_left() -> list[str]:
    """This process's children still running (the resource tracker of multiprocessing aside)."""
    deadline = time.monotonic() + 5
    while True:
        left = []
        for child in psutil.Process().children(recursive=True):
            try:
                if child.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(child.cmdline()):
                    left.append(f"{child.pid} {' '.join(child.cmdline())[:200]}")
            except psutil.NoSuchProcess:
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def test_a_killed_actor_is_restarted_and_ctrl_c_twice_stops_thousands_of_slots(tmp_path):
    """Synchronous stepping pins each actor to a core of its own; a SIGKILLed actor is restarted with
    its slots and training goes on; Ctrl-C twice still writes a consistent checkpoint, every one of
    6,000 slots comes back, and nothing is left running."""
    run_dir = tmp_path / "run"
    proc = DistrlProcess(["train", *TINY_CARTPOLE, "num_slots=6000", "train.num_train_steps=10000000",
                          "train.save_interval=100000000", "train.num_eval_episodes=0", f"hydra.run.dir={run_dir}"])
    assert proc.wait_for(lambda: _trained(run_dir), timeout=120)
    allowed = sorted(os.sched_getaffinity(0))

    def pinned() -> list:  # each actor pins itself as it starts
        try:
            return sorted(p.cpu_affinity() for p in _actors(proc))
        except psutil.NoSuchProcess:
            return []

    assert proc.wait_for(lambda: len(pinned()) == 2 and all(len(c) == 1 for c in pinned()), timeout=30), pinned()
    cores = pinned()
    assert all(c[0] in allowed for c in cores) and (len(allowed) < 2 or cores[0] != cores[1])
    actors = _actors(proc)

    actors[0].send_signal(signal.SIGKILL)
    log = run_dir / "train.log"
    assert proc.wait_for(lambda: "actor 0 died (killed by SIGKILL): restarted" in log.read_text(), timeout=60)
    at_restart = max(r["agent_steps"] for r in _records(run_dir))
    # training goes on: losses logged well after the restart
    assert proc.wait_for(lambda: any("losses/total" in r and r["agent_steps"] > at_restart + 500
                                     for r in _records(run_dir)), timeout=60)

    start = time.monotonic()
    proc.signal(signal.SIGINT)
    time.sleep(0.3)
    proc.signal(signal.SIGINT)
    done = proc.finish(timeout=30)
    assert done.returncode == 130, done.stderr[-3000:]
    assert time.monotonic() - start < 20
    assert "already stopping" in done.stdout + done.stderr
    assert "slots not returned" not in log.read_text()
    state = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    assert state["agent_steps"] > 0 and _consistent(state)
    assert max(r.get("charts/actor_restarts", 0) for r in _records(run_dir)) == 1
    assert done.alive_children() == []


@pytest.mark.long  # over 10 s end to end (12-20 s on 2 cores): the second tier
def test_sigusr1_saves_and_training_goes_on_then_sigterm_stops_the_group(tmp_path):
    run_dir = tmp_path / "run"
    proc = DistrlProcess(["train", *TINY_CARTPOLE, "train.num_train_steps=10000000", "train.save_interval=100000000",
                          "train.num_eval_episodes=0", f"hydra.run.dir={run_dir}"])
    assert proc.wait_for(lambda: _trained(run_dir), timeout=120)
    proc.signal(signal.SIGUSR1)  # the whole group, as `scancel --signal=USR1` does: actors ignore it
    latest = run_dir / "checkpoints" / "latest.pt"
    assert proc.wait_for(latest.exists, timeout=30)
    saved_at = load_checkpoint(latest)["agent_steps"]
    assert saved_at > 0
    assert proc.wait_for(lambda: max(r["agent_steps"] for r in _records(run_dir)) > saved_at + 1000, timeout=60)

    proc.signal(signal.SIGTERM)  # a preemption: the whole group
    done = proc.finish(timeout=30)
    assert done.returncode == 143, done.stderr[-3000:]
    log = (run_dir / "train.log").read_text()
    assert "slots not returned" not in log and "died" not in log
    assert load_checkpoint(latest)["agent_steps"] > saved_at
    assert done.alive_children() == []


@pytest.mark.long
def test_an_env_that_always_fails_stops_after_the_restart_budget(tmp_path):
    run_dir = tmp_path / "run"
    done = run_distrl(["train", *TINY_CARTPOLE, "env.id=failing_env:FailsAfterSteps-v0",
                       "train.num_train_steps=1000000", "train.max_actor_restarts=2", f"hydra.run.dir={run_dir}"],
                      env={"PYTHONPATH": TESTS_DIR}, timeout=180)
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("distrl train: error: ") and "after 2 actor restarts" in last, done.stderr[-3000:]
    assert "the emulator broke at step" in last and "train.max_actor_restarts=2" in last
    assert f"a checkpoint was saved in {run_dir}/checkpoints" in last
    assert (run_dir / "train.log").read_text().count("restarted (restart") == 2
    assert done.alive_children() == []
    assert _consistent(load_checkpoint(run_dir / "checkpoints" / "latest.pt"))  # one to resume from


def _train_failing(env_id: str, run_dir: Path, *overrides: str) -> Trainer:
    cfg = compose_train([*TINY_CARTPOLE, f"env.id=failing_env:{env_id}", "train.num_train_steps=1000000",
                         "train.num_eval_episodes=0", *overrides])
    return Trainer(cfg, run_dir, progress=False)


@pytest.mark.long
def test_a_hung_env_trips_the_stall_watchdog(tmp_path, monkeypatch):
    # the watchdog's clock starts before the actors are up: 10 s leaves a slow, busy machine time to
    # spawn them and take their first steps (4 s did not on a 2-core EPYC beside a training run)
    monkeypatch.setattr(supervisor, "ACTOR_JOIN_SECONDS", 1.0)  # the hung actors are killed sooner
    trainer = _train_failing("HangsAfterSteps-v0", tmp_path, "train.stall_timeout=10")
    with pytest.raises(Stalled, match=r"^stalled: no agent step consumed for \d+ s at \d+ agent steps "
                                      r"\(train.stall_timeout=10\); train.log says where"):
        trainer.train()
    log = (tmp_path / "train.log").read_text()
    assert "actor 0 (pid" in log and "last step" in log and "free" in log
    assert "distrl-learner-0: alive, waiting for full slots" in log
    assert "did not stop in" in log  # the hung actors were killed
    assert _consistent(load_checkpoint(tmp_path / "checkpoints" / "latest.pt"))
    assert _children_left() == []


def test_nan_rewards_skip_updates_then_stop_and_no_checkpoint_holds_nan(tmp_path):
    """NaN rewards from each env's 1,000th step (4,000 agent steps in all; checkpoints are saved on the
    trainer's 0.25 s tick, so a second or so of finite rewards): the updates on them are skipped,
    three in a row stop the run, and every checkpoint, one saved per tick, is finite."""
    trainer = _train_failing("NanRewardsAfterSteps-v0", tmp_path, "train.max_nonfinite_updates=3",
                             "train.save_interval=80", "train.keep_checkpoints=100")
    with pytest.raises(TrainingError, match="3 updates in a row had a non-finite loss or gradient"):
        trainer.train()
    log = (tmp_path / "train.log").read_text()
    # a batch of slots filled before the rewards turned NaN is finite and resets the count, so how
    # many are skipped in all depends on timing; the last three in a row are what stopped the run
    assert log.count("skipped: non-finite loss") >= 3 and "(3 in a row)" in log
    files = sorted((tmp_path / "checkpoints").glob("step_*.pt"))
    assert files
    for path in files:
        state = load_checkpoint(path)
        assert all(torch.isfinite(v).all() for v in state["model"].values()), path
    assert _children_left() == []


def test_a_failed_save_keeps_the_last_checkpoint_and_training_goes_on(tmp_path, monkeypatch):
    """A full disk, injected: the write fails with ENOSPC after part of the file is written. The
    error that ends the run (the command's one line) says why."""
    cfg = compose_train(TINY_CARTPOLE + ["train.num_eval_episodes=0", "train.num_train_steps=1000",
                                         "train.save_interval=300"])
    trainer = Trainer(cfg, tmp_path, progress=False)
    first = trainer.save()
    real_save = torch.save

    def disk_full(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(TrainingError, match="the final checkpoint could not be written.*No space left on device"):
        trainer.train()
    assert trainer.counters["agent_steps"] >= 1000  # training went on to its budget
    directory = tmp_path / "checkpoints"
    assert sorted(p.name for p in directory.iterdir()) == sorted([first.name, "latest.pt"])  # no temp file
    assert load_checkpoint(directory / "latest.pt")["agent_steps"] == 0
    log = (tmp_path / "train.log").read_text()
    assert "checkpoint not saved, training goes on" in log and "No space left on device" in log
    monkeypatch.setattr(torch, "save", real_save)
    trainer.save()  # the disk has room again
    assert load_checkpoint(directory / "latest.pt")["agent_steps"] >= 1000

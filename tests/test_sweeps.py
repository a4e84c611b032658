"""Hydra sweeps with jobs side by side (hydra/launcher=joblib): each job on its own share of the
cores, a sweep the machine cannot hold refused before any job starts, Ctrl-C stopping every job
with its checkpoint."""

from __future__ import annotations

import os
import re
import signal

import psutil
import pytest
import yaml
from conftest import DistrlProcess, finish_all, metrics, run_distrl

from distrl.cli.sweeps import INTERRUPTED_MARK, claim_share
from distrl.config.host import core_share

SWEEP = ["train", "-m", "experiment=cartpole", "hydra/launcher=joblib", "train.log_interval=1000"]


def test_shares_split_the_cores_and_a_claim_is_held_until_released(tmp_path):
    assert [core_share([0, 1, 2, 3], i, 2) for i in range(2)] == [(0, 1), (2, 3)]
    assert [core_share([4, 5], i, 3) for i in range(3)] == [(4,), (5,), (4,)]  # more shares than cores: one each
    before = os.sched_getaffinity(0)
    first = claim_share(tmp_path, 2)
    assert os.sched_getaffinity(0) == set(first.cores)
    second = claim_share(tmp_path, 2)  # another job (the same process here): the other share
    assert {first.index, second.index} == {0, 1}
    with pytest.raises(RuntimeError, match="all 2 core shares"):
        claim_share(tmp_path, 2)
    second.release()
    first.release()
    assert os.sched_getaffinity(0) == before
    again = claim_share(tmp_path, 2)  # a finished job's share is free again
    assert again.index == 0
    again.release()


CORES = len(os.sched_getaffinity(0))


def refused_sweeps(cores: int) -> dict[str, tuple[list[str], str]]:
    """The sweep's arguments -> the one error line (a regular expression), for a machine of ``cores``
    cores: more jobs than cores, more actors than a job's share (with 2 jobs of cores // 2 each), more
    memory than there is, Optuna told to minimise a return. On one core two jobs are already too many:
    the actors' and the memory's cases need two jobs side by side, so only the others exist there."""
    share = cores // 2
    cases = {
        "jobs": ([f"hydra.launcher.n_jobs={cores + 1}"],
                 f"hydra.launcher.n_jobs={cores + 1} jobs at once on {cores} cores: each job needs at least one core"),
        "optuna-direction": (["hydra/sweeper=optuna", "agent.lr=interval(0.001,0.01)", "seed=1"],
                             "hydra.sweeper.direction=minimize with objective=eval/mean_return: Optuna would look "
                             "for the lowest return"),
    }
    if cores >= 2:
        cases["actors"] = (["hydra.launcher.n_jobs=2", f"num_actors=1,{share + 1}"],
                           rf"num_actors={share + 1} with 2 jobs at once on {cores} cores: 2 x {share + 1} actors > "
                           rf"{cores} cores; each job has {share} core\(s\)")
        cases["memory"] = (["hydra.launcher.n_jobs=2", "num_slots=10000000000"],
                           r"2 jobs at once need about [\d.]+ GiB \([\d.]+ GiB each: rollout storage and processes\), "
                           r"this machine has [\d.]+ GiB available")
    return cases


def test_a_sweep_the_machine_cannot_hold_is_refused_before_any_job_starts(tmp_path):
    """Each way once through the real command, all started at once (their start-ups overlap)."""
    refused = refused_sweeps(CORES)
    procs = {}
    for case, (args, _) in refused.items():
        sweep = [a for a in SWEEP if not a.startswith("hydra/launcher")] if "hydra/sweeper=optuna" in args else SWEEP
        seeds = [] if "seed=1" in args else ["seed=1,2"]
        procs[case] = DistrlProcess([*sweep, *seeds, *args, f"hydra.sweep.dir={tmp_path / case}"])
    for (case, (_, message)), done in zip(refused.items(), finish_all(list(procs.values()), timeout=120),
                                          strict=True):
        assert done.returncode == 2, (case, done.stderr[-2000:])
        errors = [line for line in done.stderr.splitlines() if "error" in line]
        assert len(errors) == 1 and re.match(f"distrl train: error: {message}", errors[0]), (case, done.stderr[-2000:])
        assert not (tmp_path / case / "0").exists()


@pytest.mark.long
def test_jobs_side_by_side_take_their_own_cores_and_ctrl_c_stops_each_with_a_checkpoint(tmp_path):
    sweep_dir = tmp_path / "sweep"
    args = [*SWEEP, "seed=1,2,3,4", "hydra.launcher.n_jobs=2", "train.num_train_steps=2000000",
            f"hydra.sweep.dir={sweep_dir}"]
    proc = DistrlProcess(args)
    logs = [sweep_dir / str(job) / "train.log" for job in (0, 1)]
    started = lambda: all(p.exists() and "training to" in p.read_text() for p in logs)  # noqa: E731
    assert proc.wait_for(started, timeout=120), "the first two jobs did not start"
    jobs = [child for child in proc.poll_children() if child.pid == os.getpgid(child.pid)]
    assert len(jobs) == 2  # each job in a process group of its own
    shares = {frozenset(job.cpu_affinity()) for job in jobs}
    assert len(shares) == 2 and not set.intersection(*map(set, shares))  # two jobs, two different cores
    proc.signal(signal.SIGINT)  # a terminal's Ctrl-C: the launching process's group
    done = proc.finish(timeout=120)
    assert done.returncode == 130, done.stderr[-3000:]
    for job in (0, 1):
        ckpts = sorted((sweep_dir / str(job) / "checkpoints").glob("step_*.pt"))
        assert ckpts, f"job {job} saved no checkpoint"
    for job in (2, 3):  # waiting jobs did not start
        assert not (sweep_dir / str(job) / "checkpoints").exists()
    assert (sweep_dir / INTERRUPTED_MARK).exists()
    assert not [pid for pid in done.children if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]

    # the same command again continues: the interrupted jobs resume, the others run
    again = run_distrl([*args[:-2], "train.num_train_steps=50000", "train.num_eval_episodes=2", args[-1]],
                       timeout=240)
    assert again.returncode == 0, again.stderr[-3000:]
    text = again.stderr + "".join((sweep_dir / str(job) / "train.log").read_text() for job in range(4))
    assert text.count("resumed at") == 2
    for job in range(4):
        assert (sweep_dir / str(job) / "checkpoints" / "latest.pt").exists()
    assert not (sweep_dir / INTERRUPTED_MARK).exists()


@pytest.mark.long
def test_an_optuna_study_maximises_the_final_evaluation(tmp_path):
    sweep_dir = tmp_path / "study"
    done = run_distrl(["train", "-m", "experiment=cartpole", "train.num_train_steps=10000", "train.num_eval_episodes=3",
                       "hydra/sweeper=optuna", "hydra.sweeper.n_trials=3", "hydra.sweeper.direction=maximize",
                       "hydra.sweeper.sampler.seed=1", "agent.lr=interval(0.001,0.01)",
                       f"hydra.sweep.dir={sweep_dir}"], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    finals = []
    for trial in range(3):
        records = metrics(sweep_dir / str(trial))
        finals.append([r["eval/mean_return"] for r in records if "eval/mean_return" in r][-1])
    results = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert results["best_value"] == pytest.approx(max(finals))
    assert 0.001 <= results["best_params"]["agent.lr"] <= 0.01


def test_the_shipped_slurm_launcher_requeues_before_the_time_limit(tmp_path):
    """distrl_slurm: the plugin's SLURM launcher with a USR2 before the time limit and requeues on
    (the plugin's default is none), one task with the CPUs distrl sizes itself on."""
    done = run_distrl(["train", "hydra/launcher=distrl_slurm", "--cfg", "hydra", "-p", "hydra.launcher"], timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    launcher = yaml.safe_load(done.stdout.split("\n", 1)[1])
    assert launcher["_target_"].endswith("SlurmLauncher")
    assert launcher["signal_delay_s"] >= 120 and launcher["max_num_timeout"] > 0
    assert launcher["tasks_per_node"] == 1 and launcher["cpus_per_task"] > 1


@pytest.mark.long
def test_a_job_at_its_time_limit_saves_is_requeued_and_resumes(tmp_path):
    """submitit's local executor plays SLURM's time limit: USR2 30 s before ``timeout_min``. The job
    saves a checkpoint, submitit requeues it into the same job directory and it resumes there. (The
    run is too long to finish: once it has resumed, the test stops everything.)"""
    sweep_dir = tmp_path / "sweep"
    proc = DistrlProcess(["train", "-m", "experiment=cartpole", "seed=1", "train.num_train_steps=100000000",
                          "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=1",
                          f"hydra.sweep.dir={sweep_dir}"])
    log = sweep_dir / "0" / "train.log"
    try:
        assert proc.wait_for(lambda: log.exists() and "resumed at" in log.read_text(), timeout=180), \
            log.read_text() if log.exists() else "no train.log"
        text = log.read_text()
    finally:
        for child in proc.poll_children():
            child.kill()
        proc.signal(signal.SIGKILL)
        proc.finish(timeout=30)
    assert "exit requested: stopping actors and learners" in text
    stopped = re.search(r"training interrupted at (\d+) agent steps", text)
    assert stopped and f"resumed at {stopped.group(1)} agent steps" in text
    saved = [p.name for p in (sweep_dir / "0" / "checkpoints").glob("step_*.pt")]
    assert f"step_{int(stopped.group(1)):012d}.pt" in saved

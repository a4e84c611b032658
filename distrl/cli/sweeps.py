"""Hydra multirun sweeps of ``distrl train``: jobs side by side on one machine, each on its own cores.

With ``hydra/launcher=joblib`` (hydra-joblib-launcher) a sweep runs ``hydra.launcher.n_jobs`` jobs
at once in loky worker processes. Each job claims one of ``n_jobs`` shares of the cores before it
is sized (:func:`start_job`): the share's cores are its whole world, so ``auto`` sizing and actor
pinning apply to them and two jobs never pin to one core. A share is claimed with an ``fcntl.flock``
on ``<sweep dir>/.core-shares/<i>.lock``, which goes with its job however it ends, so a job that
starts when another finished takes the freed share whatever their order. :class:`SweepCheck` (a
Hydra callback) refuses a sweep the machine cannot hold before any job starts: more jobs at once
than cores, more actors than a share's cores, or more memory than the machine has available.

Ctrl-C (SIGINT, or SIGTERM) stops every running job with its checkpoint: the jobs run in process
groups of their own, so that the signal reaches the launching process alone, which passes it on to
each job once (:class:`SweepCheck`) and marks the sweep interrupted (``<sweep dir>/.interrupted``);
a running job repeats the signal to itself until its trainer stops (:class:`_InterruptWatcher`),
jobs that were still waiting see the mark and do not start. ``distrl`` then exits with 130.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from distrl.cli.exits import fail
from distrl.config.host import available_memory, core_share, cpu_count
from distrl.utils.runlock import try_flock, unflock

log = logging.getLogger(__name__)

SHARES_DIR = ".core-shares"
INTERRUPTED_MARK = ".interrupted"
ALLOWED_CORES_ENV = "DISTRL_SWEEP_CORES"  # the cores a loky worker had before its first job took a share
# Memory of one run besides its rollout storage: the trainer and each actor process hold torch,
# the network and the envs (Pong: 0.61-0.65 GiB in all for 1 actor, docs/lab/benchmarks.md).
PROCESS_GIB = 0.3


def parallel_jobs(hydra_cfg: DictConfig) -> int:
    """How many jobs the sweep's launcher runs at once on this machine: hydra-joblib-launcher's
    ``n_jobs`` (joblib's meaning: -1 all cores, -2 all but one, ...), 1 for any other launcher."""
    launcher = hydra_cfg.get("launcher") or {}
    if "JoblibLauncher" not in str(launcher.get("_target_", "")):
        return 1
    n_jobs = launcher.get("n_jobs", -1)
    n_jobs = -1 if n_jobs is None else int(n_jobs)
    return n_jobs if n_jobs > 0 else max(1, (os.cpu_count() or 1) + 1 + n_jobs)


def _allowed_cores() -> list[int]:
    """The cores the sweep may use: this worker's affinity before its first job restricted it."""
    saved = os.environ.get(ALLOWED_CORES_ENV)
    if saved:
        return [int(c) for c in saved.split(",")]
    allowed = sorted(os.sched_getaffinity(0))
    os.environ[ALLOWED_CORES_ENV] = ",".join(map(str, allowed))
    return allowed


class _InterruptWatcher(threading.Thread):
    """Signals this job (SIGINT) once a second while its sweep is marked interrupted and its trainer
    has not begun to stop. The launching process signals each job once; a trainer ignores signals
    for the moment it spawns an actor (the child must start with them ignored), so that one can be
    lost: this one is not."""

    def __init__(self, mark: Path):
        super().__init__(name="distrl-sweep-interrupt", daemon=True)
        self.mark, self.done = mark, threading.Event()

    def run(self) -> None:
        from distrl.runtime.loop import SHUTTING_DOWN

        while not self.done.wait(1.0):
            if self.mark.exists() and not SHUTTING_DOWN.is_set():
                os.kill(os.getpid(), signal.SIGINT)


class CoreShare:
    """One job's claim on a share of the cores; :meth:`release` gives it back and restores the
    worker's affinity (loky workers run one job after another)."""

    def __init__(self, index: int, cores: tuple[int, ...], lock_file, before: set[int]):
        self.index, self.cores, self._file, self._before = index, cores, lock_file, before
        self.watcher: _InterruptWatcher | None = None

    def release(self) -> None:
        if self.watcher is not None:
            self.watcher.done.set()
            self.watcher = None
        if self._file is not None:
            os.sched_setaffinity(0, self._before)
            unflock(self._file)
            self._file = None


def claim_share(sweep_dir: str | os.PathLike, jobs: int) -> CoreShare:
    """Claim a free share of ``jobs`` in ``sweep_dir`` and restrict this process to its cores.

    Raises:
        RuntimeError: every share is held (more jobs running than the launcher's ``n_jobs``).
    """
    allowed = _allowed_cores()
    folder = Path(sweep_dir) / SHARES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(jobs):
        cores = core_share(allowed, index, jobs)
        f, _ = try_flock(folder / f"{index}.lock", f"pid {os.getpid()}, cores {','.join(map(str, cores))}")
        if f is None:  # another running job's
            continue
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, cores)
        return CoreShare(index, cores, f, before)
    raise RuntimeError(f"all {jobs} core shares of {sweep_dir} are held: more jobs run at once than n_jobs={jobs}")


class SweepInterrupted(Exception):
    """The sweep was interrupted before this job started: it does not run."""


def start_job(hydra_cfg: DictConfig) -> CoreShare | None:
    """Prepare a multirun job's process: processes it spawns use the standard ``spawn`` method
    (a loky worker's default method, ``loky``, is unknown to the children), and with jobs side by
    side the job takes its share of the cores (:func:`claim_share`) in a process group of its own
    (signals come from the launching process, :class:`SweepCheck`). None when it runs alone.

    Raises:
        SweepInterrupted: the sweep was interrupted before this job could start.
    """
    if multiprocessing.get_start_method(allow_none=True) not in (None, "spawn", "fork", "forkserver"):
        multiprocessing.set_start_method("spawn", force=True)
    jobs = parallel_jobs(hydra_cfg)
    if jobs <= 1:
        return None
    if (Path(hydra_cfg.sweep.dir) / INTERRUPTED_MARK).exists():
        raise SweepInterrupted(f"job {hydra_cfg.job.get('num')}: the sweep was interrupted before it started")
    if os.getpgid(0) != os.getpid():
        os.setpgid(0, 0)
    claimed = claim_share(hydra_cfg.sweep.dir, jobs)
    claimed.watcher = _InterruptWatcher(Path(hydra_cfg.sweep.dir) / INTERRUPTED_MARK)
    claimed.watcher.start()
    log.info("job %s: core share %d of %d, cores %s", hydra_cfg.job.get("num"), claimed.index, jobs,
             ",".join(map(str, claimed.cores)))
    return claimed


def objective_value(run_dir: str | os.PathLike, key: str, window: int = 100) -> float:
    """What ``distrl train`` returns to a Hydra sweeper (e.g. hydra-optuna-sweeper): the last value of
    an ``eval/`` key in ``<run dir>/metrics.jsonl`` (``eval/mean_return``: the final evaluation's
    mean return), the mean of the last ``window`` values of any other scalar logged there (e.g.
    ``charts/episodic_return``: the last 100 training episodes). NaN, with a warning that names the
    logged keys, when ``key`` was never logged."""
    import math

    from distrl import runs

    values, keys = [], set()
    path = Path(run_dir) / "metrics.jsonl"
    for record in runs.metrics(run_dir) if path.exists() else []:
        keys.update(record)
        if key in record:
            values.append(float(record[key]))
    if not values:
        log.warning("objective=%s was never logged in %s (logged: %s); the sweeper gets NaN", key, path,
                    ", ".join(sorted(keys - {"agent_steps", "frames", "time"})) or "nothing")
        return math.nan
    return values[-1] if key.startswith("eval/") else sum(values[-window:]) / len(values[-window:])


def _sweep_values(overrides: list[str], key: str) -> list[str]:
    """The values the sweep's ``overrides`` give ``key`` (all of a sweep ``a,b``), or ``[]``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    values: list[str] = []
    for override in OverridesParser.create().parse_overrides(overrides):
        if override.get_key_element() != key:
            continue
        values += list(override.sweep_string_iterator()) if override.is_sweep_override() else [str(override.value())]
    return values


def check_sweep(config: DictConfig) -> str | None:
    """Why the machine cannot hold the sweep's jobs side by side, with the numbers; None if it can.

    Reads the launcher's jobs at once, the base config and the sweep's values of ``num_actors``."""
    sweeper = config.hydra.get("sweeper") or {}
    direction = str(sweeper.get("direction", "minimize")).split(".")[-1].lower()  # a string or an enum
    if "OptunaSweeper" in str(sweeper.get("_target_", "")) and "return" in config.objective and direction == "minimize":
        return (f"hydra.sweeper.direction=minimize with objective={config.objective}: Optuna would look for the "
                f"lowest return; add hydra.sweeper.direction=maximize")
    jobs = parallel_jobs(config.hydra)
    if jobs <= 1:
        return None
    cores = cpu_count()
    if jobs > cores:
        return (f"hydra.launcher.n_jobs={jobs} jobs at once on {cores} cores: each job needs at least one core "
                f"(use n_jobs <= {cores})")
    per_job = cores // jobs
    actors = _sweep_values(list(config.hydra.overrides.task), "num_actors") or [str(config.num_actors)]
    fixed = [int(v) for v in actors if v != "auto"]
    if fixed and max(fixed) > per_job:
        return (f"num_actors={max(fixed)} with {jobs} jobs at once on {cores} cores: {jobs} x {max(fixed)} actors "
                f"> {cores} cores; each job has {per_job} core(s) (use num_actors=auto or <= {per_job}, or fewer "
                f"jobs)")
    need = jobs * _job_gib(config, per_job)
    available = available_memory() / 2**30
    if need > available:
        return (f"{jobs} jobs at once need about {need:.1f} GiB ({need / jobs:.2f} GiB each: rollout storage and "
                f"processes), this machine has {available:.1f} GiB available (use fewer jobs)")
    return None


def _job_gib(config: DictConfig, cores: int) -> float:
    """A job's memory, roughly: its rollout storage as ``auto`` sizes it on ``cores`` cores
    (:func:`distrl.config.placement.plan`, :meth:`RolloutLayout.nbytes`) plus :data:`PROCESS_GIB`
    per process (its actors and trainer)."""
    from distrl.config.placement import plan
    from distrl.envs import env_spec
    from distrl.rollout import RolloutLayout

    placement = plan(config, cores)
    storage = RolloutLayout.for_run(config, env_spec(config.env)).nbytes(placement.num_slots)
    return storage / 2**30 + PROCESS_GIB * (placement.actors.count + 1)


def _running_jobs() -> list[int]:
    """Pids of this process's children that lead a process group of their own: the launcher's
    workers that have started a job (:func:`start_job`), not its resource trackers."""
    me, found = str(os.getpid()), []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me and fields[2] == entry.name:  # parent pid, then process group id
                found.append(int(entry.name))
    return found


class SweepCheck(Callback):
    """In the launching process of a multirun: refuses, before any job starts, a sweep whose jobs
    at once the machine cannot hold (:func:`check_sweep`; one ``distrl train: error:`` line, exit
    code 2), and with jobs side by side passes SIGINT and SIGTERM on to them (see the module)."""

    interrupted = False  # a signal came during the sweep: distrl exits with 130

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        problem = check_sweep(config)
        if problem:
            fail("train", problem)
        if parallel_jobs(config.hydra) > 1:
            sweep_dir = Path(str(config.hydra.sweep.dir))
            (sweep_dir / INTERRUPTED_MARK).unlink(missing_ok=True)  # rerun into an interrupted sweep: it resumes

            def pass_on(signum, frame):
                SweepCheck.interrupted = True
                sweep_dir.mkdir(parents=True, exist_ok=True)
                (sweep_dir / INTERRUPTED_MARK).touch()
                log.warning("%s: stopping the running jobs (each saves a checkpoint); waiting jobs will not start",
                            signal.Signals(signum).name)
                for pid in _running_jobs():
                    try:
                        os.kill(pid, signum)
                    except ProcessLookupError:
                        pass

            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, pass_on)

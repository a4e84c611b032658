"""Shared helpers: Hydra composition of the real configs and the real ``distrl`` command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from distrl import runs
from distrl.config.schema import config_dir, register_configs

REPO = Path(__file__).resolve().parent.parent
DISTRL = [sys.executable, "-m", "distrl"]

# Small but real runs: 2 actors, short unrolls, short Pong episodes.
TINY_PONG = [
    "env=atari", "num_actors=2", "envs_per_actor=2", "num_steps=20", "batch_size=4",
    "train.num_train_steps=2000", "train.log_interval=400", "train.num_eval_episodes=1",
    "env.max_episode_steps=150", "learner_threads=1",
]
TINY_CARTPOLE = [
    "experiment=cartpole", "num_actors=2", "envs_per_actor=2", "num_steps=20", "batch_size=4",
    "train.num_train_steps=3000", "train.log_interval=500", "train.num_eval_episodes=2", "learner_threads=1",
]


# The shared Pong run of the suite (the ``pong_run`` fixture): the previous action and reward as
# inputs, LayerNorm in the encoder, async stepping, two learners on the fewest slots validation
# accepts (2 x 2 envs + 4 x 2), the arithmetic ``precision=auto`` picks here (what a user gets), an
# evaluation at 500 agent steps (so a best.pt) and at the end. Not bf16 on every CPU: a CPU without
# AVX512-BF16 or AMX emulates it, and the fixture took 83-89 s in bf16 against 38-42 s in fp32 on a
# 2-core AVX2-only EPYC beside two training runs (test_train_e2e's LSTM run is bf16 on any CPU).
# The default agent, APPO, with 2 epochs of 2 minibatches instead of 4 of 4: still several optimizer
# steps per batch, at a quarter of the learner's work (the fixture took 29.5 s against 38 s with
# 4 x 4, 2-core AMD EPYC beside three training runs).
PONG_RUN = [*TINY_PONG, "model.last_action_reward=true", "model.layer_norm=true", "env.async_step=true",
            "num_learners=2", "num_slots=12",
            "precision=auto", "agent.num_epochs=2", "agent.num_minibatches=2",
            "train.num_train_steps=1000", "train.log_interval=400", "train.eval_interval=500"]


def pytest_ignore_collect(collection_path, config):
    """tests/test_cuda.py only where torch sees a CUDA device (the header says whether)."""
    if collection_path.name == "test_cuda.py" and not torch.cuda.is_available():
        return True
    return None


def pytest_report_header(config):
    if torch.cuda.is_available():
        return f"CUDA tests (tests/test_cuda.py): collected, on {torch.cuda.get_device_name(0)}"
    return "CUDA tests (tests/test_cuda.py): not collected, torch sees no CUDA device"


def metrics(run_dir: Path) -> list[dict]:
    """The records of a run's ``metrics.jsonl``, one dict a line (:func:`distrl.runs.metrics`)."""
    return runs.metrics(run_dir)


def tensorboard_scalars(run_dir: Path, tag: str) -> list[float]:
    """The values of one scalar of a run's TensorBoard files (``run_dir/tb``), read with TensorBoard's reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    return [event.value for event in events.Scalars(tag)]


def compose_train(overrides: list[str]):
    """The train config as ``distrl train`` would compose it, without running anything."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return compose("train", overrides=overrides)


def write_run(path: Path, overrides: list[str], records: list[dict]) -> str:
    """A run directory as ``distrl train`` writes it, for the scripts that read runs: the composed
    config of ``overrides`` (``config.yaml``) and ``records`` (``metrics.jsonl``)."""
    path.mkdir()
    cfg = compose_train(overrides)
    (path / "config.yaml").write_text(yaml.safe_dump(OmegaConf.to_container(cfg, resolve=True)))
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return str(path)


def assert_actor_holds(actor_state: dict, weights: dict) -> None:
    """Each tensor of the actor copy's ``state_dict`` is the one of ``weights`` (a learner's or a
    checkpoint's; it may hold more, e.g. an intrinsic value head) cast to the actor's dtype (bf16 for
    the matrix products of a bf16 actor copy, exactly as a publish casts)."""
    import torch

    for name, value in actor_state.items():
        assert torch.equal(value, weights[name].to(value.dtype)), name


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str
    children: set[int] = field(default_factory=set)

    def alive_children(self, grace: float = 5.0) -> list[str]:
        """The children still running ``grace`` seconds after distrl exited, as "pid cmdline".

        The grace covers children that are already on their way out when the parent exits
        (multiprocessing's resource tracker exits once it reads EOF from the dead parent);
        a child that stays is left behind.
        """
        deadline = time.monotonic() + grace
        while True:
            alive = []
            for pid in self.children:
                try:
                    proc = psutil.Process(pid)
                    if proc.status() != psutil.STATUS_ZOMBIE:
                        alive.append(f"{pid} {' '.join(proc.cmdline())[:200]}")
                except psutil.NoSuchProcess:
                    pass
            if not alive or time.monotonic() >= deadline:
                return alive
            time.sleep(0.1)


class DistrlProcess:
    """``python -m distrl ...`` (or ``launcher + args``) in a subprocess, in its own process group, with
    its children tracked. One that a test leaves running (a failed assertion) is killed after it."""

    started: list[DistrlProcess] = []

    def __init__(self, args: list[str], cwd: Path | str | None = None, env: dict | None = None,
                 launcher: list[str] | None = None):
        DistrlProcess.started.append(self)
        self.popen = subprocess.Popen(
            (launcher or DISTRL) + args, cwd=cwd or REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        self.children: set[int] = set()

    def poll_children(self) -> list[psutil.Process]:
        try:
            kids = psutil.Process(self.popen.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        self.children.update(k.pid for k in kids)
        return kids

    def wait_for(self, predicate, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.popen.poll() is None:
            self.poll_children()
            if predicate():
                return True
            time.sleep(0.2)
        return predicate()

    def signal(self, sig: int) -> None:
        os.killpg(self.popen.pid, sig)

    def finish(self, timeout: float) -> Finished:
        deadline = time.monotonic() + timeout
        while self.popen.poll() is None and time.monotonic() < deadline:
            self.poll_children()
            time.sleep(0.2)
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            out, err = self.popen.communicate()
            pytest.fail(f"distrl did not exit within {timeout} s\nstdout:\n{out}\nstderr:\n{err[-5000:]}")
        out, err = self.popen.communicate()
        return Finished(self.popen.returncode, out, err, set(self.children))


@dataclass
class Run:
    """A finished ``distrl train``: its run directory, its result and its budget in agent steps."""

    run_dir: Path
    done: Finished
    steps: int


@pytest.fixture(scope="session")
def pong_run(tmp_path_factory) -> Run:
    """One Pong run through the real command (``PONG_RUN``), shared by the tests that read a run
    directory or a checkpoint: they must not change it (copy it first)."""
    run_dir = tmp_path_factory.mktemp("pong") / "run"
    done = run_distrl(["train", *PONG_RUN, f"hydra.run.dir={run_dir}"])
    assert done.returncode == 0, done.stderr[-3000:]
    return Run(run_dir, done, 1000)


@pytest.fixture(autouse=True)
def _no_command_outlives_its_test():
    yield
    while DistrlProcess.started:
        proc = DistrlProcess.started.pop()
        if proc.popen.poll() is None:
            os.killpg(proc.popen.pid, signal.SIGKILL)
            proc.popen.communicate()


def run_distrl(args: list[str], timeout: float = 240, cwd=None, env=None, launcher=None) -> Finished:
    return DistrlProcess(args, cwd=cwd, env=env, launcher=launcher).finish(timeout)


def finish_all(procs: list[DistrlProcess], timeout: float) -> list[Finished]:
    """Wait for commands started together (their children tracked all the while); their results in order."""
    deadline = time.monotonic() + timeout
    while any(p.popen.poll() is None for p in procs) and time.monotonic() < deadline:
        for p in procs:
            p.poll_children()
        time.sleep(0.1)
    return [p.finish(timeout=max(0.0, deadline - time.monotonic())) for p in procs]

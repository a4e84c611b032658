"""Checkpoints you can trust: rotation and best.pt, safe loading, resume (from a checkpoint of an
earlier version too), auto-resume, eval from the path alone; in the long tier, the command run
again in its run directory (auto-resume end to end) and a kill in the middle of a save."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import imageio.v2 as imageio
import psutil
import pytest
import torch
from conftest import (
    PONG_RUN,
    REPO,
    TINY_CARTPOLE,
    TINY_PONG,
    DistrlProcess,
    assert_actor_holds,
    compose_train,
    metrics,
    run_distrl,
)

from distrl.cli.evaluate import evaluation_precision
from distrl.runtime.evaluator import Evaluations
from distrl.runtime.loop import TrainingLoop
from distrl.runtime.reporter import Reporter
from distrl.runtime.trainer import Trainer
from distrl.utils.checkpoint import CheckpointError, load_checkpoint, save_best, save_checkpoint
from distrl.utils.telemetry import NullTelemetry

# Written by distrl at 751cbb7 (before the learning-rate schedule was derived from the update count;
# it holds a ``scheduler`` entry): CartPole, 1 actor x 2 envs, T=20, B=4, 800 agent steps, 10 updates.
OLD_CHECKPOINT = REPO / "tests" / "data" / "cartpole-751cbb7.pt"
OLD_RUN = ["experiment=cartpole", "num_actors=1", "envs_per_actor=2", "num_steps=20", "batch_size=4",
           "learner_threads=1", "train.num_eval_episodes=0"]


def _state(agent_steps: int) -> dict:
    return {"distrl_version": "0", "model": {"w": torch.full((2,), float(agent_steps))}, "config": {},
            "agent_steps": agent_steps}


def test_rotation_keeps_the_newest_files_and_best_outlives_its_step_file(tmp_path):
    for steps in (100, 200, 300, 400, 500):
        save_checkpoint(_state(steps), tmp_path, keep=3, best=steps == 200)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "best.pt", "latest.pt", "step_000000000300.pt", "step_000000000400.pt", "step_000000000500.pt"]
    assert load_checkpoint(tmp_path / "latest.pt")["agent_steps"] == 500
    assert load_checkpoint(tmp_path / "best.pt")["agent_steps"] == 200
    save_best(_state(600), tmp_path)  # an evaluation between two saves beat the best
    assert load_checkpoint(tmp_path / "best.pt")["agent_steps"] == 600
    assert load_checkpoint(tmp_path / "latest.pt")["agent_steps"] == 500
    assert len(list(tmp_path.iterdir())) == 5  # no temporary file left


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("case", ["missing", "directory", "truncated", "not_distrl", "pickled"])
def test_bad_checkpoints_are_refused_in_one_line(case, tmp_path):
    marker = tmp_path / "EXECUTED"
    path = tmp_path / "ckpt.pt"
    if case == "directory":
        path = tmp_path
    elif case == "truncated":
        data = OLD_CHECKPOINT.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif case == "not_distrl":
        torch.save({"weights": torch.zeros(3)}, path)
    elif case == "pickled":
        torch.save({"distrl_version": "0.1.0", "model": {}, "config": {}, "agent_steps": 0,
                    "payload": _Evil(str(marker))}, path)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)
    assert not marker.exists()  # nothing from the file was executed


def test_the_layout_and_contents_of_a_run(pong_run):
    ckpts = pong_run.run_dir / "checkpoints"
    assert {"latest.pt", "best.pt"} <= {p.name for p in ckpts.iterdir()}
    assert all(re.fullmatch(r"step_\d{12}\.pt", p.name) for p in ckpts.glob("step_*"))
    state = torch.load(ckpts / "latest.pt", weights_only=True)
    for key in ("model", "optimizer", "agent_steps", "updates", "last_eval_step", "last_save_step",
                "best_eval_return", "config", "rng", "distrl_version"):
        assert key in state, key
    assert state["agent_steps"] >= pong_run.steps and state["config"]["env"]["id"] == "ALE/Pong-v5"
    assert isinstance(state["rng"]["torch"], torch.Tensor)


def test_eval_prints_episodes_and_writes_results_and_a_video(pong_run, tmp_path):
    out = tmp_path / "eval"
    trained = load_checkpoint(pong_run.run_dir / "checkpoints" / "latest.pt")["precision"]  # auto's choice here
    asked = "fp32" if trained == "bf16" else "bf16"  # not the run's: eval uses the arithmetic it is given
    done = run_distrl(["eval", f"ckpt={pong_run.run_dir}/checkpoints/latest.pt", "num_episodes=2", "seed=5",
                       "video=true", "env.max_episode_steps=60", f"precision={asked}", f"hydra.run.dir={out}"],
                      timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [(float(r), int(n)) for r, n in re.findall(r"episode \d+: return (\S+), length (\d+)", done.stdout)]
    results = json.loads((out / "results.json").read_text())
    assert len(printed) == 2 == results["n_episodes"]
    assert printed == list(zip(results["returns"], results["lengths"], strict=True))
    assert results["mean_return"] == pytest.approx(sum(r for r, _ in printed) / 2)
    assert results["env_id"] == "ALE/Pong-v5" and results["agent_steps"] >= pong_run.steps
    assert results["deterministic"] is False and results["checkpoint"].endswith("latest.pt")
    assert results["device"] == "cpu"  # eval.yaml's default
    assert results["precision"] == asked and f", {asked}, checkpoint at" in done.stdout
    frames = [frame for frame in imageio.get_reader(out / "video.mp4")]  # (list() asks its length: inf)
    assert len(frames) == sum(length + 1 for length in results["lengths"])  # each reset frame, then one per step
    assert frames[0].shape == (210, 160, 3)


def test_a_checkpoint_of_751cbb7_resumes_weights_optimizer_schedule_and_counters(tmp_path):
    state = load_checkpoint(OLD_CHECKPOINT)
    saved = state["agent_steps"]
    assert (saved, state["updates"]) == (800, 10) and "scheduler" in state
    cfg = compose_train([*OLD_RUN, f"train.num_train_steps={2 * saved}", f"resume={OLD_CHECKPOINT}"])
    trainer = Trainer(cfg, tmp_path, progress=False)
    steps_per_update = cfg.num_steps * cfg.batch_size
    expected_lr = cfg.agent.lr * (1 - saved / (2 * saved))
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(expected_lr)
    for index, values in trainer.optimizer.state_dict()["state"].items():
        torch.testing.assert_close(values["square_avg"], state["optimizer"]["state"][index]["square_avg"])
    for name, value in trainer.networks.learner.state_dict().items():
        torch.testing.assert_close(value, state["model"][name])
    assert_actor_holds(trainer.networks.actor.state_dict(), state["model"])
    assert trainer.counters["agent_steps"] == saved and trainer.counters["updates"] == 10

    counters = trainer.train()
    assert counters["agent_steps"] >= 2 * saved and counters["updates"] > 10
    final = load_checkpoint(tmp_path / "checkpoints" / "latest.pt")
    assert 2 * saved <= final["agent_steps"] < 2 * saved + 2 * steps_per_update
    assert "scheduler" not in final
    logged = metrics(tmp_path)
    assert min(r["agent_steps"] for r in logged) >= saved  # TensorBoard steps do not restart
    assert all(r["agent_steps"] > saved for r in logged if "losses/total" in r)
    first_lr = next(r["charts/learning_rate"] for r in logged if "charts/learning_rate" in r)
    assert first_lr <= expected_lr + 1e-12


def test_resume_with_another_env_names_the_mismatch(tmp_path):
    cfg = compose_train([*OLD_RUN, "env.id=Acrobot-v1", f"resume={OLD_CHECKPOINT}"])
    with pytest.raises(CheckpointError, match=r"^cannot resume from .*: env.id='CartPole-v1' in the checkpoint, "
                                              r"env.id='Acrobot-v1' here$"):
        Trainer(cfg, tmp_path, progress=False)


def test_resume_with_another_optimizer_names_the_agent_to_continue_with(tmp_path):
    """An IMPALA run (RMSProp) continued with APPO's Adam would load RMSProp's statistics into Adam
    and fail at its first step; it is refused before any process starts, naming the agent.
    (experiment=cartpole sets RMSProp for either loss: the optimizer is named here.)"""
    cfg = compose_train([*OLD_RUN, "agent=appo", "agent.optimizer=adam", f"resume={OLD_CHECKPOINT}"])
    expected = (r"^cannot resume from .*: agent.optimizer='rmsprop' \(agent=impala\) in the checkpoint, "
                r"'adam' \(agent=appo\) here: continue it with agent=impala$")
    with pytest.raises(CheckpointError, match=expected):
        Trainer(cfg, tmp_path, progress=False)


def test_a_run_directory_with_a_checkpoint_resumes_by_default_and_resume_false_starts_afresh(pong_run, tmp_path):
    """``resume=auto`` (the default) picks up the run directory's ``latest.pt``: counters and weights;
    the long tier runs the command again in the directory."""
    run_dir = tmp_path / "run"
    shutil.copytree(pong_run.run_dir, run_dir)
    latest = run_dir / "checkpoints" / "latest.pt"
    state = load_checkpoint(latest)
    again = Trainer(compose_train(PONG_RUN), run_dir, progress=False)
    assert again.resumed_from == latest
    assert again.counters["agent_steps"] == state["agent_steps"] and again.counters["updates"] == state["updates"]
    assert_actor_holds(again.networks.actor.state_dict(), state["model"])
    again.run_lock.release()  # as train() does when it ends
    fresh = Trainer(compose_train([*PONG_RUN, "resume=false"]), run_dir, progress=False)
    assert fresh.resumed_from is None and fresh.counters["agent_steps"] == 0 and fresh.counters["updates"] == 0


@pytest.mark.long
def test_rerunning_the_command_in_its_run_dir_resumes_and_its_steps_continue(pong_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(pong_run.run_dir, run_dir)
    first = load_checkpoint(run_dir / "checkpoints" / "latest.pt")["agent_steps"]
    more = [a for a in PONG_RUN if not a.startswith("train.num_train_steps=")] + [
        f"train.num_train_steps={first + 400}", "train.num_eval_episodes=0"]
    done = run_distrl(["train", *more, f"hydra.run.dir={run_dir}"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resumed at {first} agent steps" in done.stdout
    assert load_checkpoint(run_dir / "checkpoints" / "latest.pt")["agent_steps"] >= first + 400
    logged = metrics(run_dir)
    losses = [r["agent_steps"] for r in logged if "losses/total" in r]
    assert losses == sorted(losses) and losses[-1] >= first + 400  # the second run's steps continue the first's


def test_resume_from_best_continues_from_the_best_evaluation(pong_run, tmp_path):
    best = pong_run.run_dir / "checkpoints" / "best.pt"
    state = load_checkpoint(best)
    assert state["best_eval_return"] > -float("inf")
    # one moment: the counters match the weights' updates, and the last save lies before it
    assert state["agent_steps"] == state["updates"] * state["config"]["num_steps"] * state["config"]["batch_size"]
    assert state["last_save_step"] <= state["agent_steps"]
    cfg = compose_train([*PONG_RUN, f"resume={best}"])
    trainer = Trainer(cfg, tmp_path / "from-best", progress=False)
    assert trainer.counters["agent_steps"] == state["agent_steps"]
    assert trainer.counters["best_eval_return"] == state["best_eval_return"]
    assert_actor_holds(trainer.networks.actor.state_dict(), state["model"])  # the actors start with the best weights


def test_an_evaluation_counts_as_run_when_it_finishes_so_a_resumed_run_does_not_skip_it(tmp_path):
    """Ctrl-C while an evaluation plays ends it unlogged (the shutdown stops it). Counted as run when
    it started, the checkpoint's ``last_eval_step`` said it had run and the resumed run skipped that
    point of its curve (Atari-5's DoubleDunk run lost its 7.5M evaluation so); it counts when it
    finishes."""
    cfg = compose_train([*TINY_CARTPOLE, "train.eval_interval=1000"])
    trainer = Trainer(cfg, tmp_path, progress=False)
    loop = TrainingLoop(trainer)
    # log_eval's part of a reporter: no channels or workers (no actor runs here)
    loop.reporter = Reporter(NullTelemetry(), None, trainer.learner, trainer.stats, None, 1)
    loop.evaluations = Evaluations(trainer.networks.learner, cfg.env, 10**6, cfg.seed)  # outlasts the test
    loop._evaluate_when_due(1000, done=False)
    assert loop.evaluations.busy and trainer.counters["last_eval_step"] == 0
    loop.evaluations.stop()  # as the shutdown does
    assert trainer.counters["last_eval_step"] == 0  # what the checkpoint saved after it records
    assert trainer.checkpointer.evals.due(1000)  # so a run resumed from it evaluates at its first tick

    loop.evaluations = Evaluations(trainer.networks.learner, cfg.env, 1, cfg.seed)
    loop._evaluate_when_due(1000, done=False)
    loop.evaluations.running.result()
    loop._evaluate_when_due(1500, done=False)  # logs it; the next one is due at 2000
    assert trainer.counters["last_eval_step"] == 1000 and not loop.evaluations.busy
    assert not trainer.checkpointer.evals.due(1999) and trainer.checkpointer.evals.due(2000)
    loop.evaluations.stop()


def test_init_model_path_loads_weights_only(pong_run, tmp_path):
    path = pong_run.run_dir / "checkpoints" / "latest.pt"
    state = load_checkpoint(path)
    cfg = compose_train([*PONG_RUN, f"train.init_model_path={path}"])
    trainer = Trainer(cfg, tmp_path / "finetune", progress=False)
    for name, value in trainer.networks.learner.state_dict().items():
        torch.testing.assert_close(value, state["model"][name])
    assert_actor_holds(trainer.networks.actor.state_dict(), state["model"])  # published to the actors too
    assert trainer.counters["agent_steps"] == 0 and trainer.counters["updates"] == 0
    assert trainer.optimizer.state_dict()["state"] == {}
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(trainer.schedule.at(0).learning_rate)


@pytest.mark.long
def test_sigkill_during_frequent_saves_leaves_a_loadable_latest_and_nothing_in_dev_shm(tmp_path):
    before = set(os.listdir("/dev/shm"))
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
                if psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"child {child} outlived its SIGKILLed parent")
    assert set(os.listdir("/dev/shm")) - before == set()


def test_a_write_that_fails_on_the_disk_names_the_os_error_not_torchs_zip_writer(tmp_path):
    """A checkpoint larger than the room left (here a file-size limit, RLIMIT_FSIZE, in a process of
    its own): the error says what the OS said ("File too large"; on a full disk "No space left on
    device"), not torch's "unexpected pos", and no file is left behind."""
    script = f"""
import resource, signal, torch
from pathlib import Path
from distrl.utils.checkpoint import CheckpointSaveError, save_file
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    save_file({{"model": torch.zeros(500_000)}}, Path({str(tmp_path / "latest.pt")!r}))
except CheckpointSaveError as exc:
    print(exc)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "File too large" in done.stdout and "unexpected pos" not in done.stdout, done.stdout
    assert list(tmp_path.iterdir()) == []


def test_eval_scores_in_the_precision_of_the_runs_own_evaluations():
    """Evaluations during training run in the actors' precision; distrl eval does the same by default,
    not in the learner's: a checkpoint of a bf16 learner whose actors ran fp32 (a CUDA learner beside
    a CPU without bf16) is scored in fp32; one older than the key as its config's precision makes the
    actors (fp32 for one older than bf16)."""
    state = load_checkpoint(OLD_CHECKPOINT)
    assert "precision" not in state["config"] and evaluation_precision(state) == "fp32"
    state["precision"], state["actor_precision"] = "bf16", "fp32"
    assert evaluation_precision(state) == "fp32"
    del state["actor_precision"]
    state["config"]["precision"] = "bf16"
    assert evaluation_precision(state) == "bf16"


MOVED = {  # checkpoints written by main at 2bd13d2, before the engine became sampling/, learning/, runtime/
    "cartpole-2bd13d2.pt": OLD_RUN,
    "pendulum-2bd13d2.pt": ["experiment=mujoco_1m", "env.id=Pendulum-v1", "num_actors=1", "envs_per_actor=2",
                            "num_steps=8", "batch_size=4", "agent.num_minibatches=2", "agent.num_epochs=2",
                            "learner_threads=1", "train.num_eval_episodes=0"],
}


@pytest.mark.parametrize("name", sorted(MOVED))
def test_a_checkpoint_of_the_main_before_the_move_resumes_and_trains_on(name, tmp_path):
    """Weights, running statistics (the Box run's observation and return normalisation), optimizer
    and counters of a checkpoint written before the engine's modules moved come back, and the run
    goes on from them."""
    path = REPO / "tests" / "data" / name
    state = load_checkpoint(path)
    saved = state["agent_steps"]
    if name.startswith("pendulum"):
        assert {"obs_norm.mean", "return_norm.var"} <= set(state["model"]) and state["action_space"]["kind"] == "box"
    cfg = compose_train([*MOVED[name], f"train.num_train_steps={2 * saved}", f"resume={path}"])
    trainer = Trainer(cfg, tmp_path, progress=False)
    for key, value in trainer.networks.learner.state_dict().items():
        torch.testing.assert_close(value, state["model"][key])
    assert_actor_holds(trainer.networks.actor.state_dict(), state["model"])
    assert trainer.counters["agent_steps"] == saved and trainer.counters["updates"] == state["updates"] == 10
    assert trainer.optimizer.state_dict()["state"].keys() == state["optimizer"]["state"].keys()
    counters = trainer.train()
    assert counters["agent_steps"] >= 2 * saved and counters["updates"] > 10

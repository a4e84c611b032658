"""The CUDA paths through the real ``distrl`` command: the learner on ``cuda`` in fp32 and in bf16,
``distrl eval device=cuda``, and a checkpoint written with a CUDA learner resumed and evaluated on
the CPU; in this process, batches prefetched to CUDA (``train.prefetch``) and the compiled update
replayed as CUDA graphs (``train.compile_mode=reduce-overhead``).

Collected only where torch sees a CUDA device (``conftest.pytest_ignore_collect``); pytest's header
says which, so a CPU machine's run never passes them silently. On a GPU node ``make test`` runs
them with the rest; alone: ``make test ARGS=tests/test_cuda.py``; on the device machine
``scripts/gpu_check.sh`` runs them first.
"""

import dataclasses
import json
import math
import multiprocessing
import threading
from pathlib import Path

import pytest
import torch
from conftest import TINY_PONG, compose_train, metrics, run_distrl
from test_learner import OBS, A, B, T, on_policy_batch

from distrl.learning.batches import BatchSource
from distrl.learning.learner import Learner, make_learner, make_optimizer
from distrl.learning.schedule import Schedule
from distrl.learning.step import StepOptions
from distrl.nn.actor_learner import ActorLearner
from distrl.nn.distributions import ActionSpace
from distrl.rollout import RolloutLayout
from distrl.sampling.queues import drain
from distrl.sampling.slots import Slots
from distrl.utils.checkpoint import load_checkpoint

STEPS = 1600  # agent steps: 20 updates of T x B = 80, and an evaluation at 800
CUDA_RUN = [*TINY_PONG, "device=cuda", f"train.num_train_steps={STEPS}", "train.eval_interval=800"]


def train(run_dir: Path, overrides: list[str]):
    done = run_distrl(["train", *overrides, f"hydra.run.dir={run_dir}"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.alive_children() == []
    return done


def evaluate(ckpt: Path, out: Path, device: str) -> dict:
    done = run_distrl(["eval", f"ckpt={ckpt}", "num_episodes=2", "env.max_episode_steps=100", f"device={device}",
                       f"hydra.run.dir={out}"], timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "results.json").read_text())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_learner_trains_on_cuda_and_its_checkpoint_holds_fp32_weights(precision, tmp_path):
    done = train(tmp_path, [*CUDA_RUN, f"precision={precision}"])
    assert "learner on cuda" in done.stdout and f"precision: learner {precision} (set)" in done.stdout
    losses = [r["losses/total"] for r in metrics(tmp_path) if "losses/total" in r]
    assert losses and all(math.isfinite(x) for x in losses)
    raw = torch.load(tmp_path / "checkpoints" / "latest.pt", map_location="cpu", weights_only=True)
    assert raw["agent_steps"] >= STEPS and raw["precision"] == precision
    assert all(v.dtype == torch.float32 for v in raw["model"].values() if v.is_floating_point())


def test_eval_on_cuda_and_a_cuda_checkpoint_resumed_and_evaluated_on_the_cpu(tmp_path):
    run_dir = tmp_path / "run"
    train(run_dir, [*CUDA_RUN, "precision=fp32"])
    ckpt = run_dir / "checkpoints" / "latest.pt"
    on_cuda = evaluate(ckpt, tmp_path / "eval-cuda", "cuda")
    assert on_cuda["device"].startswith("cuda") and on_cuda["n_episodes"] == 2

    # the same run directory, continued with the learner on the CPU (resume=auto picks up latest.pt)
    done = train(run_dir, [*TINY_PONG, "device=cpu", "precision=fp32", f"train.num_train_steps={2 * STEPS}"])
    assert "learner on cpu" in done.stdout and "resumed at" in done.stdout
    state = load_checkpoint(ckpt)
    assert state["agent_steps"] >= 2 * STEPS
    assert any(r["agent_steps"] > STEPS for r in metrics(run_dir) if "losses/total" in r)  # it learned on
    on_cpu = evaluate(ckpt, tmp_path / "eval-cpu", "cpu")
    assert on_cpu["device"] == "cpu" and on_cpu["agent_steps"] >= 2 * STEPS


def test_prefetched_batches_on_cuda_hold_the_slots_the_learner_took():
    """``train.prefetch`` on CUDA: the prefetching thread copies on a stream of its own; the batch
    the learner thread gets equals the slots' contents, and stays so while that stream copies the
    next batch into fresh memory."""
    layout = RolloutLayout(num_steps=31, obs_shape=(4, 84, 84), obs_dtype=torch.uint8,
                           action_space=ActionSpace("discrete", (6,)))
    slots = Slots(layout, 8, multiprocessing.get_context("fork"))
    slots.tensors["obs"].random_(0, 255)
    drain(slots.free_queue)
    for index in range(8):
        slots.full_queue.put(index)
    stop = threading.Event()
    source = BatchSource(slots, 2, torch.device("cuda"), stop, {}, "learner", prefetch=True)
    for first in range(0, 8, 2):
        batch = source.next().tensors
        assert batch["obs"].is_cuda
        expected = slots.tensors["obs"][[first, first + 1]].transpose(0, 1)
        assert torch.equal(batch["obs"].cpu(), expected)
        slots.tensors["obs"][first].zero_()  # the slot is free again: an actor would overwrite it
        assert torch.equal(batch["obs"].cpu(), expected)  # the copy is the batch's own
    stop.set()
    source.close()
    slots.close()


def test_the_compiled_update_as_cuda_graphs_steps_as_eager_does():
    """``train.th_compile=true train.compile_mode=reduce-overhead``: on CUDA the network and APPO's
    loss, forward and backward, are replayed as CUDA graphs (none skipped), and two updates of 2 x 2
    optimizer steps report eager's losses and leave eager's weights, to float32's rounding."""
    from torch._dynamo.utils import counters

    cfg = compose_train(["experiment=cartpole", "agent=appo", "agent.num_minibatches=2", "agent.num_epochs=2"])
    cfg.train.num_train_steps = 10**9
    device = torch.device("cuda")

    def build(compile: bool) -> tuple[Learner, ActorLearner]:
        torch.manual_seed(0)
        policy = ActorLearner((OBS,), A, cfg.model).to(device)
        policy.share_actor()
        schedule = dataclasses.replace(Schedule.for_run(cfg), steps_per_update=T * B)
        return make_learner(policy, make_optimizer(policy, cfg.agent), schedule, cfg.agent,
                       StepOptions(device, compile_mode="reduce-overhead" if compile else None)), policy

    torch._dynamo.reset()
    counters.clear()
    compiled, compiled_policy = build(True)
    eager, eager_policy = build(False)
    for seed in range(2):
        data = on_policy_batch(eager_policy, seed, device)
        expected, got = eager.update(data), compiled.update(data)
        for name in ("total", "policy", "value", "entropy", "grad_norm"):
            assert got[name] == pytest.approx(expected[name], rel=1e-4, abs=1e-5), (seed, name)
    for p, q in zip(compiled_policy.learner.parameters(), eager_policy.learner.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-4)
    assert counters["inductor"]["cudagraph_skips"] == 0

"""``precision``: which arithmetic ``auto`` picks, and bf16 where the networks run (the learner's
forward under autocast with fp32 weights, optimizer state and losses; the actors' inference)."""

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import REPO, compose_train

from distrl.config import host
from distrl.config.placement import plan
from distrl.config.schema import ConfigError
from distrl.envs import make_vector_env
from distrl.learning.learner import make_learner, make_optimizer
from distrl.learning.schedule import Schedule
from distrl.learning.step import StepOptions
from distrl.nn.actor_learner import ActorLearner
from distrl.nn.precision import autocast
from distrl.runtime.preflight import validate


@pytest.mark.parametrize("flags, expected", [(("avx512_bf16",), "bf16"), (("amx_bf16",), "bf16"), ((), "fp32")])
def test_auto_is_bf16_where_the_cpu_computes_it(monkeypatch, flags, expected):
    monkeypatch.setattr(host, "cpu_bf16_flags", lambda: flags)
    placement = plan(compose_train(["experiment=cartpole", "device=cpu"]))
    assert (placement.precision, placement.actors.precision) == (expected, expected)
    assert ("auto: the CPU has " + ", ".join(flags) if flags else "neither") in placement.precision_reason
    fixed = plan(compose_train(["experiment=cartpole", "precision=fp32"]))
    assert (fixed.precision, fixed.precision_reason) == ("fp32", "set")


def test_the_cpu_flags_are_read_from_cpuinfo():
    with open("/proc/cpuinfo") as f:
        flags = next(line for line in f if line.startswith("flags")).split(":", 1)[1].split()
    assert host.cpu_bf16_flags() == tuple(flag for flag in host.BF16_CPU_FLAGS if flag in flags)


def test_another_precision_is_refused():
    with pytest.raises(ConfigError, match="precision='fp16' is not allowed: auto, fp32, bf16"):
        validate(compose_train(["experiment=cartpole", "precision=fp16"]))


def _pong_batch(T: int = 20, B: int = 4) -> dict:
    """Real Pong frames (random play) in the slots' ``[T+1, B]`` layout, on-policy for ``policy``."""
    env = make_vector_env(compose_train(["env=atari"]).env, B)
    obs, _ = env.reset(seed=3)
    frames = [obs]
    for _ in range(T):
        obs, *_ = env.step(np.random.default_rng(0).integers(0, 6, B))
        frames.append(obs)
    env.close()
    return torch.from_numpy(np.stack(frames))


def test_the_learner_in_bf16_keeps_fp32_weights_and_losses_near_fp32_ones():
    cfg = compose_train(["env=atari", "agent=impala"])
    torch.manual_seed(0)
    policy = ActorLearner((4, 84, 84), 6, cfg.model)
    with torch.no_grad():  # logits of a trained policy's size (the initial head gives ~0.01)
        policy.learner.policy.weight.mul_(1000.0)
    policy.share_actor()
    obs = _pong_batch()
    T1, B = obs.shape[:2]
    first = torch.zeros(T1, B, dtype=torch.bool)
    with torch.no_grad():
        logits32, values32, _ = policy.learner(obs, first)
        with autocast("bf16"):
            logits16, values16, _ = policy.learner(obs, first)
    assert logits16.dtype == values16.dtype == torch.float32  # cast back at the heads
    # the actors' bf16 logits against the learner's fp32 ones: V-trace's ratios see this KL
    kl = F.kl_div(F.log_softmax(logits16, -1), F.log_softmax(logits32, -1), log_target=True, reduction="batchmean")
    print(f"KL(bf16 || fp32) {kl.item():.2e}, logits' std {logits32.std().item():.2f}")
    assert logits32.std() > 1.0 and -1e-6 < kl.item() < 1e-3

    g = torch.Generator().manual_seed(0)
    actions = torch.multinomial(F.softmax(logits32.flatten(0, 1), -1), 1, generator=g).view(T1, B)  # the actors'
    batch = {"obs": obs, "first": first, "action": actions,
             "policy_params": logits32, "reward": torch.randint(-1, 2, (T1, B), generator=g).float(),
             "terminated": torch.zeros(T1, B, dtype=torch.bool), "truncated": torch.zeros(T1, B, dtype=torch.bool),
             "truncation_value": torch.zeros(T1, B), "policy_version": torch.zeros(B, dtype=torch.int64)}
    cfg.train.num_train_steps = 10**9
    schedule = dataclasses.replace(Schedule.for_run(cfg), steps_per_update=80)
    losses = {}
    for precision in ("fp32", "bf16"):
        learner = make_learner(policy, make_optimizer(policy, cfg.agent), schedule, cfg.agent,
                          StepOptions(torch.device("cpu"), precision))
        losses[precision] = torch.stack(learner.optimizer_step.loss_of(batch, 0.01, 0.0)[:4]).detach()
    torch.testing.assert_close(losses["bf16"], losses["fp32"], rtol=0.05, atol=2e-3)

    learner.updates = 1000  # past the warm-up: a real step
    result = learner.update(batch)
    assert result["finite"]
    assert all(p.dtype == torch.float32 for p in policy.learner.parameters())
    state = learner.optimizer_step.optimizer.state.values()
    assert all(v.dtype == torch.float32 for s in state for v in s.values()
               if torch.is_tensor(v) and v.is_floating_point())


def test_the_actors_bf16_copy_acts_exactly_as_autocast_on_the_learners_weights():
    """The actor copy keeps bf16 weights (cast once per publish, not at every step); what it computes
    is what the fp32 weights give under autocast, to the bit, before and after a publish."""
    cfg = compose_train(["env=atari", "model.use_lstm=true", "model.last_action_reward=true"])
    torch.manual_seed(0)
    policy = ActorLearner((4, 84, 84), 6, cfg.model)
    policy.share_actor(actor_precision="bf16")
    assert policy.actor.encoder.fc[0].weight.dtype == policy.actor.policy.bias.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in policy.actor.core.parameters())  # the LSTM stays fp32
    assert all(p.is_shared() for p in policy.actor.parameters())
    assert all(p.dtype == torch.float32 for p in policy.learner.parameters())
    obs = _pong_batch(T=3, B=5)
    first, action, reward = torch.zeros(4, 5, dtype=torch.bool), torch.randint(0, 6, (4, 5)), torch.randn(4, 5)
    for _ in range(2):
        with torch.no_grad(), autocast("bf16"):
            expected = policy.learner(obs, first, policy.learner.initial_state(5), action, reward)
            got = policy.actor(obs, first, policy.actor.initial_state(5), action, reward)
        for e, g in zip((*expected[:2], *expected[2]), (*got[:2], *got[2]), strict=True):
            assert g.dtype == torch.float32 and torch.equal(e, g)
        with torch.no_grad():
            for p in policy.learner.parameters():
                p.add_(0.01 * torch.randn_like(p))
        policy.publish()
    with torch.no_grad(), autocast("bf16"):
        out, _ = policy.actor.act(obs[0], first[0], policy.actor.initial_state(5), False, action[0], reward[0])
    assert out["action"].shape == (5,)
    policy.share_actor(actor_precision="fp32")  # back to fp32 weights: runs without autocast
    assert all(p.dtype == torch.float32 and p.is_shared() for p in policy.actor.parameters())
    policy.actor(obs, first, policy.actor.initial_state(5), action, reward)


def test_frames_become_bf16_directly_under_autocast_with_the_values_of_the_float32_path():
    from distrl.nn.encoders import _to_float_image

    frames = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    assert _to_float_image(frames).dtype == torch.float32
    with autocast("bf16"):
        direct = _to_float_image(frames)
    assert direct.dtype == torch.bfloat16 and direct.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(direct, _to_float_image(frames).to(torch.bfloat16))


@pytest.mark.long
def test_the_benchmark_measures_the_precision_given_on_its_command_line():
    """scripts/bench.py with ``precision=fp32`` among its overrides measures fp32 (it once appended
    its own ``precision=auto`` after them and measured bf16 on a bf16 CPU); with ``--precisions`` too
    it refuses the pair."""
    bench = [sys.executable, str(REPO / "scripts" / "bench.py"), "env=atari", "precision=fp32", "--only", "E",
             "--seconds", "0.3", "--warmup", "0"]
    done = subprocess.run(bench, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    asked = [json.loads(line)["precision"] for line in done.stdout.splitlines() if '"asked"' in line]
    assert asked == [{"asked": "fp32", "learner": "fp32", "why": "set", "actors": "fp32"}]
    both = subprocess.run([*bench, "--precisions", "bf16"], capture_output=True, text=True, timeout=300)
    assert both.returncode == 2 and "precision=fp32 and --precisions bf16: give one of them" in both.stderr

"""``Learner.update`` on hand-made batches: which rows it reads, what it bootstraps from.

On-policy batches (behaviour logits = the network's own), so V-trace's rho = c = 1 and its
targets are plain n-step returns that can be written out here by hand:
``vs_t = r_t + gamma * vs_{t+1}``, ending in ``V(obs_T)`` (the bootstrap row), ``0`` after a
termination, and the stored ``truncation_value`` after a truncation.
"""

import dataclasses
import math

import pytest
import torch
from conftest import compose_train

from distrl.learning.learner import Learner, make_learner, make_optimizer
from distrl.learning.schedule import Schedule
from distrl.learning.step import StepOptions
from distrl.nn.actor_learner import ActorLearner

T, B, OBS, A, GAMMA = 3, 2, 4, 2, 0.9


def learner_for(cfg, policy, num_train_steps: int = 10**9, steps_per_update: int = T * B, intrinsic=None) -> Learner:
    """A learner of ``cfg`` whose updates consume ``steps_per_update`` agent steps of a budget of
    ``num_train_steps`` (the schedule's constants as the trainer makes them, with other sizes)."""
    cfg.train.num_train_steps = num_train_steps
    schedule = dataclasses.replace(Schedule.for_run(cfg), steps_per_update=steps_per_update)
    return make_learner(policy, make_optimizer(policy, cfg.agent), schedule, cfg.agent,
                        StepOptions(torch.device("cpu")), pretraining=cfg.train.pretraining, intrinsic=intrinsic)


def make():
    cfg = compose_train(["experiment=cartpole", f"agent.discount={GAMMA}"])
    torch.manual_seed(0)
    policy = ActorLearner((OBS,), A, cfg.model)
    policy.share_actor()
    return learner_for(cfg, policy), policy


def on_policy_batch(policy, seed: int = 0, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """A ``[T+1, B]`` batch of random observations whose behaviour logits and values are the
    learner copy's own, on ``device`` (the policy's); the same values whatever the device."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(T + 1, B, OBS, generator=g).to(device)
    first = torch.zeros(T + 1, B, dtype=torch.bool, device=device)
    with torch.no_grad():
        logits, values, _ = policy.learner(obs, first)
    return {
        "obs": obs, "first": first, "action": torch.randint(0, A, (T + 1, B), generator=g).to(device),
        "policy_params": logits, "baseline": values,
        "reward": (torch.rand(T + 1, B, generator=g) * 2 - 1).to(device),  # inside the reward clip
        "terminated": torch.zeros(T + 1, B, dtype=torch.bool, device=device),
        "truncated": torch.zeros(T + 1, B, dtype=torch.bool, device=device),
        "truncation_value": torch.zeros(T + 1, B, device=device),
        "policy_version": torch.zeros(B, dtype=torch.int64, device=device), "env_id": torch.arange(B, device=device),
    }


def hand_targets(policy, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values [T+1, B], vs [T, B])``: the network's values and the on-policy V-trace targets
    written out row by row, ``vs_t = r_t + gamma vs_{t+1}`` from ``V(obs_T)``, ``r_t`` after a
    termination, ``r_t + gamma truncation_value_t`` after a truncation."""
    with torch.no_grad():
        _, values, _ = policy.learner(batch["obs"], batch["first"])
    vs = torch.zeros(T, B)
    for b in range(B):
        target = values[T, b].item()  # bootstrap: the value of row T's observation
        for t in reversed(range(T)):
            r = batch["reward"][t, b].item()
            if batch["terminated"][t, b]:
                target = r
            elif batch["truncated"][t, b]:
                target = r + GAMMA * batch["truncation_value"][t, b].item()
            else:
                target = r + GAMMA * target
            vs[t, b] = target
    return values, vs


def expected_value_loss(policy, batch) -> float:
    """0.5 x mean over the T x B steps of (vs_t - V(obs_t))^2, vs from :func:`hand_targets`."""
    values, vs = hand_targets(policy, batch)
    return (0.5 * (vs - values[:T]) ** 2).mean().item()


def test_the_value_target_is_the_n_step_return_bootstrapped_from_row_T():
    learner, policy = make()
    batch = on_policy_batch(policy)
    expected = expected_value_loss(policy, batch)
    assert learner.update(batch)["value"] == pytest.approx(expected, rel=1e-5)


def test_row_T_of_the_step_keys_is_never_read():
    """Row T's reward and episode ends belong to the next slot's row 0."""
    learner, policy = make()
    batch = on_policy_batch(policy)
    expected = expected_value_loss(policy, batch)
    batch["reward"][T] = 100.0
    batch["terminated"][T] = True
    batch["truncated"][T] = True
    batch["truncation_value"][T] = 50.0
    assert learner.update(batch)["value"] == pytest.approx(expected, rel=1e-5)


def test_a_termination_cuts_the_return_and_a_truncation_bootstraps_from_its_stored_value():
    learner, policy = make()
    batch = on_policy_batch(policy)
    batch["terminated"][1, 0] = True
    batch["first"][2, 0] = True
    batch["truncated"][0, 1] = True
    batch["first"][1, 1] = True
    batch["truncation_value"][0, 1] = 7.5  # far from any value the network gives: used exactly
    expected = expected_value_loss(policy, batch)
    with_next_value = dict(batch, truncation_value=torch.zeros(T + 1, B))
    assert expected != pytest.approx(expected_value_loss(policy, with_next_value), rel=1e-3)
    assert learner.update(batch)["value"] == pytest.approx(expected, rel=1e-5)


def test_normalize_advantages_standardises_the_policy_gradients_advantages_over_the_batch():
    """On-policy, the advantage of step t is ``r_t + gamma vs_{t+1} - V(x_t)``; with
    ``agent.normalize_advantages`` the policy loss uses them shifted and scaled to mean 0 and
    standard deviation 1 over the T x B steps, and nothing else of the loss changes."""
    losses = {}
    for normalize in (False, True):
        cfg = compose_train(["experiment=cartpole", f"agent.discount={GAMMA}",
                             f"agent.normalize_advantages={normalize}"])
        torch.manual_seed(0)
        policy = ActorLearner((OBS,), A, cfg.model)
        policy.share_actor()
        batch = on_policy_batch(policy)
        with torch.no_grad():
            logits, _, _ = policy.learner(batch["obs"], batch["first"])
        values, vs = hand_targets(policy, batch)
        advantages = batch["reward"][:T] + GAMMA * torch.cat([vs[1:], values[T:]]) - values[:T]
        if normalize:
            advantages = (advantages - advantages.mean()) / advantages.std(correction=0)
        log_probs = torch.log_softmax(logits[:T], -1).gather(-1, batch["action"][:T, :, None]).squeeze(-1)
        expected = -(log_probs * advantages).mean().item()
        losses[normalize] = learner_for(cfg, policy).update(batch)
        assert losses[normalize]["policy"] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert losses[True]["policy"] != pytest.approx(losses[False]["policy"], rel=1e-2)
    assert losses[True]["value"] == pytest.approx(losses[False]["value"], rel=1e-6)


def test_the_learning_rate_warms_up_linearly_then_decays_to_zero():
    W, N = 5 * T * B, 20 * T * B  # warm-up over 5 updates, budget of 20 updates
    cfg = compose_train(["experiment=cartpole", f"agent.lr_warmup_steps={W}"])
    policy = ActorLearner((OBS,), A, cfg.model)
    policy.share_actor()
    learner = learner_for(cfg, policy, N)
    rates = [learner.update(on_policy_batch(policy, seed))["learning_rate"] for seed in range(20)]
    expected = [cfg.agent.lr * min(1, (k + 1) / 5) * (1 - k / 20) for k in range(20)]
    assert rates == pytest.approx(expected)


def test_a_schedule_of_points_holds_the_entropy_cost_then_ramps_it_to_the_last_factor():
    """``[[2TB, 1.0], [6TB, 0.2]]``: the update at k x T x B agent steps uses ``entropy_cost`` times
    1 up to 2 updates in, then 0.8, 0.6, 0.4, then 0.2 for good."""
    cfg = compose_train(["experiment=cartpole", f"agent.entropy_schedule=[[{2 * T * B},1.0],[{6 * T * B},0.2]]"])
    policy = ActorLearner((OBS,), A, cfg.model)
    policy.share_actor()
    learner = learner_for(cfg, policy, 100 * T * B)
    costs = [learner.update(on_policy_batch(policy, seed))["entropy_cost"] for seed in range(9)]
    factors = [1.0, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2, 0.2, 0.2]
    assert costs == pytest.approx([cfg.agent.entropy_cost * f for f in factors])


def test_epochs_are_optimizer_steps_on_the_same_batch_with_one_schedule_step():
    """``agent.num_epochs=2``: the weights after one update are those after two one-epoch updates
    on the same batch; the first epoch's losses are reported, the actors get the weights once and
    the learning rate advances by one batch's agent steps."""
    def build(epochs: int):
        cfg = compose_train(["experiment=cartpole", f"agent.num_epochs={epochs}"])
        torch.manual_seed(0)
        policy = ActorLearner((OBS,), A, cfg.model)
        policy.share_actor()
        return learner_for(cfg, policy, 10 * T * B), policy  # the lr falls by a tenth an update

    twice, policy2 = build(2)
    once, policy1 = build(1)
    batch = on_policy_batch(policy2)
    published = []
    policy2.publish = lambda: published.append(True)
    losses = twice.update(batch)
    assert published == [True]
    assert twice.updates == 1 and twice.position.learning_rate == pytest.approx(0.9 * losses["learning_rate"])

    first = once.update(batch)
    once.updates = 0  # the second step at the first step's learning rate
    once.update(batch)
    assert losses["total"] == pytest.approx(first["total"])
    for p2, p1 in zip(policy2.learner.parameters(), policy1.learner.parameters(), strict=True):
        torch.testing.assert_close(p2, p1)
    start = build(1)[1]
    assert any(not torch.equal(p, q) for p, q in zip(policy2.learner.parameters(),
                                                         start.learner.parameters(), strict=True))


@pytest.mark.parametrize("warmup_steps", [0, 80_000])
def test_the_first_update_on_pong_leaves_the_policy_near_uniform_only_with_a_warm_up(warmup_steps):
    """torch's RMSProp starts its mean of squared gradients at 0: without a warm-up its first step
    moves every weight by 10 x lr in the sign of its gradient, and the Atari policy collapses."""
    from distrl.envs import make_vector_env

    cfg = compose_train(["agent=impala", f"agent.lr_warmup_steps={warmup_steps}"])
    steps, envs = cfg.num_steps, cfg.batch_size
    torch.manual_seed(0)
    env = make_vector_env(cfg.env, envs)
    try:
        obs, _ = env.reset(seed=0)
        frames = [torch.from_numpy(obs)]
        for _ in range(steps):
            obs, *_ = env.step(torch.randint(0, 6, (envs,)).numpy())
            frames.append(torch.from_numpy(obs))
    finally:
        env.close()
    policy = ActorLearner(tuple(frames[0].shape[1:]), 6, cfg.model)
    policy.share_actor()
    learner = make_learner(policy, make_optimizer(policy, cfg.agent), Schedule.for_run(cfg), cfg.agent,
                      StepOptions(torch.device("cpu")))
    obs = torch.stack(frames)  # [T+1, B, 4, 84, 84] uint8
    first = torch.zeros(steps + 1, envs, dtype=torch.bool)
    with torch.no_grad():
        logits, values, _ = policy.learner(obs, first)
    batch = {"obs": obs, "first": first, "action": torch.randint(0, 6, (steps + 1, envs)),
             "policy_params": logits, "baseline": values, "reward": torch.zeros(steps + 1, envs),
             "terminated": torch.zeros(steps + 1, envs, dtype=torch.bool),
             "truncated": torch.zeros(steps + 1, envs, dtype=torch.bool),
             "truncation_value": torch.zeros(steps + 1, envs), "policy_version": torch.zeros(envs, dtype=torch.int64)}
    batch["reward"][2, 3] = 1.0  # one point scored
    learner.update(batch)
    with torch.no_grad():
        after = torch.distributions.Categorical(logits=policy.learner(obs, first)[0]).entropy().mean().item()
    if warmup_steps:
        assert after > 0.99 * math.log(6)
    else:
        assert after < 0.5 * math.log(6)  # the defect the warm-up is for


@pytest.mark.long
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_th_compile_makes_the_network_and_the_loss_one_graph_that_steps_as_eager_does(mode):
    """``train.th_compile=true``: the learner network and APPO's loss (PFO's drift term with it, the
    default) compile into one graph (no graph break, since the loss reads its config as plain
    values), whose update reports eager's losses and leaves eager's weights, to float32's rounding;
    another entropy cost is no new graph. In either ``train.compile_mode`` (on the CPU
    ``reduce-overhead`` has no CUDA graphs to make: tests/test_cuda.py checks them). About 20 s of
    compiling on 2 cores each."""
    from torch._dynamo.utils import counters

    def build(compile: bool) -> tuple[Learner, ActorLearner]:
        cfg = compose_train(["experiment=cartpole", "agent=appo", "agent.num_minibatches=2", "agent.num_epochs=2"])
        cfg.train.num_train_steps = 10**9
        torch.manual_seed(0)
        policy = ActorLearner((OBS,), A, cfg.model)
        policy.share_actor()
        schedule = dataclasses.replace(Schedule.for_run(cfg), steps_per_update=T * B)
        return make_learner(policy, make_optimizer(policy, cfg.agent), schedule, cfg.agent,
                       StepOptions(torch.device("cpu"), compile_mode=mode if compile else None)), policy

    torch._dynamo.reset()
    counters.clear()
    compiled, compiled_policy = build(True)
    eager, eager_policy = build(False)
    batch = on_policy_batch(eager_policy)
    expected = eager.update(batch)
    got = compiled.update(batch)
    for name in ("total", "policy", "value", "entropy", "grad_norm", "clip_fraction", "approx_kl"):
        assert got[name] == pytest.approx(expected[name], rel=1e-5, abs=1e-6), name
    for p, q in zip(compiled_policy.learner.parameters(), eager_policy.learner.parameters(), strict=True):
        torch.testing.assert_close(p, q)
    # a minibatch's shape, with what the plan adds before the first step (PFO's anchor: APPO's default)
    prepared = compiled.plan.prepare(batch, compiled.optimizer_step.forward, 0.0)
    compiled.optimizer_step.loss_of(next(compiled.plan.minibatches(prepared)), 0.02, 0.0)
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 1

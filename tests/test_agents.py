"""The agents' losses (:mod:`distrl.learning.losses`): APPO's clipped surrogate and value clipping written out
by hand, the minibatch plan the learner follows, V-trace recomputed per minibatch."""

import pytest
import torch
from conftest import compose_train
from test_learner import GAMMA, OBS, A, B, T, hand_targets, learner_for, on_policy_batch

from distrl.learning.losses import ClippedSurrogate, PolicyGradient, VTrace, make_loss
from distrl.learning.losses.appo import clip_bounds, clipped_surrogate_loss, clipped_value_loss, ratio_diagnostics
from distrl.learning.plan import UpdatePlan
from distrl.nn.actor_learner import ActorLearner


def test_the_clipped_surrogate_stops_the_gradient_outside_the_clip_on_the_advantages_side():
    """PPO's eq. 7: with A > 0 a ratio above 1 + clip earns nothing more (no gradient), below it the
    gradient is A r; with A < 0 the same below 1 - clip."""
    clip = 0.2
    log_ratios = torch.log(torch.tensor([[1.5, 1.1, 0.5, 0.9]])).requires_grad_()
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    loss = clipped_surrogate_loss(log_ratios, advantages, *clip_bounds(clip))
    loss.backward()
    expected = -torch.tensor([1.2 * 1.0, 1.1 * 1.0, 0.8 * -1.0, 0.9 * -1.0]).mean()
    assert loss.item() == pytest.approx(expected.item())
    # d(-mean r A)/d log r = -r A / n where the unclipped term is the min, 0 where the clipped one is
    torch.testing.assert_close(log_ratios.grad, torch.tensor([[0.0, -1.1 / 4, 0.0, 0.9 / 4]]))


def test_sample_factorys_reciprocal_range_and_ratio_clamp():
    """``agent.clip_range=reciprocal``: the ratio clipped to [1/1.2, 1.2] (Sample Factory's, symmetric in
    log r); ``agent.ratio_clamp=[0.05, 20]``: the ratio clamped there first, with no gradient beyond."""
    assert clip_bounds(0.2, "reciprocal") == pytest.approx((1 / 1.2, 1.2))
    log_ratios = torch.log(torch.tensor([[0.8, 0.85, 30.0, 0.01]])).requires_grad_()
    advantages = torch.tensor([[-1.0, -1.0, -1.0, 1.0]])
    loss = clipped_surrogate_loss(log_ratios, advantages, *clip_bounds(0.2, "reciprocal"), ratio_clamp=(0.05, 20.0))
    loss.backward()
    # A < 0: min(r A, clip(r) A) = -max(r, clip(r)): 1/1.2 (0.8 clipped up), 0.85, 20 (clamped), and A > 0: 0.05
    expected = -torch.tensor([-1 / 1.2, -0.85, -20.0, 0.05]).mean()
    assert loss.item() == pytest.approx(expected.item())
    torch.testing.assert_close(log_ratios.grad, torch.tensor([[0.0, 0.85 / 4, 0.0, 0.0]]))
    got = ratio_diagnostics(log_ratios, *clip_bounds(0.2, "reciprocal"))
    assert got["clip_fraction"].item() == pytest.approx(0.75)  # 0.8, 30 and 0.01 lie outside [0.833, 1.2]
    cfg = compose_train(["experiment=cartpole", "agent=appo", "agent.clip=0.2", "agent.clip_range=reciprocal",
                         "agent.ratio_clamp=[0.05,20]"])
    objective = make_loss(cfg.agent, 2).objective
    assert (objective.low, objective.high, objective.ratio_clamp) == (pytest.approx(1 / 1.2), 1.2, (0.05, 20.0))
    from distrl.config.schema import ConfigError
    from distrl.config.validation import validate_config
    for bad, key in (("agent.clip_range=log", "agent.clip_range"), ("agent.ratio_clamp=[1.5,20]", "agent.ratio_clamp"),
                     ("agent.ratio_clamp=[0.05]", "agent.ratio_clamp")):
        with pytest.raises(ConfigError, match=key):
            validate_config(compose_train(["experiment=cartpole", "agent=appo", bad]))


def test_value_clipping_keeps_the_larger_error_of_the_clipped_and_the_free_value():
    values = torch.tensor([[1.0, 0.05, -1.0]], requires_grad=True)
    old = torch.zeros(1, 3)
    targets = torch.tensor([[2.0, 0.0, 0.0]])
    # clipped values 0.1, 0.05, -0.1: errors max((1-2)^2, (0.1-2)^2), max(0.05^2, 0.05^2), max(1, 0.01)
    loss = clipped_value_loss(values, old, targets, clip=0.1)
    assert loss.item() == pytest.approx(0.5 * (1.9**2 + 0.05**2 + 1.0) / 3)
    assert clipped_value_loss(values, old, targets, None).item() == pytest.approx(0.5 * (1.0 + 0.05**2 + 1.0) / 3)


def test_the_ratio_diagnostics_are_the_share_outside_the_clip_and_the_k3_kl_estimate():
    ratios = torch.tensor([[1.5, 1.1, 0.5, 0.95]])
    got = ratio_diagnostics(ratios.log(), *clip_bounds(0.2))
    assert got["clip_fraction"].item() == pytest.approx(0.5)  # 1.5 and 0.5 lie outside [0.8, 1.2]
    assert got["approx_kl"].item() == pytest.approx(((ratios - 1) - ratios.log()).mean().item())
    assert got["approx_kl"].item() > 0 and not got["approx_kl"].requires_grad


def _appo(overrides=()):
    cfg = compose_train(["experiment=cartpole", "agent=appo", f"agent.discount={GAMMA}", "agent.trace_lambda=1.0",
                         "agent.num_minibatches=1", *overrides])
    torch.manual_seed(0)
    policy = ActorLearner((OBS,), A, cfg.model)
    policy.share_actor()
    return learner_for(cfg, policy), policy


def test_appos_first_step_is_the_clipped_surrogate_on_the_standardised_on_policy_advantages():
    """On-policy (ratio 1), one minibatch: the policy term is -mean(r A) with A the standardised
    n-step advantages; the value term is the clipped one around the stored behaviour values."""
    learner, policy = _appo(["agent.value_clip=0.05"])
    assert isinstance(learner.optimizer_step.loss.objective, ClippedSurrogate)
    batch = on_policy_batch(policy)
    batch["baseline"] = batch["baseline"] + 0.3  # the stored values differ from the network's: clipping acts
    values, vs = hand_targets(policy, batch)
    advantages = batch["reward"][:T] + GAMMA * torch.cat([vs[1:], values[T:]]) - values[:T]
    advantages = (advantages - advantages.mean()) / advantages.std(correction=0)
    losses = learner.update(batch)
    assert losses["policy"] == pytest.approx(-advantages.mean().item(), abs=1e-6)  # 0: ratio 1, mean 0
    # the first step's diagnostics are reported (logged as losses/<name>): on-policy, nothing moved yet
    assert losses["clip_fraction"] == 0.0 and losses["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    expected_value = clipped_value_loss(values[:T], batch["baseline"][:T], vs, 0.05).item()
    assert losses["value"] == pytest.approx(expected_value, rel=1e-5)
    assert expected_value != pytest.approx(clipped_value_loss(values[:T], batch["baseline"][:T], vs, None).item())


def test_an_update_makes_epochs_times_minibatches_steps_on_whole_unrolls_each_with_fresh_targets():
    """agent.num_epochs=2, agent.num_minibatches=2 on B=2: four optimizer steps, each on one whole
    unroll, every unroll once per epoch; V-trace's importance weights are those of the network of
    each step (0 on the first, on-policy step; not after the weights moved)."""
    learner, policy = _appo(["agent.num_epochs=2", "agent.num_minibatches=2"])
    batch = on_policy_batch(policy)
    batch["obs"][:, 1] += 5.0  # tell the unrolls apart
    seen, log_rhos = [], []
    targets = learner.optimizer_step.loss.minibatch_targets

    def recording(minibatch, *args):
        seen.append(minibatch["obs"].clone())
        out = targets(minibatch, *args)
        log_rhos.append(out.log_rhos.detach().abs().max().item())
        return out

    learner.optimizer_step.loss.minibatch_targets = recording
    learner.update(batch)
    assert len(seen) == 4 and all(obs.shape == (T + 1, 1, OBS) for obs in seen)
    for epoch in (seen[:2], seen[2:]):
        got = sorted(round(obs.mean().item(), 4) for obs in epoch)
        want = sorted(round(batch["obs"][:, b:b + 1].mean().item(), 4) for b in range(B))
        assert got == want
    assert log_rhos[0] == 0.0 and max(log_rhos[1:]) > 0.0
    assert learner.updates == 1


def test_the_loss_is_the_agents_own_by_name():
    cfg = compose_train(["experiment=cartpole"])
    loss = make_loss(cfg.agent, 2)
    assert isinstance(loss.objective, PolicyGradient) and isinstance(loss.estimator, VTrace)
    cfg = compose_train(["experiment=cartpole", "agent=appo"])
    loss = make_loss(cfg.agent, 2)
    assert isinstance(loss.objective, ClippedSurrogate) and isinstance(loss.estimator, VTrace)
    plan = UpdatePlan.for_agent(cfg.agent, loss)
    assert (plan.num_epochs, plan.minibatches_of.parts) == (4, 4)


def test_a_steps_minibatch_with_one_pass_is_the_unrolls_loss_on_the_same_batch():
    """agent.minibatch=steps, one minibatch: the targets computed once before the step are those
    the unrolls path computes on the whole batch, so the first step's losses agree (a mean over
    the same T x B steps in another order)."""
    batch_losses = []
    for minibatch in ("unrolls", "steps"):
        learner, policy = _appo([f"agent.minibatch={minibatch}", "agent.value_clip=0.05"])
        batch = on_policy_batch(policy)
        batch["baseline"] = batch["baseline"] + 0.3
        batch_losses.append(learner.update(batch))
    unrolls, steps = batch_losses
    for key in ("total", "policy", "value", "entropy", "grad_norm"):
        assert steps[key] == pytest.approx(unrolls[key], rel=1e-5, abs=1e-6), key


def test_steps_minibatches_cover_every_step_once_an_epoch_on_targets_computed_once():
    """agent.minibatch=steps, 2 epochs x T minibatches of B single steps each: every step
    once per epoch, its advantage and value target those of the batch before the first step (they
    do not move with the weights)."""
    learner, policy = _appo(["agent.minibatch=steps", "agent.num_epochs=2", f"agent.num_minibatches={T}"])
    batch = on_policy_batch(policy)
    batch["obs"][..., 0] = torch.arange(T + 1, dtype=torch.float32)[:, None] * 10 + torch.arange(B)  # the step's id
    seen = []
    targets = learner.optimizer_step.loss.minibatch_targets
    assert targets == learner.optimizer_step.loss.step_targets  # chosen by agent.minibatch=steps

    def recording(minibatch, *args):
        seen.append((minibatch["obs"][0, :, 0].clone(), minibatch["advantages"][0].clone()))
        return targets(minibatch, *args)

    learner.optimizer_step.loss.minibatch_targets = recording
    learner.update(batch)
    assert len(seen) == 2 * T and all(ids.shape == (B,) for ids, _ in seen)
    want = sorted(t * 10 + b for t in range(T) for b in range(B))
    epochs = [{i: a for ids, adv in epoch for i, a in zip(ids.tolist(), adv.tolist(), strict=True)}
              for epoch in (seen[:T], seen[T:])]
    assert sorted(epochs[0]) == sorted(epochs[1]) == want and len(set(epochs[0].values())) > 1
    assert epochs[0] == epochs[1]


def test_unshuffled_minibatches_are_the_same_contiguous_unrolls_every_epoch():
    """agent.shuffle_minibatches=false (Sample Factory's): with steps, each minibatch is whole unrolls
    taken in the batch's order, each unroll's steps in time order, and every epoch takes the same
    minibatches in the same order; with unrolls, the columns in order."""
    from distrl.learning.plan import Steps, Unrolls

    T_, B_ = 4, 6
    step_id = torch.arange(T_ + 1)[:, None] * 10 + torch.arange(B_)  # t x 10 + b
    batch = {"action": step_id, "obs": step_id.float()}
    generator = torch.Generator().manual_seed(0)
    for _ in range(2):  # two epochs, the same parts
        parts = Steps(3, shuffle=False).split(batch, generator)
        assert [p["action"][0].tolist() for p in parts] == [
            [t * 10 + b for b in (2 * k, 2 * k + 1) for t in range(T_)] for k in range(3)]
        parts = Unrolls(3, shuffle=False).split(batch, generator)
        assert [p["action"][0].tolist() for p in parts] == [[2 * k, 2 * k + 1] for k in range(3)]
    shuffled = [p["action"][0].tolist() for p in Steps(3).split(batch, generator)]
    assert sorted(sum(shuffled, [])) == sorted(step_id[:T_].reshape(-1).tolist())
    assert shuffled != [p["action"][0].tolist() for p in Steps(3, shuffle=False).split(batch, generator)]
    cfg = compose_train(["experiment=mujoco", "agent.shuffle_minibatches=false"])
    assert not UpdatePlan.for_agent(cfg.agent, make_loss(cfg.agent, 2)).minibatches_of.shuffle


def test_steps_minibatches_are_refused_with_an_lstm_and_where_they_do_not_divide_the_batch():
    from distrl.config.schema import ConfigError
    from distrl.config.validation import validate_config
    refusals = ((["model.use_lstm=true"], "agent.minibatch"), (["agent.num_minibatches=7"], "agent.num_minibatches"))
    for overrides, key in refusals:
        cfg = compose_train(["experiment=cartpole", "agent=appo", "agent.minibatch=steps", *overrides])
        with pytest.raises(ConfigError, match=key):
            validate_config(cfg)


def test_pfo_adds_the_weighted_drift_of_the_encoders_preactivations_from_the_updates_start():
    """``agent.pfo_coef``: the loss adds coef x mean (phi - phi_old)^2 over the steps and features, phi
    the encoder's output before its activation (here the MLP's last tanh); phi_old is taken at the
    update's start, so the first optimizer step sees no drift and the later ones move the weights
    differently from the same update without PFO."""
    from distrl.learning.losses.penalties import OLD_PREACTIVATIONS

    learner, policy = _appo(["agent.pfo_coef=0.5", "agent.num_epochs=2"])
    batch = on_policy_batch(policy)
    with torch.no_grad():
        _, _, _, pre = policy.learner(batch["obs"], batch["first"], with_preactivations=True)
        features = policy.learner.encoder(batch["obs"].flatten(0, 1))
    assert pre.shape == (T + 1, B, features.shape[-1])
    torch.testing.assert_close(torch.tanh(pre.flatten(0, 1)), features)  # the activation's input
    plain, _ = _appo(["agent.num_epochs=2", "agent.pfo_coef=0"])
    moved = {**batch, OLD_PREACTIVATIONS: pre + 0.1}
    got, want = learner.optimizer_step.loss_of(moved, 0.01, 0.0), plain.optimizer_step.loss_of(batch, 0.01, 0.0)
    assert got.diagnostics["feature_drift"].item() == pytest.approx(0.01, rel=1e-4)
    assert got.total.item() == pytest.approx(want.total.item() + 0.5 * 0.01, rel=1e-5)

    losses = learner.update(batch)  # 2 optimizer steps: the drift reported is the last one's, before its step
    assert losses["feature_drift"] > 0.0 and "feature_drift" not in plain.update(batch)
    assert any(not torch.equal(a, b) for a, b in zip(policy.learner.parameters(),
                                                     plain.networks.learner.parameters(), strict=True))


def test_pfos_behaviour_anchor_is_the_stored_features_and_costs_no_forward_pass():
    """``agent.pfo_anchor=behaviour``: the anchor is the batch's ``behaviour_preactivations`` (what the
    actors stored, tests/test_actor.py), so the update computes nothing before its first step; given the
    features of the update's start it makes the very update of the paper's anchor."""
    learner, policy = _appo(["agent.pfo_coef=0.5", "agent.num_epochs=2"])
    behaviour, twin = _appo(["agent.pfo_coef=0.5", "agent.num_epochs=2", "agent.pfo_anchor=behaviour"])
    twin.learner.load_state_dict(policy.learner.state_dict())
    batch = on_policy_batch(policy)
    with torch.no_grad():
        _, _, _, pre = policy.learner(batch["obs"], batch["first"], with_preactivations=True)
    assert learner.plan.loss.prepares and not behaviour.plan.loss.prepares
    assert learner.update(batch)["feature_drift"] == behaviour.update({**batch, "behaviour_preactivations": pre})[
        "feature_drift"]
    for a, b in zip(policy.learner.parameters(), twin.learner.parameters(), strict=True):
        assert torch.equal(a, b)


def test_pfo_is_refused_where_it_cannot_act():
    from distrl.config.schema import ConfigError
    from distrl.config.validation import validate_config

    with pytest.raises(ConfigError, match="agent.pfo_coef=-1.0 is not allowed: a number >= 0"):
        validate_config(compose_train(["experiment=cartpole", "agent=appo", "agent.pfo_coef=-1"]))
    with pytest.raises(ConfigError, match="agent.pfo_coef=1.0 is not allowed: 0 with one optimizer step a batch"):
        validate_config(compose_train(["experiment=cartpole", "agent=impala", "agent.pfo_coef=1"]))
    validate_config(compose_train(["experiment=cartpole", "agent=appo", "agent.pfo_coef=1"]))
    # anchored to the behaviour policy, the features drift before a single step too
    validate_config(compose_train(["experiment=cartpole", "agent=impala", "agent.pfo_coef=1",
                                   "agent.pfo_anchor=behaviour"]))
    with pytest.raises(ConfigError, match="agent.pfo_anchor='start' is not allowed: update or behaviour"):
        validate_config(compose_train(["experiment=cartpole", "agent.pfo_anchor=start"]))


def test_the_reward_scale_multiplies_the_extrinsic_rewards_before_the_clip():
    """agent.reward_scale=100 (RLeXplore's MiniGrid): the loss of the env's rewards x 100, then clipped."""
    from distrl.config.schema import ConfigError
    from distrl.config.validation import validate_config

    losses = []
    for scale, factor, clip in ((100.0, 1.0, "null"), (1.0, 100.0, "null"), (100.0, 1.0, 2.0), (1.0, 1.0, 2.0)):
        learner, policy = _appo([f"agent.reward_scale={scale}", f"agent.reward_clip={clip}"])
        batch = on_policy_batch(policy)
        batch["reward"] = batch["reward"] * factor
        losses.append(learner.update(batch))
    assert losses[0]["value"] == pytest.approx(losses[1]["value"], rel=1e-6)
    assert losses[0]["value"] > 100 * losses[3]["value"]  # the scaled rewards reach the critic's targets
    assert losses[2]["value"] != pytest.approx(losses[3]["value"], rel=1e-3)  # scaled, then clipped at 2
    with pytest.raises(ConfigError, match=r"agent.reward_scale=0.0 is not allowed: a number > 0"):
        validate_config(compose_train(["experiment=cartpole", "agent.reward_scale=0"]))
    with pytest.raises(ConfigError, match=r"agent.reward_scale=100.0 is not allowed: 1 with agent.normalize_rewards"):
        validate_config(compose_train(["experiment=cartpole", "agent.reward_scale=100",
                                       "agent.normalize_rewards=true"]))

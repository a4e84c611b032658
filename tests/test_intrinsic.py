"""Intrinsic rewards (distrl/intrinsic/) on hand-made batches, the learner's use of them, and the
keys that configure them."""

import io
import json
import subprocess
import sys

import pytest
import torch
from conftest import REPO, assert_actor_holds, compose_train, metrics
from test_learner import learner_for, on_policy_batch

from distrl.config.schema import ConfigError
from distrl.envs.sparse import SparseChain
from distrl.intrinsic import RE3, RND, make_intrinsic, needs_value_head
from distrl.learning.losses import Outputs
from distrl.learning.losses.terms import baseline_loss
from distrl.nn.actor_learner import ActorLearner
from distrl.nn.normalization import RunningMeanStd
from distrl.runtime.preflight import validate

T, B, A = 8, 4, 5


def intrinsic_cfg(name: str, **values):
    cfg = compose_train(["experiment=cartpole", f"intrinsic={name}"]).intrinsic
    for key, value in values.items():
        cfg[key] = value
    return cfg


def batch_of(obs: torch.Tensor, ended_at: tuple[int, int] | None = None,
             env_id: torch.Tensor | None = None, action: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """A ``[T+1, B]`` batch holding ``obs`` and what else the modules read: the episode ends, the
    env that wrote each slot (slot ``b`` by env ``b`` unless ``env_id`` says otherwise) and the
    actions (random unless given)."""
    terminated = torch.zeros(obs.shape[:2], dtype=torch.bool)
    if ended_at is not None:
        terminated[ended_at] = True
    return {"obs": obs, "terminated": terminated, "truncated": torch.zeros_like(terminated),
            "env_id": torch.arange(obs.shape[1]) if env_id is None else env_id,
            "action": torch.randint(0, A, obs.shape[:2]) if action is None else action}


def actor_bonuses(module, obs: torch.Tensor, ended: torch.Tensor) -> torch.Tensor:
    """``[T+1, B]``: E3B's bonuses as one actor stepping the B envs gives them to the rows of ``obs``
    (``ended [T+1, B]``: the step from row t ends an episode, so row t+1 is the next one's first)."""
    bonus = module.actor_bonus.start(obs.shape[1])
    first = torch.zeros_like(ended)
    first[0] = True
    first[1:] = ended[:-1]
    return torch.stack([bonus(obs[t], first[t], torch.arange(obs.shape[1])) for t in range(obs.shape[0])])


def test_running_mean_std_is_that_of_all_samples_seen():
    rms = RunningMeanStd((3,), prior_count=0.0)  # as the intrinsic rewards' statistics
    parts = [torch.randn(n, 3) * 2 + 1 for n in (5, 40, 1)]
    for part in parts:
        rms.update_from(part)
    every = torch.cat(parts).double()
    torch.testing.assert_close(rms.mean, every.mean(0))
    torch.testing.assert_close(rms.var, every.var(0, unbiased=False))
    assert rms.count.item() == 46


@pytest.mark.parametrize("shape, dtype", [((4, 84, 84), torch.uint8), ((3, 7, 7), torch.uint8), ((40,), torch.float32)],
                         ids=["atari-frames", "minigrid-view", "vector"])
@pytest.mark.parametrize("name", ["rnd", "re3", "e3b"])
def test_every_module_rewards_each_step_of_images_and_vectors(name, shape, dtype):
    torch.manual_seed(0)
    module = make_intrinsic(shape, intrinsic_cfg(name), newest_frame_only=shape[0] == 4, num_envs=B, num_actions=A)
    obs = torch.randint(0, 255, (T + 1, B, *shape)).to(dtype)
    batch = batch_of(obs, ended_at=(2, 1))
    if module.actor_bonus is not None:  # e3b: the bonuses an actor of B envs gives, row by row
        batch["intrinsic_bonus"] = actor_bonuses(module, obs, batch["terminated"])
    raw, normalised = module.rewards(batch)
    assert raw.shape == normalised.shape == (T, B)
    assert torch.isfinite(normalised).all() and (raw >= 0).all()
    assert raw[2, 1] == 0 and normalised[2, 1] == 0  # the step that ended its episode
    assert raw.sum() > 0


def test_rnd_rewards_new_observations_more_than_those_it_was_trained_on():
    """As the learner calls it: each batch's rewards (which update the observation statistics), then
    a predictor step on it."""
    torch.manual_seed(0)
    module = RND((40,), intrinsic_cfg("rnd", lr=1e-3))

    def seen_cells() -> torch.Tensor:  # cells 0-4, one-hot
        return torch.eye(40)[torch.randint(0, 5, (T + 1, B))]

    losses = []
    for _ in range(150):
        batch = batch_of(seen_cells())
        module.rewards(batch)
        losses.append(module.update(batch))
    assert losses[-1] < 0.1 * losses[0]
    obs = seen_cells()
    obs[5, 2] = torch.eye(40)[30]  # one observation of a cell never seen
    raw, normalised = module.rewards(batch_of(obs))
    others = torch.ones_like(raw, dtype=torch.bool)
    others[4, 2] = False  # step 4 led to row 5
    assert raw[4, 2] > 10 * raw[others].mean() and normalised[4, 2] > 10 * normalised[others].mean()


def test_re3_rewards_observations_with_few_neighbours_among_those_their_env_saw():
    torch.manual_seed(0)
    spread = torch.eye(40)[torch.randperm(40)[: (T + 1) * B].view(T + 1, B)]  # 36 different cells
    module = RE3((40,), intrinsic_cfg("re3"), num_envs=B)
    spread_raw, _ = module.rewards(batch_of(spread))
    assert (spread_raw > 0).all()
    # the reward is log(1 + the distance to the k-th nearest other observation of the same env), k = 3
    y = module.encoder(spread[1:, 0])
    distances = torch.cdist(y, y, compute_mode="donot_use_mm_for_euclid_dist")[0].sort().values
    assert spread_raw[0, 0] == pytest.approx(torch.log1p(distances[3]).item(), rel=1e-5)

    crowded = torch.zeros(T + 1, B, 40)
    crowded[..., 0] = 1.0  # everyone in cell 0: every neighbour at distance 0
    assert RE3((40,), intrinsic_cfg("re3"), num_envs=B).rewards(batch_of(crowded))[0].abs().max() == 0

    # each env's memory holds its own last observations: env 0 has seen cell 30 often, env 1 never;
    # cell 30 is new to env 1 only, and a batch with two slots of env 0 counts the first as seen
    module = RE3((40,), intrinsic_cfg("re3", memory=32), num_envs=2)
    seen = torch.eye(40)[torch.zeros(T + 1, 2, dtype=torch.int64)]  # cell 0 in both envs
    seen[1:5, 0] = torch.eye(40)[30]  # and cell 30 in env 0
    for _ in range(6):
        module.rewards(batch_of(seen))
    assert module.filled.tolist() == [32, 32]
    obs = torch.eye(40)[torch.zeros(T + 1, 2, dtype=torch.int64)]
    obs[3, :] = torch.eye(40)[30]
    raw, _ = module.rewards(batch_of(obs))
    assert raw[2, 1] > 0 and raw.sum() == raw[2, 1]
    fresh = RE3((40,), intrinsic_cfg("re3", memory=32), num_envs=1)
    twice = torch.eye(40)[torch.randint(0, 5, (T + 1, 2))]
    twice[3, :] = torch.eye(40)[30]  # cell 30 in two slots of the same env (k = 3: 4 of them in the second)
    twice[4:7, 0] = torch.eye(40)[30]
    raw, _ = fresh.rewards(batch_of(twice, env_id=torch.zeros(2, dtype=torch.int64)))
    assert raw[2, 0] == 0 and raw[2, 1] == 0


def test_re3_with_obs_norm_pays_the_same_whatever_each_elements_scale():
    """``intrinsic.obs_norm``: the inputs standardised per element (as rllte's RE3), so an element
    with small values (MiniGrid's door state, 0-2) weighs as much as one with large ones (its object
    index, 0-10): rescaling and shifting each element leaves the rewards as they were. Without it
    they change."""
    torch.manual_seed(0)
    obs = torch.randn(T + 1, B, 40)
    scale, shift = torch.rand(40) * 10 + 0.1, torch.randn(40) * 5
    for obs_norm in (True, False):
        rewards = []
        for x in (obs, obs * scale + shift):
            torch.manual_seed(1)  # the same random encoder
            module = RE3((40,), intrinsic_cfg("re3", obs_norm=obs_norm), num_envs=B)
            rewards.append(module.rewards(batch_of(x))[0])
        if obs_norm:
            torch.testing.assert_close(rewards[0], rewards[1], rtol=1e-4, atol=1e-5)
        else:
            assert not torch.allclose(rewards[0], rewards[1], rtol=1e-2)


def test_re3_memory_of_another_shape_starts_empty_on_resume():
    """A checkpoint of a run with other env counts, or of the one memory all envs shared before."""
    module = RE3((40,), intrinsic_cfg("re3", memory=32), num_envs=2)
    module.rewards(batch_of(torch.randn(T + 1, 2, 40)))
    state = module.checkpoint_state()
    state["module"] = {**state["module"], "memory": torch.ones(1024, 128), "filled": torch.tensor(1024),
                       "next_row": torch.tensor(0)}
    other = RE3((40,), intrinsic_cfg("re3", memory=32), num_envs=2)
    other.load_checkpoint_state(state)
    assert other.filled.tolist() == [0, 0]
    torch.testing.assert_close(other.encoder.state_dict(), module.encoder.state_dict())


@pytest.mark.parametrize("name, values", [("rnd", {}), ("re3", {}), ("re3", {"obs_norm": True}), ("e3b", {})],
                         ids=["rnd", "re3", "re3-obs_norm", "e3b"])
def test_a_module_state_resumes_exactly(name, values):
    torch.manual_seed(0)
    first = make_intrinsic((40,), intrinsic_cfg(name, **values), num_envs=B, num_actions=A)
    batches = [{**batch_of(torch.randn(T + 1, B, 40)), "intrinsic_bonus": torch.rand(T + 1, B)} for _ in range(3)]
    for batch in batches[:2]:
        first.rewards(batch)
        first.update(batch)
    saved = io.BytesIO()
    torch.save(first.checkpoint_state(), saved)  # as a checkpoint holds it, loadable with weights_only
    saved.seek(0)
    state = torch.load(saved, weights_only=True)
    torch.manual_seed(1)
    second = make_intrinsic((40,), intrinsic_cfg(name, **values), num_envs=B, num_actions=A)
    second.load_checkpoint_state(state)
    for module in (first, second):
        module.update(batches[2])
    torch.testing.assert_close(first.rewards(batches[2]), second.rewards(batches[2]))


def test_e3b_bonus_is_the_elliptical_potential_of_the_episode_so_far():
    """Henaff et al. 2022, Eq. 2: ``b_t = phi_t^T (ridge I + sum_{i<t} phi_i phi_i^T)^-1 phi_t`` over the
    episode's earlier observations, written with a matrix inverse; each env its own, restarted at an
    episode's first observation."""
    torch.manual_seed(0)
    module = make_intrinsic((40,), intrinsic_cfg("e3b", ridge=0.5), num_envs=2, num_actions=A)
    obs = torch.randn(T + 1, 2, 40)
    ended = torch.zeros(T + 1, 2, dtype=torch.bool)
    ended[4, 1] = True  # env 1's episode ends at step 4: row 5 starts the next one
    bonuses = actor_bonuses(module, obs, ended)
    phi = module.actor_bonus.encoder(obs.reshape(-1, 40)).view(T + 1, 2, -1).double()
    for env, starts in ((0, [0]), (1, [0, 5])):
        for t in range(T + 1):
            start = max(s for s in starts if s <= t)
            seen = phi[start:t, env]
            cov = 0.5 * torch.eye(phi.shape[-1], dtype=torch.float64) + seen.T @ seen
            expected = phi[t, env] @ torch.linalg.inv(cov) @ phi[t, env]
            assert bonuses[t, env].item() == pytest.approx(expected.item(), rel=1e-3)
    assert bonuses[5, 1].item() == pytest.approx((phi[5, 1] @ phi[5, 1]).item() / 0.5, rel=1e-4)  # |phi|^2 / ridge
    again = obs.clone()
    again[6, 0] = obs[2, 0]  # an embedding the episode has seen: a small bonus
    assert actor_bonuses(module, again, ended)[6, 0] < 0.1 * bonuses[:, 0].mean()


def test_e3b_with_unit_embedding_pays_the_bonus_of_phis_direction_whatever_its_scale():
    """``intrinsic.unit_embedding``: the bonus of ``phi / |phi|``, so an episode's first is exactly
    ``1 / ridge``, none is more, and scaling ``phi`` by 10 changes none."""
    torch.manual_seed(0)
    module = make_intrinsic((40,), intrinsic_cfg("e3b", ridge=0.5, unit_embedding=True), num_envs=2, num_actions=A)
    obs = torch.randn(T + 1, 2, 40)
    ended = torch.zeros(T + 1, 2, dtype=torch.bool)
    bonuses = actor_bonuses(module, obs, ended)
    torch.testing.assert_close(bonuses[0], torch.full((2,), 2.0))
    assert (bonuses <= 2.0 + 1e-5).all() and (bonuses[1:] < 2.0).all()
    with torch.no_grad():
        module.actor_bonus.encoder[-2].weight.mul_(10.0)
        module.actor_bonus.encoder[-2].bias.mul_(10.0)
    torch.testing.assert_close(actor_bonuses(module, obs, ended), bonuses, rtol=1e-4, atol=1e-5)
    plain = make_intrinsic((40,), intrinsic_cfg("e3b", ridge=0.5), num_envs=2, num_actions=A)
    plain.actor_bonus.encoder.load_state_dict(module.actor_bonus.encoder.state_dict())
    assert actor_bonuses(plain, obs, ended)[0].min() > 10.0  # of phi itself: |phi|^2 / ridge


@pytest.mark.parametrize("shape", [(3, 7, 7), (40,)], ids=["images", "vectors"])
def test_e3b_embeddings_end_in_a_relu_as_both_references_do(shape):
    """E3B's ``phi`` is ``>= 0`` (E3B's and RLeXplore's embeddings end in a ReLU), and the ReLU holds
    no weights: a state dict of the layers before it (a checkpoint from before it) loads."""
    torch.manual_seed(0)
    module = make_intrinsic(shape, intrinsic_cfg("e3b"), num_envs=1, num_actions=A)
    obs = torch.randint(0, 11, (64, *shape), dtype=torch.uint8) if len(shape) == 3 else torch.randn(64, *shape)
    phi = module.encoder(module.inputs(obs))
    assert phi.shape == (64, module.cfg.embed_dim) and (phi >= 0).all() and (phi > 0).float().mean() > 0.2
    before = torch.nn.Sequential(*list(module.encoder)[:-1]).state_dict()
    module.encoder.load_state_dict(before)


def test_e3b_with_the_models_encoder_embeds_as_rlexplores_minigrid_runs():
    """``intrinsic.encoder=model``: ``phi`` has ``model.encoder``'s layers (minigrid_cnn: three 2x2
    convolutions, a Linear + ReLU, as RLeXplore's MinigridEncoder) with ``embed_dim`` outputs and
    weights of its own, on the cell indices unscaled; the actors' copy computes the same bonus."""
    from distrl.nn.encoders import MiniGridCNN

    cfg = compose_train(["experiment=minigrid", "intrinsic=e3b", "intrinsic.encoder=model", "intrinsic.embed_dim=64"])
    validate(cfg)
    torch.manual_seed(0)
    module = make_intrinsic((3, 7, 7), cfg.intrinsic, num_envs=2, num_actions=A, model=cfg.model)
    assert isinstance(module.encoder, MiniGridCNN)
    obs = torch.randint(0, 11, (T + 1, 2, 3, 7, 7), dtype=torch.uint8)
    phi = module.encoder(module.inputs(obs[0]))
    torch.testing.assert_close(phi, module.encoder(obs[0].float()))  # the indices as numbers, not / 255
    assert phi.shape == (2, 64) and (phi >= 0).all() and (phi > 0).any()
    expected = phi.pow(2).sum(-1) / cfg.intrinsic.ridge  # an episode's first bonus: |phi|^2 / ridge
    torch.testing.assert_close(actor_bonuses(module, obs, torch.zeros(T + 1, 2, dtype=torch.bool))[0], expected)
    assert module.update(batch_of(obs, action=torch.randint(0, A, (T + 1, 2)))) > 0
    with pytest.raises(ConfigError, match=r"intrinsic.encoder='policy' is not allowed: own or model"):
        validate(compose_train(["experiment=minigrid", "intrinsic=e3b", "intrinsic.encoder=policy"]))


@pytest.mark.parametrize("normalize, clip", [("returns", None), ("rewards", None), ("rewards", 1.0)])
def test_intrinsic_rewards_are_divided_by_the_running_std_chosen_then_clipped(normalize, clip):
    """``intrinsic.normalize``: the std of the discounted returns within each unroll (E3B's episodic
    ones cut at an episode's end), or of the rewards of the steps that did not end an episode, over
    every batch so far; ``intrinsic.clip``: the most a normalised reward may be (E3B's defaults:
    rewards, 1)."""
    module = make_intrinsic((40,), intrinsic_cfg("e3b", normalize=normalize, clip=clip), num_envs=2, num_actions=A)
    counted = []
    for scale in (1.0, 50.0):
        batch = batch_of(torch.zeros(T + 1, 2, 40), ended_at=(2, 1))
        batch["intrinsic_bonus"] = torch.rand(T + 1, 2) * scale
        batch["intrinsic_bonus"][1, 0] = 200.0 * scale  # a spike, as an episode's first bonus is
        raw, normalised = module.rewards(batch)
        within = ~batch["terminated"][:-1]  # the steps that did not end an episode
        if normalize == "rewards":
            counted.append(raw[within])
        else:
            running, returns = torch.zeros(2), []
            for t in range(T - 1, -1, -1):
                running = raw[t] + 0.99 * running * within[t]
                returns.append(running)
            counted.append(torch.stack(returns).flatten())
    expected = raw / torch.cat(counted).double().std(unbiased=False).float()
    if clip is not None:
        assert expected.max() > clip
        expected = expected.clamp_max(clip)
    torch.testing.assert_close(normalised, expected, rtol=1e-4, atol=1e-6)


def train_on_action_world(module, updates: int, ended_at: tuple[int, int] | None = None) -> list[float]:
    """``updates`` of ``module`` on batches of a world where the action sets the next observation
    (``[40]`` vectors, one-hot cell ``a + 10``; row 0 cell 0): the inverse dynamics' losses."""
    losses = []
    for _ in range(updates):
        action = torch.randint(0, A, (T + 1, B))
        obs = torch.zeros(T + 1, B, 40)
        obs[1:] = torch.eye(40)[action[:-1] + 10]
        obs[0] = torch.eye(40)[0]
        losses.append(module.update(batch_of(obs, ended_at=ended_at, action=action)))
    return losses


def test_e3b_trains_its_embedding_by_inverse_dynamics_and_publishes_it_to_the_actors():
    """A world where the action sets the next observation (one-hot cell ``a``): the inverse dynamics'
    loss falls, the learner's rewards are the stored bonuses of rows 1..T (0 where an episode ends),
    and after each update the actors' copy of the embedding is the learner's."""
    torch.manual_seed(0)
    module = make_intrinsic((40,), intrinsic_cfg("e3b", lr=1e-3), num_envs=B, num_actions=A)
    losses = train_on_action_world(module, updates=100)
    assert losses[-1] < 0.2 * losses[0]
    for actor_p, learner_p in zip(module.actor_bonus.encoder.parameters(), module.encoder.parameters(), strict=True):
        assert torch.equal(actor_p, learner_p) and actor_p.is_shared()
    batch = {**batch_of(torch.randn(T + 1, B, 40), ended_at=(2, 1)), "intrinsic_bonus": torch.rand(T + 1, B) + 1}
    raw, _ = module.rewards(batch)
    expected = batch["intrinsic_bonus"][1:].clone()
    expected[2, 1] = 0.0
    torch.testing.assert_close(raw, expected)
    assert "actor_bonus" not in str(module.state_dict().keys())


def test_e3b_with_a_minibatch_size_takes_one_pass_of_steps_over_each_batch():
    """``intrinsic.minibatch_size`` (RLeXplore's 256): one Adam step per that many of the batch's steps
    that did not end an episode, in a random order, and the embedding learns as with one step a batch."""
    torch.manual_seed(0)
    module = make_intrinsic((40,), intrinsic_cfg("e3b", lr=1e-3, minibatch_size=8), num_envs=B, num_actions=A)
    losses = train_on_action_world(module, updates=25, ended_at=(2, 1))
    steps = {int(state["step"]) for state in module.optimizer.state.values()}
    assert steps == {25 * 4}  # 31 steps of T x B = 32 did not end an episode: 4 minibatches of up to 8
    assert losses[-1] < 0.2 * losses[0]
    for actor_p, learner_p in zip(module.actor_bonus.encoder.parameters(), module.encoder.parameters(), strict=True):
        assert torch.equal(actor_p, learner_p)


def _learner(overrides: list[str]):
    cfg = compose_train(["experiment=cartpole", *overrides])
    torch.manual_seed(0)
    policy = ActorLearner((4,), 2, cfg.model, intrinsic_value=needs_value_head(cfg.intrinsic))
    policy.share_actor()
    module = make_intrinsic((4,), cfg.intrinsic, num_envs=2)
    return learner_for(cfg, policy, intrinsic=module), policy


def test_the_episodic_choice_adds_the_weighted_intrinsic_reward_to_the_extrinsic_one():
    learner, policy = _learner(["intrinsic=rnd", "intrinsic.coef=0.3", "intrinsic.episodic=true"])
    batch = on_policy_batch(policy)
    intrinsic = torch.rand(batch["reward"].shape[0] - 1, batch["reward"].shape[1])
    with_bonus = learner.optimizer_step.loss_of({**batch, "intrinsic_reward": intrinsic}, 0.0, 0.3)
    shifted = {**batch, "reward": batch["reward"].clone()}
    shifted["reward"][:-1] += 0.3 * intrinsic  # the same rewards, added by hand (inside the clip)
    plain, _ = _learner([])  # the same network (seed), no intrinsic reward
    by_hand = plain.optimizer_step.loss_of(shifted, 0.0, 0.0)
    torch.testing.assert_close(torch.stack(with_bonus[:4]), torch.stack(by_hand[:4]))

    losses = learner.update(on_policy_batch(policy, seed=1))
    assert losses["intrinsic_coef"] == 0.3 and losses["intrinsic_loss"] > 0
    assert losses["intrinsic_reward_raw"] > 0 and losses["intrinsic_reward"] > 0


def test_the_intrinsic_share_is_the_weighted_bonus_part_of_the_reward_the_loss_sees():
    learner, policy = _learner(["intrinsic=rnd", "agent.reward_clip=1.0"])
    batch = on_policy_batch(policy)
    steps = batch["reward"][:-1]
    batch["reward"] = torch.zeros_like(batch["reward"])
    batch["reward"][0, 0], batch["reward"][1, 1] = 5.0, -0.5  # clipped: 1 + 0.5 paid
    batch["intrinsic_reward"] = torch.full_like(steps, 0.25)
    paid = 0.4 * 0.25 * steps.numel()
    assert learner.optimizer_step.loss.intrinsic_share(batch, 0.4) == pytest.approx(paid / (paid + 1.5))
    assert learner.optimizer_step.loss.intrinsic_share(batch, 0.0) == 0.0
    batch["reward"].zero_()
    assert learner.optimizer_step.loss.intrinsic_share(batch, 0.4) == 1.0


def targets(learner, batch, logits, values, coef=0.0):
    """The learner's agent's V-trace targets: ``(advantages, [vs - V per value head])``."""
    out = learner.optimizer_step.loss.unroll_targets(batch, logits, values, coef)
    return out.advantages, [vs - v for v, vs in zip(out.values, out.vs, strict=True)]


@pytest.mark.parametrize("name", ["rnd", "re3"])
def test_the_intrinsic_return_has_its_own_value_head_and_runs_on_past_an_episode_end(name):
    """The default (Burda et al. 2019, Section 2.3): novelty found after an episode's end still
    counts before it, through a second value head; the extrinsic return is cut there as always."""
    learner, policy = _learner([f"intrinsic={name}", "intrinsic.coef=0.5"])
    batch = on_policy_batch(policy)
    assert batch["baseline"].shape[-1] == 2  # [T+1, B, 2]: extrinsic, intrinsic
    batch["terminated"][0, 0] = True  # env 0's episode ends at step 0
    logits, values, _ = policy.learner(batch["obs"], batch["first"])
    intrinsic = torch.zeros(3, 2)
    later = intrinsic.clone()
    later[1, 0] = 1.0  # a bonus in env 0's next episode
    advantages, errors = targets(learner, {**batch, "intrinsic_reward": intrinsic}, logits, values, 0.5)
    advantages_later, errors_later = targets(learner, {**batch, "intrinsic_reward": later}, logits, values, 0.5)
    assert len(errors) == 2
    assert advantages_later[0, 0] > advantages[0, 0]  # seen across the episode's end
    torch.testing.assert_close(errors_later[0], errors[0])  # the extrinsic targets do not see it
    assert (errors_later[1][:2, 0] > errors[1][:2, 0]).all()
    without, _ = targets(learner, {**batch, "intrinsic_reward": later}, logits, values, 0.0)
    extrinsic_only, _ = targets(_learner([])[0], batch, logits, values[..., 0])  # one head, no bonus
    torch.testing.assert_close(without, extrinsic_only)  # coef 0: the extrinsic advantages alone

    single, policy_single = _learner([f"intrinsic={name}", "intrinsic.coef=0.5", "intrinsic.episodic=true"])
    batch = on_policy_batch(policy_single)
    batch["terminated"][0, 0] = True
    logits, values, _ = policy_single.learner(batch["obs"], batch["first"])
    advantages, _ = targets(single, {**batch, "intrinsic_reward": intrinsic}, logits, values, 0.5)
    advantages_later, _ = targets(single, {**batch, "intrinsic_reward": later}, logits, values, 0.5)
    assert advantages_later[0, 0] == advantages[0, 0]  # episodic: the end cuts it


def test_the_intrinsic_heads_loss_weighs_in_the_units_of_its_advantages():
    """The intrinsic head's values and targets come out times the coef, so its squared error is
    coef^2 times the one on the unit-scale return; on a minibatch of steps as on whole unrolls."""
    learner, policy = _learner(["intrinsic=rnd", "agent=appo", "agent.value_clip=null", "agent.pfo_coef=0"])
    bonus = torch.rand(3, 2, generator=torch.Generator().manual_seed(1))
    batch = {**on_policy_batch(policy), "intrinsic_reward": bonus}
    logits, values, _ = policy.learner(batch["obs"], batch["first"])
    unit = learner.optimizer_step.loss.unroll_targets(batch, logits, values, 1.0)
    weighted = learner.optimizer_step.loss.unroll_targets(batch, logits, values, 0.1)
    torch.testing.assert_close(weighted.values[1], 0.1 * values[:-1, :, 1])
    torch.testing.assert_close(weighted.vs[1], 0.1 * unit.vs[1])
    torch.testing.assert_close(weighted.vs[0], unit.vs[0])  # the extrinsic head's are the coef's own
    extrinsic, intrinsic = (baseline_loss(vs - v) for v, vs in zip(unit.values, unit.vs, strict=True))
    assert intrinsic > 0.01 * extrinsic
    terms = learner.optimizer_step.loss(batch, Outputs(logits, values), 0.0, 0.1)
    assert terms.value.item() == pytest.approx((extrinsic + 0.01 * intrinsic).item(), rel=1e-5)

    steps, policy = _learner(["intrinsic=rnd", "agent=appo", "agent.minibatch=steps", "agent.num_minibatches=1"])
    loss = steps.optimizer_step.loss
    with_targets = {**batch, **loss.batch_targets(batch, logits.detach(), values.detach(), 0.1)}
    minibatch, = steps.plan.minibatches_of.split(with_targets, steps.plan.generator)
    params, step_values, _ = policy.learner(minibatch["obs"], minibatch["first"])
    stepped = loss.step_targets(minibatch, params, step_values, 0.1)
    assert baseline_loss(stepped.vs[1] - stepped.values[1]).item() == pytest.approx(
        baseline_loss(weighted.vs[1] - weighted.values[1]).item(), rel=1e-5)


def test_pretraining_leaves_the_extrinsic_reward_out():
    learner, policy = _learner(["intrinsic=re3", "train.pretraining=true"])
    batch = {**on_policy_batch(policy), "intrinsic_reward": torch.zeros(3, 2)}
    other = {**batch, "reward": -batch["reward"]}
    torch.testing.assert_close(torch.stack(learner.optimizer_step.loss_of(batch, 0.01, 0.5)[:4]),
                               torch.stack(learner.optimizer_step.loss_of(other, 0.01, 0.5)[:4]))


@pytest.mark.parametrize("overrides, key", [
    (["intrinsic=rnd", "intrinsic.coef=-0.1"], "intrinsic.coef"),
    (["intrinsic=rnd", "intrinsic.coef_schedule=linear"], "intrinsic.coef_schedule"),
    (["intrinsic=rnd", "intrinsic.coef_schedule=[[2000,1.0],[1000,0.0]]"], "intrinsic.coef_schedule"),
    (["intrinsic=re3", "intrinsic.k=16"], "intrinsic.k"),  # T = 16 with experiment=cartpole
    (["intrinsic=re3", "intrinsic.memory=0"], "intrinsic.memory"),
    (["intrinsic=rnd", "intrinsic.embed_dim=0"], "intrinsic.embed_dim"),
    (["intrinsic=rnd", "intrinsic.lr=0"], "intrinsic.lr"),
    (["intrinsic=e3b", "intrinsic.ridge=0"], "intrinsic.ridge"),
    (["intrinsic=e3b", "intrinsic.minibatch_size=0"], "intrinsic.minibatch_size"),
    (["intrinsic=e3b", "intrinsic.normalize=returns_std"], "intrinsic.normalize"),
    (["intrinsic=e3b", "intrinsic.clip=0"], "intrinsic.clip"),
    (["intrinsic=e3b", "intrinsic.obs_norm=true"], "intrinsic.obs_norm"),
    (["train.pretraining=true"], "train.pretraining"),
])
def test_intrinsic_settings_that_cannot_work_are_refused(overrides, key):
    with pytest.raises(ConfigError) as info:
        validate(compose_train(["experiment=cartpole", *overrides]))
    assert str(info.value).startswith(f"{key}=") and "\n" not in str(info.value)


def test_the_intrinsic_weight_follows_its_schedule():
    from distrl.learning.schedule import Schedule

    cfg = compose_train(["experiment=cartpole", "intrinsic=rnd", "intrinsic.coef=0.4", "num_steps=10",
                         "batch_size=10", "intrinsic.coef_schedule=[[1000,1.0],[2000,0.0]]"])
    validate(cfg)
    schedule = Schedule.for_run(cfg)
    assert [schedule.at(u).intrinsic_coef for u in (5, 15, 25)] == pytest.approx([0.4, 0.2, 0.0])
    assert Schedule.for_run(compose_train(["experiment=cartpole"])).at(3).intrinsic_coef == 0.0


def test_pretraining_then_fine_tuning_from_its_run_directory(tmp_path):
    """A reward-free run with ``intrinsic=rnd`` (in this process): its checkpoints say so and hold
    the module, which a resume restores exactly; the extrinsic return is still logged. A fine-tuning
    run from its run directory starts from its policy weights with a fresh optimizer and counters,
    keeping the module with ``intrinsic=rnd`` and dropping it with ``intrinsic=none``."""

    from distrl.runtime.trainer import Trainer
    from distrl.utils.checkpoint import load_checkpoint

    run = tmp_path / "pretrain"
    common = ["experiment=sparse_chain", "num_actors=1", "train.num_eval_episodes=0", "train.log_interval=1000"]
    cfg = compose_train([*common, "intrinsic=rnd", "train.pretraining=true", "train.num_train_steps=3000"])
    Trainer(cfg, run, progress=False).train()
    state = load_checkpoint(run / "checkpoints" / "latest.pt")
    assert state["pretraining"] is True and {"module", "optimizer"} <= set(state["intrinsic"])
    records = metrics(run)
    assert any("charts/episodic_return" in r for r in records)
    assert any(r.get("charts/intrinsic_reward", 0) > 0 for r in records)
    # reward-free: the whole reward paid is the bonus
    assert all(r["charts/intrinsic_share"] == 1.0 for r in records if r.get("charts/intrinsic_reward", 0) > 0)

    resumed = Trainer(compose_train([*common, "intrinsic=rnd", "train.pretraining=true",
                                                "train.num_train_steps=6000", f"resume={run}"]), tmp_path / "r")
    for name, value in resumed.intrinsic.state_dict().items():
        torch.testing.assert_close(value, state["intrinsic"]["module"][name])
    assert resumed.intrinsic.optimizer.state_dict()["state"].keys() == state["intrinsic"]["optimizer"]["state"].keys()
    with pytest.raises(Exception, match="intrinsic=rnd in the checkpoint, intrinsic=re3 here"):
        Trainer(compose_train([*common, "intrinsic=re3", f"resume={run}"]), tmp_path / "x")

    for name in ("rnd", "none"):
        tuned = Trainer(compose_train([*common, f"intrinsic={name}", f"train.init_model_path={run}"]),
                                   tmp_path / name, progress=False)
        assert_actor_holds(tuned.networks.actor.state_dict(), state["model"])
        assert tuned.counters["agent_steps"] == 0 and tuned.optimizer.state_dict()["state"] == {}
        assert tuned.checkpointer.state()["pretraining"] is False
        if name == "rnd":
            for key, value in tuned.intrinsic.state_dict().items():
                torch.testing.assert_close(value, state["intrinsic"]["module"][key])
        else:
            assert tuned.intrinsic is None and "intrinsic" not in tuned.checkpointer.state()


def test_the_seed_api_saves_pretrained_and_fine_tuned_weights_by_step(tmp_path):
    from distrl.compat.rllte import DistributedActorLearner

    policy = DistributedActorLearner((40,), 2, feature_dim=64, hidden_dim=64)
    first = policy.save(tmp_path, pretraining=True, global_step=5000)
    second = policy.save(tmp_path, pretraining=False, global_step=8000)
    assert (first.name, second.name) == ("pretrained_5000.pth", "agent_8000.pth")
    other = DistributedActorLearner((40,), 2, feature_dim=64, hidden_dim=64)
    other.load(str(first), "cpu")
    assert_actor_holds(other.actor.state_dict(), policy.learner.state_dict())


def test_e3b_bonuses_come_from_the_actors_of_a_run(tmp_path):
    """``intrinsic=e3b`` in a whole run (in this process, actors in their own): the slots carry the
    actors' bonuses, the learner logs them and trains the embedding, and the actors' copy of the
    embedding is the learner's at the end."""

    from distrl.runtime.trainer import Trainer

    cfg = compose_train(["experiment=sparse_chain", "intrinsic=e3b", "num_actors=1", "train.num_eval_episodes=0",
                         "train.log_interval=1000", "train.num_train_steps=4000"])
    trainer = Trainer(cfg, tmp_path, progress=False)
    trainer.train()
    records = metrics(tmp_path)
    logged = [r for r in records if "charts/intrinsic_reward_raw" in r]
    assert logged and all(r["charts/intrinsic_reward_raw"] > 0 and r["losses/intrinsic"] > 0 for r in logged)
    # the chain pays nothing to random play: over the first interval the bonus is all the reward and
    # no episode succeeded (E3B may reach the last cell within 4,000 steps: later intervals may differ)
    assert logged[0]["charts/intrinsic_share"] == 1.0
    assert all(0.0 < r["charts/intrinsic_share"] <= 1.0 for r in logged)
    rates = [r["charts/success_rate"] for r in records if "charts/success_rate" in r]
    assert rates and rates[0] == 0.0 and all(0.0 <= rate <= 1.0 for rate in rates)
    module = trainer.intrinsic
    for actor_p, learner_p in zip(module.actor_bonus.encoder.parameters(), module.encoder.parameters(), strict=True):
        assert torch.equal(actor_p, learner_p.cpu())

    # scripts/e3b_bonuses.py on the run's checkpoint: one random episode of the chain (80 steps),
    # its first bonus |phi|^2 / ridge with the trained phi
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "e3b_bonuses.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    profile = json.loads(done.stdout)
    phi = module.encoder(module.inputs(torch.as_tensor(SparseChain().reset(seed=123)[0])[None])).float()
    assert profile["first_bonus"] == pytest.approx(phi.pow(2).sum().item() / cfg.intrinsic.ridge, rel=1e-3)
    assert profile["episode_steps"] <= 80 and len(profile["paid_first_10"]) == 10
    assert 0.0 <= profile["square_share_first_10"] <= profile["square_share_first_50"] <= 1.0
    # what each step is paid at the run's weight and clip, over the checkpoint's running std
    assert profile["running_std"] == pytest.approx(float(module.reward_rms.std), rel=1e-4)
    assert (profile["coef"], profile["clip"]) == (cfg.intrinsic.coef, cfg.intrinsic.clip)
    assert 0.0 < profile["paid_sum"]["first_10"] <= 10 * cfg.intrinsic.coef * cfg.intrinsic.clip

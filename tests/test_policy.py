"""The seed API of DistributedActorLearner: describe, explore, freeze, forward, to, save, load."""

import pytest
import torch
from conftest import compose_train

from distrl.policy import DistributedActorLearner


def make(model: str, obs_shape):
    cfg = compose_train([f"model={model}", "experiment=cartpole" if model == "mlp" else "env=atari"])
    return DistributedActorLearner.from_config(obs_shape, 6, cfg.model)


def test_actor_and_learner_copies(tmp_path):
    policy = make("nature_cnn", (4, 84, 84))
    assert policy.describe().endswith(f"{sum(p.numel() for p in policy.learner.parameters()):,} parameters")
    policy.to("cpu")
    policy.freeze()
    assert all(p.is_shared() and not p.requires_grad for p in policy.actor.parameters())
    assert all(p.requires_grad for p in policy.learner.parameters())

    obs = torch.randint(0, 255, (3, 4, 84, 84), dtype=torch.uint8)
    first = torch.ones(3, dtype=torch.bool)
    actions = policy.explore(obs, first)
    assert actions.shape == (3,) and actions.dtype == torch.int64
    out, _ = policy.actor.act(obs, first)
    assert out["policy_logits"].shape == (3, 6) and out["baseline"].shape == (3,)
    greedy, _ = policy(obs, first, deterministic=True)
    assert torch.equal(greedy, out["policy_logits"].argmax(-1))  # both copies hold the same weights

    with torch.no_grad():
        for p in policy.learner.parameters():
            p.add_(0.01)
    policy.publish()
    for a, b in zip(policy.actor.parameters(), policy.learner.parameters(), strict=True):
        assert torch.equal(a, b)

    path = tmp_path / "weights.pt"
    policy.save(str(path))
    other = make("nature_cnn", (4, 84, 84))
    other.load(str(path))
    for a, b in zip(other.learner.state_dict().values(), policy.learner.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(other.actor.state_dict().values(), policy.learner.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_every_encoder_runs_an_unroll():
    for model, shape, obs in (("nature_cnn", (4, 84, 84), torch.randint(0, 255, (5, 2, 4, 84, 84), dtype=torch.uint8)),
                              ("impala_resnet", (4, 84, 84), torch.randint(0, 255, (5, 2, 4, 84, 84),
                                                                           dtype=torch.uint8)),
                              ("mlp", (4,), torch.randn(5, 2, 4))):
        policy = make(model, shape)
        logits, baseline, _ = policy.learner(obs, torch.zeros(5, 2, dtype=torch.bool))
        assert logits.shape == (5, 2, 6) and baseline.shape == (5, 2)
        (logits.sum() + baseline.sum()).backward()
        assert all(p.grad is not None for p in policy.learner.parameters())


def test_the_previous_action_and_reward_count_within_an_episode_only():
    cfg = compose_train(["env=atari", "model.last_action_reward=true"])
    net = DistributedActorLearner.from_config((4, 84, 84), 6, cfg.model).learner
    obs = torch.randint(0, 255, (2, 3, 4, 84, 84), dtype=torch.uint8)
    first = torch.tensor([[True, True, True], [False, False, False]])
    with pytest.raises(ValueError, match="last_action"):
        net(obs, first)
    with torch.no_grad():
        a = net(obs, first, (), torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 3))[:2]
        b = net(obs, first, (), torch.full((2, 3), 5), torch.full((2, 3), 3.0))[:2]
        c = net(obs, first, (), torch.full((2, 3), 5), torch.full((2, 3), 1.0))[:2]
    for x, y, z in zip(a, b, c, strict=True):
        assert torch.equal(x[0], y[0])  # an episode's first step: nothing came before it
        assert not torch.allclose(x[1], y[1])  # later steps see the previous action and reward
        assert torch.equal(y[1], z[1])  # the reward is clipped to [-1, 1]

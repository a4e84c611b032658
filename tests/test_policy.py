"""The seed API of DistributedActorLearner: summary, explore, freeze, forward, to, save, load."""

import torch
from conftest import compose_train

from distrl.policy import DistributedActorLearner


def make(model: str, obs_shape):
    cfg = compose_train([f"model={model}", "experiment=cartpole" if model == "mlp" else "env=atari"])
    return DistributedActorLearner(obs_shape, 6, cfg.model)


def test_actor_and_learner_copies(tmp_path):
    policy = make("nature_cnn", (4, 84, 84))
    assert policy.summary().endswith(f"{sum(p.numel() for p in policy.learner.parameters()):,} parameters")
    policy.to("cpu")
    policy.freeze()
    assert all(p.is_shared() and not p.requires_grad for p in policy.actor.parameters())
    assert all(p.requires_grad for p in policy.learner.parameters())

    obs = torch.randint(0, 255, (3, 4, 84, 84), dtype=torch.uint8)
    first = torch.ones(3, dtype=torch.bool)
    out, _ = policy.explore(obs, first)
    assert out["action"].shape == (3,) and out["action"].dtype == torch.int64
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

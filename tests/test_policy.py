"""The actor and learner copies (distrl.nn.actor_learner.ActorLearner: describe, share_actor, publish,
to, load) and rllte's methods on them (distrl.compat.rllte.DistributedActorLearner: explore, freeze,
forward, save)."""

import pytest
import torch
from conftest import compose_train

from distrl.nn.actor_learner import ActorLearner


def make(model: str, obs_shape):
    cfg = compose_train([f"model={model}", "experiment=cartpole" if model == "mlp" else "env=atari"])
    return ActorLearner(obs_shape, 6, cfg.model)


def test_actor_and_learner_copies(tmp_path):
    from distrl.compat.rllte import DistributedActorLearner

    policy = DistributedActorLearner((4, 84, 84), 6)  # the Nature CNN, as make("nature_cnn", ...)
    assert policy.describe().endswith(f"{sum(p.numel() for p in policy.learner.parameters()):,} parameters")
    policy.to("cpu")
    policy.share_actor()
    assert all(p.is_shared() and not p.requires_grad for p in policy.actor.parameters())
    assert all(p.requires_grad for p in policy.learner.parameters())

    obs = torch.randint(0, 255, (3, 4, 84, 84), dtype=torch.uint8)
    first = torch.ones(3, dtype=torch.bool)
    actions = policy.explore(obs, first)
    assert actions.shape == (3,) and actions.dtype == torch.int64
    out, _ = policy.actor.act(obs, first)
    assert out["policy_params"].shape == (3, 6) and out["baseline"].shape == (3,)
    greedy, _ = policy(obs, first, deterministic=True)
    assert torch.equal(greedy, out["policy_params"].argmax(-1))  # both copies hold the same weights

    with torch.no_grad():
        for p in policy.learner.parameters():
            p.add_(0.01)
    policy.publish()
    for a, b in zip(policy.actor.parameters(), policy.learner.parameters(), strict=True):
        assert torch.equal(a, b)

    path = tmp_path / "weights.pt"
    policy.save(str(path))
    other = make("nature_cnn", (4, 84, 84))  # distrl's own, from the config: the same network
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


@pytest.mark.parametrize("layer_norm", [False, True])
def test_every_encoder_gives_its_features_preactivations(layer_norm):
    """``with_preactivations`` (what PFO regularises): the encoder's last linear layer's output, whose
    (normalisation and) activation are the features the heads read; the outputs are unchanged."""
    from distrl.nn.encoders import make_encoder

    images = torch.randint(0, 255, (3, 4, 84, 84), dtype=torch.uint8)
    cells = torch.randint(0, 10, (3, 3, 7, 7), dtype=torch.uint8)
    for model, obs in (("nature_cnn", images), ("impala_resnet", images), ("minigrid_cnn", cells),
                       ("mlp", torch.randn(3, 4))):
        if layer_norm and model == "impala_resnet":
            continue  # refused: it has no LayerNorm
        cfg = compose_train([f"model={model}", f"model.layer_norm={str(layer_norm).lower()}"]).model
        encoder = make_encoder(tuple(obs.shape[1:]), cfg)
        features, pre = encoder.forward_with_preactivation(obs)
        torch.testing.assert_close(features, encoder(obs))
        activation = torch.tanh if model == "mlp" else torch.relu
        norm = torch.nn.functional.layer_norm(pre, pre.shape[-1:]) if layer_norm else pre  # affine at init: 1, 0
        torch.testing.assert_close(features, activation(norm))
        assert pre.shape == (3, cfg.feature_dim) and (pre < 0).any()


def test_the_previous_action_and_reward_count_within_an_episode_only():
    cfg = compose_train(["env=atari", "model.last_action_reward=true"])
    net = ActorLearner((4, 84, 84), 6, cfg.model).learner
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


def test_the_dormant_share_counts_units_whose_mean_activity_is_at_most_tau_of_the_layers():
    """Sokar et al. 2023, Definition 3.1: 4 units with mean |activation| 0, 0.02, 1 and 2.98 (layer
    mean 1): scores 0, 0.02, 1, 2.98, so tau=0 counts one, tau=0.025 two; a convolution's unit is
    its channel, averaged over the positions too."""
    from distrl.nn.dormant import dormant_fractions

    linear = torch.nn.Sequential(torch.nn.Identity(), torch.nn.ReLU())
    obs = torch.tensor([[0.0, 0.04, 1.0, 2.98], [0.0, 0.0, 1.0, 2.98]])  # unit means 0, 0.02, 1, 2.98
    assert dormant_fractions(linear, obs, tau=0.0) == {"1": 0.25}
    assert dormant_fractions(linear, obs) == {"1": 0.5}
    conv = torch.zeros(2, 4, 3, 3)
    conv[:, 2] = 1.0
    conv[0, 3, 0, 0] = 5.0  # one position of one observation: the channel is alive
    assert dormant_fractions(linear, conv, tau=0.0) == {"1": 0.5}
    assert dormant_fractions(linear, torch.zeros(2, 4)) == {"1": 1.0}  # all silent: all dormant


def test_the_feature_rank_is_the_fewest_singular_values_holding_99_percent_of_their_sum():
    """Kumar et al. 2021's srank with delta 0.01: singular values 10, 5, 0.1 (sum 15.1) need 2 for
    99 % (15.0 / 15.1 = 0.993), 3 for 99.9 %; a rank-1 matrix has 1; all-zero features 0."""
    from distrl.nn.dormant import feature_health, feature_rank

    u, _ = torch.linalg.qr(torch.randn(50, 3, generator=torch.Generator().manual_seed(0)))
    features = u @ torch.diag(torch.tensor([10.0, 5.0, 0.1])) @ torch.eye(3, 8)  # [50, 8], sigma 10, 5, 0.1
    assert feature_rank(features) == 2 and feature_rank(features, delta=0.001) == 3
    assert feature_rank(torch.ones(20, 8)) == 1 and feature_rank(torch.zeros(20, 8)) == 0
    encoder = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    fractions, rank = feature_health(encoder, torch.randn(32, 8))
    assert set(fractions) == {"1"} and 1 <= rank <= 8


def test_layer_norm_puts_a_norm_before_every_activation_and_leaves_the_plain_networks_keys():
    """model.layer_norm=false keeps the parameter names checkpoints have always had; true adds a
    LayerNorm before each ReLU (a GroupNorm of one group for the convolutions), and the network runs
    under bf16 autocast with bf16 weights as the actors run it."""
    from distrl.nn.precision import autocast, cast_matmul_weights

    plain = ActorLearner((4, 84, 84), 6, compose_train([]).model).learner
    assert [k for k in plain.state_dict() if k.startswith("encoder")] == [
        "encoder.convs.0.weight", "encoder.convs.0.bias", "encoder.convs.2.weight", "encoder.convs.2.bias",
        "encoder.convs.4.weight", "encoder.convs.4.bias", "encoder.fc.0.weight", "encoder.fc.0.bias"]
    normed = ActorLearner((4, 84, 84), 6, compose_train(["model.layer_norm=true"]).model).learner
    norms = [m for m in normed.encoder.modules() if isinstance(m, (torch.nn.GroupNorm, torch.nn.LayerNorm))]
    assert [type(m).__name__ for m in norms] == ["GroupNorm"] * 3 + ["LayerNorm"]
    obs = torch.randint(0, 255, (2, 3, 4, 84, 84), dtype=torch.uint8)
    first = torch.zeros(2, 3, dtype=torch.bool)
    features = normed.encoder.fc[:2](normed.encoder.convs(obs.flatten(0, 1).float() / 255))
    torch.testing.assert_close(features.mean(-1), torch.zeros(6), atol=1e-5, rtol=0)  # normalised per observation
    cast_matmul_weights(normed, torch.bfloat16)
    with autocast("bf16"):
        logits, values, _ = normed(obs, first)
    assert logits.shape == (2, 3, 6) and torch.isfinite(logits).all() and torch.isfinite(values).all()

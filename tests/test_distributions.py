"""Action distributions (distrl/nn/distributions.py): one interface for Discrete, MultiDiscrete and Box
actions, and the discrete path unchanged bit for bit."""

from __future__ import annotations

import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from distrl import compose_config
from distrl.learning.losses import Outputs, make_loss
from distrl.nn.distributions import ActionSpace

REFERENCE = Path(__file__).parent / "data" / "discrete-losses-30df573.pt"


def fixed_batch(T=5, B=4, A=6, two_heads=False):
    """The batch tests/data/discrete-losses-30df573.pt was computed on (by 30df573's losses, which took
    logits and stored ``policy_logits``)."""
    g = torch.Generator().manual_seed(0)
    batch = {
        "action": torch.randint(0, A, (T + 1, B), generator=g),
        "policy_params": torch.randn(T + 1, B, A, generator=g),
        "baseline": torch.randn(T + 1, B, generator=g),
        "reward": torch.randn(T + 1, B, generator=g) * 2,
        "terminated": torch.rand(T + 1, B, generator=g) < 0.1,
        "truncated": torch.rand(T + 1, B, generator=g) < 0.1,
        "truncation_value": torch.randn(T + 1, B, generator=g),
    }
    logits = torch.randn(T + 1, B, A, generator=g, requires_grad=True)
    values = torch.randn(T + 1, B, *((2,) if two_heads else ()), generator=g, requires_grad=True)
    if two_heads:
        batch["intrinsic_reward"] = torch.rand(T, B, generator=g)
    return batch, logits, values


def loss_config(agent: str):
    """The composed config of ``agent`` ("appo" or "impala") whose loss these tests call on a fixed
    batch's logits and values alone: APPO without PFO's term (it needs the encoder's features and the
    plan's anchor; its own test is in tests/test_agents.py), as at 30df573; IMPALA at CartPole's."""
    return compose_config([f"agent={agent}", "experiment=cartpole"] if agent == "impala"
                          else ["agent=appo", "agent.pfo_coef=0"])


@pytest.mark.parametrize("agent", ["appo", "impala"])
@pytest.mark.parametrize("two_heads", [False, True])
def test_the_discrete_losses_are_those_of_30df573_bit_for_bit_and_their_gradients_to_the_last_bits(agent, two_heads):
    """With an intrinsic value head (coef 0.5), one change since 30df573, by design: that head's
    squared error is weighted by coef^2 (AgentLoss.unroll_targets), so its values' gradients are 0.25 times
    the reference's and the value term is smaller; everything else is 30df573's."""
    reference = torch.load(REFERENCE, weights_only=True)[f"{agent}-{'two' if two_heads else 'one'}"]
    cfg = loss_config(agent)
    batch, logits, values = fixed_batch(two_heads=two_heads)
    loss = make_loss(cfg.agent, ActionSpace("discrete", (6,)), value_heads=2 if two_heads else 1, intrinsic=two_heads)
    coef = 0.5 if two_heads else 0.0
    terms = loss(batch, Outputs(logits, values), 0.01, coef)
    terms.total.backward()
    got = torch.stack([terms.total, terms.policy, terms.value, terms.entropy]).detach()
    want_values_grad = reference["values_grad"]
    if two_heads:
        assert torch.equal(got[[1, 3]], reference["terms"][[1, 3]])  # the policy and entropy terms
        assert got[2] < reference["terms"][2] and got[0] < reference["terms"][0]
        want_values_grad = want_values_grad * torch.tensor([1.0, coef**2])
    else:
        assert torch.equal(got, reference["terms"])
    # the gradients within 4 ulp: the reference was computed on an AMD EPYC, and on a 2-core Intel
    # Xeon (AVX-512) 2 of APPO's 144 logit gradients differ in the last bits (7e-12, 2.6e-7 relative)
    # at 30df573's own successor 5203fcb as well: the CPU's vectorised reductions round differently
    torch.testing.assert_close(logits.grad, reference["logits_grad"], rtol=5e-7, atol=0)
    torch.testing.assert_close(values.grad, want_values_grad, rtol=5e-7, atol=0)


def test_the_spaces_distrl_models_and_the_ones_it_refuses_in_one_line():
    assert ActionSpace.from_gym(gym.spaces.Discrete(4)) == ActionSpace("discrete", (4,))
    assert ActionSpace.from_gym(gym.spaces.MultiDiscrete([3, 2])).param_size == 5
    box = ActionSpace.from_gym(gym.spaces.Box(-1, 1, (6,), np.float32))
    assert (box.kind, box.dim, box.param_size, box.action_shape) == ("box", 6, 12, (6,))
    for space in (gym.spaces.Dict({"a": gym.spaces.Discrete(2)}), gym.spaces.Tuple([gym.spaces.Discrete(2)]),
                  gym.spaces.MultiBinary(3), gym.spaces.Box(-1, 1, (2, 3), np.float32)):
        with pytest.raises(ValueError, match="distrl models Discrete") as info:
            ActionSpace.from_gym(space)
        assert "\n" not in str(info.value)


def test_a_gaussians_log_prob_entropy_and_mode_are_torchs_normal_summed_over_dimensions():
    g = torch.Generator().manual_seed(1)
    mean, log_std = torch.randn(7, 3, generator=g), torch.randn(7, 3, generator=g) * 0.3
    actions = torch.randn(7, 3, generator=g)
    dist = ActionSpace("box", (), (-1.0,) * 3, (1.0,) * 3).distribution(torch.cat([mean, log_std], -1))
    normal = torch.distributions.Normal(mean, log_std.exp())
    torch.testing.assert_close(dist.log_prob(actions), normal.log_prob(actions).sum(-1))
    torch.testing.assert_close(dist.entropy(), normal.entropy().sum(-1))
    assert torch.equal(dist.mode(), mean)
    torch.manual_seed(0)
    draws = torch.stack([dist.sample() for _ in range(4000)])
    torch.testing.assert_close(draws.std(0), log_std.exp(), atol=0.05, rtol=0.05)


def test_independent_categoricals_sum_their_log_probs_and_entropies():
    space = ActionSpace("multi_discrete", (3, 2))
    logits = torch.tensor([[0.1, 0.5, -0.3, 1.0, -1.0]])
    dist = space.distribution(logits)
    actions = torch.tensor([[2, 0]])
    first = torch.distributions.Categorical(logits=logits[:, :3])
    second = torch.distributions.Categorical(logits=logits[:, 3:])
    torch.testing.assert_close(dist.log_prob(actions), first.log_prob(actions[:, 0]) + second.log_prob(actions[:, 1]))
    torch.testing.assert_close(dist.entropy(), first.entropy() + second.entropy())
    assert dist.mode().tolist() == [[1, 0]]
    assert space.encode(actions).tolist() == [[0, 0, 1, 1, 0]]


def test_the_env_gets_a_box_action_clipped_to_finite_bounds_and_the_sample_is_kept():
    space = ActionSpace("box", (), (-1.0, -math.inf), (1.0, math.inf))
    sample = torch.tensor([[2.5, -7.0], [-0.5, 3.0]])
    assert space.to_env(sample).tolist() == [[1.0, -7.0], [-0.5, 3.0]]
    assert sample.tolist() == [[2.5, -7.0], [-0.5, 3.0]]


def test_a_gaussians_log_ratio_is_computed_in_float32_whatever_the_parameters_dtype():
    """17 dimensions (Humanoid), two policies 1e-3 apart: the log-ratio in float32 is within 1e-4 of
    float64's; the same sums in bf16 (8 bits of mantissa on log-densities of about -25) lose it."""
    g = torch.Generator().manual_seed(2)
    mean = torch.randn(1000, 17, generator=g)
    actions = mean + torch.randn(1000, 17, generator=g)
    space = ActionSpace("box", (), (-0.4,) * 17, (0.4,) * 17)
    params = torch.cat([mean, torch.zeros_like(mean)], -1)
    moved = torch.cat([mean + 1e-3, torch.zeros_like(mean)], -1)

    def log_ratio(dtype):
        return (space.distribution(moved.to(dtype)).log_prob(actions.to(dtype))
                - space.distribution(params.to(dtype)).log_prob(actions.to(dtype)))

    a = actions.double()
    exact = (torch.distributions.Normal(mean.double() + 1e-3, 1.0).log_prob(a).sum(-1)
             - torch.distributions.Normal(mean.double(), 1.0).log_prob(a).sum(-1))
    assert log_ratio(torch.bfloat16).dtype == torch.float32  # cast up before any arithmetic
    torch.testing.assert_close(log_ratio(torch.float32).double(), exact, atol=1e-4, rtol=0)
    bf16 = (torch.distributions.Normal(moved[:, :17].bfloat16(), 1.0).log_prob(actions.bfloat16()).sum(-1)
            - torch.distributions.Normal(mean.bfloat16(), 1.0).log_prob(actions.bfloat16()).sum(-1))
    assert (bf16.double() - exact).abs().max() > 1e-2


def test_each_distributions_kl_is_torchs():
    """KL(p || q) of every action distribution against torch.distributions.kl_divergence (the
    MultiDiscrete one the sum over its dimensions, the Gaussian's over its dimensions: Independent)."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(5, 4, 6, generator=g), torch.randn(5, 4, 6, generator=g)
    want = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=a),
                                             torch.distributions.Categorical(logits=b))
    space = ActionSpace("discrete", (6,))
    torch.testing.assert_close(space.distribution(a).kl(space.distribution(b)), want)
    multi = ActionSpace("multi_discrete", (2, 4))
    want = sum(torch.distributions.kl_divergence(torch.distributions.Categorical(logits=x[..., s]),
                                                 torch.distributions.Categorical(logits=y[..., s]))
               for x, y in [(a, b)] for s in (slice(0, 2), slice(2, 6)))
    torch.testing.assert_close(multi.distribution(a).kl(multi.distribution(b)), want)
    box = ActionSpace("box", (3,), (-1.0,) * 3, (1.0,) * 3)

    def normal(params):
        return torch.distributions.Independent(torch.distributions.Normal(params[..., :3], params[..., 3:].exp()), 1)

    torch.testing.assert_close(box.distribution(a).kl(box.distribution(b)),
                               torch.distributions.kl_divergence(normal(a), normal(b)))
    assert (box.distribution(a).kl(box.distribution(a)).abs() < 1e-6).all()


@pytest.mark.parametrize("agent", ["appo", "impala"])
def test_the_kl_penalty_adds_its_weight_times_the_mean_kl_to_the_behaviour_policy(agent):
    cfg = loss_config(agent)
    batch, logits, values = fixed_batch()
    plain = make_loss(cfg.agent, ActionSpace("discrete", (6,)))(batch, Outputs(logits, values), 0.01)
    cfg.agent.kl_cost = 0.1
    terms = make_loss(cfg.agent, ActionSpace("discrete", (6,)))(batch, Outputs(logits, values), 0.01)
    want = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=logits[:-1]),
                                             torch.distributions.Categorical(logits=batch["policy_params"][:-1]))
    torch.testing.assert_close(terms.diagnostics["kl"], want.mean().detach())
    torch.testing.assert_close(terms.total, plain.total + 0.1 * want.mean())
    assert "kl" not in (plain.diagnostics or {})
    terms.total.backward()  # it pulls the current logits towards the behaviour's
    assert logits.grad is not None
    from distrl import ConfigError

    with pytest.raises(ConfigError, match=r"agent.kl_cost=-1.0 is not allowed: a number >= 0"):
        compose_config(["experiment=cartpole", "agent.kl_cost=-1"])

"""V-trace against a reference written straight from the paper's definition.

Espeholt et al. 2018, eq. (1): v_s = V(x_s) + sum_{t=s}^{s+n-1} gamma^{t-s}
(prod_{i=s}^{t-1} c_i) delta_t V, with delta_t V = rho_t (r_t + gamma V(x_{t+1})
- V(x_t)) and c_i = lambda min(c_bar, rho_i) (Section 4.1's trace lambda). The sum
runs to the end of the unroll (bootstrapping from V(x_T)) or
stops at the step that ends the episode: after a terminal step nothing is
bootstrapped; after a time-limit truncation the value of the episode's final
observation is.
"""

import math

import pytest
import torch

from distrl.learning.losses import vtrace
from distrl.learning.losses.terms import baseline_loss, standardize
from distrl.nn.distributions import Categorical


def action_log_probs(logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """``log pi(a_t | x_t)``: logits ``[T, B, A]``, actions ``[T, B]`` int64 -> ``[T, B]``."""
    return Categorical(logits).log_prob(actions)


def reference(log_rhos, rewards, values, bootstrap, terminated, truncated, final_values, gamma, rho_bar, c_bar,
              trace_lambda=1.0):
    T, B = len(rewards), len(rewards[0])
    rhos = [[math.exp(log_rhos[t][b]) for b in range(B)] for t in range(T)]
    vs = [[0.0] * B for _ in range(T)]
    adv = [[0.0] * B for _ in range(T)]

    def next_value(t, b):
        """gamma x the value that follows step t, or 0 after a terminal step."""
        if terminated[t][b]:
            return 0.0
        if truncated[t][b]:
            return gamma * final_values[t][b]
        return gamma * (values[t + 1][b] if t + 1 < T else bootstrap[b])

    for b in range(B):
        for s in range(T):
            total, weight = values[s][b], 1.0  # weight = gamma^{t-s} prod_{i<t} c_i
            for t in range(s, T):
                rho = min(rho_bar, rhos[t][b])
                total += weight * rho * (rewards[t][b] + next_value(t, b) - values[t][b])
                if terminated[t][b] or truncated[t][b]:
                    break
                weight *= gamma * trace_lambda * min(c_bar, rhos[t][b])
            vs[s][b] = total
        for s in range(T):
            rho = min(rho_bar, rhos[s][b])
            if terminated[s][b]:
                follow = 0.0
            elif truncated[s][b]:
                follow = gamma * final_values[s][b]
            else:
                follow = gamma * (vs[s + 1][b] if s + 1 < T else bootstrap[b])
            adv[s][b] = rho * (rewards[s][b] + follow - values[s][b])
    return torch.tensor(vs), torch.tensor(adv)


def from_logits(behaviour, target, actions, *args, **kwargs):
    """V-trace with ``log_rhos = log pi(a) - log mu(a)`` from the two policies' logits."""
    log_rhos = action_log_probs(target, actions) - action_log_probs(behaviour, actions)
    return vtrace.vtrace_with_episode_ends(log_rhos, *args, **kwargs)


@pytest.mark.parametrize("rho_bar,c_bar,trace_lambda", [(1.0, 1.0, 1.0), (0.7, 0.4, 1.0), (2.0, 1.5, 1.0),
                                                        (1.0, 1.0, 0.95), (2.0, 1.5, 0.5)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vtrace_matches_the_papers_sum(seed, rho_bar, c_bar, trace_lambda):
    g = torch.Generator().manual_seed(seed)
    T, B, A, gamma = 12, 5, 4, 0.97
    behaviour = torch.randn(T, B, A, generator=g)
    target = behaviour + 0.5 * torch.randn(T, B, A, generator=g)
    actions = torch.randint(0, A, (T, B), generator=g)
    rewards = torch.randn(T, B, generator=g)
    values = torch.randn(T, B, generator=g)
    bootstrap = torch.randn(B, generator=g)
    final_values = torch.randn(T, B, generator=g)
    terminated = torch.rand(T, B, generator=g) < 0.12
    truncated = torch.rand(T, B, generator=g) < 0.12
    terminated[3, 0], truncated[3, 0] = True, True  # both: terminal wins
    assert terminated.any() and truncated.any() and (truncated & ~terminated).any()

    got = from_logits(behaviour, target, actions, rewards, terminated, truncated, values,
                      bootstrap, final_values, gamma, rho_bar, c_bar, trace_lambda)
    log_rhos = (action_log_probs(target, actions) - action_log_probs(behaviour, actions))
    want_vs, want_adv = reference(log_rhos.tolist(), rewards.tolist(), values.tolist(), bootstrap.tolist(),
                                  terminated.tolist(), truncated.tolist(), final_values.tolist(), gamma,
                                  rho_bar, c_bar, trace_lambda)
    torch.testing.assert_close(got.vs, want_vs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.pg_advantages, want_adv, rtol=1e-5, atol=1e-5)


def test_on_policy_vtrace_is_the_n_step_return():
    """With pi = mu and no episode end, v_s is the discounted n-step return (paper, Remark 1)."""
    T, B, gamma = 6, 3, 0.9
    logits = torch.randn(T, B, 3)
    actions = torch.randint(0, 3, (T, B))
    rewards, values, bootstrap = torch.randn(T, B), torch.randn(T, B), torch.randn(B)
    no = torch.zeros(T, B, dtype=torch.bool)
    got = from_logits(logits, logits, actions, rewards, no, no, values, bootstrap, torch.zeros(T, B), gamma)
    for s in range(T):
        n_step = sum(gamma ** (t - s) * rewards[t] for t in range(s, T)) + gamma ** (T - s) * bootstrap
        torch.testing.assert_close(got.vs[s], n_step, rtol=1e-5, atol=1e-5)


def test_loss_terms():
    adv = torch.tensor([[2.0, -1.0], [0.5, 0.5]])
    assert baseline_loss(adv).item() == pytest.approx(0.5 * (4.0 + 1.0 + 0.25 + 0.25) / 4)
    standardised = standardize(adv)
    assert standardised.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert standardised.std(correction=0).item() == pytest.approx(1.0, abs=1e-6)
    assert standardize(torch.ones(3, 2)).abs().max().item() == 0.0  # equal advantages: 0, finite


def test_on_policy_vtrace_with_a_trace_lambda_is_the_lambda_return():
    """With pi = mu, c_s = lambda and v_s is TD(lambda)'s target: v_s = r_s + gamma ((1 - lambda) V(x_{s+1})
    + lambda v_{s+1}), from the bootstrap value (Sutton and Barto 2018, eq. 12.3, recursively)."""
    T, B, gamma, lam = 6, 3, 0.9, 0.8
    logits = torch.randn(T, B, 3)
    actions = torch.randint(0, 3, (T, B))
    rewards, values, bootstrap = torch.randn(T, B), torch.randn(T, B), torch.randn(B)
    no = torch.zeros(T, B, dtype=torch.bool)
    got = from_logits(logits, logits, actions, rewards, no, no, values, bootstrap, torch.zeros(T, B), gamma,
                      trace_lambda=lam)
    target = bootstrap
    for s in reversed(range(T)):
        next_value = bootstrap if s == T - 1 else values[s + 1]
        target = rewards[s] + gamma * ((1 - lam) * next_value + lam * target)
        torch.testing.assert_close(got.vs[s], target, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 3), (12, 5), (33, 4, 2)])
def test_the_batched_recursion_is_the_loop(shape):
    """reverse_discounted_sum's matrix of products gives the backward loop's sums (the loop is what it
    falls back to for a large T x T x B), episode ends (factor 0) included."""
    g = torch.Generator().manual_seed(3)
    deltas = torch.randn(shape, generator=g)
    factors = 0.99 * torch.rand(shape, generator=g) * (torch.rand(shape, generator=g) > 0.1)
    want = torch.zeros(shape)
    acc = torch.zeros(shape[1:])
    for t in reversed(range(shape[0])):
        acc = deltas[t] + factors[t] * acc
        want[t] = acc
    torch.testing.assert_close(vtrace.reverse_discounted_sum(deltas, factors), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(vtrace.reverse_discounted_sum(deltas, factors, max_elements=0), want)


def gae_reference(rewards, values, bootstrap, terminated, truncated, final_values, gamma, lam):
    """GAE(gamma, lambda) by its backward recursion (Schulman et al. 2016, eq. 16, as CleanRL's PPO
    computes it): A_t = delta_t + gamma lambda A_{t+1}, cut where the episode ended; after a
    truncation delta bootstraps from the final observation's value."""
    T, B = len(rewards), len(rewards[0])
    adv = [[0.0] * B for _ in range(T)]
    for b in range(B):
        following = 0.0
        for t in reversed(range(T)):
            ended = terminated[t][b] or truncated[t][b]
            if terminated[t][b]:
                next_value = 0.0
            elif truncated[t][b]:
                next_value = final_values[t][b]
            else:
                next_value = values[t + 1][b] if t + 1 < T else bootstrap[b]
            delta = rewards[t][b] + gamma * next_value - values[t][b]
            following = delta + (0.0 if ended else gamma * lam * following)
            adv[t][b] = following
    return adv


@pytest.mark.parametrize("seed", [0, 1])
def test_gae_is_the_backward_recursion_and_its_targets_the_lambda_returns(seed):
    from distrl.learning.losses.returns import GAE, Stream

    g = torch.Generator().manual_seed(seed)
    T, B, gamma, lam = 7, 3, 0.97, 0.9
    rewards, values = torch.randn(T, B, generator=g), torch.randn(T, B, generator=g)
    bootstrap, final = torch.randn(B, generator=g), torch.randn(T, B, generator=g)
    terminated = torch.rand(T, B, generator=g) < 0.15
    truncated = (torch.rand(T, B, generator=g) < 0.15) & ~terminated
    log_rhos = torch.randn(T, B, generator=g)  # ignored: GAE is on-policy
    estimate = GAE(gamma, lam)(log_rhos, Stream(rewards, terminated, truncated, values, bootstrap, final))
    want = torch.tensor(gae_reference(rewards.tolist(), values.tolist(), bootstrap.tolist(), terminated.tolist(),
                                      truncated.tolist(), final.tolist(), gamma, lam))
    torch.testing.assert_close(estimate.advantages, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(estimate.targets, want + values, rtol=1e-5, atol=1e-5)

"""V-trace targets and the IMPALA loss terms, as pure tensor functions.

Source: Espeholt et al. 2018, "IMPALA: Scalable Distributed Deep-RL with
Importance Weighted Actor-Learner Architectures", arXiv 1802.01561,
Section 4. Shapes use T (unroll length) and B (batch); all tensors float32
on one device unless said otherwise.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from distrl.utils.discounted import reverse_discounted_sum


class VTraceReturns(NamedTuple):
    """``vs``: V-trace value targets ``[T, B]``; ``pg_advantages``: ``[T, B]``."""

    vs: torch.Tensor
    pg_advantages: torch.Tensor


@torch.no_grad()
def vtrace_from_importance_weights(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    trace_lambda: float = 1.0,
) -> VTraceReturns:
    """V-trace targets by the backward recursion of Remark 1.

    ``v_s - V(x_s) = delta_s V + gamma_s c_s (v_{s+1} - V(x_{s+1}))`` with
    ``delta_s V = rho_s (r_s + gamma_s V(x_{s+1}) - V(x_s))`` (eq. 1),
    ``rho_s = min(rho_bar, pi/mu)`` and ``c_s = lambda min(c_bar, pi/mu)``
    (the trace lambda of Section 4.1's remarks; ``lambda = 1`` is eq. 1 as written,
    and on-policy ``lambda < 1`` gives TD(lambda)'s targets). The
    policy-gradient advantage is ``rho_s (r_s + gamma_s v_{s+1} - V(x_s))``
    (Section 4.2).

    Args:
        log_rhos: ``[T, B]`` log of target over behaviour probability of the taken action.
        discounts: ``[T, B]`` per-step discount ``gamma_s``; 0 where the episode terminated.
        rewards: ``[T, B]`` rewards (already clipped and bootstrapped as the caller wants).
        values: ``[T, B]`` baseline ``V(x_s)`` of the target network.
        bootstrap_value: ``[B]`` ``V(x_T)``.
        rho_bar: truncation level of ``rho`` (> 0).
        c_bar: truncation level of ``c`` (> 0).
        trace_lambda: the traces' factor lambda in ``(0, 1]``.

    Returns:
        ``VTraceReturns(vs, pg_advantages)``, each ``[T, B]``, without gradient.
    """
    rhos = torch.exp(log_rhos)
    clipped_rhos = torch.clamp(rhos, max=rho_bar)
    cs = trace_lambda * torch.clamp(rhos, max=c_bar)
    values_t_plus_1 = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    deltas = clipped_rhos * (rewards + discounts * values_t_plus_1 - values)

    vs = reverse_discounted_sum(deltas, discounts * cs) + values

    vs_t_plus_1 = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
    pg_advantages = clipped_rhos * (rewards + discounts * vs_t_plus_1 - values)
    return VTraceReturns(vs, pg_advantages)


def action_log_probs(logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """``log pi(a_t | x_t)``: logits ``[T, B, A]``, actions ``[T, B]`` int64 -> ``[T, B]``."""
    return -F.cross_entropy(logits.flatten(0, 1), actions.flatten(), reduction="none").view_as(actions)


def vtrace_with_episode_ends(
    log_rhos: torch.Tensor,
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    truncation_values: torch.Tensor,
    discount: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    trace_lambda: float = 1.0,
) -> VTraceReturns:
    """V-trace targets (Espeholt et al. 2018, Section 4.1) from the log importance weights, with
    episode ends handled.

    A ``terminated`` step cuts the discount to 0. A ``truncated`` step (time
    limit) also stops the recursion at the reset, but first bootstraps from
    the value of the episode's final observation:
    ``r_s <- r_s + gamma V(x_final)`` — so nothing leaks across the reset and
    the time limit is not mistaken for a terminal state.

    Args:
        log_rhos: ``[T, B]`` ``log pi(a_t|x_t) - log mu(a_t|x_t)`` (target minus behaviour policy);
            one tensor serves every return computed over the same batch (the learner's two heads).
        rewards: ``[T, B]`` rewards (clipped by the caller if wanted).
        terminated: ``[T, B]`` bool, the step ended the episode in a terminal state.
        truncated: ``[T, B]`` bool, the step ended the episode by a time limit.
        values: ``[T, B]`` ``V(x_s)``.
        bootstrap_value: ``[B]`` ``V(x_T)``.
        truncation_values: ``[T, B]`` ``V`` of the final observation where ``truncated``
            (ignored elsewhere).
        discount: gamma in [0, 1].
        rho_bar, c_bar: truncation levels of the importance weights.
        trace_lambda: the traces' factor (:func:`vtrace_from_importance_weights`).

    Returns:
        ``VTraceReturns(vs, pg_advantages)``, each ``[T, B]``, without gradient.
    """
    ended = terminated | truncated
    bootstrap_at_limit = (truncated & ~terminated).float()
    rewards = rewards + discount * bootstrap_at_limit * truncation_values
    discounts = discount * (~ended).float()
    return vtrace_from_importance_weights(
        log_rhos.detach(), discounts, rewards, values.detach(), bootstrap_value.detach(), rho_bar, c_bar,
        trace_lambda,
    )


# The loss terms are means over the T x B steps of a batch, not IMPALA's sums (Section 4.2,
# also monobeast and scalable_agent). With a sum the gradient grows with T x B, so RMSProp's
# eps and the global-norm clip mean something else for every T and B: at monobeast's T=80,
# B=8 the clip at 40 cut most updates 2-20x and eps = 0.01 was 8x sqrt(square_avg) of the
# fully connected layer, and Pong stayed at random play (docs/lab/learning.md). With means,
# the same eps and clip hold for any T x B, as in A2C and PPO.


def policy_gradient_loss(logits: torch.Tensor, actions: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """``-mean_t,b log pi(a_t|x_t) * A_t`` (IMPALA Section 4.2, averaged over the batch).

    logits ``[T, B, A]``, actions ``[T, B]`` int64, advantages ``[T, B]`` (no gradient) -> scalar.
    """
    return -(action_log_probs(logits, actions) * advantages.detach()).mean()


def standardise(advantages: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """The advantages shifted and scaled to mean 0 and standard deviation 1 over all their elements
    (``[T, B]`` -> ``[T, B]``), as PPO's implementations do per minibatch (OpenAI Baselines' ppo2,
    CleanRL's ``norm_adv``; not in IMPALA): the policy gradient's scale then no longer depends on
    the game's reward density. ``eps`` keeps a batch of equal advantages finite (they become 0)."""
    return (advantages - advantages.mean()) / (advantages.std(correction=0) + eps)


def baseline_loss(errors: torch.Tensor) -> torch.Tensor:
    """``0.5 * mean_t,b (v_s - V(x_s))^2`` (IMPALA Section 4.2, averaged): ``errors`` are the value
    errors ``v_s - V(x_s)`` ``[T, B]`` (with gradient through ``V``) -> scalar."""
    return 0.5 * (errors**2).mean()


def entropy_loss(logits: torch.Tensor) -> torch.Tensor:
    """Negative policy entropy ``mean_t,b sum_a pi log pi`` (IMPALA Section 4.2, averaged):
    logits ``[T, B, A]`` -> scalar in ``[-ln A, 0]``."""
    log_policy = F.log_softmax(logits, dim=-1)
    return (log_policy.exp() * log_policy).sum(-1).mean()

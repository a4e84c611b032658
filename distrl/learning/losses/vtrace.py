"""V-trace's targets, as pure tensor functions (the loss terms built on them:
:mod:`distrl.learning.losses.terms`).

Source: Espeholt et al. 2018, "IMPALA: Scalable Distributed Deep-RL with
Importance Weighted Actor-Learner Architectures", arXiv 1802.01561,
Section 4. Shapes use T (unroll length) and B (batch); all tensors float32
on one device unless said otherwise.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

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

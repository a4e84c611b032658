"""APPO's loss: PPO's clipped surrogate on V-trace's advantages, what ``agent=appo`` trains.

Sample Factory's asynchronous PPO with ``with_vtrace=True`` (Petrenko et al. 2020; its learner's
``_calculate_losses``): the learner makes ``num_epochs`` passes over each batch, each in
``num_minibatches`` minibatches of whole unrolls, and recomputes V-trace on every minibatch with
the network of that moment (:meth:`distrl.learning.losses.base.AgentLoss.unroll_targets`), so that the targets
follow the policy as it moves within the batch; with ``agent.minibatch=steps`` the minibatches are
single steps and the targets those of the batch at the update's start, as PPO's GAE once per
rollout (:meth:`distrl.learning.losses.base.AgentLoss.batch_targets`). On one minibatch, averaged
over its steps:

- the clipped surrogate (Schulman et al. 2017, "Proximal Policy Optimization Algorithms", eq. 7)
  ``-mean min(r_t A_t, clip(r_t, low, high) A_t)``, where ``r_t = pi(a_t|x_t) / mu(a_t|x_t)``
  is the ratio of the current policy to the behaviour policy that acted (the actor's, lag
  included), ``[low, high]`` the clip's range (``agent.clip_range``: ``symmetric``, PPO's
  ``[1 - clip, 1 + clip]``; ``reciprocal``, Sample Factory's ``[1 / (1 + clip), 1 + clip]``, symmetric
  in ``log r``), ``r_t`` first clamped to ``agent.ratio_clamp`` where one is given (Sample Factory
  clamps it to ``[0.05, 20]``: ``sample_factory/algo/learning/learner.py``, ``_calculate_losses``),
  and ``A_t`` V-trace's policy-gradient advantage ``rho_t (r_t + gamma v_{t+1} - V(x_t))``
  (Espeholt et al. 2018, Section 4.2), standardised over the minibatch with
  ``agent.normalize_advantages`` (as PPO's implementations do);
- the value loss toward V-trace's targets ``v_t``, ``0.5 mean max((V - v_t)^2, (V_clip - v_t)^2)`` with
  ``V_clip = V_old + clip(V - V_old, -value_clip, value_clip)``, ``V_old`` the behaviour policy's value
  the actor stored (PPO's value clipping, as OpenAI Baselines' ppo2 and Sample Factory clip it);
  ``agent.value_clip: null`` is the plain squared error. An intrinsic value head
  (:mod:`distrl.intrinsic`) has no stored value: its loss is the plain squared error;
- ``entropy_cost`` x the negative entropy (of the action space's distribution, summed over an
  action's dimensions), as IMPALA's.

Beside the loss it reports (:func:`ratio_diagnostics`) the fraction of steps whose ratio lies
outside the clip's range and the approximate KL divergence from the behaviour policy, as CleanRL's
PPO logs ``clipfrac`` and ``approx_kl``.
"""

from __future__ import annotations

import torch

from distrl.config.schema import CLIP_RANGES
from distrl.learning.losses.base import LossTerms, Targets
from distrl.learning.losses.terms import baseline_loss


def clip_bounds(clip: float, clip_range: str = "symmetric") -> tuple[float, float]:
    """The ratio's clip range ``(low, high)``: ``symmetric`` ``(1 - clip, 1 + clip)`` (Schulman et al.
    2017, eq. 7); ``reciprocal`` ``(1 / (1 + clip), 1 + clip)`` (Sample Factory's, which stays
    positive for any ``clip > 0``).

    Raises:
        ValueError: another ``clip_range`` (validation refuses it first).
    """
    if clip_range == "symmetric":
        return 1.0 - clip, 1.0 + clip
    if clip_range == "reciprocal":
        return 1.0 / (1.0 + clip), 1.0 + clip
    raise ValueError(f"agent.clip_range={clip_range!r}: use one of {', '.join(CLIP_RANGES)}")


def clipped_surrogate_loss(log_ratios: torch.Tensor, advantages: torch.Tensor, low: float, high: float,
                           ratio_clamp: tuple[float, float] | None = None) -> torch.Tensor:
    """``-mean min(r A, clip(r, low, high) A)`` with ``r = exp(log_ratios)`` (Schulman et al. 2017, eq. 7),
    ``r`` first clamped to ``ratio_clamp`` (no gradient outside it) where one is given.
    ``log_ratios [T, B]`` with gradient, ``advantages [T, B]`` (no gradient) -> scalar."""
    ratios = log_ratios.exp()
    if ratio_clamp is not None:
        ratios = ratios.clamp(*ratio_clamp)
    advantages = advantages.detach()
    unclipped = ratios * advantages
    clipped = ratios.clamp(low, high) * advantages
    return -torch.min(unclipped, clipped).mean()


def ratio_diagnostics(log_ratios: torch.Tensor, low: float, high: float) -> dict[str, torch.Tensor]:
    """How far the current policy has moved from the behaviour policy on a (mini)batch:
    ``clip_fraction``, the fraction of steps whose ratio lies outside ``[low, high]``, and ``approx_kl``, the mean of
    ``(r - 1) - log r`` (an unbiased, non-negative estimate of ``KL(mu || pi)`` in nats; Schulman,
    "Approximating KL divergence", 2020, the ``k3`` estimator). ``log_ratios [T, B]`` -> scalar
    tensors without gradient."""
    log_ratios = log_ratios.detach().float()
    ratios = log_ratios.exp()
    return {"clip_fraction": ((ratios < low) | (ratios > high)).float().mean(),
            "approx_kl": ((ratios - 1.0) - log_ratios).mean()}


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, targets: torch.Tensor,
                       clip: float | None) -> torch.Tensor:
    """``0.5 mean max((V - v)^2, (V_old + clip(V - V_old, -clip, clip) - v)^2)``: PPO's value clipping
    (OpenAI Baselines' ppo2). ``values [T, B]`` with gradient, ``old_values`` and ``targets`` ``[T, B]``
    without; ``clip`` None: ``0.5 mean (V - v)^2``."""
    errors = (values - targets) ** 2
    if clip is not None:
        clipped = old_values + (values - old_values).clamp(-clip, clip)
        errors = torch.max(errors, (clipped - targets) ** 2)
    return 0.5 * errors.mean()


class ClippedSurrogate:
    """APPO's objective; the module docstring gives its terms (:class:`distrl.learning.losses.base.Objective`).

    Args:
        clip: the ratio's clip (``agent.clip``, > 0).
        value_clip: the value's clip (``agent.value_clip``: None, or > 0 in the units of the clipped
            reward's return).
        baseline_cost: the value loss's weight (``agent.baseline_cost``).
        clip_range: ``symmetric`` or ``reciprocal`` (``agent.clip_range``, :func:`clip_bounds`).
        ratio_clamp: ``(low, high)``, the ratio's hard clamp before the surrogate (``agent.ratio_clamp``),
            or None.
    """

    def __init__(self, clip: float, value_clip: float | None, baseline_cost: float, clip_range: str = "symmetric",
                 ratio_clamp: tuple[float, float] | None = None):
        self.clip, self.value_clip, self.baseline_cost = clip, value_clip, baseline_cost
        self.low, self.high = clip_bounds(clip, clip_range)
        self.ratio_clamp = ratio_clamp
        self.reads_old_values = value_clip is not None  # the clip is around the behaviour's values

    def __call__(self, batch: dict[str, torch.Tensor], targets: Targets, entropy_cost: float) -> LossTerms:
        pg_loss = clipped_surrogate_loss(targets.log_rhos, targets.advantages, self.low, self.high, self.ratio_clamp)
        value_loss = clipped_value_loss(targets.values[0], targets.old_values, targets.vs[0], self.value_clip)
        for v, vs in zip(targets.values[1:], targets.vs[1:], strict=True):  # the intrinsic head
            value_loss = value_loss + baseline_loss(vs - v)
        entropy_loss = -targets.entropy.mean()
        total = pg_loss + self.baseline_cost * value_loss + entropy_cost * entropy_loss
        return LossTerms(total, pg_loss, value_loss, entropy_loss,
                         ratio_diagnostics(targets.log_rhos, self.low, self.high))

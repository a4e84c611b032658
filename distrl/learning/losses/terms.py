"""Loss terms the objectives share, as pure tensor functions.

The terms are means over the T x B steps of a batch, not IMPALA's sums (Espeholt et al. 2018,
Section 4.2; also monobeast and scalable_agent). With a sum the gradient grows with T x B, so
RMSProp's eps and the global-norm clip mean something else for every T and B: at monobeast's T=80,
B=8 the clip at 40 cut most updates 2-20x and eps = 0.01 was 8x sqrt(square_avg) of the fully
connected layer, and Pong stayed at random play (docs/lab/learning.md). With means, the same eps
and clip hold for any T x B, as in A2C and PPO.
"""

from __future__ import annotations

import torch


def standardize(advantages: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """The advantages shifted and scaled to mean 0 and standard deviation 1 over all their elements
    (``[T, B]`` -> ``[T, B]``), as PPO's implementations do per minibatch (OpenAI Baselines' ppo2,
    CleanRL's ``norm_adv``; not in IMPALA): the policy gradient's scale then no longer depends on
    the game's reward density. ``eps`` keeps a batch of equal advantages finite (they become 0)."""
    return (advantages - advantages.mean()) / (advantages.std(correction=0) + eps)


def baseline_loss(errors: torch.Tensor) -> torch.Tensor:
    """``0.5 * mean_t,b (v_s - V(x_s))^2`` (IMPALA Section 4.2, averaged): ``errors`` are the value
    errors ``v_s - V(x_s)`` ``[T, B]`` (with gradient through ``V``) -> scalar."""
    return 0.5 * (errors**2).mean()

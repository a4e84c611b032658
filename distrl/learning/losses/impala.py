"""IMPALA's objective (Espeholt et al. 2018, Section 4.2): what ``agent=impala`` trains, on the
targets of the run's return estimator (V-trace by default, :mod:`distrl.learning.losses.returns`).

``policy gradient + baseline_cost x value loss + entropy_cost x (negative entropy)``, each averaged
over the ``T x B`` steps of the batch (IMPALA sums them; :mod:`distrl.learning.losses.vtrace` says why distrl
averages):

- the policy gradient ``-mean log pi(a_t|x_t) A_t`` with the estimator's advantages (V-trace's:
  ``A_t = rho_t (r_t + gamma v_{t+1} - V(x_t))``; standardised over the batch with
  ``agent.normalize_advantages``, as PPO's implementations do);
- the value loss ``0.5 mean (v_t - V(x_t))^2`` toward the estimator's targets, per value head;
- the entropy bonus, the mean negative entropy of the policy (``mean sum_a pi log pi`` for a
  categorical; summed over an action's dimensions for MultiDiscrete and Box actions).

The policy enters through its distribution's log-probabilities (:mod:`distrl.nn.distributions`), so
every action space takes the same loss.
"""

from __future__ import annotations

import torch

from distrl.learning.losses.base import LossTerms, Targets
from distrl.learning.losses.terms import baseline_loss


class PolicyGradient:
    """IMPALA's objective; the module docstring gives its terms (:class:`distrl.learning.losses.base.Objective`).

    Args:
        baseline_cost: the value loss's weight (``agent.baseline_cost``).
    """

    reads_old_values = False

    def __init__(self, baseline_cost: float):
        self.baseline_cost = baseline_cost

    def __call__(self, batch: dict[str, torch.Tensor], targets: Targets, entropy_cost: float) -> LossTerms:
        pg_loss = -(targets.log_probs * targets.advantages.detach()).mean()
        value_loss = sum(baseline_loss(vs - v) for v, vs in zip(targets.values, targets.vs, strict=True))
        entropy_loss = -targets.entropy.mean()
        total = pg_loss + self.baseline_cost * value_loss + entropy_cost * entropy_loss
        return LossTerms(total, pg_loss, value_loss, entropy_loss)

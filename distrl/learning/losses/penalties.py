"""Terms an agent's loss may add to its objective's total, each a named part chosen once from the
config (:class:`distrl.learning.losses.base.AgentLoss`): the total gains ``coef x value`` and the value
is reported beside the losses (``losses/<name>``).

- :class:`FeatureDrift` (``agent.pfo_coef``): PFO's trust region on the encoder's features;
- :class:`KLPenalty` (``agent.kl_cost``): Sample Factory's KL penalty on the policy's move away from
  the behaviour policy.

Each takes the rows of a minibatch its objective is computed on: rows ``0..T-1`` of whole unrolls, or
every row of a ``[1, n]`` minibatch of steps. Each says whether it reads the network's pre-activations
(``reads_preactivations``: the learner's forward pass then returns them) and what it needs computed
once before an update's first optimizer step (``before_first_step``: keys added to the batch, each
declared in :data:`distrl.rollout.KEYS`; :meth:`distrl.learning.losses.base.AgentLoss.prepare`).
"""

from __future__ import annotations

import torch

from distrl.nn.distributions import ActionSpace
from distrl.rollout import BEHAVIOUR_PREACTIVATIONS

# PFO's anchor with agent.pfo_anchor=update, [T+1, B, feature_dim] float32 (declared in
# distrl.rollout.KEYS): the encoder's pre-activations at the start of the batch's update, which the
# learner adds; with behaviour the actors stored the behaviour policy's (BEHAVIOUR_PREACTIVATIONS)
OLD_PREACTIVATIONS = "preactivations_old"


class FeatureDrift:
    """PFO's auxiliary loss (Proximal Feature Optimization: Moalla et al. 2024, "No Representation, No
    Trust: Connecting Representation, Collapse, and Trust Issues in PPO"): ``mean over steps and
    features of (phi(x_t) - phi_old(x_t))^2``, ``phi`` the encoder's output features before their
    activation (the network's pre-activations, with gradient) and ``phi_old`` the anchor: a trust
    region on the features, as PPO's clip is one on the policy. A scalar tensor, in float32.

    ``anchor`` (``agent.pfo_anchor``): ``update``, the paper's, the network's at the start of the
    batch's update (``batch[OLD_PREACTIVATIONS]``, one forward pass of the batch before the first
    step: :meth:`update_anchor` is its ``before_first_step``); ``behaviour``, the behaviour policy's,
    which the actors stored as they acted (``batch[BEHAVIOUR_PREACTIVATIONS]``: no pass, nothing
    before the first step; the actor copy's arithmetic, bf16 with ``precision=bf16``, and weights up
    to the policy lag older)."""

    name = "feature_drift"
    reads_preactivations = True

    def __init__(self, coef: float, rows: slice, anchor: str = "update"):
        self.coef, self.rows = coef, rows
        self.anchor_key = OLD_PREACTIVATIONS if anchor == "update" else BEHAVIOUR_PREACTIVATIONS
        # with the behaviour anchor the actors stored it: nothing to compute before the first step
        self.before_first_step = self.update_anchor if anchor == "update" else None

    def update_anchor(self, outputs) -> dict[str, torch.Tensor]:
        """The anchor: the pre-activations of the update's starting network (its ``outputs`` on the
        whole ``[T+1, B]`` batch, without gradient), as ``{OLD_PREACTIVATIONS: [T+1, B, F] float32}``."""
        return {OLD_PREACTIVATIONS: outputs.preactivations.float()}

    def __call__(self, minibatch: dict[str, torch.Tensor], params: torch.Tensor,
                 preactivations: torch.Tensor) -> torch.Tensor:
        rows = self.rows
        return (preactivations[rows].float() - minibatch[self.anchor_key][rows]).pow(2).mean()


class KLPenalty:
    """Sample Factory's KL penalty (``kl_loss_coeff``, sample_factory/algo/learning/learner.py
    ``_kl_loss``): ``mean over steps of KL(pi(.|x_t) || mu(.|x_t))``, the current policy (``params``,
    with gradient) against the behaviour policy that acted (``batch["policy_params"]``), each
    distribution's own KL (:meth:`distrl.nn.distributions.Categorical.kl`, ``MultiCategorical.kl``,
    ``DiagGaussian.kl``), in nats. It pulls each optimizer step's policy back towards the one that
    acted, as the clip does only past ``1 +- agent.clip``. A scalar tensor, in float32."""

    name = "kl"
    reads_preactivations = False
    before_first_step = None  # nothing computed before the first step

    def __init__(self, coef: float, rows: slice, action_space: ActionSpace):
        self.coef, self.rows, self.action_space = coef, rows, action_space

    def __call__(self, minibatch: dict[str, torch.Tensor], params: torch.Tensor,
                 preactivations: torch.Tensor | None) -> torch.Tensor:
        current = self.action_space.distribution(params[self.rows].float())
        behaviour = self.action_space.distribution(minibatch["policy_params"][self.rows])
        return current.kl(behaviour).mean()

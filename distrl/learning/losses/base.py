"""An agent's loss as three parts composed: the action distribution, a return estimator and an
objective (:class:`AgentLoss`). It maps a minibatch and the network's outputs on it
(:class:`Outputs`) to named terms (:class:`LossTerms`); which minibatches an update makes, and what is
computed once before them, is the learner's plan (:mod:`distrl.learning.plan`).

A batch is ``[T+1, B]``: rows ``0..T-1`` (:data:`distrl.rollout.STEPS`) are the steps the loss is
computed on and row ``T`` (:data:`distrl.rollout.BOOTSTRAP`) the observation whose value bootstraps
the unroll (:mod:`distrl.rollout`). On a (mini)batch and the network's outputs on it,
:meth:`AgentLoss.unroll_targets` scores the stored actions under the current and the behaviour
distribution, splits the rewards into streams (:meth:`AgentLoss.streams`: the extrinsic one, and an
intrinsic one with its own value head), runs the return estimator on each
(:mod:`distrl.learning.losses.returns`: V-trace or GAE) and combines their advantages; the objective
(:mod:`distrl.learning.losses.impala`'s policy gradient, :mod:`distrl.learning.losses.appo`'s clipped surrogate) turns
those :class:`Targets` into :class:`LossTerms`. Every choice (the minibatch's kind, the value heads,
how an intrinsic reward enters, PFO's term) is made once, at construction, from the config.

The policy's outputs are the parameters of the action space's distribution
(:mod:`distrl.nn.distributions`: logits, or a Gaussian's mean and log-std); the losses see the
policy only through that distribution's log-probabilities and entropy, so every action space
(Discrete, MultiDiscrete, Box) takes the same V-trace and the same losses. The importance weight of
a Box action is the ratio of two densities, ``pi(a|x) / mu(a|x)``, as it is a ratio of probabilities
for a discrete one.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import NamedTuple, Protocol

import torch
from omegaconf import DictConfig, OmegaConf

from distrl.learning.losses.penalties import FeatureDrift, KLPenalty
from distrl.learning.losses.returns import GAE, NormalizedValues, Stream, VTrace, make_estimator
from distrl.learning.losses.terms import standardize
from distrl.nn.distributions import ActionSpace
from distrl.rollout import BOOTSTRAP, STEPS

BATCH_TARGETS = ("advantages", "value_targets")  # the keys agent.minibatch=steps adds to a batch


class Outputs(NamedTuple):
    """The learner network's outputs on every row of a (mini)batch: the policy parameters ``params
    [rows, B, P]`` float32, the values ``[rows, B]`` (``[rows, B, 2]`` with an intrinsic value head)
    float32 and, with PFO (``agent.pfo_coef > 0``), the encoder's pre-activations ``[rows, B, F]``
    (else None)."""

    params: torch.Tensor
    values: torch.Tensor
    preactivations: torch.Tensor | None = None


class LossTerms(NamedTuple):
    """One optimizer step's loss: scalar tensors averaged over the (mini)batch's ``T x B`` steps.

    ``total`` (with gradient) is what the learner minimises; ``policy``, ``value`` and ``entropy``
    its terms (the entropy term is the negative entropy, in nats); ``diagnostics``: scalar tensors
    without gradient that the agent reports beside them (APPO's ``clip_fraction`` and
    ``approx_kl``), logged as ``losses/<name>``; None: none.
    """

    total: torch.Tensor
    policy: torch.Tensor
    value: torch.Tensor
    entropy: torch.Tensor
    diagnostics: dict[str, torch.Tensor] | None = None


class Targets(NamedTuple):
    """What an objective needs of a (mini)batch: the return estimator's outputs and the policy's scores.

    ``log_rhos``: ``[T, B]`` ``log pi(a_t|x_t) - log mu(a_t|x_t)`` of the current network against
    the behaviour policy, with gradient through ``pi``; ``log_probs``: ``[T, B]`` ``log pi(a_t|x_t)``
    with gradient; ``entropy``: ``[T, B]`` the current policy's entropy (nats, summed over the action's
    dimensions) with gradient; ``advantages``: ``[T, B]`` the policy
    gradient's advantages (no gradient); ``values``: per value head, ``V(x_t)`` ``[T, B]`` with
    gradient; ``vs``: per value head, the estimator's value targets ``[T, B]`` (no gradient). The heads
    are the extrinsic one, then with an intrinsic value head the intrinsic one, whose ``values`` and
    ``vs`` are times ``intrinsic_coef``: in the units of the advantages it adds, so that its loss
    weighs in the gradient as much as its advantages do in the policy's (:meth:`AgentLoss.unroll_targets`);
    ``old_values``: ``[T, B]`` the behaviour policy's extrinsic value ``V_old(x_t)`` the actor stored
    (no gradient), read only for an objective that reads it (APPO's value clipping), else None.
    """

    log_rhos: torch.Tensor
    log_probs: torch.Tensor
    entropy: torch.Tensor
    advantages: torch.Tensor
    values: list[torch.Tensor]
    vs: list[torch.Tensor]
    old_values: torch.Tensor | None


class Objective(Protocol):
    """What an agent optimizes, given :meth:`AgentLoss.unroll_targets` or :meth:`AgentLoss.step_targets`
    on a (mini)batch: ``objective(batch, targets, entropy_cost)`` -> :class:`LossTerms`
    (:class:`distrl.learning.losses.impala.PolicyGradient`, :class:`distrl.learning.losses.appo.ClippedSurrogate`).
    ``reads_old_values``: whether it reads :attr:`Targets.old_values` (APPO's value clipping)."""

    reads_old_values: bool

    def __call__(self, batch: dict[str, torch.Tensor], targets: Targets, entropy_cost: float) -> LossTerms: ...


class AgentLoss:
    """An agent's loss: ``objective`` on the targets of ``estimator`` for the actions of ``action_space``.

    Args:
        objective: what is minimised (:class:`Objective`).
        agent: the ``agent`` config node (``discount``, ``reward_scale``, ``reward_clip``, ``estimator``, ``rho_bar``,
            ``c_bar``, ``trace_lambda``, ``normalize_advantages``, ``minibatch``, ``pfo_coef``, ``kl_cost``).
        action_space: the actions' space, whose distribution scores them
            (:class:`distrl.nn.distributions.ActionSpace`; an int ``A`` means ``Discrete(A)``).
        value_heads: 1, or 2 with an intrinsic value head (the network's ``intrinsic_value``).
        intrinsic: the batches carry an intrinsic reward (``batch["intrinsic_reward"]``); with one
            value head it is added to the extrinsic reward, with two it is a stream of its own
            (:meth:`streams`).
        pretraining: the extrinsic reward is left out (reward-free training with an intrinsic one).
        estimator: the return estimator (:mod:`distrl.learning.losses.returns`); None: ``agent.estimator``'s.

    Attributes:
        agent: the node's values, read once into plain Python values (``agent.clip`` as on the node),
            so that ``torch.compile`` traces the loss without stepping into OmegaConf.
        minibatch_targets: the targets of one optimizer step's minibatch, chosen by ``agent.minibatch``:
            :meth:`unroll_targets` (whole unrolls: the estimator runs on each minibatch with the network
            of that step) or :meth:`step_targets` (single steps, on the targets the estimator gave once
            per batch, :meth:`batch_targets`, as PPO computes GAE once per rollout).
        penalties: the terms added to the objective's total (:mod:`distrl.learning.losses.penalties`):
            PFO's :class:`~distrl.learning.losses.penalties.FeatureDrift` with ``agent.pfo_coef > 0``,
            the :class:`~distrl.learning.losses.penalties.KLPenalty` with ``agent.kl_cost > 0``.
        reads_preactivations: a penalty reads the encoder's pre-activations (the learner's forward
            pass returns them, :class:`Outputs`).
    """

    def __init__(self, objective: Objective, agent: DictConfig, action_space: ActionSpace | int,
                 value_heads: int = 1, intrinsic: bool = False, pretraining: bool = False,
                 estimator: VTrace | GAE | NormalizedValues | None = None):
        self.objective = objective
        self.agent = SimpleNamespace(**OmegaConf.to_container(agent, resolve=True))
        self.estimator = estimator if estimator is not None else make_estimator(agent)
        self.action_space = ActionSpace.of(action_space)
        self.pretraining = pretraining
        self.normalize_advantages = bool(agent.normalize_advantages)
        self.two_heads = value_heads == 2
        self.bonus_added = intrinsic and not self.two_heads  # one head: extrinsic + coef x intrinsic
        steps = agent.minibatch == "steps"
        self.minibatch_targets = self.step_targets if steps else self.unroll_targets
        rows = slice(None) if steps else STEPS  # a minibatch of steps has no bootstrap row
        wanted = ((FeatureDrift(float(agent.pfo_coef), rows, agent.get("pfo_anchor", "update")), agent.pfo_coef > 0),
                  (KLPenalty(float(agent.kl_cost), rows, self.action_space), agent.kl_cost > 0))
        self.penalties = [penalty for penalty, on in wanted if on]
        self.reads_preactivations = any(penalty.reads_preactivations for penalty in self.penalties)
        self._anchors = [penalty.before_first_step for penalty in self.penalties if penalty.before_first_step]
        self._targets_per_batch = steps

    @property
    def prepares(self) -> bool:
        """Whether something is computed once before an update's first optimizer step (:meth:`prepare`)."""
        return bool(self._anchors) or self._targets_per_batch

    def prepare(self, batch: dict[str, torch.Tensor], outputs: Outputs,
                intrinsic_coef: float = 0.0) -> dict[str, torch.Tensor]:
        """``batch`` with what is computed once before an update's first optimizer step, from the
        network's ``outputs`` on it at the update's start (without gradient): each penalty's
        ``before_first_step`` (PFO's anchor) and, with ``agent.minibatch=steps``, :meth:`batch_targets`.
        Every key added is declared in :data:`distrl.rollout.KEYS`."""
        added = {}
        for anchor in self._anchors:
            added.update(anchor(outputs))
        if self._targets_per_batch:
            added.update(self.batch_targets(batch, outputs.params, outputs.values, intrinsic_coef))
        return {**batch, **added}

    def __call__(self, minibatch: dict[str, torch.Tensor], outputs: Outputs, entropy_cost: float,
                 intrinsic_coef: float = 0.0) -> LossTerms:
        """The loss of one optimizer step: ``outputs`` are the network's on every row of ``minibatch``
        (``[T+1, B]`` of whole unrolls, or ``[1, n]`` steps carrying :data:`BATCH_TARGETS`).
        Returns :class:`LossTerms`, scalar tensors averaged over the minibatch's steps.

        Each of :attr:`penalties` adds its ``coef`` x its value to the total, and reports the value
        under its name (``feature_drift``, ``kl``)."""
        targets = self.minibatch_targets(minibatch, outputs.params, outputs.values, intrinsic_coef)
        terms = self.objective(minibatch, targets, entropy_cost)
        total, diagnostics = terms.total, terms.diagnostics
        for penalty in self.penalties:
            value = penalty(minibatch, outputs.params, outputs.preactivations)
            total = total + penalty.coef * value
            diagnostics = {**(diagnostics or {}), penalty.name: value.detach()}
        return terms._replace(total=total, diagnostics=diagnostics)

    def streams(self, batch: dict[str, torch.Tensor], values: torch.Tensor,
                intrinsic_coef: float = 0.0) -> list[tuple[Stream, float]]:
        """The batch's reward streams and the weight of each one's advantages: the intrinsic-extrinsic
        combination.

        The extrinsic stream's rewards are the extrinsic ones clipped to ``agent.reward_clip`` (0 when
        pretraining), its episodes end where the env's did. With an intrinsic reward
        (``batch["intrinsic_reward"]`` ``[T, B]``, normalised): with an intrinsic value head (``values
        [T+1, B, 2]``), a second stream of the intrinsic return with weight ``intrinsic_coef``,
        discounted by ``agent.discount`` and not cut at episode ends (Burda et al. 2019, Section 2.3);
        with one head (``intrinsic.episodic``), the extrinsic stream's reward is the extrinsic one plus
        ``intrinsic_coef`` times it.
        """
        values, intrinsic_values = (values[..., 0], values[..., 1]) if self.two_heads else (values, None)
        rewards = self.extrinsic_rewards(batch)
        if self.bonus_added:
            rewards = rewards + intrinsic_coef * batch["intrinsic_reward"]
        baseline = values[STEPS]
        streams = [(Stream(rewards, batch["terminated"][STEPS], batch["truncated"][STEPS], baseline,
                           values[BOOTSTRAP], batch["truncation_value"][STEPS]), 1.0)]
        if self.two_heads:
            never = torch.zeros_like(batch["terminated"][STEPS], dtype=torch.bool)
            intrinsic_baseline = intrinsic_values[STEPS]
            streams.append((Stream(batch["intrinsic_reward"], never, never, intrinsic_baseline,
                                   intrinsic_values[BOOTSTRAP], torch.zeros_like(intrinsic_baseline)), intrinsic_coef))
        return streams

    def extrinsic_rewards(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``[T, B]``: the extrinsic rewards the loss sees, the batch's times ``agent.reward_scale``, then
        clipped to ``agent.reward_clip`` (0 when pretraining)."""
        rewards = batch["reward"][STEPS]
        if self.agent.reward_scale != 1:
            rewards = rewards * self.agent.reward_scale
        if self.agent.reward_clip is not None:
            rewards = rewards.clamp(-self.agent.reward_clip, self.agent.reward_clip)
        return torch.zeros_like(rewards) if self.pretraining else rewards

    def intrinsic_share(self, batch: dict[str, torch.Tensor], intrinsic_coef: float) -> float:
        """The intrinsic part of the reward the agent is paid over the batch's ``T x B`` steps:
        ``coef x sum |r_int| / (coef x sum |r_int| + sum |r_ext|)``, with ``r_int`` the normalised
        intrinsic rewards (``batch["intrinsic_reward"]``) and ``r_ext`` :meth:`extrinsic_rewards`; an
        episode's sums are its length times the per-step means, so this is also the bonus's share of
        an episode's reward. Near 1, the bonus drowns the task's reward; 0 with nothing paid."""
        bonus, extrinsic = torch.stack([batch["intrinsic_reward"].abs().sum(),
                                        self.extrinsic_rewards(batch).abs().sum()]).tolist()  # one sync
        intrinsic = intrinsic_coef * bonus
        return intrinsic / (intrinsic + extrinsic) if intrinsic + extrinsic > 0 else 0.0

    def unroll_targets(self, batch: dict[str, torch.Tensor], params: torch.Tensor, values: torch.Tensor,
                       intrinsic_coef: float = 0.0, per_minibatch: bool = True) -> Targets:
        """The estimator on each of :meth:`streams` with the current network's policy parameters
        ``params [T+1, B, P]`` and ``values`` (``[T+1, B]`` or ``[T+1, B, 2]``) on a batch of whole
        unrolls, the advantages summed with the streams' weights (``A_ext + intrinsic_coef x A_int``)
        and, with ``agent.normalize_advantages`` and ``per_minibatch``, standardised over the batch given.

        The intrinsic head's values and targets come out times ``intrinsic_coef``, so its squared
        error is ``intrinsic_coef^2`` times that on the normalised intrinsic return. The head still
        learns that unit-scale return (its own weights see only this loss, and Adam's steps do not
        depend on a loss's scale while its gradients stay well above ``optimizer.eps``), but in
        the torso it shares with the policy its loss weighs what its advantages do. Unweighted,
        with raw advantages (``agent.normalize_advantages=false``, a policy loss near 0.002), it
        took the gradient: on DoorKey-8x8, RE3 at coef 0.001 had a gradient norm of 1.10 against
        0.007 without a bonus, and the policy stayed uniform (docs/lab/exploration.md).

        The log importance weights are the difference of the current and the behaviour
        distribution's log-probabilities of the stored actions (``batch["policy_params"]``), in float32
        whatever the network's precision; both streams share them.
        """
        dist, log_probs, log_rhos = self._scores(batch["action"][STEPS], params[STEPS],
                                                   batch["policy_params"][STEPS])
        advantages, heads, vs = None, [], []
        for stream, weight in self.streams(batch, values, intrinsic_coef):
            estimate = self.estimator(log_rhos, stream)
            advantages = estimate.advantages if advantages is None else advantages + weight * estimate.advantages
            heads.append(weight * stream.values)
            vs.append(weight * estimate.targets)
        if self.normalize_advantages and per_minibatch:
            advantages = standardize(advantages)
        old_values = batch["baseline"][STEPS] if self.objective.reads_old_values else None
        return Targets(log_rhos, log_probs, dist.entropy(), advantages, heads, vs, old_values)

    def batch_targets(self, batch: dict[str, torch.Tensor], params: torch.Tensor, values: torch.Tensor,
                      intrinsic_coef: float = 0.0) -> dict[str, torch.Tensor]:
        """The targets of a whole ``[T+1, B]`` batch, computed once before the epochs
        (``agent.minibatch=steps``): :meth:`unroll_targets` with the network's ``params [T+1, B, P]`` and
        ``values`` (``[T+1, B]`` or ``[T+1, B, 2]``) at the start of the update, without gradient and
        not standardised (each minibatch standardises its own).

        Returns:
            ``{"advantages": [T, B], "value_targets": [T, B, H]}`` float32, H the value heads (the
            intrinsic one's times ``intrinsic_coef``, as :meth:`unroll_targets` gives them).
        """
        with torch.no_grad():
            targets = self.unroll_targets(batch, params, values, intrinsic_coef, per_minibatch=False)
        return {"advantages": targets.advantages, "value_targets": torch.stack(targets.vs, dim=-1)}

    def step_targets(self, batch: dict[str, torch.Tensor], params: torch.Tensor, values: torch.Tensor,
                     intrinsic_coef: float = 0.0) -> Targets:
        """:class:`Targets` of a minibatch of steps (``agent.minibatch=steps``, :mod:`distrl.learning.plan`):
        every tensor ``[1, n, ...]``, every row a step; the advantages and value targets are the
        batch's (:meth:`batch_targets`), standardised over the minibatch with
        ``agent.normalize_advantages``; the log importance weights, log-probabilities, entropy and
        values those of the network given (``params [1, n, P]``, ``values [1, n]`` or ``[1, n, 2]``),
        the intrinsic head's times ``intrinsic_coef`` as its targets are (:meth:`unroll_targets`)."""
        dist, log_probs, log_rhos = self._scores(batch["action"], params, batch["policy_params"])
        heads = [values[..., 0], intrinsic_coef * values[..., 1]] if self.two_heads else [values]
        advantages = batch["advantages"]
        if self.normalize_advantages:
            advantages = standardize(advantages)
        old_values = batch["baseline"] if self.objective.reads_old_values else None
        return Targets(log_rhos, log_probs, dist.entropy(), advantages, heads,
                       list(batch["value_targets"].unbind(-1)), old_values)

    def _scores(self, actions: torch.Tensor, params: torch.Tensor, behaviour_params: torch.Tensor):
        """The stored ``actions`` ``[T, B, ...]`` under the current policy (``params [T, B, P]``, fp32:
        the network's heads give fp32) and the behaviour policy (``behaviour_params``): the current
        distribution, ``log pi(a|x)`` and ``log pi(a|x) - log mu(a|x)``, each ``[T, B]`` (summed over an
        action's dimensions)."""
        dist = self.action_space.distribution(params)
        log_probs = dist.log_prob(actions)
        return dist, log_probs, log_probs - self.action_space.distribution(behaviour_params).log_prob(actions)

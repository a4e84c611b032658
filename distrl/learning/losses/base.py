"""An agent's loss as three parts composed: the action distribution, a return estimator and an
objective (:class:`AgentLoss`), with the split of a batch into minibatches.

A batch is ``[T+1, B]``: rows ``0..T-1`` (:data:`distrl.rollout.STEPS`) are the steps the loss is
computed on and row ``T`` (:data:`distrl.rollout.BOOTSTRAP`) the observation whose value bootstraps
the unroll (:mod:`distrl.rollout`). On a (mini)batch and the network's outputs on it,
:meth:`AgentLoss.targets` scores the stored actions under the current and the behaviour
distribution, splits the rewards into streams (:meth:`AgentLoss.streams`: the extrinsic one, and an
intrinsic one with its own value head), runs the return estimator on each
(:mod:`distrl.learning.losses.returns`: V-trace or GAE) and combines their advantages; the objective
(:mod:`distrl.learning.losses.impala`'s policy gradient, :mod:`distrl.learning.losses.appo`'s clipped surrogate) turns
those :class:`Targets` into :class:`LossTerms`. The learner (:mod:`distrl.learning.learner`) runs the
network, makes ``num_epochs x num_minibatches`` optimizer steps per batch and never looks inside
the loss.

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

from distrl.learning.losses.returns import GAE, Stream, VTrace, make_estimator
from distrl.learning.losses.terms import standardise
from distrl.nn.distributions import ActionSpace
from distrl.rollout import ACTED_KEYS, BOOTSTRAP, STEPPED_KEYS, STEPS

BATCH_TARGETS = ("advantages", "value_targets")  # the keys agent.minibatch=steps adds to a batch
# with agent.pfo_coef > 0, the key the learner adds to a batch: the encoder's pre-activations at the
# start of the batch's update, [T+1, B, feature_dim] float32 (AgentLoss.feature_drift)
OLD_PREACTIVATIONS = "preactivations_old"


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
    weighs in the gradient as much as its advantages do in the policy's (:meth:`AgentLoss.targets`); ``old_values``:
    ``[T, B]`` the behaviour policy's extrinsic value ``V_old(x_t)`` the actor stored (no gradient;
    None for a batch without ``baseline``, which only APPO's value clipping reads).
    """

    log_rhos: torch.Tensor
    log_probs: torch.Tensor
    entropy: torch.Tensor
    advantages: torch.Tensor
    values: list[torch.Tensor]
    vs: list[torch.Tensor]
    old_values: torch.Tensor | None


class Objective(Protocol):
    """What an agent optimizes, given :meth:`AgentLoss.targets` on a (mini)batch: ``objective(batch,
    targets, entropy_cost)`` -> :class:`LossTerms` (:class:`distrl.learning.losses.impala.PolicyGradient`,
    :class:`distrl.learning.losses.appo.ClippedSurrogate`)."""

    def __call__(self, batch: dict[str, torch.Tensor], targets: Targets, entropy_cost: float) -> LossTerms: ...


class AgentLoss:
    """An agent's loss: ``objective`` on the targets of ``estimator`` for the actions of
    ``action_space``, and the plan of a batch's optimizer steps.

    Args:
        objective: what is minimised (:class:`Objective`).
        agent: the ``agent`` config node (``discount``, ``reward_clip``, ``estimator``, ``rho_bar``,
            ``c_bar``, ``trace_lambda``, ``normalize_advantages``, ``num_epochs``, ``num_minibatches``).
        action_space: the actions' space, whose distribution scores them
            (:class:`distrl.nn.distributions.ActionSpace`; an int ``A`` means ``Discrete(A)``).
        pretraining: the extrinsic reward is left out (reward-free training with an intrinsic one).
        estimator: the return estimator (:mod:`distrl.learning.losses.returns`); None: ``agent.estimator``'s.

    Attributes:
        agent: the node's values, read once into plain Python values (``agent.clip`` as on the node),
            so that ``torch.compile`` traces the loss without stepping into OmegaConf.
        num_epochs: passes over each batch.
        num_minibatches: minibatches each pass splits the batch into.
        minibatch: what a minibatch holds (``agent.minibatch``): ``unrolls``, whole unrolls, the
            estimator run on each minibatch with the network of that optimizer step; ``steps``,
            single steps drawn at random from the batch's ``T x B``, on targets the estimator gave
            once per batch (:meth:`batch_targets`), as PPO computes GAE once per rollout.
    """

    def __init__(self, objective: Objective, agent: DictConfig, action_space: ActionSpace | int,
                 pretraining: bool = False, estimator: VTrace | GAE | None = None):
        self.objective = objective
        self.agent = SimpleNamespace(**OmegaConf.to_container(agent, resolve=True))
        self.estimator = estimator if estimator is not None else make_estimator(agent)
        self.action_space = ActionSpace.of(action_space)
        self.pretraining = pretraining
        self.num_epochs = int(agent.num_epochs)
        self.num_minibatches = int(agent.get("num_minibatches", 1))
        self.normalize_advantages = bool(agent.normalize_advantages)
        self.minibatch = agent.get("minibatch", "unrolls")
        self.pfo_coef = float(agent.get("pfo_coef", 0.0))  # checkpoints written before agent.pfo_coef have none

    def __call__(self, batch: dict[str, torch.Tensor], params: torch.Tensor, values: torch.Tensor,
                 entropy_cost: float, intrinsic_coef: float = 0.0,
                 preactivations: torch.Tensor | None = None) -> LossTerms:
        """The loss of one optimizer step: ``params [T+1, B, P]`` (the policy parameters) and ``values``
        (``[T+1, B]``, or ``[T+1, B, 2]`` with an intrinsic value head) are the network's on every row
        of ``batch``.
        Returns :class:`LossTerms`, scalar tensors averaged over the ``T x B`` steps.

        A minibatch of steps (``agent.minibatch=steps``: ``[1, n]`` rows carrying
        :data:`BATCH_TARGETS`) is scored by :meth:`step_targets` instead, ``params [1, n, P]`` and
        ``values [1, n]`` (or ``[1, n, 2]``) on its rows.

        With ``preactivations`` (the encoder's, ``[T+1, B, F]`` or ``[1, n, F]``; ``agent.pfo_coef > 0``)
        the total adds ``agent.pfo_coef`` x :meth:`feature_drift`, reported as ``feature_drift``."""
        if BATCH_TARGETS[0] in batch:
            terms = self.objective(batch, self.step_targets(batch, params, values, intrinsic_coef), entropy_cost)
        else:
            terms = self.objective(batch, self.targets(batch, params, values, intrinsic_coef), entropy_cost)
        if preactivations is None:
            return terms
        drift = self.feature_drift(batch, preactivations)
        return terms._replace(total=terms.total + self.pfo_coef * drift,
                              diagnostics={**(terms.diagnostics or {}), "feature_drift": drift.detach()})

    def feature_drift(self, batch: dict[str, torch.Tensor], preactivations: torch.Tensor) -> torch.Tensor:
        """PFO's auxiliary loss (Proximal Feature Optimization: Moalla et al. 2024, "No
        Representation, No Trust: Connecting Representation, Collapse, and Trust Issues in PPO"):
        ``mean over steps and features of (phi(x_t) - phi_old(x_t))^2``, ``phi`` the encoder's
        output features before their activation (``preactivations``, with gradient) and ``phi_old``
        those of the network at the start of the batch's update (``batch[OLD_PREACTIVATIONS]``): a
        trust region on the features, as PPO's clip is one on the policy. A scalar tensor over the
        steps (rows ``0..T-1``, or every row of a minibatch of steps), in float32."""
        rows = slice(None) if BATCH_TARGETS[0] in batch else STEPS
        return (preactivations[rows].float() - batch[OLD_PREACTIVATIONS][rows]).pow(2).mean()

    def streams(self, batch: dict[str, torch.Tensor], values: torch.Tensor,
                intrinsic_coef: float = 0.0) -> list[tuple[Stream, float]]:
        """The batch's reward streams and the weight of each one's advantages: the intrinsic-extrinsic
        combination.

        The extrinsic stream's rewards are the extrinsic ones clipped to ``agent.reward_clip`` (0 when
        pretraining), its episodes end where the env's did. With ``batch["intrinsic_reward"]``
        (``[T, B]``, normalised): on a network with an intrinsic value head (``values [T+1, B, 2]``),
        a second stream of the intrinsic return with weight ``intrinsic_coef``, discounted by
        ``agent.discount`` and not cut at episode ends (Burda et al. 2019, Section 2.3); on a network
        with one head (``intrinsic.episodic``), the extrinsic stream's reward is the extrinsic one plus
        ``intrinsic_coef`` times it.
        """
        two_heads = values.dim() == 3
        values, intrinsic_values = (values[..., 0], values[..., 1]) if two_heads else (values, None)
        rewards = self.extrinsic_rewards(batch)
        if "intrinsic_reward" in batch and not two_heads:
            rewards = rewards + intrinsic_coef * batch["intrinsic_reward"]
        baseline = values[STEPS]
        streams = [(Stream(rewards, batch["terminated"][STEPS], batch["truncated"][STEPS], baseline,
                           values[BOOTSTRAP], batch["truncation_value"][STEPS]), 1.0)]
        if two_heads:
            never = torch.zeros_like(batch["terminated"][STEPS], dtype=torch.bool)
            intrinsic_baseline = intrinsic_values[STEPS]
            streams.append((Stream(batch.get("intrinsic_reward", torch.zeros_like(rewards)), never, never,
                                   intrinsic_baseline, intrinsic_values[BOOTSTRAP],
                                   torch.zeros_like(intrinsic_baseline)), intrinsic_coef))
        return streams

    def extrinsic_rewards(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``[T, B]``: the extrinsic rewards the loss sees, the batch's clipped to ``agent.reward_clip``
        (0 when pretraining)."""
        rewards = batch["reward"][STEPS]
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

    def targets(self, batch: dict[str, torch.Tensor], params: torch.Tensor, values: torch.Tensor,
                intrinsic_coef: float = 0.0, per_minibatch: bool = True) -> Targets:
        """The estimator on each of :meth:`streams` with the current network's policy parameters
        ``params [T+1, B, P]`` and ``values`` (``[T+1, B]`` or ``[T+1, B, 2]``), the advantages summed
        with the streams' weights (``A_ext + intrinsic_coef x A_int``) and, with
        ``agent.normalize_advantages`` and ``per_minibatch``, standardised over the batch given.

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
        policy, log_probs, log_rhos = self._scores(batch["action"][STEPS], params[STEPS],
                                                   batch["policy_params"][STEPS])
        advantages, heads, vs = None, [], []
        for stream, weight in self.streams(batch, values, intrinsic_coef):
            estimate = self.estimator(log_rhos, stream)
            advantages = estimate.advantages if advantages is None else advantages + weight * estimate.advantages
            heads.append(weight * stream.values)
            vs.append(weight * estimate.targets)
        if self.normalize_advantages and per_minibatch:
            advantages = standardise(advantages)
        old_values = batch["baseline"][STEPS] if "baseline" in batch else None
        return Targets(log_rhos, log_probs, policy.entropy(), advantages, heads, vs, old_values)

    def batch_targets(self, batch: dict[str, torch.Tensor], params: torch.Tensor, values: torch.Tensor,
                      intrinsic_coef: float = 0.0) -> dict[str, torch.Tensor]:
        """The targets of a whole ``[T+1, B]`` batch, computed once before the epochs
        (``agent.minibatch=steps``): :meth:`targets` with the network's ``params [T+1, B, P]`` and
        ``values`` (``[T+1, B]`` or ``[T+1, B, 2]``) at the start of the update, without gradient and
        not standardised (each minibatch standardises its own).

        Returns:
            ``{"advantages": [T, B], "value_targets": [T, B, H]}`` float32, H the value heads (the
            intrinsic one's times ``intrinsic_coef``, as :meth:`targets` gives them).
        """
        with torch.no_grad():
            targets = self.targets(batch, params, values, intrinsic_coef, per_minibatch=False)
        return {"advantages": targets.advantages, "value_targets": torch.stack(targets.vs, dim=-1)}

    def step_targets(self, batch: dict[str, torch.Tensor], params: torch.Tensor, values: torch.Tensor,
                     intrinsic_coef: float = 0.0) -> Targets:
        """:class:`Targets` of a minibatch of steps (:meth:`minibatches` with ``agent.minibatch=steps``):
        every tensor ``[1, n, ...]``, every row a step; the advantages and value targets are the
        batch's (:meth:`batch_targets`), standardised over the minibatch with
        ``agent.normalize_advantages``; the log importance weights, log-probabilities, entropy and
        values those of the network given (``params [1, n, P]``, ``values [1, n]`` or ``[1, n, 2]``),
        the intrinsic head's times ``intrinsic_coef`` as its targets are (:meth:`targets`)."""
        policy, log_probs, log_rhos = self._scores(batch["action"], params, batch["policy_params"])
        heads = [values[..., 0], intrinsic_coef * values[..., 1]] if values.dim() == 3 else [values]
        advantages = batch["advantages"]
        if self.normalize_advantages:
            advantages = standardise(advantages)
        return Targets(log_rhos, log_probs, policy.entropy(), advantages, heads,
                       list(batch["value_targets"].unbind(-1)), batch.get("baseline"))

    def _scores(self, actions: torch.Tensor, params: torch.Tensor, behaviour_params: torch.Tensor):
        """The stored ``actions`` ``[T, B, ...]`` under the current policy (``params [T, B, P]``, fp32:
        the network's heads give fp32) and the behaviour policy (``behaviour_params``): the current
        distribution, ``log pi(a|x)`` and ``log pi(a|x) - log mu(a|x)``, each ``[T, B]`` (summed over an
        action's dimensions)."""
        policy = self.action_space.distribution(params)
        log_probs = policy.log_prob(actions)
        return policy, log_probs, log_probs - self.action_space.distribution(behaviour_params).log_prob(actions)

    def minibatches(self, batch: dict[str, torch.Tensor], generator: torch.Generator | None = None
                    ) -> list[dict[str, torch.Tensor]]:
        """``batch`` split into :attr:`num_minibatches` minibatches.

        ``unrolls``: of whole unrolls, a random permutation of the ``B`` columns cut into equal parts
        (validation makes them divide ``B``); one minibatch is the batch itself. ``steps``: ``batch``
        carries :data:`BATCH_TARGETS`; its ``T x B`` steps (rows ``0..T-1`` of every per-step key,
        the slots' own keys left out) in a random permutation cut into equal parts (validation makes
        them divide ``T x B``), each a ``[1, n]`` minibatch whose rows are steps."""
        if self.minibatch == "steps":
            return self._step_minibatches(batch, generator)
        if self.num_minibatches == 1:
            return [batch]
        size = batch["action"].shape[1]
        order = torch.randperm(size, generator=generator)
        # the unrolls' dimension: 0 of a [B] key (policy_version), 1 of every other ([T+1, B, ...] rows,
        # [T, B] intrinsic rewards, the [1, B, H] LSTM state)
        return [{key: value.index_select(0 if value.dim() == 1 else 1, part.to(value.device))
                 for key, value in batch.items()}
                for part in order.chunk(self.num_minibatches)]

    def _step_minibatches(self, batch: dict[str, torch.Tensor], generator: torch.Generator | None
                          ) -> list[dict[str, torch.Tensor]]:
        """:meth:`minibatches` of single steps (``agent.minibatch=steps``)."""
        steps = batch["action"].shape[0] - 1
        flat = {}
        for key, value in batch.items():
            if key in ACTED_KEYS or key in STEPPED_KEYS or key == OLD_PREACTIVATIONS:
                value = value[STEPS]
            elif not (key in BATCH_TARGETS or key == "intrinsic_reward"):
                continue  # one value per slot (policy_version, env_id): no step's
            flat[key] = value.reshape(steps * value.shape[1], *value.shape[2:])
        order = torch.randperm(steps * batch["action"].shape[1], generator=generator)
        return [{key: value.index_select(0, part.to(value.device)).unsqueeze(0) for key, value in flat.items()}
                for part in order.chunk(self.num_minibatches)]

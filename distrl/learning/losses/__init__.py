"""The agents' losses: a loss is an objective x a return estimator x the action space's
distribution (:class:`base.AgentLoss`), one objective per file.

- ``base.py``: the composition (the batch's rows and reward streams, the estimator on each);
- ``returns.py``: the return estimators (``agent.estimator``): V-trace, GAE; on normalised values;
- ``vtrace.py``: V-trace's recursion, as pure tensor functions;
- ``terms.py``: the loss terms the objectives share (the value loss, standardised advantages);
- ``impala.py``: IMPALA's policy gradient (``agent=impala``; what rllte's ``IMPALA`` trains);
- ``appo.py``: PPO's clipped surrogate (``agent=appo``, the default).

The action distributions are :mod:`distrl.nn.distributions`'.
"""

from __future__ import annotations

from omegaconf import DictConfig

from distrl.learning.losses.appo import ClippedSurrogate
from distrl.learning.losses.base import BOOTSTRAP, STEPS, AgentLoss, LossTerms, Objective, Outputs, Targets
from distrl.learning.losses.impala import PolicyGradient
from distrl.learning.losses.returns import ESTIMATORS, GAE, NormalizedValues, VTrace, make_estimator
from distrl.nn.distributions import ActionSpace
from distrl.nn.normalization import RunningMeanStd

AGENTS = ("impala", "appo")

__all__ = ["AGENTS", "BOOTSTRAP", "ESTIMATORS", "GAE", "STEPS", "AgentLoss", "ClippedSurrogate", "LossTerms",
           "NormalizedValues", "Objective", "Outputs", "PolicyGradient", "Targets", "VTrace", "make_estimator",
           "make_loss", "make_objective"]


def make_objective(agent: DictConfig) -> Objective:
    """The objective of ``agent.name`` over the ``agent`` node's values.

    Raises:
        ValueError: another name (validation refuses it first).
    """
    if agent.name == "impala":
        return PolicyGradient(agent.baseline_cost)
    if agent.name == "appo":
        clamp = None if agent.ratio_clamp is None else (float(agent.ratio_clamp[0]), float(agent.ratio_clamp[1]))
        return ClippedSurrogate(agent.clip, agent.value_clip, agent.baseline_cost, agent.clip_range, clamp)
    raise ValueError(f"agent.name={agent.name!r}: use one of {', '.join(AGENTS)}")


def make_loss(agent: DictConfig, action_space: ActionSpace | int, value_heads: int = 1, intrinsic: bool = False,
              pretraining: bool = False, value_norm: RunningMeanStd | None = None) -> AgentLoss:
    """The loss of ``agent.name`` (one of :data:`AGENTS`: its objective, :func:`make_objective`) on the
    targets of ``agent.estimator`` (:func:`make_estimator`), for actions of ``action_space`` (an int
    ``A`` means ``Discrete(A)``), a network of ``value_heads`` value heads and batches with an
    intrinsic reward or not (:class:`AgentLoss`). ``value_norm``: the network's value statistics
    (``agent.normalize_values``): the estimator reads denormalised values (:class:`NormalizedValues`).

    Raises:
        ValueError: another agent or estimator name (validation refuses them first); ``value_norm``
            with two value heads (the statistics are the extrinsic return's).
    """
    estimator = make_estimator(agent)
    if value_norm is not None:
        if value_heads != 1:
            raise ValueError("agent.normalize_values=true: not with an intrinsic value head")
        estimator = NormalizedValues(estimator, value_norm)
    return AgentLoss(make_objective(agent), agent, action_space, value_heads, intrinsic, pretraining, estimator)

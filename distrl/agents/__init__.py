"""Agents: one loss per file, behind one interface (:class:`distrl.agents.base.AgentLoss`).

- :mod:`distrl.agents.vtrace`: V-trace's targets and the loss terms, as pure tensor functions;
- :mod:`distrl.agents.base`: what every loss shares (the batch's rows, V-trace on one or two value
  heads, minibatches);
- :mod:`distrl.agents.impala`: IMPALA's loss (``agent=impala``; what the seeds' ``IMPALA`` trains);
- :mod:`distrl.agents.appo`: PPO's clipped surrogate on V-trace's advantages (``agent=appo``, the
  default).
"""

from __future__ import annotations

from omegaconf import DictConfig

from distrl.agents.appo import AppoLoss
from distrl.agents.base import BOOTSTRAP, STEPS, AgentLoss, LossTerms, Targets
from distrl.agents.impala import ImpalaLoss
from distrl.nn.distributions import ActionSpace

AGENTS: dict[str, type[AgentLoss]] = {"impala": ImpalaLoss, "appo": AppoLoss}

__all__ = ["AGENTS", "BOOTSTRAP", "STEPS", "AgentLoss", "AppoLoss", "ImpalaLoss", "LossTerms", "Targets", "make_loss"]


def make_loss(agent: DictConfig, action_space: ActionSpace | int, pretraining: bool = False) -> AgentLoss:
    """The loss of ``agent.name`` (a key of :data:`AGENTS`) over the ``agent`` config node, for actions
    of ``action_space`` (an int ``A`` means ``Discrete(A)``).

    Raises:
        ValueError: another name (validation refuses it first).
    """
    if agent.name not in AGENTS:
        raise ValueError(f"agent.name={agent.name!r}: use one of {', '.join(AGENTS)}")
    return AGENTS[agent.name](agent, action_space, pretraining)

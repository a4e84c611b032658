"""Return estimators: from one reward stream of a batch and the network's values to the policy
gradient's advantages and the value targets, swappable under every objective (``agent.estimator``).

- :class:`VTrace` (``vtrace``, both agents' default): Espeholt et al. 2018, Section 4: the
  importance weights of the current policy against the behaviour policy that acted correct the
  targets for the actors' lag and for the optimizer steps a batch has already seen; the advantage is
  ``rho_s (r_s + gamma_s v_{s+1} - V(x_s))`` (Section 4.2).
- :class:`GAE` (``gae``): generalized advantage estimation, Schulman et al. 2016 ("High-Dimensional
  Continuous Control Using Generalized Advantage Estimation", eq. 16), on-policy: no importance
  weight, advantages ``sum_l (gamma lambda)^l delta_{s+l}`` and value targets the lambda-returns
  ``A_s + V(x_s)``, as PPO computes them (Sample Factory's ``with_vtrace=False``). It is V-trace with
  every ``rho`` = 1 and ``c_s = lambda``, so it shares V-trace's recursion and its handling of
  episode ends (:func:`distrl.learning.losses.vtrace.vtrace_with_episode_ends`). The policy lag it ignores is
  the clipped surrogate's ratio's business (APPO), not the targets'.

Both run without gradient and in float32. With ``agent.normalize_values`` the critic learns normalised
values and :class:`NormalizedValues` wraps either: the stream's values denormalised before it runs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from omegaconf import DictConfig

from distrl.config.schema import ESTIMATORS
from distrl.learning.losses import vtrace
from distrl.nn.normalization import RunningMeanStd


class Stream(NamedTuple):
    """One reward stream of a ``[T+1, B]`` batch, every tensor ``[T, B]`` but ``bootstrap_value [B]``:
    ``rewards``; ``terminated`` and ``truncated`` (bool) at the steps whose episode ended there;
    ``values`` ``V(x_t)`` (with gradient); ``bootstrap_value`` ``V(x_T)``; ``truncation_values`` the
    values a time-limited episode is bootstrapped from (:func:`distrl.sampling.policy.final_values`)."""

    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    values: torch.Tensor
    bootstrap_value: torch.Tensor
    truncation_values: torch.Tensor


class Estimate(NamedTuple):
    """``advantages`` and value ``targets``, each ``[T, B]`` float32 without gradient."""

    advantages: torch.Tensor
    targets: torch.Tensor


class VTrace:
    """V-trace's targets (module docstring) with ``discount``, the truncation levels ``rho_bar`` and
    ``c_bar`` (> 0) and the traces' ``trace_lambda`` in ``(0, 1]``."""

    def __init__(self, discount: float, rho_bar: float = 1.0, c_bar: float = 1.0, trace_lambda: float = 1.0):
        self.traces = {"discount": discount, "rho_bar": rho_bar, "c_bar": c_bar, "trace_lambda": trace_lambda}

    def __call__(self, log_rhos: torch.Tensor, stream: Stream) -> Estimate:
        """``log_rhos [T, B]``: ``log pi(a_t|x_t) - log mu(a_t|x_t)`` of the stored actions."""
        out = vtrace.vtrace_with_episode_ends(
            log_rhos=log_rhos, rewards=stream.rewards, terminated=stream.terminated, truncated=stream.truncated,
            values=stream.values, bootstrap_value=stream.bootstrap_value,
            truncation_values=stream.truncation_values, **self.traces)
        return Estimate(out.pg_advantages, out.vs)


class GAE:
    """GAE(``discount``, ``gae_lambda``) (module docstring): V-trace's recursion with every ``rho`` = 1
    and ``c_s = gae_lambda``; ``log_rhos`` are not used and the advantages are ``v_s - V(x_s)``."""

    def __init__(self, discount: float, gae_lambda: float):
        self.on_policy = VTrace(discount, rho_bar=1.0, c_bar=1.0, trace_lambda=gae_lambda)

    def __call__(self, log_rhos: torch.Tensor, stream: Stream) -> Estimate:
        """``log_rhos [T, B]`` are ignored (GAE takes every action as on-policy)."""
        targets = self.on_policy(torch.zeros_like(log_rhos), stream).targets
        return Estimate(targets - stream.values.detach(), targets)


class NormalizedValues:
    """``estimator`` on a critic that learns normalised values (``agent.normalize_values``): the stream's
    values (``values``, ``bootstrap_value``, ``truncation_values``) denormalised by ``stats``
    (:meth:`distrl.nn.normalization.RunningMeanStd.denormalize`) before ``estimator`` runs, so that
    the advantages and the targets are in the rewards' units (Sample Factory 2.1.1,
    ``sample_factory/algo/learning/learner.py``, ``_prepare_batch``: the values denormalised before GAE
    and the time-outs' bootstrap). The targets come out raw; the learner normalises them once per
    batch (:func:`distrl.nn.normalization.normalize_value_targets`).

    Args:
        estimator: :class:`VTrace` or :class:`GAE`.
        stats: the network's ``value_norm`` (:func:`distrl.nn.normalization.value_statistics`), read
            at each call (the learner updates it between batches).
    """

    def __init__(self, estimator: VTrace | GAE, stats: RunningMeanStd):
        self.estimator, self.stats = estimator, stats

    def __call__(self, log_rhos: torch.Tensor, stream: Stream) -> Estimate:
        raw = self.stats.denormalize
        return self.estimator(log_rhos, stream._replace(values=raw(stream.values), bootstrap_value=raw(
            stream.bootstrap_value), truncation_values=raw(stream.truncation_values)))


def make_estimator(agent: DictConfig) -> VTrace | GAE:
    """The estimator of ``agent.estimator`` over the ``agent`` node's
    ``discount``, ``rho_bar``, ``c_bar`` and ``trace_lambda`` (GAE's lambda).

    Raises:
        ValueError: another name (validation refuses it first).
    """
    name = agent.estimator
    if name == "vtrace":
        return VTrace(agent.discount, agent.rho_bar, agent.c_bar, agent.trace_lambda)
    if name == "gae":
        return GAE(agent.discount, agent.trace_lambda)
    raise ValueError(f"agent.estimator={name!r}: use one of {', '.join(ESTIMATORS)}")

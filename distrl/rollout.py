"""The rollout: what one environment's unroll of ``T`` steps holds, row by row (a slot).

A slot holds one environment's unroll of ``T`` steps in ``T + 1`` rows. The row layout
(:class:`RolloutLayout`) is the contract between the actor, which writes rows, and the
learner, which reads them:

- ``ACTED_KEYS``, row ``t`` for ``t`` in ``0..T``: ``obs_t``, whether it starts an episode
  (``first``), the action taken before ``obs_t`` and the raw reward it gave (``last_action``,
  ``last_reward``; 0 where ``first``), and the behaviour policy's output at ``obs_t``
  (``action``, the sample as drawn; ``policy_params``, the behaviour distribution's parameters,
  :mod:`distrl.nn.distributions`; ``baseline``); with ``intrinsic=e3b`` also the bonus the actor
  gave ``obs_t`` (``intrinsic_bonus``, :mod:`distrl.intrinsic.e3b`). Row 0 repeats the previous
  slot's row T, so a slot is a self-contained unroll with its bootstrap observation in row T.
- ``STEPPED_KEYS``, row ``t`` for ``t`` in ``0..T-1``: what stepping the env with ``action_t``
  gave: ``reward``, ``terminated``, ``truncated`` and, on truncation, the behaviour baseline of
  the episode's final observation (``truncation_value``); with ``agent.normalize_returns`` the
  env's discounted return so far, restarted at every episode end (``discounted_return``, whose
  running variance scales the rewards). Row T of these keys is unused: the next slot completes
  that step.
- ``SLOT_KEYS``, one value per slot: the policy version the unroll started with, the env that
  wrote it (``env_id``: ``actor x envs_per_actor + env``, numbered within a rank), and with an
  LSTM core the state before row 0 (``core_h``, ``core_c``).

The learner reads ``[T+1, B]`` batches of slots; the loss takes rows ``0..T-1`` (:data:`STEPS`, the
T steps) and bootstraps from row T (:data:`BOOTSTRAP`).

The slots themselves (shared memory, free and full queues) are :mod:`distrl.sampling.slots`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:  # the layout reads a space's shapes; it imports nothing above it
    from distrl.nn.distributions import ActionSpace

Specs = dict[str, tuple[tuple[int, ...], torch.dtype]]

ACTED_KEYS = ("obs", "first", "last_action", "last_reward", "action", "policy_params", "baseline", "intrinsic_bonus")
STEPPED_KEYS = ("reward", "terminated", "truncated", "truncation_value", "discounted_return")
SLOT_KEYS = ("policy_version", "env_id", "core_h", "core_c")
SLOT_SCALARS = ("policy_version", "env_id")  # the slot keys of one number each: [B] in a batch, core_* [1, B, H]

# a [T+1, B] batch of slots (or a minibatch of it) as the learner reads it: key -> tensor
Batch = dict[str, torch.Tensor]
STEPS = slice(0, -1)  # rows 0..T-1 of a [T+1, ...] batch: the steps the loss is computed on
BOOTSTRAP = -1        # row T: the observation whose value bootstraps the unroll



@dataclass(frozen=True)
class RolloutLayout:
    """Shape and dtype of every key of a slot (see the module docstring for the rows).

    Attributes:
        num_steps: unroll length T; time-indexed keys have ``T + 1`` rows.
        obs_shape: one observation's shape.
        obs_dtype: ``torch.uint8`` for images, ``torch.float32`` for vectors.
        action_space: the actions' space (:class:`distrl.nn.distributions.ActionSpace`): the shape
            and dtype of ``action`` and ``last_action``, the width of ``policy_params``.
        core_size: the LSTM core's hidden size H, or None without a core.
        actor_bonus: the actors store an intrinsic bonus per row (``intrinsic=e3b``).
        returns: the actors store each env's discounted return (``agent.normalize_returns``).
    """

    num_steps: int
    obs_shape: tuple[int, ...]
    obs_dtype: torch.dtype
    action_space: ActionSpace
    core_size: int | None = None
    actor_bonus: bool = False
    returns: bool = False

    @classmethod
    def for_run(cls, cfg, spec) -> RolloutLayout:
        """The layout of a train config ``cfg`` on env ``spec`` (a :class:`distrl.envs.EnvSpec`)."""
        return cls(cfg.num_steps, tuple(spec.obs_shape),
                   torch.uint8 if spec.obs_dtype == np.uint8 else torch.float32, spec.action_space,
                   cfg.model.feature_dim if cfg.model.use_lstm else None, cfg.intrinsic.name == "e3b",
                   bool(cfg.agent.get("normalize_returns", False)))

    def nbytes(self, num_storages: int) -> int:
        """Bytes of shared memory ``num_storages`` slots of this layout take."""
        per_slot = sum(math.prod(shape) * dtype.itemsize for shape, dtype in self.specs().values())
        return per_slot * num_storages

    def specs(self) -> Specs:
        """``{key: (per-slot shape, dtype)}``, without the leading slot dimension."""
        T1 = self.num_steps + 1
        space = self.action_space
        action = ((T1, *space.action_shape), space.action_dtype)
        specs: Specs = {
            "obs": ((T1, *self.obs_shape), self.obs_dtype),
            "first": ((T1,), torch.bool),
            "last_action": action,
            "last_reward": ((T1,), torch.float32),
            "action": action,
            "policy_params": ((T1, space.param_size), torch.float32),
            "baseline": ((T1,), torch.float32),
            "reward": ((T1,), torch.float32),
            "terminated": ((T1,), torch.bool),
            "truncated": ((T1,), torch.bool),
            "truncation_value": ((T1,), torch.float32),
            "policy_version": ((), torch.int64),
            "env_id": ((), torch.int64),
        }
        if self.returns:
            specs["discounted_return"] = ((T1,), torch.float32)
        if self.actor_bonus:
            specs["intrinsic_bonus"] = ((T1,), torch.float32)
        if self.core_size is not None:
            specs["core_h"] = ((1, self.core_size), torch.float32)
            specs["core_c"] = ((1, self.core_size), torch.float32)
        return specs

"""Action spaces and their distributions: one interface for the actors, the losses and evaluation.

:class:`ActionSpace` is what distrl knows of a Gymnasium action space (picklable plain values):

- ``Discrete(n)``: :class:`Categorical` over ``n`` logits; actions ``[] int64``;
- ``MultiDiscrete(nvec)`` (rank 1): :class:`MultiCategorical`, independent categoricals over
  ``sum(nvec)`` concatenated logits (Sample Factory's and SheepRL's); actions ``[len(nvec)] int64``;
- ``Box`` of rank 1: :class:`DiagGaussian`, a diagonal Gaussian whose mean is the policy head's output
  and whose log-std is a learned state-independent parameter (rllte's and CleanRL's
  ``ppo_continuous_action``); actions ``[D] float32``, the unclipped sample. The env gets it clipped to
  the space's bounds (:meth:`ActionSpace.to_env`, CleanRL's ``ClipAction``), or with
  ``env.clip_actions=false`` the sample itself (Sample Factory's); the sample is what is stored and
  scored, so the density ratio of V-trace and PPO stays that of the policy that acted.

The policy head's output for one step is a vector of ``param_size`` floats, the *policy
parameters*: the logits for the categoricals, ``[mean, log_std]`` for the Gaussian. The actors store
them (the rollout's ``policy_params``), so the learner can rebuild the behaviour distribution and score
the stored action again. Log-probabilities are summed over an action's dimensions and computed in
float32 (a Gaussian's log-density over 17 dimensions in bf16 loses the difference of two policies).
Anything else (Dict, Tuple, MultiBinary, Box actions of rank > 1) raises ``ValueError`` naming the space.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
import torch.nn.functional as F

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
KINDS = ("discrete", "multi_discrete", "box")


@dataclass(frozen=True)
class ActionSpace:
    """An action space distrl can model.

    Attributes:
        kind: ``discrete``, ``multi_discrete`` or ``box``.
        nvec: the number of choices of each discrete dimension (``(n,)`` for ``Discrete(n)``);
            ``()`` for a Box.
        low, high: a Box's bounds per dimension (``-inf``/``inf`` where unbounded); ``()`` otherwise.
    """

    kind: str
    nvec: tuple[int, ...] = ()
    low: tuple[float, ...] = ()
    high: tuple[float, ...] = ()

    @classmethod
    def from_gym(cls, space) -> ActionSpace:
        """distrl's view of a Gymnasium action space.

        Raises:
            ValueError: a space distrl cannot model, in one line naming it and what is supported.
        """
        import gymnasium as gym

        if isinstance(space, gym.spaces.Discrete):
            if int(space.start) != 0:
                raise ValueError(f"action space {space}: Discrete spaces must start at 0")
            return cls("discrete", (int(space.n),))
        if isinstance(space, gym.spaces.MultiDiscrete) and len(space.nvec.shape) == 1:
            if np.any(np.asarray(getattr(space, "start", 0)) != 0):
                raise ValueError(f"action space {space}: MultiDiscrete spaces must start at 0")
            return cls("multi_discrete", tuple(int(n) for n in space.nvec))
        if isinstance(space, gym.spaces.Box) and len(space.shape) == 1 and np.issubdtype(space.dtype, np.floating):
            return cls("box", (), tuple(float(x) for x in space.low), tuple(float(x) for x in space.high))
        raise ValueError(f"action space {space}: distrl models Discrete, MultiDiscrete of rank 1 and float Box "
                         f"of rank 1 (continuous) actions")

    @classmethod
    def of(cls, space) -> ActionSpace:
        """An :class:`ActionSpace` as is, an ``int`` ``n`` as ``Discrete(n)``, or a Gymnasium space
        (:meth:`from_gym`).

        Raises:
            ValueError: a Gymnasium space distrl cannot model (:meth:`from_gym`).
        """
        if isinstance(space, ActionSpace):
            return space
        if isinstance(space, (int, np.integer)):
            return cls("discrete", (int(space),))
        return cls.from_gym(space)

    @classmethod
    def from_dict(cls, state: dict) -> ActionSpace:
        """The inverse of :meth:`as_dict` (a checkpoint's ``action_space``)."""
        return cls(state["kind"], tuple(state.get("nvec", ())), tuple(state.get("low", ())),
                   tuple(state.get("high", ())))

    def as_dict(self) -> dict:
        """Plain values, for a checkpoint."""
        return {"kind": self.kind, "nvec": list(self.nvec), "low": list(self.low), "high": list(self.high)}

    @property
    def is_discrete(self) -> bool:
        return self.kind == "discrete"

    @property
    def dim(self) -> int:
        """Dimensions of one action: 1 for Discrete (a scalar), ``len(nvec)``, or the Box's size."""
        return len(self.low) if self.kind == "box" else len(self.nvec)

    @property
    def action_shape(self) -> tuple[int, ...]:
        """One action's shape: ``()`` for Discrete, ``(dim,)`` otherwise."""
        return () if self.kind == "discrete" else (self.dim,)

    @property
    def action_dtype(self) -> torch.dtype:
        return torch.float32 if self.kind == "box" else torch.int64

    @property
    def param_size(self) -> int:
        """Floats of the policy parameters of one step: the logits, or a Gaussian's mean and log-std."""
        return 2 * self.dim if self.kind == "box" else sum(self.nvec)

    @property
    def head_size(self) -> int:
        """Outputs of the network's policy head: the logits, or the Gaussian's mean."""
        return self.dim if self.kind == "box" else sum(self.nvec)

    @property
    def encoding_size(self) -> int:
        """Width of :meth:`encode`: one-hot per discrete dimension, the action itself for a Box."""
        return self.dim if self.kind == "box" else sum(self.nvec)

    def describe(self) -> str:
        """A short text for logs: ``6 actions``, ``MultiDiscrete[3, 3]``, ``Box(6)``."""
        if self.kind == "discrete":
            return f"{self.nvec[0]} actions"
        if self.kind == "multi_discrete":
            return f"MultiDiscrete{list(self.nvec)}"
        return f"Box({self.dim})"

    def distribution(self, params: torch.Tensor) -> Categorical | MultiCategorical | DiagGaussian:
        """The distribution of policy parameters ``params [..., param_size]`` (cast to float32)."""
        params = params.float()
        if self.kind == "discrete":
            return Categorical(params)
        if self.kind == "multi_discrete":
            return MultiCategorical(params, self.nvec)
        return DiagGaussian(*params.chunk(2, dim=-1))

    def encode(self, actions: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``[N, *action_shape]`` actions -> ``[N, encoding_size]``, the previous action as an input
        of the network: one-hot per discrete dimension; a Box's action clipped to its finite bounds."""
        if self.kind == "discrete":
            return F.one_hot(actions.long(), self.nvec[0]).to(dtype)
        if self.kind == "multi_discrete":
            return torch.cat([F.one_hot(actions[:, i].long(), n) for i, n in enumerate(self.nvec)], dim=-1).to(dtype)
        low, high = self.bounds(actions.device)
        return torch.maximum(torch.minimum(actions.float(), high), low).to(dtype)

    def bounds(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """A Box's ``low`` and ``high`` as ``[D] float32`` tensors on ``device`` (built once, on the CPU)."""
        low, high = self._bound_tensors
        return low.to(device), high.to(device)

    def to_env(self, actions: torch.Tensor, clip: bool = True) -> np.ndarray:
        """What the env is sent for the sampled ``actions [N, *action_shape]``: the same integers, or a
        Box's actions clipped to its bounds with ``clip`` (CleanRL's ``ClipAction``; infinite bounds clip
        nothing), else as sampled (``env.clip_actions=false``: :func:`distrl.envs.clips_actions`)."""
        actions = actions.cpu().numpy()
        if self.kind == "box" and clip:
            low, high = self._bound_arrays
            return np.clip(actions, low, high)
        return actions

    # Built on first use rather than on every actor step or forward pass; not fields, so equality,
    # hashing and as_dict are unchanged.
    @cached_property
    def _bound_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(self.low, np.float32), np.asarray(self.high, np.float32)

    @cached_property
    def _bound_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(self.low, dtype=torch.float32), torch.tensor(self.high, dtype=torch.float32)


class Categorical:
    """A categorical distribution over the last dimension of ``logits [..., A] float32``."""

    def __init__(self, logits: torch.Tensor):
        self.logits = logits

    def sample(self) -> torch.Tensor:
        """``[...] int64``."""
        flat = self.logits.reshape(-1, self.logits.shape[-1])
        return torch.multinomial(F.softmax(flat, dim=-1), 1).view(self.logits.shape[:-1])

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """``log pi(a)``: ``actions [...] int64`` -> ``[...]``."""
        return -F.cross_entropy(self.logits.reshape(-1, self.logits.shape[-1]), actions.reshape(-1),
                                reduction="none").view(actions.shape)

    def entropy(self) -> torch.Tensor:
        """``-sum_a pi log pi`` -> ``[...]`` in ``[0, ln A]``."""
        log_policy = F.log_softmax(self.logits, dim=-1)
        return -(log_policy.exp() * log_policy).sum(-1)

    def mode(self) -> torch.Tensor:
        """The most probable action, ``[...] int64``."""
        return self.logits.argmax(dim=-1)

    def kl(self, other: Categorical) -> torch.Tensor:
        """``KL(self || other) = sum_a p(a) (log p(a) - log q(a))`` -> ``[...]``, >= 0."""
        log_p, log_q = F.log_softmax(self.logits, dim=-1), F.log_softmax(other.logits, dim=-1)
        return (log_p.exp() * (log_p - log_q)).sum(-1)


class MultiCategorical:
    """Independent categoricals over the concatenated ``logits [..., sum(nvec)]``; log-probs and
    entropies are summed over the dimensions."""

    def __init__(self, logits: torch.Tensor, nvec: tuple[int, ...]):
        self.parts = [Categorical(part) for part in logits.split(list(nvec), dim=-1)]

    def sample(self) -> torch.Tensor:
        """``[..., len(nvec)] int64``."""
        return torch.stack([part.sample() for part in self.parts], dim=-1)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """``actions [..., len(nvec)] int64`` -> ``[...]``."""
        return sum(part.log_prob(actions[..., i]) for i, part in enumerate(self.parts))

    def entropy(self) -> torch.Tensor:
        return sum(part.entropy() for part in self.parts)

    def mode(self) -> torch.Tensor:
        return torch.stack([part.mode() for part in self.parts], dim=-1)

    def kl(self, other: MultiCategorical) -> torch.Tensor:
        """``KL(self || other)``, summed over the independent dimensions -> ``[...]``."""
        return sum(part.kl(theirs) for part, theirs in zip(self.parts, other.parts, strict=True))


class DiagGaussian:
    """A Gaussian with diagonal covariance: ``mean`` and ``log_std`` ``[..., D] float32``. Log-densities
    and entropies are summed over the ``D`` dimensions (so an entropy cost weighs each dimension: one
    tuned on a 6-dimensional task is about 3x as strong on a 17-dimensional one)."""

    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor):
        self.mean, self.log_std = mean, log_std

    def sample(self) -> torch.Tensor:
        """``[..., D] float32``, unbounded (the env gets it clipped: :meth:`ActionSpace.to_env`)."""
        return self.mean + self.log_std.exp() * torch.randn_like(self.mean)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """``log N(a; mean, std^2)`` summed over dimensions: ``actions [..., D]`` -> ``[...]``."""
        z = (actions.float() - self.mean) * torch.exp(-self.log_std)
        return (-0.5 * z * z - self.log_std - LOG_SQRT_2PI).sum(-1)

    def entropy(self) -> torch.Tensor:
        """``sum_d (0.5 + log sqrt(2 pi) + log_std_d)`` -> ``[...]``."""
        return (0.5 + LOG_SQRT_2PI + self.log_std).sum(-1).expand(self.mean.shape[:-1])

    def mode(self) -> torch.Tensor:
        """The mean, ``[..., D]``."""
        return self.mean

    def kl(self, other: DiagGaussian) -> torch.Tensor:
        """``KL(self || other)`` summed over the dimensions: ``sum_d log(s2/s1) + (s1^2 + (m1 - m2)^2) /
        (2 s2^2) - 1/2`` -> ``[...]``, >= 0."""
        variance_ratio = torch.exp(2 * (self.log_std - other.log_std))
        gap = (self.mean - other.mean) * torch.exp(-other.log_std)
        return (other.log_std - self.log_std + 0.5 * (variance_ratio + gap * gap) - 0.5).sum(-1)

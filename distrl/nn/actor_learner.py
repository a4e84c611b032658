"""``DistributedActorLearner``: the network's actor copy, read by the actor processes from shared
memory, and its learner copy on the training device, published into the actor copy after each
update by the learner (step 4 of the five files of :mod:`distrl.runtime`)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from distrl.nn.actor_critic import ActorCritic, CoreState
from distrl.nn.distributions import ActionSpace
from distrl.nn.precision import autocast, cast_matmul_weights
from distrl.utils.checkpoint import CheckpointError, load_weights

# the distribution classes rllte's freeze(dist=...) may name, per action space kind
FITTING_DISTRIBUTIONS = {"discrete": ("Categorical",), "multi_discrete": ("MultiCategorical",),
                         "box": ("DiagonalGaussian", "Normal", "DiagGaussian")}


class DistributedActorLearner(nn.Module):
    """An actor copy of the network on the CPU and a learner copy on the training device.

    Args:
        obs_shape: one observation's shape.
        action_space: the :class:`ActionSpace` (an int ``A`` means ``Discrete(A)``).
        model: the ``model`` config node (encoder, feature_dim, hidden_dim, init_fn, use_lstm,
            last_action_reward, layer_norm, normalize_obs, separate_critic, log_std_init).
        intrinsic_value: a second value head for an intrinsic return (:class:`ActorCritic`).
        return_norm: the running statistics of the discounted return (``agent.normalize_returns``).

    rllte's signature, ``DistributedActorLearner(observation_space, action_space, feature_dim, ...)``,
    is :class:`distrl.compat.rllte.DistributedActorLearner`, which builds this. The actor copy is put
    in shared memory by :meth:`freeze` so actor processes read the weights the learner publishes with
    :meth:`publish`.

    Attributes:
        optimizers: rllte's optimizer dict (empty here: distrl's trainer makes its own from ``agent.*``).
    """

    def __init__(self, obs_shape: tuple[int, ...], action_space: ActionSpace | int, model: DictConfig,
                 intrinsic_value: bool = False, return_norm: bool = False):
        super().__init__()
        self.learner = ActorCritic(tuple(obs_shape), action_space, model, intrinsic_value, return_norm)
        self.actor = ActorCritic(tuple(obs_shape), action_space, model, intrinsic_value, return_norm)
        self.actor.load_state_dict(self.learner.state_dict())
        self.actor_precision = "fp32"
        self.optimizers: dict[str, torch.optim.Optimizer] = {}

    def describe(self) -> str:
        """One line: the encoder, the core and the number of parameters."""
        net = self.learner
        n_params = sum(p.numel() for p in net.parameters())
        core = f"LSTM {net.core.hidden_size}" if net.core is not None else "no LSTM"
        return f"model {type(net.encoder).__name__}, {core}, {n_params:,} parameters"

    def freeze(self, encoder: nn.Module | None = None, dist: Any = None, *, actor_precision: str = "fp32") -> None:
        """Put the actor copy in shared memory, without gradients, in eval mode.

        Args:
            encoder: rllte's custom encoder, ``[N, *obs_shape] -> [N, feature_dim]`` float32, given the
                observations as the actors store them (``uint8`` images, ``float32`` vectors): it
                replaces the configured one in both copies (the learner's is trained). None: keep it.
            dist: the action distribution, by its class's name (rllte's): None, or one that fits the
                action space (``Categorical`` for Discrete; ``MultiCategorical`` for MultiDiscrete;
                ``DiagonalGaussian``, ``Normal`` or ``DiagGaussian`` for a Box).
            actor_precision: the arithmetic of the actors' inference (:attr:`actor_precision`). With
                ``bf16`` the actor copy keeps its convolutions' and linear layers' weights in bf16
                (:func:`cast_matmul_weights`; :meth:`publish` casts into them), so it must
                be run under ``autocast("bf16")``.

        Raises:
            ValueError: another distribution, or an encoder whose output is not ``feature_dim`` wide.
        """
        if dist is not None:
            name = getattr(dist, "__name__", type(dist).__name__)
            kind = self.learner.action_space.kind
            if name not in FITTING_DISTRIBUTIONS[kind]:
                raise ValueError(f"dist={name}: the action space is {self.learner.action_space.describe()}; "
                                 f"use {' or '.join(FITTING_DISTRIBUTIONS[kind])}")
        if encoder is not None:
            shape = self.learner.obs_shape
            with torch.no_grad():
                out = encoder(torch.zeros(1, *shape, dtype=torch.uint8 if len(shape) == 3 else torch.float32))
            width = self.learner.policy.in_features - (self.learner.action_space.encoding_size + 1
                                                        if self.learner.last_action_reward else 0)
            if self.learner.core is not None:
                width = self.learner.core.input_size
            if out.shape[-1] != width:
                raise ValueError(f"encoder gives {out.shape[-1]} features, the network takes {width}")
            self.learner.encoder = encoder
            self.actor.encoder = copy.deepcopy(encoder)
            self.actor.load_state_dict(self.learner.state_dict())
            if "opt" in self.optimizers:
                self.optimizers["opt"] = type(self.optimizers["opt"])(self.learner.parameters(),
                                                                      **self.optimizers["opt"].defaults)
        self.actor.requires_grad_(False)
        self.actor.eval()
        cast_matmul_weights(self.actor, torch.bfloat16 if actor_precision == "bf16" else torch.float32)
        self.actor_precision = actor_precision
        self.actor.share_memory()

    def explore(self, obs: torch.Tensor, first: torch.Tensor | None = None) -> torch.Tensor:
        """Actions ``[B, *action_shape]`` sampled by the actor copy (the behaviour policy) for ``obs
        [B, *obs_shape]`` (``first [B] bool``: episode starts; None: all). From a zero LSTM state,
        with action 0 and reward 0 as the previous ones; :func:`step_policy` carries the real ones."""
        n = obs.shape[0]
        first = torch.ones(n, dtype=torch.bool) if first is None else first
        space = self.actor.action_space
        nothing_before = (torch.zeros((n, *space.action_shape), dtype=space.action_dtype),
                          torch.zeros(n))  # the previous action and reward
        with autocast(self.actor_precision):
            out, _ = self.actor.act(obs, first, self.actor.initial_state(n), False, *nothing_before)
        return out["action"]

    def forward(
        self, obs: torch.Tensor, first: torch.Tensor | None = None, core_state: CoreState = (),
        deterministic: bool = False, last_action: torch.Tensor | None = None, last_reward: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, CoreState]:
        """Actions ``[B, *action_shape]`` of the learner copy (target policy) for ``obs [B, *obs_shape]``
        (and the previous action and reward, see :meth:`ActorCritic.act`); for inference only."""
        first = torch.ones(obs.shape[0], dtype=torch.bool, device=obs.device) if first is None else first
        out, core_state = self.learner.act(obs, first, core_state, deterministic, last_action, last_reward)
        return out["action"], core_state

    def to(self, device: Any) -> DistributedActorLearner:
        """Move the learner copy to ``device``; the actor copy stays on the CPU."""
        self.learner.to(device)
        return self

    @torch.no_grad()
    def publish(self) -> None:
        """Copy the learner's weights and buffers (the running statistics of
        :mod:`distrl.nn.normalization`) into the (shared-memory) actor copy (cast to bf16 where
        :meth:`freeze` made the actor copy's weights bf16)."""
        for actor_p, learner_p in zip(self.actor.parameters(), self.learner.parameters(), strict=True):
            actor_p.copy_(learner_p, non_blocking=False)
        for actor_b, learner_b in zip(self.actor.buffers(), self.learner.buffers(), strict=True):
            actor_b.copy_(learner_b, non_blocking=False)

    def save(self, path: str | Path, pretraining: bool = False, global_step: int | None = None) -> Path:
        """Write the learner's ``state_dict`` (weights only; :meth:`load` and
        ``train.init_model_path`` read it).

        Args:
            path: the file to write; with ``global_step``, the directory to write into.
            pretraining: the weights come from reward-free pretraining (names the file, below).
            global_step: agent steps trained: the file is ``path/pretrained_<global_step>.pth``
                with ``pretraining``, else ``path/agent_<global_step>.pth`` (rllte's names).

        Returns:
            The path written.
        """
        path = Path(path)
        if global_step is not None:
            path.mkdir(parents=True, exist_ok=True)
            path = path / f"{'pretrained' if pretraining else 'agent'}_{int(global_step)}.pth"
        torch.save(self.learner.state_dict(), path)
        return path

    def load(self, path: str, device: Any = "cpu") -> None:
        """Load weights saved by :meth:`save`, or the model of a distrl checkpoint, into both copies.

        The intrinsic value head is the one part that may differ: weights with one load into a
        network without (it is left out), weights without one leave this network's head as it is
        (a fine-tuning run's intrinsic return starts from a fresh value).

        Raises:
            distrl.utils.checkpoint.CheckpointError: the file is unsafe or unreadable, or its
                weights do not fit this network (names the mismatch).
        """
        weights = load_weights(path, device)
        own = self.learner.state_dict()
        head = {k for k in (*own, *weights) if k.startswith("intrinsic_baseline.")}
        weights = {k: v for k, v in weights.items() if k not in head or k in own}
        weights.update({k: v for k, v in own.items() if k in head and k not in weights})
        try:
            self.learner.load_state_dict(weights)
        except RuntimeError as exc:
            raise CheckpointError(f"{path}: its weights do not fit this model: {str(exc).splitlines()[0]}") from None
        self.publish()

"""``ActorLearner``: the network's actor copy, read by the actor processes from shared memory, and
its learner copy on the training device, published into the actor copy after each update by the
learner (:mod:`distrl.learning.learner`). rllte's ``ActorLearner`` (its signature,
``freeze(encoder, dist)``, ``explore``, ``save`` with rllte's file names, ``optimizers``) is
:class:`distrl.compat.rllte.ActorLearner`, built on this."""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from distrl.nn.actor_critic import ActorCritic
from distrl.nn.distributions import ActionSpace
from distrl.nn.precision import cast_matmul_weights
from distrl.utils.checkpoint import CheckpointError, load_weights


class ActorLearner(nn.Module):
    """An actor copy of the network on the CPU and a learner copy on the training device.

    Args:
        obs_shape: one observation's shape.
        action_space: the :class:`ActionSpace` (an int ``A`` means ``Discrete(A)``).
        model: the ``model`` config node (encoder, feature_dim, hidden_dim, init_fn, use_lstm,
            last_action_reward, layer_norm, normalize_obs, separate_critic, log_std_init).
        intrinsic_value: a second value head for an intrinsic return (:class:`ActorCritic`).
        return_norm: the running statistics of the discounted return (``agent.normalize_rewards``).
        value_norm: the running statistics of the value targets (``agent.normalize_values``).

    The actor copy is put in shared memory by :meth:`share_actor` so actor processes read the
    weights the learner publishes with :meth:`publish`.
    """

    def __init__(self, obs_shape: tuple[int, ...], action_space: ActionSpace | int, model: DictConfig,
                 intrinsic_value: bool = False, return_norm: bool = False, value_norm: bool = False):
        super().__init__()
        self.learner = ActorCritic(tuple(obs_shape), action_space, model, intrinsic_value, return_norm, value_norm)
        self.actor = ActorCritic(tuple(obs_shape), action_space, model, intrinsic_value, return_norm, value_norm)
        self.actor.load_state_dict(self.learner.state_dict())
        self.actor_precision = "fp32"

    def describe(self) -> str:
        """One line: the encoder, the core and the number of parameters."""
        net = self.learner
        n_params = sum(p.numel() for p in net.parameters())
        core = f"LSTM {net.core.hidden_size}" if net.core is not None else "no LSTM"
        return f"model {type(net.encoder).__name__}, {core}, {n_params:,} parameters"

    def share_actor(self, actor_precision: str = "fp32") -> None:
        """Put the actor copy in shared memory, without gradients, in eval mode, so that actor
        processes read the weights :meth:`publish` copies into it.

        Args:
            actor_precision: the arithmetic of the actors' inference (:attr:`actor_precision`). With
                ``bf16`` the actor copy keeps its convolutions' and linear layers' weights in bf16
                (:func:`cast_matmul_weights`; :meth:`publish` casts into them), so it must
                be run under ``autocast("bf16")``.
        """
        self.actor.requires_grad_(False)
        self.actor.eval()
        cast_matmul_weights(self.actor, torch.bfloat16 if actor_precision == "bf16" else torch.float32)
        self.actor_precision = actor_precision
        self.actor.share_memory()

    def to(self, device: Any) -> ActorLearner:
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

    def load(self, path: str, device: Any = "cpu") -> None:
        """Load a learner's ``state_dict`` (rllte's ``save``), or the model of a distrl checkpoint, into
        both copies.

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

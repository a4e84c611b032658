"""rllte's ``DistributedActorLearner(observation_space, action_space, ...)``: distrl's actor and
learner copies of the network (:class:`distrl.nn.actor_learner.ActorLearner`) built from rllte's
arguments, with rllte's methods (``freeze(encoder, dist)``, ``explore``, ``forward``, ``save``)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from torch import nn

from distrl.nn import actor_learner
from distrl.nn.actor_critic import CoreState
from distrl.nn.distributions import ActionSpace
from distrl.nn.encoders import MIN_IMAGE_SIDE
from distrl.nn.precision import autocast

__all__ = ["DistributedActorLearner"]

# the distribution classes rllte's freeze(dist=...) may name, per action space kind
FITTING_DISTRIBUTIONS = {"discrete": ("Categorical",), "multi_discrete": ("MultiCategorical",),
                         "box": ("DiagonalGaussian", "Normal", "DiagGaussian")}


class DistributedActorLearner(actor_learner.ActorLearner):
    """rllte's ``DistributedActorLearner(observation_space, action_space, feature_dim, hidden_dim,
    opt_class, opt_kwargs, init_fn, use_lstm)``: distrl's
    :class:`distrl.nn.actor_learner.ActorLearner` built from these arguments, with rllte's methods:
    ``freeze(encoder, dist)``, ``explore``, ``forward`` (the learner copy's actions) and ``save``
    (rllte's file names).

    Args:
        observation_space: a Gymnasium ``Box`` (or one observation's shape): ``[C, H, W] uint8``
            images get the Nature CNN (the IMPALA ResNet below 36 pixels a side), vectors the MLP.
        action_space: a Gymnasium ``Discrete``, ``MultiDiscrete`` or ``Box`` of rank 1 (a diagonal
            Gaussian policy, as rllte's), or the number of discrete actions.
        feature_dim: the encoder's output features.
        hidden_dim: the MLP's hidden units (vectors only).
        opt_class, opt_kwargs: the optimizer over the learner copy, in :attr:`optimizers` ``["opt"]``
            (``opt_kwargs`` None: the class's defaults). distrl's trainer makes its own from
            ``agent.*`` instead.
        init_fn: ``orthogonal``, ``xavier_uniform``, or ``identity`` (rllte's name for the layers'
            own initialisation; ``default`` in distrl's config).
        use_lstm: an LSTM core.

    Raises:
        ValueError: a space distrl cannot model (:class:`distrl.nn.distributions.ActionSpace`; not
            images or vectors), or an unknown ``init_fn``.
    """

    INIT_FNS = {"orthogonal": "orthogonal", "xavier_uniform": "xavier_uniform", "identity": "default",
                "default": "default"}

    def __init__(self, observation_space: Any, action_space: Any, feature_dim: int = 512, hidden_dim: int = 512,
                 opt_class: type[torch.optim.Optimizer] = torch.optim.Adam, opt_kwargs: dict | None = None,
                 init_fn: str = "orthogonal", use_lstm: bool = False):
        obs_shape = tuple(getattr(observation_space, "shape", observation_space))
        space = ActionSpace.of(action_space)
        if init_fn not in self.INIT_FNS:
            raise ValueError(f"init_fn={init_fn!r}: use one of {', '.join(self.INIT_FNS)}")
        model = OmegaConf.create({"encoder": _seed_encoder(obs_shape), "feature_dim": feature_dim,
                                  "hidden_dim": hidden_dim, "init_fn": self.INIT_FNS[init_fn],
                                  "use_lstm": use_lstm, "last_action_reward": False, "layer_norm": False})
        super().__init__(obs_shape, space, model)
        self.optimizers: dict[str, torch.optim.Optimizer] = {
            "opt": opt_class(self.learner.parameters(), **(opt_kwargs or {}))}

    def freeze(self, encoder: nn.Module | None = None, dist: Any = None, *, actor_precision: str = "fp32") -> None:
        """rllte's ``freeze``: put the actor copy in shared memory, without gradients, in eval mode
        (:meth:`distrl.nn.actor_learner.ActorLearner.share_actor`), after swapping in ``encoder``.

        Args:
            encoder: rllte's custom encoder, ``[N, *obs_shape] -> [N, feature_dim]`` float32, given the
                observations as the actors store them (``uint8`` images, ``float32`` vectors): it
                replaces the configured one in both copies (the learner's is trained). None: keep it.
            dist: the action distribution, by its class's name (rllte's): None, or one that fits the
                action space (``Categorical`` for Discrete; ``MultiCategorical`` for MultiDiscrete;
                ``DiagonalGaussian``, ``Normal`` or ``DiagGaussian`` for a Box).
            actor_precision: the arithmetic of the actors' inference
                (:meth:`distrl.nn.actor_learner.ActorLearner.share_actor`).

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
        self.share_actor(actor_precision)

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



def _seed_encoder(obs_shape: tuple[int, ...]) -> str:
    """The encoder for observations of ``obs_shape`` built from rllte's signature: the Nature CNN for
    images of at least 36 pixels a side, the IMPALA ResNet for smaller ones, the MLP for vectors."""
    if len(obs_shape) == 3:
        return "nature_cnn" if min(obs_shape[1:]) >= MIN_IMAGE_SIDE["nature_cnn"] else "impala_resnet"
    if len(obs_shape) == 1:
        return "mlp"
    raise ValueError(f"observations of shape {obs_shape}: distrl's policy takes [C, H, W] images or vectors")

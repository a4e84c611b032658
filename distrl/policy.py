"""The IMPALA network and ``DistributedActorLearner``, its actor and learner copies.

Encoders: the Nature CNN (Mnih et al. 2015, "Human-level control through
deep RL", Methods), the IMPALA ResNet (Espeholt et al. 2018, Fig. 3, right)
and an MLP for flat observations; optionally the previous action (one-hot) and
reward (clipped to [-1, 1]) beside the encoder's features (IMPALA's Fig. 3 feeds
them to its LSTM; monobeast's AtariNet concatenates them with or without one);
an optional LSTM core; a policy head (logits over the discrete actions) and a
baseline head (state value), with a second one for the value of a non-episodic intrinsic
return when a run has one (Burda et al. 2019, Section 2.3; :mod:`distrl.intrinsic`).

This module knows nothing of processes: the actor copy lives on the CPU in
shared memory and is read by actor processes; the learner copy lives on the
training device and is published into the actor copy after each update.
:func:`step_policy` is the one way the policy is stepped on envs (by the
actors and by evaluation): :class:`AgentState` carries what one step hands
the next (the LSTM state, the previous action and reward, episode starts).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import nn

CoreState = tuple[torch.Tensor, ...]


def _to_float_image(obs: torch.Tensor) -> torch.Tensor:
    """``[N, C, H, W] uint8`` -> floats in [0, 1], channels-last: float32, or bfloat16 under a bf16
    :func:`autocast`, the dtype the first convolution would cast to (the same values: every uint8 is
    exact in bf16 and the division rounds once, as the cast of the float32 quotient does), without
    writing and re-reading the frames in float32."""
    device = obs.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else torch.float32
    return obs.contiguous(memory_format=torch.channels_last).to(dtype).div_(255.0)


def _activation(units: int, layer_norm: bool, conv: bool, activation: type[nn.Module] = nn.ReLU) -> list[nn.Module]:
    """The activation after a layer of ``units`` units (channels for a convolution), with
    ``layer_norm`` a LayerNorm before it: over each observation's channels and positions for a
    convolution (``GroupNorm`` with one group, an affine per channel), over the units otherwise."""
    norm = [nn.GroupNorm(1, units) if conv else nn.LayerNorm(units)] if layer_norm else []
    return [*norm, activation()]


class _ConvEncoder(nn.Module):
    """Convolutions, flattened, then a ReLU fully connected layer of ``feature_dim`` (with
    ``layer_norm`` a LayerNorm before the ReLU)."""

    def __init__(self, convs: nn.Module, obs_shape: tuple[int, ...], feature_dim: int, layer_norm: bool = False):
        super().__init__()
        self.convs = convs
        with torch.no_grad():
            n_flat = self.convs(torch.zeros(1, *obs_shape)).shape[1]
        self.fc = nn.Sequential(nn.Linear(n_flat, feature_dim), *_activation(feature_dim, layer_norm, conv=False))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.fc(self.convs(_to_float_image(obs)))


class NatureCNN(_ConvEncoder):
    """``[N, C, 84, 84] uint8`` -> ``[N, feature_dim]`` (Mnih et al. 2015); with ``layer_norm`` a
    LayerNorm before every ReLU (Juliani and Ash 2024, "A Study of Plasticity Loss in On-Policy
    Deep RL")."""

    def __init__(self, obs_shape: tuple[int, ...], feature_dim: int, layer_norm: bool = False):
        convs = nn.Sequential(
            nn.Conv2d(obs_shape[0], 32, 8, stride=4), *_activation(32, layer_norm, conv=True),
            nn.Conv2d(32, 64, 4, stride=2), *_activation(64, layer_norm, conv=True),
            nn.Conv2d(64, 64, 3, stride=1), *_activation(64, layer_norm, conv=True),
            nn.Flatten(),
        )
        super().__init__(convs, obs_shape, feature_dim, layer_norm)


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


class ImpalaResNet(_ConvEncoder):
    """``[N, C, H, W] uint8`` -> ``[N, feature_dim]`` (Espeholt et al. 2018, Fig. 3)."""

    def __init__(self, obs_shape: tuple[int, ...], feature_dim: int, channels=(16, 32, 32)):
        layers: list[nn.Module] = []
        in_channels = obs_shape[0]
        for out_channels in channels:
            layers += [
                nn.Conv2d(in_channels, out_channels, 3, padding=1),
                nn.MaxPool2d(3, stride=2, padding=1),
                _ResidualBlock(out_channels),
                _ResidualBlock(out_channels),
            ]
            in_channels = out_channels
        layers += [nn.ReLU(), nn.Flatten()]
        super().__init__(nn.Sequential(*layers), obs_shape, feature_dim)


class MiniGridCNN(nn.Module):
    """``[N, C, H, W] uint8`` cell indices (MiniGrid's 7 x 7 view) -> ``[N, feature_dim]``: three 2 x 2
    convolutions (16, 32, 64 channels, a 2 x 2 max-pool after the first; the network of the
    MiniGrid authors' rl-starter-files), then a ReLU fully connected layer. The indices are used as
    numbers, not divided by 255: they are object, colour and state ids of up to 10."""

    def __init__(self, obs_shape: tuple[int, ...], feature_dim: int, layer_norm: bool = False):
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv2d(obs_shape[0], 16, 2), *_activation(16, layer_norm, conv=True), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 2), *_activation(32, layer_norm, conv=True),
            nn.Conv2d(32, 64, 2), *_activation(64, layer_norm, conv=True),
            nn.Flatten(),
        )
        with torch.no_grad():
            n_flat = self.convs(torch.zeros(1, *obs_shape)).shape[1]
        self.fc = nn.Sequential(nn.Linear(n_flat, feature_dim), *_activation(feature_dim, layer_norm, conv=False))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.fc(self.convs(obs.float()))


class MLP(nn.Module):
    """``[N, D] float32`` -> ``[N, feature_dim]``: two tanh layers of ``hidden_dim`` and ``feature_dim``
    units (with ``layer_norm`` a LayerNorm before each tanh)."""

    def __init__(self, obs_shape: tuple[int, ...], feature_dim: int, hidden_dim: int, layer_norm: bool = False):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(math.prod(obs_shape), hidden_dim), *_activation(hidden_dim, layer_norm, False, nn.Tanh),
            nn.Linear(hidden_dim, feature_dim), *_activation(feature_dim, layer_norm, False, nn.Tanh),
        )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.float())


IMAGE_ENCODERS = ("nature_cnn", "impala_resnet", "minigrid_cnn")
# the smallest image side each image encoder takes (the Nature CNN's 8 x 8 / 4, 4 x 4 / 2, 3 x 3 convolutions)
MIN_IMAGE_SIDE = {"nature_cnn": 36, "impala_resnet": 1, "minigrid_cnn": 7}


def make_encoder(obs_shape: tuple[int, ...], cfg: DictConfig) -> nn.Module:
    """The encoder named by ``cfg.encoder`` (nature_cnn | impala_resnet | minigrid_cnn | mlp), with
    ``cfg.layer_norm`` a LayerNorm before each activation (not for impala_resnet).

    Raises:
        ValueError: unknown encoder name, an image encoder on non-image observations, or
            ``layer_norm`` with impala_resnet.
    """
    if cfg.encoder in IMAGE_ENCODERS and len(obs_shape) != 3:
        raise ValueError(f"model.encoder={cfg.encoder} needs [C, H, W] observations, got {obs_shape}")
    layer_norm = bool(cfg.get("layer_norm", False))  # checkpoints written before model.layer_norm have none
    if cfg.encoder == "nature_cnn":
        return NatureCNN(obs_shape, cfg.feature_dim, layer_norm)
    if cfg.encoder == "impala_resnet":
        if layer_norm:
            raise ValueError("model.layer_norm=true: nature_cnn, minigrid_cnn or mlp, not impala_resnet")
        return ImpalaResNet(obs_shape, cfg.feature_dim)
    if cfg.encoder == "minigrid_cnn":
        return MiniGridCNN(obs_shape, cfg.feature_dim, layer_norm)
    if cfg.encoder == "mlp":
        return MLP(obs_shape, cfg.feature_dim, cfg.hidden_dim, layer_norm)
    raise ValueError(f"model.encoder={cfg.encoder!r}: use nature_cnn, impala_resnet, minigrid_cnn or mlp")


def init_weights(module: nn.Module, init_fn: str) -> None:
    """Initialise Linear/Conv layers: orthogonal (gain sqrt 2), xavier_uniform, or default."""
    if init_fn == "default":
        return
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            if init_fn == "orthogonal":
                nn.init.orthogonal_(m.weight, gain=math.sqrt(2))
            else:
                nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)


class ActorCritic(nn.Module):
    """Encoder -> (LSTM) -> policy logits and baseline, over a ``[T, B]`` unroll.

    Args:
        obs_shape: one observation's shape.
        num_actions: number of discrete actions A.
        cfg: the ``model`` config node.
        intrinsic_value: add a second baseline head, ``intrinsic_baseline``, for the value of the
            intrinsic return (:func:`distrl.intrinsic.needs_value_head`).
    """

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int, cfg: DictConfig, intrinsic_value: bool = False):
        super().__init__()
        self.obs_shape = tuple(obs_shape)
        self.num_actions = num_actions
        self.encoder = make_encoder(self.obs_shape, cfg)
        # checkpoints written before model.last_action_reward existed have neither input
        self.last_action_reward = bool(cfg.get("last_action_reward", False))
        core_in = cfg.feature_dim + (num_actions + 1 if self.last_action_reward else 0)
        self.core = nn.LSTM(core_in, cfg.feature_dim) if cfg.use_lstm else None
        head_in = cfg.feature_dim if cfg.use_lstm else core_in
        self.policy = nn.Linear(head_in, num_actions)
        self.baseline = nn.Linear(head_in, 1)
        self.intrinsic_baseline = nn.Linear(head_in, 1) if intrinsic_value else None
        init_weights(self, cfg.init_fn)
        if cfg.init_fn == "orthogonal":
            nn.init.orthogonal_(self.policy.weight, gain=0.01)
            for head in (self.baseline, self.intrinsic_baseline):
                if head is not None:
                    nn.init.orthogonal_(head.weight, gain=1.0)
        if len(self.obs_shape) == 3:
            self.to(memory_format=torch.channels_last)

    def initial_state(self, batch_size: int) -> CoreState:
        """Zero LSTM state ``(h, c)``, each ``[1, B, feature_dim]``; ``()`` without LSTM."""
        if self.core is None:
            return ()
        size = (1, batch_size, self.core.hidden_size)
        return tuple(torch.zeros(size, device=self.policy.weight.device) for _ in range(2))

    def forward(
        self, obs: torch.Tensor, first: torch.Tensor, core_state: CoreState = (),
        last_action: torch.Tensor | None = None, last_reward: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, CoreState]:
        """Policy logits and baseline over an unroll.

        Args:
            obs: ``[T, B, *obs_shape]`` (uint8 images or float32 vectors).
            first: ``[T, B] bool``, True where ``obs[t]`` starts a new episode; the
                LSTM state is zeroed before that step, and so are the previous action and reward.
            core_state: LSTM state at ``t = 0`` (``initial_state``), or ``()``.
            last_action: ``[T, B] int64``, the action taken before ``obs[t]`` (any value where
                ``first``); needed with ``model.last_action_reward``, else ignored.
            last_reward: ``[T, B] float32``, the raw reward that action gave; used clipped to [-1, 1].

        Returns:
            ``logits [T, B, A] float32``, ``baseline [T, B] float32`` (float32 under a bf16
            :func:`autocast` too: the heads' outputs are cast back), the core state after step T-1.
            With the intrinsic head, ``baseline`` is ``[T, B, 2] float32``: the extrinsic value, then
            the intrinsic one.

        Raises:
            ValueError: ``model.last_action_reward`` is on and ``last_action`` or ``last_reward`` is None.
        """
        T, B = obs.shape[:2]
        features = self.encoder(obs.reshape(T * B, *self.obs_shape))
        if self.last_action_reward:
            if last_action is None or last_reward is None:
                raise ValueError("model.last_action_reward=true: forward needs last_action and last_reward")
            seen = (~first).reshape(T * B, 1).to(features.dtype)  # nothing came before an episode's start
            one_hot = F.one_hot(last_action.reshape(T * B), self.num_actions).to(features.dtype)
            reward = last_reward.reshape(T * B, 1).to(features.dtype).clamp(-1.0, 1.0)
            features = torch.cat([features, one_hot * seen, reward * seen], dim=1)
        if self.core is not None:
            features = features.view(T, B, -1)
            outputs = []
            keep = (~first).float().unsqueeze(-1)  # [T, B, 1]
            for t in range(T):
                core_state = tuple(keep[t].unsqueeze(0) * s for s in core_state)
                out, core_state = self.core(features[t].unsqueeze(0), core_state)
                outputs.append(out)
            features = torch.cat(outputs).view(T * B, -1)
            core_state = tuple(s.float() for s in core_state)  # fp32 between steps under bf16 autocast too
        logits = self.policy(features).view(T, B, self.num_actions).float()  # fp32 under bf16 autocast too
        baseline = self.baseline(features).view(T, B).float()
        if self.intrinsic_baseline is not None:
            baseline = torch.stack([baseline, self.intrinsic_baseline(features).view(T, B).float()], dim=-1)
        return logits, baseline, core_state

    @torch.no_grad()
    def act(
        self, obs: torch.Tensor, first: torch.Tensor, core_state: CoreState = (), deterministic: bool = False,
        last_action: torch.Tensor | None = None, last_reward: torch.Tensor | None = None,
    ) -> tuple[dict[str, torch.Tensor], CoreState]:
        """One step for ``B`` environments: ``obs [B, *obs_shape]``, ``first [B] bool`` and, with
        ``model.last_action_reward``, ``last_action [B] int64`` and ``last_reward [B] float32``.

        Returns:
            ``{"action": [B] int64, "policy_logits": [B, A], "baseline": [B]}`` (the extrinsic value)
            and the new core state. Actions are sampled from the policy, or its argmax if ``deterministic``.
        """
        extra = [None if x is None else x.unsqueeze(0) for x in (last_action, last_reward)]
        logits, baseline, core_state = self(obs.unsqueeze(0), first.unsqueeze(0), core_state, *extra)
        logits, baseline = logits[0], baseline[0]
        if baseline.dim() == 2:  # [B, 2] with the intrinsic head
            baseline = baseline[:, 0]
        if deterministic:
            action = logits.argmax(dim=-1)
        else:
            action = torch.multinomial(F.softmax(logits, dim=-1), 1).squeeze(-1)
        return {"action": action, "policy_logits": logits, "baseline": baseline}, core_state


class AgentState:
    """What one policy step hands the next, for each of ``N`` environments.

    Attributes:
        first: ``[N] bool``, whether the env's next observation starts an episode (True at first).
        last_action: ``[N] int64``, the action taken before it (0 at an episode's start).
        last_reward: ``[N] float32``, the raw reward that action gave (0 at an episode's start).
        core: the LSTM state ``(h, c)``, each ``[1, N, H]``; ``()`` without an LSTM.

    All on the device of ``model``.
    """

    def __init__(self, model: ActorCritic, num_envs: int):
        device = model.policy.weight.device
        self.first = torch.ones(num_envs, dtype=torch.bool, device=device)
        self.last_action = torch.zeros(num_envs, dtype=torch.int64, device=device)
        self.last_reward = torch.zeros(num_envs, dtype=torch.float32, device=device)
        self.core = model.initial_state(num_envs)

    def after_env_step(self, actions: torch.Tensor, rewards: Any, ended: Any, ids: torch.Tensor | None = None) -> None:
        """Record what stepping envs ``ids`` (``[k] int64``; None: all) with ``actions`` (``[k] int64``)
        gave: ``rewards`` (``[k]``) and whether the episode ``ended`` (``[k] bool``; the env's next
        observation then starts a new one, with nothing before it). Arrays or tensors."""
        device = self.first.device
        where = slice(None) if ids is None else ids
        ended = torch.as_tensor(ended, dtype=torch.bool, device=device)
        rewards = torch.as_tensor(rewards, dtype=torch.float32, device=device)
        self.last_action[where] = torch.where(ended, 0, actions.to(device))
        self.last_reward[where] = torch.where(ended, 0.0, rewards)
        self.first[where] = ended


def autocast(precision: str, device: torch.device | str = "cpu"):
    """The context a network runs in for ``precision``: ``torch.autocast`` in bfloat16 for ``bf16``
    (matrix products and convolutions in bf16, the weights fp32), nothing for ``fp32``."""
    device_type = torch.device(device).type
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=precision == "bf16")


def cast_matmul_weights(model: nn.Module, dtype: torch.dtype) -> None:
    """Keep the weights and biases of ``model``'s convolutions and linear layers in ``dtype``
    (``torch.bfloat16``, or ``torch.float32`` to undo it), in place.

    Under a bf16 :func:`autocast` these layers cast their fp32 weights to bf16 on every call (the
    same round-to-nearest-even as here), so a model run that way computes exactly what it computed
    with fp32 weights, without re-reading and casting 4 bytes per weight at every forward pass (the
    actors' steps: docs/benchmarks.md, "fp32 against bf16"). Every other layer (the LSTM) stays fp32.
    Such a model runs only under a bf16 :func:`autocast`; weights copied into it are cast on copy."""
    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            module.to(dtype)


@dataclass
class StepInputs:
    """What the policy saw besides the observations at one step of ``k`` envs (see
    :class:`AgentState`): ``first [k]``, ``last_action [k]``, ``last_reward [k]`` and the LSTM
    state before the step, ``core`` (each ``[1, k, H]``, or ``()``)."""

    first: torch.Tensor
    last_action: torch.Tensor
    last_reward: torch.Tensor
    core: CoreState


@torch.no_grad()
def step_policy(model: ActorCritic, obs: torch.Tensor, state: AgentState, ids: torch.Tensor | None = None,
                deterministic: bool = False, precision: str = "fp32") -> tuple[dict[str, torch.Tensor], StepInputs]:
    """One policy step for envs ``ids`` (``[k] int64``; None: all of ``state``'s envs).

    Args:
        model: the network to act with (an actor copy, or a frozen copy for evaluation).
        obs: ``[k, *obs_shape]``, those envs' observations.
        state: the envs' state; their LSTM state advances here.
        deterministic: greedy actions instead of sampling.
        precision: ``fp32`` or ``bf16`` (:func:`autocast`); the outputs are float32 either way.

    Returns:
        ``{"action": [k] int64, "policy_logits": [k, A], "baseline": [k]}`` (:meth:`ActorCritic.act`)
        and what the policy saw besides ``obs`` (:class:`StepInputs`), which the actors store beside
        the observation.
    """
    where = slice(None) if ids is None else ids
    seen = StepInputs(state.first[where].clone(), state.last_action[where].clone(), state.last_reward[where].clone(),
                      tuple(c[:, where] for c in state.core))
    with autocast(precision, state.first.device):
        out, core = model.act(obs.to(state.first.device), seen.first, seen.core, deterministic,
                              seen.last_action, seen.last_reward)
    if core:
        state.core = core if ids is None else tuple(c.index_copy(1, ids, n) for c, n in zip(state.core, core,
                                                                                           strict=True))
    return out, seen


@torch.no_grad()
def final_values(model: ActorCritic, final_obs: torch.Tensor, state: AgentState, ids: torch.Tensor,
                 actions: torch.Tensor, rewards: torch.Tensor, precision: str = "fp32") -> torch.Tensor:
    """The baselines ``[k]`` of the final observations ``final_obs [k, *obs_shape]`` of envs ``ids``
    whose episode was cut by a time limit, as if it went on: with the envs' LSTM state after their
    last step and the ``actions`` and ``rewards`` (``[k]``) that led there. V-trace bootstraps a
    truncated trajectory from these values instead of the next episode's first state."""
    no_reset = torch.zeros(len(ids), dtype=torch.bool, device=state.first.device)
    with autocast(precision, state.first.device):
        out, _ = model.act(final_obs, no_reset, tuple(c[:, ids] for c in state.core), False, actions, rewards)
    return out["baseline"]


class DistributedActorLearner(nn.Module):
    """An actor copy of the network on the CPU and a learner copy on the training device (rllte's
    ``DistributedActorLearner``).

    Two ways to build one: rllte's signature, below, or :meth:`from_config` (what distrl's trainer
    uses: the ``model`` config node).

    Args:
        observation_space: a Gymnasium ``Box`` (or one observation's shape): ``[C, H, W] uint8``
            images get the Nature CNN (the IMPALA ResNet below 36 pixels a side), vectors the MLP.
        action_space: a Gymnasium ``Discrete`` (or the number of actions).
        feature_dim: the encoder's output features.
        hidden_dim: the MLP's hidden units (vectors only).
        opt_class, opt_kwargs: the optimizer over the learner copy, in :attr:`optimizers` ``["opt"]``
            (``opt_kwargs`` None: the class's defaults). distrl's trainer makes its own from
            ``agent.*`` instead.
        init_fn: ``orthogonal``, ``xavier_uniform``, or ``identity`` (rllte's name for the layers'
            own initialisation; ``default`` in distrl's config).
        use_lstm: an LSTM core.
        intrinsic_value: a second value head for an intrinsic return (:class:`ActorCritic`).

    Raises:
        ValueError: a space distrl cannot model (not ``Discrete`` actions; not images or vectors),
            or an unknown ``init_fn``.

    The actor copy is put in shared memory by :meth:`freeze` so actor processes
    read the weights the learner publishes with :meth:`publish`.
    """

    INIT_FNS = {"orthogonal": "orthogonal", "xavier_uniform": "xavier_uniform", "identity": "default",
                "default": "default"}

    def __init__(self, observation_space: Any, action_space: Any, feature_dim: int = 512, hidden_dim: int = 512,
                 opt_class: type[torch.optim.Optimizer] = torch.optim.Adam, opt_kwargs: dict | None = None,
                 init_fn: str = "orthogonal", use_lstm: bool = False, *, intrinsic_value: bool = False,
                 model_cfg: DictConfig | None = None):
        super().__init__()
        obs_shape = tuple(getattr(observation_space, "shape", observation_space))
        if hasattr(action_space, "n"):
            num_actions = int(action_space.n)
        elif isinstance(action_space, int):
            num_actions = action_space
        else:
            raise ValueError(f"action_space={action_space!r}: distrl's policy takes Discrete actions")
        seed_style = model_cfg is None
        if seed_style:
            if init_fn not in self.INIT_FNS:
                raise ValueError(f"init_fn={init_fn!r}: use one of {', '.join(self.INIT_FNS)}")
            model_cfg = OmegaConf.create({"encoder": _seed_encoder(obs_shape), "feature_dim": feature_dim,
                                          "hidden_dim": hidden_dim, "init_fn": self.INIT_FNS[init_fn],
                                          "use_lstm": use_lstm, "last_action_reward": False})
        self.learner = ActorCritic(obs_shape, num_actions, model_cfg, intrinsic_value)
        self.actor = ActorCritic(obs_shape, num_actions, model_cfg, intrinsic_value)
        self.actor.load_state_dict(self.learner.state_dict())
        self.actor_precision = "fp32"
        self.optimizers: dict[str, torch.optim.Optimizer] = (
            {"opt": opt_class(self.learner.parameters(), **(opt_kwargs or {}))} if seed_style else {})

    @classmethod
    def from_config(cls, obs_shape: tuple[int, ...], num_actions: int, cfg: DictConfig,
                    intrinsic_value: bool = False) -> DistributedActorLearner:
        """The pair for one observation's shape, ``num_actions`` discrete actions and the ``model``
        config node ``cfg`` (encoder, feature_dim, hidden_dim, init_fn, use_lstm, last_action_reward);
        no optimizer (the trainer makes its own)."""
        return cls(obs_shape, num_actions, intrinsic_value=intrinsic_value, model_cfg=cfg)

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
            dist: the action distribution; only the categorical one (None, or a class named
                ``Categorical``) is offered.
            actor_precision: the arithmetic of the actors' inference (:attr:`actor_precision`). With
                ``bf16`` the actor copy keeps its convolutions' and linear layers' weights in bf16
                (:func:`cast_matmul_weights`; :meth:`publish` casts into them), so it must
                be run under ``autocast("bf16")``.

        Raises:
            ValueError: another distribution, or an encoder whose output is not ``feature_dim`` wide.
        """
        if dist is not None and getattr(dist, "__name__", type(dist).__name__) != "Categorical":
            raise ValueError(f"dist={dist!r}: distrl's policy is categorical (discrete actions)")
        if encoder is not None:
            shape = self.learner.obs_shape
            with torch.no_grad():
                out = encoder(torch.zeros(1, *shape, dtype=torch.uint8 if len(shape) == 3 else torch.float32))
            width = self.learner.policy.in_features - (self.learner.num_actions + 1
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
        """Actions ``[B] int64`` sampled by the actor copy (the behaviour policy) for ``obs
        [B, *obs_shape]`` (``first [B] bool``: episode starts; None: all). From a zero LSTM state,
        with action 0 and reward 0 as the previous ones; :func:`step_policy` carries the real ones."""
        n = obs.shape[0]
        first = torch.ones(n, dtype=torch.bool) if first is None else first
        nothing_before = torch.zeros(n, dtype=torch.int64), torch.zeros(n)  # the previous action and reward
        with autocast(self.actor_precision):
            out, _ = self.actor.act(obs, first, self.actor.initial_state(n), False, *nothing_before)
        return out["action"]

    def forward(
        self, obs: torch.Tensor, first: torch.Tensor | None = None, core_state: CoreState = (),
        deterministic: bool = False, last_action: torch.Tensor | None = None, last_reward: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, CoreState]:
        """Actions ``[B] int64`` of the learner copy (target policy) for ``obs [B, *obs_shape]``
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
        """Copy the learner's weights into the (shared-memory) actor copy (cast to bf16 where
        :meth:`freeze` made the actor copy's weights bf16)."""
        for actor_p, learner_p in zip(self.actor.parameters(), self.learner.parameters(), strict=True):
            actor_p.copy_(learner_p, non_blocking=False)

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
            distrl.checkpoint.CheckpointError: the file is unsafe or unreadable, or its
                weights do not fit this network (names the mismatch).
        """
        from distrl.checkpoint import CheckpointError, load_weights

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


def _seed_encoder(obs_shape: tuple[int, ...]) -> str:
    """The encoder for observations of ``obs_shape`` built from rllte's signature: the Nature CNN for
    images of at least 36 pixels a side, the IMPALA ResNet for smaller ones, the MLP for vectors."""
    if len(obs_shape) == 3:
        return "nature_cnn" if min(obs_shape[1:]) >= MIN_IMAGE_SIDE["nature_cnn"] else "impala_resnet"
    if len(obs_shape) == 1:
        return "mlp"
    raise ValueError(f"observations of shape {obs_shape}: distrl's policy takes [C, H, W] images or vectors")

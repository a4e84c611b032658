"""The encoders: observations to features.

The Nature CNN (Mnih et al. 2015, "Human-level control through deep RL", Methods), the IMPALA
ResNet (Espeholt et al. 2018, Fig. 3, right), the MiniGrid CNN and an MLP for flat observations,
each with an optional LayerNorm before its activations (``model.layer_norm``); and the
initialisation of their layers.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn


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

    def forward_with_preactivation(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward`'s features and the fully connected layer's output before its
        normalisation and ReLU, both ``[N, feature_dim]`` (what PFO regularises:
        :class:`distrl.learning.losses.penalties.FeatureDrift`)."""
        return _after_last_linear(self.fc, self.convs(_to_float_image(obs)))


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

    def forward_with_preactivation(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward`'s features and the fully connected layer's output before its activation,
        both ``[N, feature_dim]``."""
        return _after_last_linear(self.fc, self.convs(obs.float()))


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

    def forward_with_preactivation(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward`'s features and the last linear layer's output before its activation, both
        ``[N, feature_dim]``."""
        return _after_last_linear(self.net, obs.float())


def _after_last_linear(layers: nn.Sequential, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``layers`` on ``x``: ``(output, pre)``, ``pre`` the output of the last ``nn.Linear`` of ``layers``
    (the pre-activations of the features: before the normalisation and activation after it)."""
    last = max(i for i, layer in enumerate(layers) if isinstance(layer, nn.Linear))
    pre = layers[:last + 1](x)
    return layers[last + 1:](pre), pre


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
    """Initialise the Linear/Conv layers of ``module`` by ``init_fn``: ``orthogonal`` (gain sqrt 2) or
    ``xavier_uniform`` weights, biases zero; ``default``, torch's own weights and biases (Kaiming-uniform
    weights, uniform biases in +-1/sqrt(fan_in)), untouched; ``torch_default``, torch's own weights and
    every bias zero, Sample Factory 2.1.1's ``policy_initialization=torch_default``
    (``sample_factory/model/actor_critic.py``, ``initialize_weights``, which zeroes every bias whatever
    the scheme)."""
    if init_fn == "default":
        return
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            if init_fn == "orthogonal":
                nn.init.orthogonal_(m.weight, gain=math.sqrt(2))
            elif init_fn == "xavier_uniform":
                nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)



"""Dormant units and feature rank: how much of the encoder still responds to the observations.

Sokar, Agarwal, Castro, Evci 2023, "The Dormant Neuron Phenomenon in Deep Reinforcement Learning"
(ICML), Definition 3.1: unit ``i`` of a layer with ``H`` units has the score
``s_i = E_x |h_i(x)| / ((1/H) sum_k E_x |h_k(x)|)``, the mean absolute activation over inputs ``x``
relative to the layer's average, and is **tau-dormant** when ``s_i <= tau``. For a convolution a unit
is a channel, its activation averaged over the positions too (as in the paper). ``tau = 0`` counts
the units that output 0 on every input (dead ReLUs); the paper uses ``tau = 0.025`` on Atari.

The **feature rank** of the encoder's output (the features the heads read) on ``N`` observations
is the approximate rank of Kumar, Agarwal, Ghosh, Levine 2021 ("Implicit Under-Parameterization
Inhibits Data-Efficient Deep Reinforcement Learning", ICLR, Section 3): with the singular values
``sigma_1 >= ... >= sigma_F`` of the ``[N, F]`` feature matrix, ``srank_delta = min{k : sum_{i<=k}
sigma_i / sum_i sigma_i >= 1 - delta}``, ``delta = 0.01``. Moalla et al. 2024 ("No Representation, No
Trust", NeurIPS) track it on PPO's Atari runs, where its fall comes with the collapse of the policy.
"""

from __future__ import annotations

import torch
from torch import nn

TAU = 0.025  # Sokar et al.'s threshold on Atari
DELTA = 0.01  # Kumar et al.'s srank threshold
ACTIVATIONS = (nn.ReLU, nn.Tanh)


@torch.no_grad()
def dormant_fractions(encoder: nn.Module, obs: torch.Tensor, tau: float = TAU) -> dict[str, float]:
    """The share of tau-dormant units of every activation module (``nn.ReLU``, ``nn.Tanh``) of
    ``encoder`` on the observations ``obs [N, *obs_shape]``, keyed by the module's name in the
    encoder (e.g. ``convs.1``, ``fc.1``), each a float in ``[0, 1]``.

    A layer whose activations are all 0 has every unit dormant (1.0).
    """
    return feature_health(encoder, obs, tau)[0]


@torch.no_grad()
def feature_health(encoder: nn.Module, obs: torch.Tensor, tau: float = TAU,
                   delta: float = DELTA) -> tuple[dict[str, float], int]:
    """One forward pass of ``encoder`` on ``obs [N, *obs_shape]``: :func:`dormant_fractions` and the
    :func:`feature_rank` of its output ``[N, F]``."""
    outputs: dict[str, torch.Tensor] = {}
    hooks = [module.register_forward_hook(lambda _m, _i, out, name=name: outputs.__setitem__(name, out))
             for name, module in encoder.named_modules() if isinstance(module, ACTIVATIONS)]
    try:
        features = encoder(obs)
    finally:
        for hook in hooks:
            hook.remove()
    fractions = {}
    for name, out in outputs.items():
        out = out.float().abs()
        per_unit = out.mean(dim=(0, 2, 3)) if out.dim() == 4 else out.flatten(1).mean(0)  # [H]
        average = per_unit.mean()
        if average <= 0:
            fractions[name] = 1.0
            continue
        fractions[name] = (per_unit / average <= tau).float().mean().item()
    return fractions, feature_rank(features, delta)


@torch.no_grad()
def feature_rank(features: torch.Tensor, delta: float = DELTA) -> int:
    """The approximate rank ``srank_delta`` (Kumar et al. 2021, Section 3) of ``features [N, F]``:
    the fewest singular values that hold ``1 - delta`` of their sum; an int in ``[0, min(N, F)]``
    (0 for all-zero features)."""
    sigma = torch.linalg.svdvals(features.float().flatten(1))
    total = sigma.sum()
    if total <= 0:
        return 0
    return int((sigma.cumsum(0) / total < 1 - delta).sum().item()) + 1

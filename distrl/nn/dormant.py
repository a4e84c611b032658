"""Dormant units: how much of the encoder still responds to the observations.

Sokar, Agarwal, Castro, Evci 2023, "The Dormant Neuron Phenomenon in Deep Reinforcement Learning"
(ICML), Definition 3.1: unit ``i`` of a layer with ``H`` units has the score
``s_i = E_x |h_i(x)| / ((1/H) sum_k E_x |h_k(x)|)``, the mean absolute activation over inputs ``x``
relative to the layer's average, and is **tau-dormant** when ``s_i <= tau``. For a convolution a unit
is a channel, its activation averaged over the positions too (as in the paper). ``tau = 0`` counts
the units that output 0 on every input (dead ReLUs); the paper uses ``tau = 0.025`` on Atari.
"""

from __future__ import annotations

import torch
from torch import nn

TAU = 0.025  # Sokar et al.'s threshold on Atari
ACTIVATIONS = (nn.ReLU, nn.Tanh)


@torch.no_grad()
def dormant_fractions(encoder: nn.Module, obs: torch.Tensor, tau: float = TAU) -> dict[str, float]:
    """The share of tau-dormant units of every activation module (``nn.ReLU``, ``nn.Tanh``) of
    ``encoder`` on the observations ``obs [N, *obs_shape]``, keyed by the module's name in the
    encoder (e.g. ``convs.1``, ``fc.1``), each a float in ``[0, 1]``.

    A layer whose activations are all 0 has every unit dormant (1.0).
    """
    outputs: dict[str, torch.Tensor] = {}
    hooks = [module.register_forward_hook(lambda _m, _i, out, name=name: outputs.__setitem__(name, out))
             for name, module in encoder.named_modules() if isinstance(module, ACTIVATIONS)]
    try:
        encoder(obs)
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
    return fractions

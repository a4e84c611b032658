"""The arithmetic a network runs in: bf16 autocast, and bf16 weights kept for the actors' copy."""

from __future__ import annotations

import torch
from torch import nn


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
    actors' steps: docs/lab/benchmarks.md, "fp32 against bf16"). Every other layer (the LSTM) stays fp32.
    Such a model runs only under a bf16 :func:`autocast`; weights copied into it are cast on copy."""
    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            module.to(dtype)

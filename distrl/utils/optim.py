"""Optimizer state across checkpoints."""

from __future__ import annotations

from typing import Any

import torch


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """``optimizer.load_state_dict(state)``, keeping the optimizer's own kernel choice (``foreach``,
    ``fused``): a checkpoint saves its optimizer's, and one written before distrl chose them would
    put a resumed run back on PyTorch's slower default."""
    kernels = [{key: group[key] for key in ("foreach", "fused") if key in group} for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, chosen in zip(optimizer.param_groups, kernels, strict=True):
        group.update(chosen)

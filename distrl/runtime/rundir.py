"""Where a run's directory is when none is named."""

from __future__ import annotations

import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig


def default_run_dir(tag: str = "") -> Path:
    """The running Hydra app's output directory, else ``outputs/<date>/<time>[_tag]`` (as
    ``distrl train`` names one)."""
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path("outputs") / (time.strftime("%Y-%m-%d/%H-%M-%S") + (f"_{tag}" if tag else ""))

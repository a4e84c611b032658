"""The Hydra main of ``distrl train``."""

from __future__ import annotations

import logging

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from distrl.config import register_configs, validate
from distrl.hydra_app import checked, config_dir, fail

log = logging.getLogger("distrl")

register_configs()


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="train")
def main(cfg: DictConfig) -> None:
    """Validate the config, then train one run in Hydra's run directory."""
    checked("train", cfg, validate)
    logging.getLogger("distrl").setLevel(cfg.log_level)
    from distrl.engine.trainer import ActorFailure, DistributedTrainer, TrainingError

    run_dir = HydraConfig.get().runtime.output_dir
    trainer = DistributedTrainer(cfg, run_dir)
    try:
        trainer.train()
    except ActorFailure as exc:
        fail("train", f"{exc}; a checkpoint was saved in {run_dir}/checkpoints", code=1)
    except TrainingError as exc:
        fail("train", str(exc), code=1)

"""The Hydra main of ``distrl train``."""

from __future__ import annotations

import logging
import signal

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from distrl.checkpoint import CheckpointError, find_resume_checkpoint, load_checkpoint
from distrl.config import ConfigError, register_configs, validate
from distrl.hydra_app import Terminated, checked, config_dir, fail

log = logging.getLogger("distrl")

register_configs()


def _raise_terminated(signum, frame):
    raise Terminated()


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="train")
def main(cfg: DictConfig) -> None:
    """Validate the config, then train one run in Hydra's run directory."""
    checked("train", cfg, validate)
    logging.getLogger("distrl").setLevel(cfg.log_level)
    from distrl.engine.trainer import ActorFailure, DistributedTrainer, TrainingError

    run_dir = HydraConfig.get().runtime.output_dir
    try:
        resume_path = find_resume_checkpoint(cfg.resume, run_dir)
        resume_state = load_checkpoint(resume_path) if resume_path else None
        trainer = DistributedTrainer(cfg, run_dir, resume_state=resume_state)
    except (CheckpointError, ConfigError) as exc:
        fail("train", str(exc))
    if resume_path:
        log.info("resuming from %s", resume_path)
    # A shell that starts a job in the background may leave SIGINT ignored; Ctrl-C and
    # SIGTERM must always reach the trainer so that it can stop cleanly.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        trainer.train()
    except ActorFailure as exc:
        fail("train", f"{exc}; a checkpoint was saved in {run_dir}/checkpoints", code=1)
    except TrainingError as exc:
        fail("train", str(exc), code=1)

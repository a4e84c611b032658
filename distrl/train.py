"""The Hydra main of ``distrl train``."""

from __future__ import annotations

import logging
import signal

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from distrl.checkpoint import CheckpointError
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
    from distrl.engine.trainer import ActorFailure, DistributedTrainer, Stalled, TrainingError

    run_dir = HydraConfig.get().runtime.output_dir
    try:
        trainer = DistributedTrainer(cfg, run_dir)
    except (CheckpointError, ConfigError) as exc:
        fail("train", str(exc))
    # A shell that starts a job in the background may leave SIGINT ignored; Ctrl-C and
    # SIGTERM must always reach the trainer so that it can stop cleanly.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_terminated)
    # SLURM's --signal=USR1@90: a checkpoint now, and training goes on.
    signal.signal(signal.SIGUSR1, lambda signum, frame: trainer.request_save())
    try:
        trainer.train()
    except (ActorFailure, Stalled) as exc:
        fail("train", f"{exc}; a checkpoint was saved in {run_dir}/checkpoints", code=1)
    except TrainingError as exc:
        fail("train", str(exc), code=1)

"""The Hydra main of ``distrl train``."""

from __future__ import annotations

import logging
import os
import signal
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from distrl.cli import sweeps
from distrl.cli.exits import checked, fail, remove_if_only_hydra
from distrl.config.schema import ConfigError, config_dir, register_configs
from distrl.utils.runlock import RunDirectoryBusy
from distrl.utils.signals import Terminated

log = logging.getLogger("distrl")

register_configs()


def _raise_terminated(signum, frame):
    raise Terminated()


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="train")
def main(cfg: DictConfig) -> float | None:
    """Validate the config (once), then train one run in Hydra's run directory (as one rank of several
    under ``torchrun``; or start ``distributed.nproc_per_node`` ranks here). A job of a multirun
    returns ``objective``'s value (:func:`distrl.cli.sweeps.objective_value`) for the sweeper."""
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return _train(cfg)
    try:
        core_share = sweeps.start_job(hydra_cfg)
    except sweeps.SweepInterrupted as exc:
        log.warning("%s", exc)
        return None
    if core_share is None:
        return _train(cfg)
    try:
        return _train(cfg)
    except KeyboardInterrupt:  # the launching process passed Ctrl-C on: the checkpoint is saved
        log.warning("job %s interrupted", hydra_cfg.job.num)
        return None
    finally:
        core_share.release()


def _train(cfg: DictConfig) -> float | None:
    from distrl.learning import distributed
    from distrl.runtime.preflight import validate
    from distrl.sampling import logs

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # a rank of several: sized and validated on its share
        distributed.take_core_share()
    validated = checked("train", cfg, validate)
    logging.getLogger("distrl").setLevel(cfg.log_level)
    run_dir = HydraConfig.get().runtime.output_dir
    if cfg.distributed.nproc_per_node > 1 and "WORLD_SIZE" not in os.environ:
        _launch_ranks(cfg, run_dir)
        return

    from distrl.runtime.trainer import ActorFailure, RankLost, Stalled, Trainer, TrainingError
    from distrl.utils.checkpoint import CheckpointError

    ranks = distributed.from_environment(cfg.distributed.backend, cfg.distributed.timeout)
    if ranks.enabled:
        own_dir, run_dir = run_dir, distributed.broadcast(ranks, run_dir)  # one run, one directory: rank 0's
        if not ranks.is_main:
            logs.console_only(ranks.rank)
            if own_dir != run_dir:  # Hydra's ${now} came out another second here
                remove_if_only_hydra(own_dir)
    try:
        trainer = Trainer(cfg, run_dir, ranks=ranks, validated=validated)
    except (CheckpointError, ConfigError, RunDirectoryBusy) as exc:
        fail("train", str(exc))
    # A shell that starts a job in the background may leave SIGINT ignored; Ctrl-C and
    # SIGTERM must always reach the trainer so that it can stop cleanly.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _raise_terminated)
    # SLURM's --signal=USR1@90: a checkpoint now, and training goes on.
    signal.signal(signal.SIGUSR1, lambda signum, frame: trainer.request_save())
    try:
        trainer.train()
    except (ActorFailure, Stalled, RankLost) as exc:
        saved = f"a checkpoint was saved in {run_dir}/checkpoints" if ranks.is_main else "checkpoints are rank 0's"
        fail("train", f"{exc}; {saved}", code=1)
    except TrainingError as exc:
        fail("train", str(exc), code=1)
    finally:
        distributed.shutdown(ranks)
    if HydraConfig.get().mode == RunMode.MULTIRUN and ranks.is_main:  # for a sweeper such as Optuna's
        return sweeps.objective_value(run_dir, cfg.objective)
    return None


def _launch_ranks(cfg: DictConfig, run_dir: str) -> None:
    """``distributed.nproc_per_node`` ranks of this command in ``run_dir``, through torch's elastic launcher."""
    from distrl.learning import distributed

    overrides = [a for a in HydraConfig.get().overrides.task
                 if not a.startswith(("distributed.nproc_per_node=", "hydra.run.dir="))]
    argv = [*overrides, f"hydra.run.dir={run_dir}", "distributed.nproc_per_node=1"]
    log.info("starting %d ranks in %s", cfg.distributed.nproc_per_node, run_dir)
    code = distributed.launch(cfg.distributed.nproc_per_node, argv, cfg.distributed.max_restarts)
    if code:
        sys.exit(code)

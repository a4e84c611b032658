"""rlpack's ``SimulatorDistributed``: ``n_procs`` ranks of distrl on this machine, through the
launcher of ``distributed.nproc_per_node`` (torch's elastic launcher). The table of its arguments is
docs/api.md."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from distrl.compat.env_objects import env_choice
from distrl.compat.rllte import hydra_value
from distrl.config.compose import compose
from distrl.config.schema import ConfigError
from distrl.learning import distributed
from distrl.runtime.preflight import validate
from distrl.runtime.rundir import default_run_dir

__all__ = ["SimulatorDistributed"]


class SimulatorDistributed:
    """rlpack's ``SimulatorDistributed(n_procs, config, backend)``: ``n_procs`` ranks of distrl on this
    machine, through the launcher of ``distributed.nproc_per_node`` (torch's elastic launcher), the
    gradients averaged across them.

    Args:
        n_procs: ranks (processes, each with its own actors and learner) to start.
        config: distrl keys, a dict (nested, or dotted keys ``{"train.num_train_steps": 10000}``) or
            a DictConfig; ``env`` may be a Gymnasium id; ``run_dir`` names the run directory.
        backend: ``gloo`` or ``nccl`` (``auto``: nccl with CUDA, gloo on CPU).

    Raises:
        ConfigError: a bad value, before any process starts.
    """

    BACKENDS = ("gloo", "nccl", "auto")

    def __init__(self, n_procs: int, config: dict[str, Any] | DictConfig, backend: str = "gloo"):
        if backend not in self.BACKENDS:
            raise ConfigError(f"backend={backend!r} is not allowed: use one of {', '.join(self.BACKENDS)}")
        if not isinstance(n_procs, int) or isinstance(n_procs, bool) or n_procs < 1:
            raise ConfigError(f"n_procs={n_procs!r} is not allowed: an integer >= 1")
        self.n_procs, self.backend = n_procs, backend
        config = OmegaConf.to_container(config, resolve=True) if isinstance(config, DictConfig) else dict(config)
        self.run_dir = Path(config.pop("run_dir", None) or default_run_dir(config.get("tag", "")))
        env = config.pop("env", None)
        self.overrides = [*(env_choice(env).overrides if isinstance(env, str) else []), *_flatten(config),
                          f"distributed.backend={backend}"]
        if isinstance(env, str):
            self.overrides.append(f"env.id={hydra_value(env)}")
        elif env is not None:
            raise ConfigError("config['env'] must be a Gymnasium id here: the ranks are separate processes "
                              "started by a command line")
        with _ranks_sized(n_procs):
            validate(compose(self.overrides))

    def run(self, load: bool = False, verbose: bool = True, render: bool = False, plot: bool = False) -> int:
        """Train: start the ranks and wait for them (rlpack's ``Environments.train`` keywords).

        Args:
            load: continue from the run directory's latest checkpoint (``resume=auto``); False starts
                afresh (``resume=false``).
            verbose: INFO log lines; False: warnings only.
            render, plot: refused (distrl draws curves with ``scripts/learning_curve.py`` afterwards).

        Returns:
            0, or 1 when a rank failed (its own lines say why).
        """
        if render or plot:
            raise ConfigError("render/plot are not offered while training: evaluate with `distrl eval video=true`, "
                              "draw curves with scripts/learning_curve.py")
        argv = [*self.overrides, f"hydra.run.dir={self.run_dir}", f"resume={'auto' if load else 'false'}",
                f"log_level={'INFO' if verbose else 'WARNING'}", "distributed.nproc_per_node=1"]
        return distributed.launch(self.n_procs, argv)


class _ranks_sized:
    """Validate as rank 0 of ``n`` would: on its share of the cores
    (``distrl.learning.distributed.take_core_share``)."""

    def __init__(self, n: int):
        self.n = n

    def __enter__(self):
        self.affinity = os.sched_getaffinity(0)
        if self.n > 1:
                distributed.take_core_share(0, self.n)

    def __exit__(self, *exc):
        os.sched_setaffinity(0, self.affinity)


def _flatten(config: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in config.items():
        if isinstance(value, dict):
            out += _flatten(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}={hydra_value(value)}")
    return out

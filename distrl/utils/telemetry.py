"""TensorBoard scalars, a ``metrics.jsonl`` file, Weights & Biases if asked, and the console progress bar.

Every scalar goes to TensorBoard (x-axis: agent steps) and, as one JSON
object per call of :meth:`Telemetry.log`, to ``metrics.jsonl``:
``{"agent_steps": ..., "frames": ..., "time": <unix seconds>, "<name>": value, ...}``.
With ``logger=wandb`` the same scalars, under the same names, go to a W&B run whose x-axis is the
``agent_steps`` metric (:class:`WandbSink`).
"""

from __future__ import annotations

import json
import logging
import math
import secrets
import threading
import time
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

log = logging.getLogger(__name__)


class Telemetry:
    """Writes metrics of one run under ``run_dir``.

    Args:
        run_dir: the run directory; TensorBoard files go to ``run_dir/tb``.
        total_steps: ``num_train_steps``, the progress bar's end.
        start_step: agent steps already done (a resumed run).
        frameskip: frames per agent step, for the frames column.
        hparams: flat dict of hyperparameters, logged as a text table.
        progress: show a tqdm progress bar on stderr (the trainer shows it only on a terminal).
    """

    def __init__(self, run_dir: str | Path, total_steps: int, start_step: int = 0, frameskip: int = 1,
                 hparams: dict | None = None, progress: bool = True, wandb: WandbSink | None = None):
        self.run_dir = Path(run_dir)
        self.wandb = wandb
        self.frameskip = frameskip
        self.writer = SummaryWriter(log_dir=str(self.run_dir / "tb"))
        self.jsonl = open(self.run_dir / "metrics.jsonl", "a", buffering=1)
        self.bar = tqdm(total=total_steps, initial=start_step, unit="step", unit_scale=True,
                        dynamic_ncols=True, disable=not progress, mininterval=1.0)
        self._bar_step = start_step
        self._excepthook = threading.excepthook
        threading.excepthook = self._quiet_writer_thread
        if hparams:
            table = "|key|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in sorted(hparams.items()))
            self.writer.add_text("hyperparameters", table, start_step)

    def log(self, scalars: dict[str, float], agent_steps: int) -> None:
        """Write ``scalars`` (TensorBoard tag -> value) at ``agent_steps``; non-finite values are kept.

        A write that fails (a full disk, a deleted directory) is logged once per sink, TensorBoard
        or ``metrics.jsonl``, which is then left alone: metrics never end a run.
        """
        record = {"agent_steps": agent_steps, "frames": agent_steps * self.frameskip, "time": time.time()}
        for name, value in scalars.items():
            record[name] = value if math.isfinite(value) else str(value)
        if self.writer is not None:
            self._guard("writer", lambda: [self.writer.add_scalar(n, v, agent_steps) for n, v in scalars.items()])
        if self.jsonl is not None:
            self._guard("jsonl", lambda: self.jsonl.write(json.dumps(record) + "\n"))
        if self.wandb is not None:
            self._guard("wandb", lambda: self.wandb.log(scalars, agent_steps, record["frames"]))

    def _quiet_writer_thread(self, args) -> None:
        """TensorBoard's writer thread dies on a write error and re-raises it at the next write,
        where :meth:`_guard` reports it in one line: its own traceback is not printed."""
        if not type(args.thread).__module__.startswith("tensorboard."):
            self._excepthook(args)

    def _guard(self, sink: str, write) -> None:
        try:
            write()
        except Exception as exc:  # tensorboard re-raises its writer thread's OSError as itself
            where = {"writer": self.run_dir / "tb", "jsonl": self.run_dir / "metrics.jsonl", "wandb": "W&B"}[sink]
            log.warning("metrics: cannot write %s (%s: %s); no more metrics go there in this run", where,
                        type(exc).__name__, exc)
            handle = getattr(self, sink)
            setattr(self, sink, None)
            try:
                handle.close()
            except Exception:
                pass

    def progress(self, agent_steps: int, sps: float, recent_return: float | None) -> None:
        """Advance the progress line: agent steps, frames, SPS and the recent episode return."""
        ret = "n/a" if recent_return is None else f"{recent_return:.1f}"
        self.bar.set_postfix_str(f"frames={agent_steps * self.frameskip:,} SPS={sps:,.0f} return={ret}", refresh=False)
        self.bar.update(max(0, agent_steps - self._bar_step))  # redraws with the postfix above
        self._bar_step = agent_steps

    def close(self) -> None:
        self.bar.close()
        if self.writer is not None:
            self._guard("writer", self.writer.close)  # its thread may die of a write error here
        if self.jsonl is not None:
            self._guard("jsonl", self.jsonl.close)
        if self.wandb is not None:
            self._guard("wandb", self.wandb.close)
        threading.excepthook = self._excepthook


class WandbSink:
    """One W&B run per run directory: the id is kept in ``<run dir>/wandb_run_id``, so a run resumed
    in its directory continues its W&B run (``resume="allow"``); scalars are logged with
    ``agent_steps`` and ``frames`` beside them, ``agent_steps`` being every metric's x-axis.

    Args:
        run_dir: the run directory (W&B's files go to ``run_dir/wandb``).
        settings: the ``logger`` config node (``project``, ``entity``, ``group``, ``tags``, ``mode``).
        config: the resolved run config, logged as the W&B run's config.

    Raises:
        Exception: whatever ``wandb.init`` raises (no login online, for one); the trainer then goes
            on without W&B.
    """

    ID_FILE = "wandb_run_id"

    @classmethod
    def start(cls, run_dir: str | Path, cfg) -> WandbSink | None:
        """With ``logger=wandb`` in the train config ``cfg``, the W&B run of ``run_dir``; None
        otherwise, or when W&B cannot start (warned: metrics never end a run)."""
        if cfg.logger.name != "wandb":
            return None
        from omegaconf import OmegaConf

        try:
            return cls(run_dir, cfg.logger, OmegaConf.to_container(cfg, resolve=True))
        except Exception as exc:
            log.warning("logger=wandb: W&B did not start (%s: %s); TensorBoard and metrics.jsonl only",
                        type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
            return None

    def __init__(self, run_dir: str | Path, settings, config: dict):
        import wandb

        run_dir = Path(run_dir)
        id_file = run_dir / self.ID_FILE
        run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(4)  # W&B's id: [a-z0-9]
        id_file.write_text(run_id + "\n")
        (run_dir / "wandb").mkdir(exist_ok=True)
        self.run = wandb.init(project=settings.project, entity=settings.entity, group=settings.group,
                              tags=list(settings.tags or []), name=run_dir.name, dir=str(run_dir), config=config,
                              id=run_id, resume="allow", mode=settings.mode, reinit="create_new")
        self.run.define_metric("agent_steps")
        self.run.define_metric("*", step_metric="agent_steps")
        log.info("W&B run %s (%s)", run_id, self.run.settings.mode)

    def log(self, scalars: dict[str, float], agent_steps: int, frames: int) -> None:
        """``scalars`` (name -> value, the TensorBoard tags) at ``agent_steps`` (and ``frames``)."""
        self.run.log({**scalars, "agent_steps": agent_steps, "frames": frames})

    def close(self) -> None:
        self.run.finish()


class NullTelemetry:
    """What ranks other than 0 write: nothing (rank 0 logs every rank's episodes)."""

    def log(self, scalars: dict[str, float], agent_steps: int) -> None:
        pass

    def progress(self, agent_steps: int, sps: float, recent_return: float | None) -> None:
        pass

    def close(self) -> None:
        pass

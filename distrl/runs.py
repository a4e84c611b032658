"""Reading runs back: one reader for run directories, the compact run records the lab keeps, and
the policies of checkpoints. Scripts, ``distrl eval``, the sweeps' objective and the tests use it.

A *run directory* is what ``distrl train`` writes (``config.yaml``, ``metrics.jsonl``, ``tb/``,
``checkpoints/``). A *run record* is what stays in git of a run (``docs/lab/runs/<group>/<name>.csv.gz``):
a gzip'd CSV of its ``metrics.jsonl`` after ``# key: value`` lines giving the command, the machine,
the commit and the resolved config (JSON), written by :func:`write_record` (``scripts/record_runs.py``).
Times are kept to 0.01 s and other floats to 7 significant digits; every value is rewritten the same
way each time, so a record's bytes depend on the run alone.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import yaml
from omegaconf import OmegaConf

RECORD_SUFFIX = ".csv.gz"
PROVENANCE_KEYS = ("run", "command", "machine", "commit")


def is_record(path: str | Path) -> bool:
    return str(path).endswith(RECORD_SUFFIX)


def metrics(path: str | Path) -> list[dict[str, Any]]:
    """The metrics of a run directory (its ``metrics.jsonl``; a torn last line, as a killed run leaves,
    is skipped) or of a run record, one dict per line in the order written.

    Raises:
        FileNotFoundError: no ``metrics.jsonl`` in the directory, or no such record.
    """
    path = Path(path)
    if is_record(path):
        return _read_record(path)[1]
    records = []
    for line in (path / "metrics.jsonl").read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line torn by a kill mid-write
    return records


def config(path: str | Path) -> dict[str, Any]:
    """The resolved train config of a run directory (``config.yaml``) or a run record, as plain values.

    Raises:
        FileNotFoundError: neither.
    """
    path = Path(path)
    if is_record(path):
        return json.loads(_read_header(path)["config"])
    return yaml.safe_load((path / "config.yaml").read_text())


def provenance(record: str | Path) -> dict[str, str]:
    """A run record's ``run``, ``command``, ``machine`` and ``commit``."""
    header = _read_header(Path(record))
    return {key: header[key] for key in PROVENANCE_KEYS}


def name(path: str | Path) -> str:
    """A run's name: its directory's, or its record's file name without ``.csv.gz``."""
    path = Path(path)
    return path.name[: -len(RECORD_SUFFIX)] if is_record(path) else path.name


def env_id(path: str | Path) -> str:
    """The env id a run trained on (``env.id`` of its config)."""
    return str(config(path)["env"]["id"])


class Curve(NamedTuple):
    """Points of one curve of a run (each ``[n] float64``): the agent steps, the wall-clock hours and
    the mean return at each, and the success (NaN where the env has no ``success_above``)."""

    steps: np.ndarray
    hours: np.ndarray
    returns: np.ndarray
    success: np.ndarray


@dataclass
class Run:
    """One run's curves: ``evaluations``, one point per evaluation (its success the evaluation's
    ``eval/success_rate``), and ``training``, one point per finished training episode (its success
    1.0 for an episode whose return is above the run's ``env.success_above``, else 0.0)."""

    name: str
    evaluations: Curve
    training: Curve


def curves(path: str | Path, gap_minutes: float = 10.0) -> Run:
    """A run's evaluation and training-episode curves (:func:`metrics` of a run directory or record).

    Wall-clock hours start at the first record; a pause longer than ``gap_minutes`` between two
    records (the run was stopped and resumed later) is left out. When a resumed run repeats agent
    steps it had logged before its last checkpoint, the repeated ones replace the earlier ones
    (evaluations are logged late, at the step they started, and are not taken for a restart).
    """
    records: list[dict] = []
    top = 0  # the highest agent step of a record that is not an evaluation
    for record in metrics(path):
        if "eval/mean_return" not in record:
            if record["agent_steps"] < top:
                records = [r for r in records if r["agent_steps"] <= record["agent_steps"]]
            top = record["agent_steps"]
        records.append(record)
    times = np.array([r["time"] for r in records], dtype=np.float64)
    gaps = np.diff(times, prepend=times[:1] if len(times) else times)
    gaps[gaps > gap_minutes * 60] = 0.0
    hours = np.cumsum(gaps) / 3600

    def series(key):
        picked = [(r["agent_steps"], h, float(r[key])) for r, h in zip(records, hours, strict=True) if key in r]
        return tuple(np.array(picked, dtype=np.float64).reshape(-1, 3).T)

    evals, train = series("eval/mean_return"), series("charts/episodic_return")
    eval_success = np.array([float(r.get("eval/success_rate", math.nan)) for r in records if "eval/mean_return" in r],
                            dtype=np.float64)
    success_above = config(path)["env"].get("success_above")
    train_success = (train[2] > success_above).astype(np.float64) if success_above is not None \
        else np.full_like(train[2], math.nan)
    return Run(name(path), Curve(*evals, eval_success), Curve(*train, train_success))


def smooth(steps: np.ndarray, values: np.ndarray, window: float) -> np.ndarray:
    """Mean of the values whose step lies in ``(step - window, step]``, at each step (sorted steps)."""
    csum = np.concatenate([[0.0], np.cumsum(values)])
    start = np.searchsorted(steps, steps - window, side="right")
    end = np.arange(1, len(steps) + 1)
    return (csum[end] - csum[start]) / (end - start)


def values(records: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """``(agent_steps, value)`` of every record that has ``key`` (e.g. ``eval/mean_return``)."""
    return [(int(r["agent_steps"]), float(r[key])) for r in records if r.get(key) is not None]


def write_record(run_dir: str | Path, dest: str | Path, *, run: str, command: str, machine: str, commit: str) -> Path:
    """Write the record of ``run_dir`` to ``dest`` (a ``.csv.gz`` file): the provenance lines, the
    resolved config, then every metrics line as a CSV row over the union of their keys (first-seen
    order; empty where a line lacks a key). Returns ``dest``."""
    return write_rows(metrics(run_dir), config(run_dir), dest, run=run, command=command, machine=machine,
                      commit=commit)


def write_rows(rows: list[dict[str, Any]], run_config: dict[str, Any], dest: str | Path, *, run: str, command: str,
               machine: str, commit: str) -> Path:
    """Write a run record of metrics ``rows`` (dicts with ``agent_steps`` and ``time`` at least) made
    with ``run_config`` (plain values): :func:`write_record`'s format, for a run of another trainer too
    (scripts/sf_record.py). Returns ``dest``."""
    dest = Path(dest)
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    text = io.StringIO()
    for key, value in (("run", run), ("command", command), ("machine", machine), ("commit", commit),
                       ("config", json.dumps(run_config, sort_keys=True))):
        text.write(f"# {key}: {value}\n")
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_format(key, row.get(key)) for key in columns])
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as out:
        out.write(text.getvalue().encode())
    return dest


def _format(key: str, value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if key == "time":
            return f"{value:.2f}"
        return "nan" if math.isnan(value) else f"{value:.7g}"
    return json.dumps(value)


def _parse(text: str) -> Any:
    if text == "":
        return None
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        return float(text)
    except ValueError:
        return json.loads(text)


def _read_header(path: Path) -> dict[str, str]:
    """A record's ``# key: value`` lines alone (the provenance and the config)."""
    header = {}
    with gzip.open(path, "rt") as f:
        for line in f:
            if not line.startswith("# "):
                break
            key, _, value = line[2:].rstrip("\n").partition(": ")
            header[key] = value
    return header


def _read_record(path: Path) -> tuple[dict[str, str], list[dict[str, Any]]]:
    with gzip.open(path, "rt") as f:
        lines = f.read().splitlines()
    header = {}
    while lines and lines[0].startswith("# "):
        key, _, value = lines.pop(0)[2:].partition(": ")
        header[key] = value
    reader = csv.reader(lines)
    columns = next(reader, [])
    rows = [{k: _parse(v) for k, v in zip(columns, row, strict=True) if v} for row in reader]  # "": not logged
    return header, rows


def load_policy(path: str | Path, device: str = "cpu"):
    """The network of a checkpoint (a file, or a run directory's ``checkpoints/latest.pt``), rebuilt
    from the config inside it with its weights, in eval mode on ``device``; any precision it was
    trained in (the weights are fp32), loaded with ``weights_only``.

    Returns:
        ``(model, train_cfg, state)``: the :class:`distrl.nn.actor_critic.ActorCritic`, the run's
        train config (``DictConfig``) and the checkpoint's dict.

    Raises:
        distrl.utils.checkpoint.CheckpointError: the file is missing, unsafe or unreadable, or its
            weights do not fit the network its config describes.
    """
    # torch only here: the scripts that read metrics start in 0.5 s instead of 3 (its import on 2 cores)
    from distrl.nn.actor_critic import ActorCritic
    from distrl.nn.distributions import ActionSpace
    from distrl.utils.checkpoint import CheckpointError, checkpoint_file, load_checkpoint, saved_action_space

    file = checkpoint_file(path)
    state = load_checkpoint(file)
    train_cfg = OmegaConf.create(state["config"])
    weights = state["model"]
    model = ActorCritic(tuple(state["obs_shape"]), ActionSpace.from_dict(saved_action_space(state)), train_cfg.model,
                        intrinsic_value="intrinsic_baseline.weight" in weights,
                        return_norm="return_norm.mean" in weights, value_norm="value_norm.mean" in weights)
    try:
        model.load_state_dict(weights)
    except RuntimeError as exc:
        raise CheckpointError(f"{file}: its weights do not fit its model config: {str(exc).splitlines()[0]}") from None
    return model.to(device).eval(), train_cfg, state

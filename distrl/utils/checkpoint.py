"""Checkpoints: atomic save, safe load, rotation.

A checkpoint is a dict of tensors and plain Python values, so it loads with
``torch.load(weights_only=True)`` and never needs unpickling:

``distrl_version``, ``model`` (learner state_dict), ``optimizer``,
``agent_steps``, ``frames``, ``updates``, ``last_eval_step``,
``last_save_step``, ``best_eval_return``, ``config`` (the resolved config
as a plain container), ``rng`` (torch, numpy and Python RNG states as
tensors/lists), ``obs_shape``, ``action_space`` (and ``num_actions`` for a Discrete one), ``pretraining`` (a reward-free
run's), ``precision`` (the learner's, ``fp32`` or ``bf16``, as resolved) and,
with an intrinsic reward, ``intrinsic`` (its networks, running statistics and
optimizer: :mod:`distrl.intrinsic`). The learning rate and the
entropy cost follow from the agent steps (:mod:`distrl.learning.schedule`), so
a resumed run restores its position from them alone; checkpoints of earlier
versions also hold a ``scheduler`` entry, which is not needed.

Layout in a run directory: ``checkpoints/step_<12-digit agent steps>.pt``,
``latest.pt`` and ``best.pt``. Every file is written to a temporary name in
the same directory, fsynced and renamed into place, so a kill at any moment
leaves the previous file intact.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import random
import re
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

STEP_FILE = re.compile(r"^step_(\d{12})\.pt$")
REQUIRED_KEYS = ("distrl_version", "model", "config", "agent_steps")


class CheckpointError(RuntimeError):
    """A checkpoint path cannot be used; the message names the path and the problem."""


@dataclass
class RunState:
    """What a run's schedule loop remembers besides the update count: when it last evaluated and
    saved, and the best evaluation so far.

    Attributes:
        last_eval_step, last_save_step: agent steps at the last finished evaluation (the step its
            weights were taken at) and at the last checkpoint.
        best_eval_return: the best evaluation mean return so far (``-inf`` before the first).
    """

    last_eval_step: int = 0
    last_save_step: int = 0
    best_eval_return: float = -math.inf

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_checkpoint(cls, state: dict[str, Any]) -> RunState:
        """The values of a loaded checkpoint (missing ones at their start values)."""
        return cls(**{key: state[key] for key in asdict(cls()) if key in state})


def rng_state() -> dict[str, Any]:
    """Torch, numpy and Python RNG states as tensors and lists (weights_only-safe)."""
    bit_gen = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy_keys": torch.from_numpy(bit_gen[1].astype(np.int64)),
        "numpy_pos": int(bit_gen[2]),
        "python": [list(x) if isinstance(x, tuple) else x for x in random.getstate()],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(("MT19937", state["numpy_keys"].numpy().astype(np.uint32), state["numpy_pos"], 0, 0.0))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written (a full disk, say); the previous files are intact and no
    temporary file is left."""


def save_file(obj: Any, path: Path) -> None:
    """``torch.save`` into memory, then written to a temporary file beside ``path``, fsynced, and
    renamed into place.

    The bytes are written by Python, not by torch's zip writer: that writer turns a failed write
    (a full disk, a file-size limit) into ``RuntimeError: ... unexpected pos ...``, which names
    neither the file nor the cause; Python's ``OSError`` names both ("No space left on device").

    Raises:
        CheckpointSaveError: writing failed; ``path`` is as it was and the temporary file is gone.
    """
    buffer = io.BytesIO()
    try:
        torch.save(obj, buffer)
    except OSError as exc:
        raise CheckpointSaveError(f"cannot write {path}: {_first_line(exc)}") from exc
    _write_atomically(path, buffer.getbuffer())


def _write_atomically(path: Path, data: Any = None, link_from: Path | None = None) -> None:
    """``data`` (bytes-like) into a temporary file beside ``path``, fsynced, renamed into place; with
    ``link_from``, a hard link to that file instead where the filesystem allows one.

    Raises:
        CheckpointSaveError: writing failed; ``path`` is as it was and the temporary file is gone.
    """
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        linked = False
        if link_from is not None:
            try:
                os.link(link_from, tmp)
                linked = True
            except OSError:  # a filesystem without hard links: a copy
                data = link_from.read_bytes()
        if not linked:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise CheckpointSaveError(f"cannot write {path}: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _atomic_alias(source: Path, alias: Path) -> None:
    """Make ``alias`` a copy of ``source`` atomically (a hard link when the filesystem allows).

    Raises:
        CheckpointSaveError: as :func:`save_file`.
    """
    _write_atomically(alias, link_from=source)


def save_checkpoint(state: dict[str, Any], directory: str | os.PathLike, keep: int, best: bool = False) -> Path:
    """Write ``step_<agent_steps>.pt``, point ``latest.pt`` (and ``best.pt`` if ``best``) at it,
    and delete all but the newest ``keep`` step files.

    Returns:
        The path of the step file.

    Raises:
        CheckpointSaveError: a write failed; ``latest.pt`` still names the previous checkpoint.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step_{state['agent_steps']:012d}.pt"
    save_file(state, path)
    _atomic_alias(path, directory / "latest.pt")
    if best:
        _atomic_alias(path, directory / "best.pt")
    step_files = sorted(p for p in directory.iterdir() if STEP_FILE.match(p.name))
    for old in step_files[:-keep]:
        old.unlink(missing_ok=True)
    return path


def save_best(state: dict[str, Any], directory: str | os.PathLike) -> Path:
    """Write ``best.pt`` alone (used when an evaluation beats the best so far)."""
    path = Path(directory) / "best.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, path)
    return path


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict[str, Any]:
    """Load a distrl checkpoint with ``torch.load(weights_only=True)`` only.

    Raises:
        CheckpointError: the path is missing or not a file, the file is truncated or
            not a torch file, it holds pickled objects, or it is not a distrl checkpoint.
    """
    state = _safe_load(Path(path), map_location)
    if any(key not in state for key in REQUIRED_KEYS):
        raise CheckpointError(f"{path}: not a distrl checkpoint (needs keys {', '.join(REQUIRED_KEYS)})")
    return state


def load_weights(path: str | os.PathLike, map_location: Any = "cpu") -> dict[str, torch.Tensor]:
    """The network weights in ``path``: a distrl checkpoint's ``model``, or a bare ``state_dict``
    (as :meth:`distrl.compat.actor_learner.DistributedActorLearner.save` writes), loaded as safely as
    :func:`load_checkpoint`.

    Raises:
        CheckpointError: as :func:`load_checkpoint`, or the file holds no tensors.
    """
    state = _safe_load(Path(path), map_location)
    weights = state["model"] if isinstance(state.get("model"), dict) else state
    if not weights or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise CheckpointError(f"{path}: holds no network weights")
    return weights


def _safe_load(path: Path, map_location: Any) -> dict[str, Any]:
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    if not path.is_file():
        raise CheckpointError(f"{path}: not a file")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"{path}: not a torch checkpoint (torch.save writes a zip archive; "
                              "this file is not one, or it is truncated)")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(exc))
        what = f" ({found.group(1)})" if found else ""
        raise CheckpointError(
            f"{path}: refused: it holds pickled Python objects{what}, which distrl never loads"
        ) from None
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}: not a readable torch checkpoint (truncated or corrupt: {reason})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: not a distrl checkpoint (holds a {type(state).__name__}, not a dict)")
    return state


MODEL_KEYS = ("encoder", "feature_dim", "hidden_dim", "use_lstm")
OPTIONAL_MODEL_KEYS = ("normalize_obs", "separate_critic")
# The env settings that make a different task: another game, or other observations or actions.
ENV_KEYS = ("kind", "id", "frameskip", "frame_stack", "img_size", "full_action_space")


def saved_action_space(state: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's action space as plain values (``distrl.nn.distributions.ActionSpace.as_dict``);
    a checkpoint written before continuous actions has ``num_actions`` alone (Discrete)."""
    if "action_space" in state:
        return state["action_space"]
    return {"kind": "discrete", "nvec": [state.get("num_actions")], "low": [], "high": []}


def incompatibility(state: dict[str, Any], cfg, obs_shape, action_space: dict[str, Any]) -> str | None:
    """Why checkpoint ``state`` cannot continue a run of ``cfg``, or None if it can: another env
    (``ENV_KEYS``), another intrinsic reward module, observation shape, action space
    (``action_space``: plain values, as :func:`saved_action_space` gives), network
    (``MODEL_KEYS``) or optimizer (``agent.optimizer``: its state holds another optimizer's
    statistics; another loss with the same optimizer may continue)."""
    saved_env = state["config"].get("env", {})
    for key in ENV_KEYS:
        if key in saved_env and key in cfg.env and saved_env[key] != cfg.env[key]:
            return f"env.{key}={saved_env[key]!r} in the checkpoint, env.{key}={cfg.env[key]!r} here"
    if list(state.get("obs_shape", [])) != list(obs_shape):
        return f"observation shape {tuple(state.get('obs_shape', []))} in the checkpoint, {tuple(obs_shape)} here"
    saved_space = saved_action_space(state)
    if saved_space != action_space:
        return f"action space {_space_text(saved_space)} in the checkpoint, {_space_text(action_space)} here"
    saved_intrinsic = state["config"].get("intrinsic", {}).get("name", "none")
    here = cfg.get("intrinsic", {}).get("name", "none")
    if saved_intrinsic != here:
        return f"intrinsic={saved_intrinsic} in the checkpoint, intrinsic={here} here"
    saved = state["config"].get("model", {})
    for key in MODEL_KEYS:
        if saved.get(key) != cfg.model[key]:
            return f"model.{key}={saved.get(key)!r} in the checkpoint, {cfg.model[key]!r} here"
    for key in OPTIONAL_MODEL_KEYS:  # absent in checkpoints older than these keys: false
        if bool(saved.get(key, False)) != bool(cfg.model.get(key, False)):
            return f"model.{key}={saved.get(key, False)!r} in the checkpoint, {cfg.model.get(key, False)!r} here"
    saved_agent = state["config"].get("agent", {})
    # each keeps statistics in the model's buffers; a checkpoint older than normalize_rewards's name
    # says normalize_returns (distrl.config.schema.RENAMED)
    for key, old_name in (("normalize_rewards", "normalize_returns"), ("normalize_values", None)):
        saved_value = bool(saved_agent.get(key, saved_agent.get(old_name, False)))
        if saved_value != bool(cfg.agent.get(key, False)):
            return f"agent.{key}={saved_value!r} in the checkpoint, {cfg.agent.get(key, False)!r} here"
    if saved_agent.get("optimizer", cfg.agent.optimizer) != cfg.agent.optimizer:
        name = saved_agent.get("name")
        return (f"agent.optimizer={saved_agent['optimizer']!r} (agent={name}) in the checkpoint, "
                f"{cfg.agent.optimizer!r} (agent={cfg.agent.name}) here: continue it with agent={name}")
    return None


def checkpoint_file(path: str | os.PathLike) -> Path:
    """``path`` itself, or for a run directory its ``checkpoints/latest.pt`` (or ``latest.pt``
    directly inside it) when there is one."""
    path = Path(path)
    if path.is_dir():
        for candidate in (path / "checkpoints" / "latest.pt", path / "latest.pt"):
            if candidate.is_file():
                return candidate
    return path


def find_resume_checkpoint(resume: Any, run_dir: str | os.PathLike) -> Path | None:
    """The checkpoint a run continues from.

    Args:
        resume: ``"auto"`` (``run_dir/checkpoints/latest.pt`` if it exists), ``False``/``None``
            (never), or the path of a checkpoint file or of a run directory.
        run_dir: this run's directory.

    Raises:
        CheckpointError: ``resume`` names a path with no checkpoint.
    """
    if resume is None or resume is False or str(resume).lower() in ("false", "none", "null"):
        return None
    if resume == "auto":
        latest = Path(run_dir) / "checkpoints" / "latest.pt"
        return latest if latest.is_file() else None
    path = checkpoint_file(str(resume))
    if path.is_file():
        return path
    raise CheckpointError(f"resume={resume}: no checkpoint there (give a .pt file or a run directory)")


def _space_text(space: dict[str, Any]) -> str:
    if space["kind"] == "discrete":
        return f"{space['nvec'][0]} actions"
    return f"Box({len(space['low'])})" if space["kind"] == "box" else f"MultiDiscrete{space['nvec']}"

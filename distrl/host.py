"""What this machine offers a run: cores, memory, shared memory, processes, devices, ranks.

Read by :mod:`distrl.validation` (to refuse what cannot run here) and by
:mod:`distrl.engine.placement` (to size what can). Probes only: nothing here
starts or allocates anything.
"""

from __future__ import annotations

import os
import shutil

from omegaconf import DictConfig

from distrl.config import ConfigError


def cpu_count() -> int:
    """Cores this process may run on (the affinity mask, not the machine total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def process_limit() -> int:
    """How many processes this user may start (RLIMIT_NPROC, capped by ``threads-max``), or a large number."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft == resource.RLIM_INFINITY:
        soft = 4_194_304  # the kernel's pid_max ceiling
    try:
        with open("/proc/sys/kernel/threads-max") as f:
            soft = min(soft, int(f.read()))
    except OSError:  # pragma: no cover - not Linux
        pass
    return soft


def available_memory() -> int:
    """Bytes of memory available to new allocations (MemAvailable), or a large number if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - not Linux
        pass
    return 1 << 62


def shared_memory_room() -> int:
    """Bytes that new shared-memory tensors may take: free space in /dev/shm, at most MemAvailable."""
    try:
        shm_free = shutil.disk_usage("/dev/shm").free
    except OSError:  # pragma: no cover - no /dev/shm
        shm_free = 1 << 62
    return min(shm_free, available_memory())


def world_size(cfg: DictConfig) -> int:
    """Ranks of the run: ``torchrun``'s ``WORLD_SIZE``, else ``distributed.nproc_per_node``."""
    return int(os.environ.get("WORLD_SIZE", cfg.distributed.nproc_per_node))


def resolve_device(name: str):
    """``device`` as a ``torch.device``: ``auto`` is ``cuda`` when available, else ``cpu``.

    Raises:
        ConfigError: unknown device string, or CUDA asked for but unavailable.
    """
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device={name!r} is not allowed: auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"device={name!r} is not allowed: auto, cpu, cuda or cuda:N")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device={name!r} is not allowed: CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(
                f"device={name!r} is not allowed: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    return device

"""What this machine offers a run: cores, memory, shared memory, processes, devices, ranks.

Read by :mod:`distrl.config.validation` (to refuse what cannot run here) and by
:mod:`distrl.config.placement` (to size what can). Probes only: nothing here
starts or allocates anything.
"""

from __future__ import annotations

import os
import shutil

from omegaconf import DictConfig

from distrl.config.schema import ConfigError


def cpu_count() -> int:
    """Cores this process may run on (the affinity mask, not the machine total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def core_share(allowed: list[int], index: int, count: int) -> tuple[int, ...]:
    """Share ``index`` of ``count`` contiguous, equal shares of the cores ``allowed`` (at least one
    core each; with more shares than cores, they wrap around). Ranks on a node and sweep jobs side by
    side each take one."""
    per = max(1, len(allowed) // count)
    start = (index * per) % len(allowed)
    return tuple(allowed[start:start + per]) or (allowed[index % len(allowed)],)


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


BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # native bf16 arithmetic (AMD Zen 4, Intel Cooper Lake / Sapphire Rapids)


def cpu_bf16_flags() -> tuple[str, ...]:
    """The flags of :data:`BF16_CPU_FLAGS` that ``/proc/cpuinfo`` lists for this machine (none
    elsewhere, e.g. off Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return tuple(flag for flag in BF16_CPU_FLAGS if flag in flags)
    except OSError:  # pragma: no cover - not Linux
        pass
    return ()


def resolve_precision(precision: str, device) -> tuple[str, str]:
    """``precision`` (``auto``, ``fp32`` or ``bf16``) for a learner on ``device``: ``("bf16" | "fp32",
    why)``. ``auto`` is bf16 on a CUDA device that computes it and on a CPU whose flags show
    AVX512-BF16 or AMX-BF16 (:func:`cpu_bf16_flags`), fp32 elsewhere (an AVX2-only CPU runs bf16
    slower than fp32). The actors run on the CPU: with a CUDA learner, ``auto`` is bf16 for them
    only if the CPU has it too (:func:`actor_precision`)."""
    import torch

    if precision != "auto":
        return precision, "set"
    if device.type == "cuda":
        if not torch.cuda.is_available():  # a placement computed for another machine (tests, dry runs)
            return "fp32", "auto: no CUDA here to ask"
        if torch.cuda.is_bf16_supported():
            return "bf16", f"auto: {torch.cuda.get_device_name(device)} computes bf16"
        return "fp32", f"auto: {torch.cuda.get_device_name(device)} does not compute bf16"
    flags = cpu_bf16_flags()
    if flags:
        return "bf16", f"auto: the CPU has {', '.join(flags)}"
    return "fp32", "auto: the CPU has neither avx512_bf16 nor amx_bf16"


def actor_precision(precision: str) -> str:
    """The actors' precision (they run on the CPU) for the ``precision`` key: ``auto`` follows the
    CPU's flags; ``fp32`` and ``bf16`` as set."""
    if precision != "auto":
        return precision
    return "bf16" if cpu_bf16_flags() else "fp32"


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


INDEX_BYTES = 8  # one slot index in an IndexQueue's pipe (distrl.sampling.queues)


def pipe_max_bytes() -> int:
    """The largest pipe buffer an unprivileged process may ask for (``/proc/sys/fs/pipe-max-size``)."""
    try:
        with open("/proc/sys/fs/pipe-max-size") as f:
            return int(f.read())
    except OSError:  # pragma: no cover - not Linux
        return 65536


def max_indices() -> int:
    """How many indices a :class:`distrl.sampling.queues.IndexQueue` can hold, hence the most rollout
    slots a run may have."""
    return pipe_max_bytes() // INDEX_BYTES

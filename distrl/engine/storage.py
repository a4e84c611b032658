"""Shared-memory rollout storages handed out through free and full index queues.

There are ``num_storages`` slots. Each holds one trajectory of ``T + 1`` steps
of one environment; row 0 repeats the previous slot's last step, so a slot
is a self-contained unroll with its bootstrap observation. Every key is one
shared tensor with the slot as the leading dimension, allocated once.

Every slot index is always in exactly one place: the free queue, an actor,
the full queue or a learner. Actors take free indices, fill them and put them
on the full queue; learners take ``B`` full indices, copy the batch out and
put the indices back on the free queue.

Row ``t`` of a slot holds ``obs_t``, whether it starts an episode
(``first``), the behaviour policy's output at ``obs_t`` (``action``,
``policy_logits``, ``baseline``), and what stepping the env with ``action_t``
gave (``reward``, ``terminated``, ``truncated`` and, on truncation, the
behaviour baseline of the episode's final observation ``truncation_value``).
Those last four are unused in row T, which the next slot completes.
"""

from __future__ import annotations

import queue
from collections.abc import Sequence

import torch

Specs = dict[str, tuple[tuple[int, ...], torch.dtype]]

# Keys with one value per slot; every other key has T + 1 rows.
PER_SLOT_KEYS = ("policy_version", "core_h", "core_c")


def rollout_specs(
    num_steps: int,
    obs_shape: Sequence[int],
    obs_dtype: torch.dtype,
    num_actions: int,
    core_state_shape: Sequence[int] | None = None,
) -> Specs:
    """Per-slot shape and dtype of every key (without the leading slot dimension).

    Args:
        num_steps: unroll length T; time-indexed keys have ``T + 1`` rows.
        obs_shape: one observation's shape.
        obs_dtype: ``torch.uint8`` for images, ``torch.float32`` for vectors.
        num_actions: number of discrete actions A.
        core_state_shape: shape of one LSTM state tensor for one env (``[1, H]``), or None.
    """
    T1 = num_steps + 1
    specs: Specs = {
        "obs": ((T1, *obs_shape), obs_dtype),
        "first": ((T1,), torch.bool),
        "action": ((T1,), torch.int64),
        "policy_logits": ((T1, num_actions), torch.float32),
        "baseline": ((T1,), torch.float32),
        "reward": ((T1,), torch.float32),
        "terminated": ((T1,), torch.bool),
        "truncated": ((T1,), torch.bool),
        "truncation_value": ((T1,), torch.float32),
        "policy_version": ((), torch.int64),
    }
    if core_state_shape is not None:
        specs["core_h"] = (tuple(core_state_shape), torch.float32)
        specs["core_c"] = (tuple(core_state_shape), torch.float32)
    return specs


def drain(q, timeout: float = 0.0) -> list:
    """Take every item currently on queue ``q``; ``timeout`` (seconds) lets items still in a
    child's pipe arrive."""
    items = []
    while True:
        try:
            items.append(q.get(timeout=timeout) if timeout else q.get_nowait())
        except queue.Empty:
            return items


class RolloutStorage:
    """``num_storages`` shared-memory slots and their free/full index queues.

    Args:
        specs: from :func:`rollout_specs`.
        num_storages: number of slots N.
        ctx: the ``torch.multiprocessing`` context whose queues the processes share.

    Attributes:
        buffers: ``{key: [N, *spec_shape] tensor}`` in shared memory.
        free_queue, full_queue: queues of slot indices (ints).
    """

    def __init__(self, specs: Specs, num_storages: int, ctx):
        self.num_storages = num_storages
        self.buffers = {
            key: torch.zeros((num_storages, *shape), dtype=dtype).share_memory_()
            for key, (shape, dtype) in specs.items()
        }
        self.free_queue = ctx.Queue()
        self.full_queue = ctx.Queue()
        for index in range(num_storages):
            self.free_queue.put(index)

    def nbytes(self) -> int:
        """Bytes of shared memory held by the slots."""
        return sum(t.numel() * t.element_size() for t in self.buffers.values())

    def gather(self, indices: Sequence[int], device: torch.device) -> dict[str, torch.Tensor]:
        """Copy the slots ``indices`` into a time-major batch on ``device``.

        Time-indexed keys come back as contiguous ``[T+1, B, ...]``, the LSTM state as
        ``[1, B, H]`` (the layout ``nn.LSTM`` takes) and ``policy_version`` as ``[B]``.
        Each slot is one memcpy into a preallocated batch (pinned, then copied
        non-blocking, on CUDA); ``index_select`` is several times slower on uint8 images.
        """
        pin = device.type == "cuda"
        batch = {}
        for key, tensor in self.buffers.items():
            if tensor.dim() >= 2:
                per_slot = tensor.shape[1:]
                value = torch.empty((per_slot[0], len(indices), *per_slot[1:]), dtype=tensor.dtype, pin_memory=pin)
                for j, index in enumerate(indices):
                    value[:, j].copy_(tensor[index])
            else:
                value = tensor[torch.as_tensor(indices, dtype=torch.int64)]
            batch[key] = value.to(device, non_blocking=True) if pin else value
        return batch

    def reclaim(self) -> list[int]:
        """After every actor and learner has stopped: move full slots back to free,
        and return the sorted list of all free indices (each exactly once when
        nothing was lost). The indices are put back on the free queue."""
        indices = drain(self.full_queue, timeout=0.05) + drain(self.free_queue, timeout=0.05)
        for index in indices:
            self.free_queue.put(index)
        return sorted(indices)

    def close(self) -> None:
        """Release the queues' feeder threads; the tensors go with the last reference."""
        for q in (self.free_queue, self.full_queue):
            q.close()
            q.join_thread()

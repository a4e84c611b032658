"""The rollout slot: its row layout, and the shared-memory storages that hold slots.

A slot holds one environment's unroll of ``T`` steps in ``T + 1`` rows. The row layout
(:class:`RolloutLayout`) is the contract between the actor, which writes rows, and the
learner, which reads them:

- ``ACTED_KEYS``, row ``t`` for ``t`` in ``0..T``: ``obs_t``, whether it starts an episode
  (``first``), the action taken before ``obs_t`` and the raw reward it gave (``last_action``,
  ``last_reward``; 0 where ``first``), and the behaviour policy's output at ``obs_t``
  (``action``, ``policy_logits``, ``baseline``). Row 0 repeats the previous slot's row T, so a
  slot is a self-contained unroll with its bootstrap observation in row T.
- ``STEPPED_KEYS``, row ``t`` for ``t`` in ``0..T-1``: what stepping the env with ``action_t``
  gave: ``reward``, ``terminated``, ``truncated`` and, on truncation, the behaviour baseline of
  the episode's final observation (``truncation_value``). Row T of these keys is unused: the
  next slot completes that step.
- ``SLOT_KEYS``, one value per slot: the policy version the unroll started with, and with an
  LSTM core the state before row 0 (``core_h``, ``core_c``).

The learner reads ``[T+1, B]`` batches; the loss takes rows ``0..T-1`` (the T steps,
:data:`distrl.agents.base.STEPS`) and bootstraps from row T (:data:`distrl.agents.base.BOOTSTRAP`).

Storages: ``num_storages`` slots, each key one shared tensor with the slot as the leading
dimension, allocated once. Every slot index is always in exactly one place: the free queue,
an actor, the full queue or a learner. Actors take free indices, fill them and put them on the
full queue; learners take ``B`` full indices, copy the batch out and put them back on the free
queue. The slots an actor holds are marked with its id in ``owner``, so that the trainer can
return them to the free queue when the actor dies (:meth:`RolloutStorage.release_owned`).
"""

from __future__ import annotations

import math
import queue
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from distrl.engine.shared import IndexQueue

Specs = dict[str, tuple[tuple[int, ...], torch.dtype]]

ACTED_KEYS = ("obs", "first", "last_action", "last_reward", "action", "policy_logits", "baseline")
STEPPED_KEYS = ("reward", "terminated", "truncated", "truncation_value")
SLOT_KEYS = ("policy_version", "core_h", "core_c")



@dataclass(frozen=True)
class RolloutLayout:
    """Shape and dtype of every key of a slot (see the module docstring for the rows).

    Attributes:
        num_steps: unroll length T; time-indexed keys have ``T + 1`` rows.
        obs_shape: one observation's shape.
        obs_dtype: ``torch.uint8`` for images, ``torch.float32`` for vectors.
        num_actions: number of discrete actions A.
        core_size: the LSTM core's hidden size H, or None without a core.
    """

    num_steps: int
    obs_shape: tuple[int, ...]
    obs_dtype: torch.dtype
    num_actions: int
    core_size: int | None = None

    @classmethod
    def for_run(cls, cfg, spec) -> RolloutLayout:
        """The layout of a train config ``cfg`` on env ``spec`` (a :class:`distrl.envs.EnvSpec`)."""
        return cls(cfg.num_steps, tuple(spec.obs_shape),
                   torch.uint8 if spec.obs_dtype == np.uint8 else torch.float32, spec.num_actions,
                   cfg.model.feature_dim if cfg.model.use_lstm else None)

    def nbytes(self, num_storages: int) -> int:
        """Bytes of shared memory ``num_storages`` slots of this layout take."""
        per_slot = sum(math.prod(shape) * dtype.itemsize for shape, dtype in self.specs().values())
        return per_slot * num_storages

    def specs(self) -> Specs:
        """``{key: (per-slot shape, dtype)}``, without the leading slot dimension."""
        T1 = self.num_steps + 1
        specs: Specs = {
            "obs": ((T1, *self.obs_shape), self.obs_dtype),
            "first": ((T1,), torch.bool),
            "last_action": ((T1,), torch.int64),
            "last_reward": ((T1,), torch.float32),
            "action": ((T1,), torch.int64),
            "policy_logits": ((T1, self.num_actions), torch.float32),
            "baseline": ((T1,), torch.float32),
            "reward": ((T1,), torch.float32),
            "terminated": ((T1,), torch.bool),
            "truncated": ((T1,), torch.bool),
            "truncation_value": ((T1,), torch.float32),
            "policy_version": ((), torch.int64),
        }
        if self.core_size is not None:
            specs["core_h"] = ((1, self.core_size), torch.float32)
            specs["core_c"] = ((1, self.core_size), torch.float32)
        return specs


NO_OWNER = -1


def drain(q) -> list:
    """Take every item on queue ``q`` now (a :mod:`distrl.engine.shared` queue)."""
    items = []
    while True:
        try:
            items.append(q.get_nowait())
        except queue.Empty:
            return items


class RolloutStorage:
    """``num_storages`` shared-memory slots and their free/full index queues.

    Args:
        layout: the slot layout.
        num_storages: number of slots N.
        ctx: the ``torch.multiprocessing`` context whose queues the processes share.

    Attributes:
        buffers: ``{key: [N, *spec_shape] tensor}`` in shared memory.
        owner: ``[N] int32`` shared tensor: the id of the actor holding each slot, or ``NO_OWNER``.
        free_queue, full_queue: :class:`distrl.engine.shared.IndexQueue` of slot indices.

    Raises:
        OSError: the queues cannot hold ``num_storages`` indices (validation refuses such sizes).
    """

    def __init__(self, layout: RolloutLayout, num_storages: int, ctx):
        self.layout = layout
        self.num_storages = num_storages
        self.free_queue = IndexQueue(num_storages, ctx)
        self.full_queue = IndexQueue(num_storages, ctx)
        self.buffers = {
            key: torch.zeros((num_storages, *shape), dtype=dtype).share_memory_()
            for key, (shape, dtype) in layout.specs().items()
        }
        self.owner = torch.full((num_storages,), NO_OWNER, dtype=torch.int32).share_memory_()
        for index in range(num_storages):
            self.free_queue.put(index)

    def nbytes(self) -> int:
        """Bytes of shared memory held by the slots."""
        return self.layout.nbytes(self.num_storages)

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

    def release_owned(self, actor_id: int) -> list[int]:
        """Return the slots marked as held by ``actor_id`` to the free queue (call it only once
        that actor is dead). Returns their indices."""
        indices = torch.nonzero(self.owner == actor_id).flatten().tolist()
        for index in indices:
            self.owner[index] = NO_OWNER
            self.free_queue.put(index)
        return indices

    def reclaim(self) -> list[int]:
        """After every actor and learner has stopped: move full slots back to free,
        and return the sorted list of all free indices (each exactly once when
        nothing was lost). The indices are put back on the free queue."""
        indices = drain(self.full_queue) + drain(self.free_queue)
        self.owner.fill_(NO_OWNER)
        for index in indices:
            self.free_queue.put(index)
        return sorted(indices)

    def close(self) -> None:
        """Close this process's ends of the queues; the tensors go with the last reference."""
        for q in (self.free_queue, self.full_queue):
            q.close()

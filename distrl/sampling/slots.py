"""Where a rollout waits between the actor that writes it and the learner that reads it: the slots
in shared memory (:class:`Slots`), the queues of their indices (:mod:`distrl.sampling.queues`) and
the other queues and numbers the trainer shares with its actor processes (:class:`Channels`); a
learner thread takes its batches from them with :class:`distrl.learning.batches.BatchSource`.

``num_slots`` slots (rllte's storages, its ``num_storages``), each key one shared tensor with the slot
as the leading dimension, allocated once; a slot's row layout is
:class:`distrl.rollout.RolloutLayout`. Every slot index is always in exactly one place: the free
queue, an actor, the full queue or a learner. Actors take free indices, fill them and put them on
the full queue; learners take ``B`` full indices, copy the batch out and put them back on the free
queue. The slots an actor holds are marked with its id in ``owner``, so that the trainer can return
them to the free queue when the actor dies (:meth:`Slots.release_owned`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from distrl.rollout import RolloutLayout, declared
from distrl.sampling.queues import IndexQueue, MessageQueue, PolicyVersion, SharedValue, drain


class ActorReports(NamedTuple):
    """What the actors tell the trainer.

    Attributes:
        episodes: finished episodes as ``(actor_id, return, length)``.
        errors: an actor's exception as ``(actor_id, traceback text)``.
        logs: the actors' log records (:mod:`distrl.sampling.logs` writes them to ``actors.log``).
        heartbeat: ``[num_actors] float64``, each actor's last step as ``time.time()`` (0: none yet).
    """

    episodes: MessageQueue
    errors: MessageQueue
    logs: MessageQueue
    heartbeat: torch.Tensor


@dataclass
class Channels:
    """The shared objects between the trainer and its actors (queues of this module and shared
    tensors only, so that a killed process leaves no lock held and nothing in /dev/shm).

    Attributes:
        free_queue, full_queue: slot index queues (those of the :class:`Slots`).
        owner: ``[N] int32``, the actor holding each slot (the slots' ``owner``).
        reports: what the actors tell the trainer (:class:`ActorReports`).
        stop_event: set by the trainer to stop every actor.
        policy_version: learner updates so far, published to the actors that wait for it
            (:class:`distrl.sampling.queues.PolicyVersion`).
    """

    free_queue: IndexQueue
    full_queue: IndexQueue
    owner: torch.Tensor
    reports: ActorReports
    stop_event: SharedValue
    policy_version: PolicyVersion

    @classmethod
    def create(cls, slots: Any, mp_context, num_actors: int, policy_version: int = 0, sync: bool = False) -> Channels:
        """The channels of a :class:`Slots` ``slots`` (its slot queues and ``owner``) for ``num_actors``
        actors, with new message queues and shared values; with ``sync`` (``train.sync``) every actor
        gets a wake-up pipe for the learner's publications (:class:`PolicyVersion`)."""
        reports = ActorReports(MessageQueue(mp_context), MessageQueue(mp_context), MessageQueue(mp_context),
                               torch.zeros(num_actors, dtype=torch.float64).share_memory_())
        return cls(slots.free_queue, slots.full_queue, slots.owner, reports, SharedValue(0),
                   PolicyVersion(mp_context, num_actors if sync else 0, policy_version))

    def close(self) -> None:
        """Close this process's ends of the message queues and the version's pipes (the slot queues
        belong to :class:`Slots`)."""
        self.policy_version.close()
        for queue in (self.reports.episodes, self.reports.errors, self.reports.logs):
            queue.close()


NO_OWNER = -1


class Slots:
    """``num_slots`` shared-memory slots and their free/full index queues.

    Args:
        layout: the slot layout.
        num_slots: number of slots N.
        mp_context: the ``torch.multiprocessing`` context whose queues the processes share.

    Attributes:
        tensors: ``{key: [N, *spec_shape] tensor}`` in shared memory.
        owner: ``[N] int32`` shared tensor: the id of the actor holding each slot, or ``NO_OWNER``.
        free_queue, full_queue: :class:`IndexQueue` of slot indices.

    Raises:
        OSError: the queues cannot hold ``num_slots`` indices (validation refuses such sizes).
    """

    def __init__(self, layout: RolloutLayout, num_slots: int, mp_context):
        self.layout = layout
        self.num_slots = num_slots
        self.free_queue = IndexQueue(num_slots, mp_context)
        self.full_queue = IndexQueue(num_slots, mp_context)
        self.tensors = {
            key: torch.zeros((num_slots, *shape), dtype=dtype).share_memory_()
            for key, (shape, dtype) in layout.specs().items()
        }
        self.owner = torch.full((num_slots,), NO_OWNER, dtype=torch.int32).share_memory_()
        for index in range(num_slots):
            self.free_queue.put(index)

    def nbytes(self) -> int:
        """Bytes of shared memory held by the slots."""
        return self.layout.nbytes(self.num_slots)

    def gather(self, indices: Sequence[int], device: torch.device) -> dict[str, torch.Tensor]:
        """Copy the slots ``indices`` into a time-major batch on ``device``.

        Each key as :data:`distrl.rollout.KEYS` declares its rows: a row per step as contiguous
        ``[T+1, B, ...]``, the LSTM state as ``[1, B, H]`` (the layout ``nn.LSTM`` takes), a number per
        unroll (``policy_version``, ``env_id``) as ``[B]``. Each slot is one memcpy into a preallocated
        batch (pinned, then copied non-blocking, on CUDA); ``index_select`` is several times slower on
        uint8 images.
        """
        pin = device.type == "cuda"
        batch = {}
        for key, tensor in self.tensors.items():
            if declared(key).unroll_dim == 1:
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

"""What an actor process is given: :class:`ActorContext`, read by the actor loop
(:mod:`distrl.sampling.actor`) and its slot writer (:mod:`distrl.sampling.writer`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from distrl.intrinsic import ActorBonus
from distrl.sampling.slots import Channels


@dataclass(frozen=True)
class ActorEnvs:
    """The envs an actor steps.

    Attributes:
        env_cfg: the ``env`` config node as a plain dict, ``async_step`` resolved
            (:class:`distrl.config.placement.Placement`); no Hydra objects in children.
        num_envs: environments stepped by this actor.
        seed: seed of this actor's first environment (:func:`distrl.envs.env_seed`).
    """

    env_cfg: dict
    num_envs: int
    seed: int


@dataclass(frozen=True)
class Collection:
    """How an actor fills its slots.

    Attributes:
        num_steps: unroll length T.
        precision: the inference's arithmetic, ``fp32`` or ``bf16`` (:func:`distrl.nn.precision.autocast`);
            the stored behaviour logits and baselines are float32 either way.
        return_discount: with ``agent.normalize_rewards``, the discount of the return each env's
            ``discounted_return`` follows (``agent.discount``); None: not recorded.
        rollouts_per_update: synchronous collection (``train.sync``): after handing in this many
            rollouts of its envs (``batch_size / (num_actors x envs_per_actor)``: every env's share of
            a batch) the actor waits for the learner's update on them and acts the next rollout with
            the new weights (:meth:`distrl.sampling.writer.SlotWriter.await_new_weights`); 0:
            asynchronous collection, no waiting.
    """

    num_steps: int
    precision: str = "fp32"
    return_discount: float | None = None
    rollouts_per_update: int = 0


@dataclass
class ActorProcess:
    """The actor's process.

    Attributes:
        parent_pid: the trainer's pid; the actor exits when it is gone.
        log_level: logging level name for this process.
        cpu_affinity: the cores this process (and the env threads it starts) may run on, or None to
            leave it to the OS.
    """

    parent_pid: int
    log_level: str = "INFO"
    cpu_affinity: tuple[int, ...] | None = None


@dataclass
class ActorContext:
    """Everything an actor process needs, as picklable plain values and shared objects.

    Attributes:
        envs: the envs it steps (:class:`ActorEnvs`).
        collection: how it fills its slots (:class:`Collection`).
        model: the shared-memory actor copy of the network (``ActorCritic``).
        slot_tensors: the slots' shared tensors ({key: [num_slots, *spec_shape]}).
        channels: queues, stop event and policy version shared with the trainer.
        process: its process (:class:`ActorProcess`).
        bonus: an intrinsic bonus the actor computes for each observation (E3B's:
            :class:`distrl.intrinsic.ActorBonus`), or None.
    """

    envs: ActorEnvs
    collection: Collection
    model: Any
    slot_tensors: dict
    channels: Channels
    process: ActorProcess
    bonus: ActorBonus | None = None

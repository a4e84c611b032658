"""The actor process loop.

Each actor steps ``envs_per_actor`` environments with one batched forward
pass of the shared-memory actor model per step and writes each
environment's unroll into its own storage slot. It uses one torch thread,
never touches CUDA, ignores SIGINT, SIGTERM and SIGUSR1 (the trainer stops it through
``stop_event``), exits when its parent is gone, and returns the slots it
holds to the free queue on the way out.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import time
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from distrl.engine.pipes import PIPE_BUF, MessageQueue
from distrl.engine.storage import ACTED_KEYS, NO_OWNER, STEPPED_KEYS, RolloutStorage

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5


class SharedValue:
    """One number in shared memory, read and written without a lock (an aligned 8-byte word):
    the stop flag and the policy version. Unlike ``multiprocessing.Value``/``Event`` it has no
    named semaphore to leave behind or to be held by a killed process."""

    def __init__(self, value: int = 0):
        self.tensor = torch.tensor([value], dtype=torch.int64).share_memory_()

    @property
    def value(self) -> int:
        return int(self.tensor[0])

    @value.setter
    def value(self, value: int) -> None:
        self.tensor[0] = value

    def set(self) -> None:
        self.tensor[0] = 1

    def is_set(self) -> bool:
        return bool(self.tensor[0])


@dataclass
class Channels:
    """The shared objects between the trainer and its actors (:mod:`distrl.engine.pipes` queues and
    shared tensors only, so that a killed process leaves no lock held and nothing in /dev/shm).

    Attributes:
        free_queue, full_queue: slot index queues (those of the :class:`RolloutStorage`).
        owner: ``[N] int32``, the actor holding each slot (the storage's ``owner``).
        episode_queue: finished episodes as ``(actor_id, return, length)``.
        error_queue: an actor's exception as ``(actor_id, traceback text)``.
        stop_event: set by the trainer to stop every actor.
        policy_version: learner updates so far.
        heartbeat: ``[num_actors] float64``, each actor's last step as ``time.time()`` (0: none yet).
    """

    free_queue: Any
    full_queue: Any
    owner: torch.Tensor
    episode_queue: MessageQueue
    error_queue: MessageQueue
    stop_event: SharedValue
    policy_version: SharedValue
    heartbeat: torch.Tensor

    @classmethod
    def create(cls, storage: RolloutStorage, mp_context, num_actors: int, policy_version: int = 0) -> Channels:
        return cls(storage.free_queue, storage.full_queue, storage.owner, MessageQueue(mp_context),
                   MessageQueue(mp_context), SharedValue(0), SharedValue(policy_version),
                   torch.zeros(num_actors, dtype=torch.float64).share_memory_())

    def close(self) -> None:
        """Close this process's ends of the message queues (the slot queues belong to the storage)."""
        self.episode_queue.close()
        self.error_queue.close()


def env_seed(run_seed: int, actor_id: int, envs_per_actor: int, restart: int = 0, num_actors: int = 1) -> int:
    """Seed of an actor's first environment; its others take the next ones, so no two envs of a
    run share a seed (and evaluation seeds, :func:`distrl.engine.evaluator.eval_seed`, lie apart).
    The ``restart``-th restart of an actor seeds as if it were actor ``actor_id + restart x
    num_actors``: fresh seeds, none shared with another actor."""
    return run_seed * 100_003 + (actor_id + restart * num_actors) * envs_per_actor


@dataclass
class ActorContext:
    """Everything an actor process needs, as picklable plain values and shared objects.

    Attributes:
        env_cfg: the ``env`` config node as a plain dict, ``async_step`` resolved
            (:class:`distrl.engine.placement.Placement`); no Hydra objects in children.
        num_steps: unroll length T.
        num_envs: environments stepped by this actor.
        seed: seed of this actor's first environment (:func:`env_seed`).
        model: the shared-memory actor copy of the network (``ActorCritic``).
        buffers: the storages' shared tensors.
        channels: queues, stop event and policy version shared with the trainer.
        parent_pid: the trainer's pid; the actor exits when it is gone.
        log_level: logging level name for this process.
        log_file: a file this process also logs to (resolved by the parent: Hydra's
            logging setup does not reach spawned children), or None.
        cpu_affinity: the cores this process (and the env threads it starts) may run on, or
            None to leave it to the OS.
    """

    env_cfg: dict
    num_steps: int
    num_envs: int
    seed: int
    model: Any
    buffers: dict
    channels: Channels
    parent_pid: int
    log_level: str = "INFO"
    log_file: str | None = None
    cpu_affinity: tuple[int, ...] | None = None


def actor_contexts(cfg, placement, model, storage: RolloutStorage, channels: Channels,
                   log_file: str | None = None, log_level: str | None = None,
                   first_actor: int = 0) -> list[ActorContext]:
    """One :class:`ActorContext` per actor of a run: train config ``cfg`` placed by ``placement``.
    ``first_actor``: the run-wide id of this rank's first actor (its env seeds follow from it)."""
    return [
        ActorContext(
            env_cfg=placement.env_cfg, num_steps=cfg.num_steps, num_envs=placement.envs_per_actor,
            seed=env_seed(cfg.seed, first_actor + actor_id, placement.envs_per_actor), model=model,
            buffers=storage.buffers, channels=channels, parent_pid=os.getpid(),
            log_level=log_level or cfg.log_level, log_file=log_file, cpu_affinity=placement.actor_cores[actor_id],
        )
        for actor_id in range(placement.num_actors)
    ]


class _Stopped(Exception):
    pass


def pin_process(cores: tuple[int, ...] | None) -> None:
    """Restrict the calling thread, and every thread it starts later (ale-py's env threads), to
    ``cores`` (core ids); None leaves it to the OS. Call it first thing in a process."""
    if cores:
        os.sched_setaffinity(0, cores)


def run_actor(actor_id: int, ctx: ActorContext) -> None:
    """Process entry point: run :func:`act` and report any exception on the error queue.

    SIGINT, SIGTERM and SIGUSR1 are ignored (they are for the trainer, which stops actors in
    order through ``stop_event``; a terminal's Ctrl-C and a cluster's SIGTERM reach the whole
    process group)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    pin_process(ctx.cpu_affinity)
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if ctx.log_file:
        handlers.append(logging.FileHandler(ctx.log_file))
    logging.basicConfig(level=ctx.log_level, handlers=handlers,
                        format=f"[%(asctime)s][actor {actor_id}][%(levelname)s] - %(message)s")
    torch.set_num_threads(1)
    ch = ctx.channels
    held: list[int] = []
    try:
        act(actor_id, ctx, held)
    except _Stopped:
        pass
    except Exception:
        log.exception("actor %d failed", actor_id)
        # the end says what failed; a message must fit one atomic pipe write (PIPE_BUF bytes)
        trace = traceback.format_exc().encode()[-(PIPE_BUF // 2):].decode(errors="ignore")
        ch.error_queue.put((actor_id, trace))
        raise SystemExit(1) from None
    finally:
        for index in held:
            ch.owner[index] = NO_OWNER
            ch.free_queue.put(index)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def _should_stop(ctx: ActorContext) -> bool:
    return ctx.channels.stop_event.is_set() or os.getppid() != ctx.parent_pid


class _Stepper:
    """One interface over the two kinds of vector env: ``send`` actions for the envs of the
    last batch, ``recv`` the next batch as ``(env_ids, obs, reward, terminated, truncated, info)``.

    ale-py's ``AtariVectorEnv`` has real ``send``/``recv``: with ``batch_size = num_envs / 2``
    its thread steps one half of the envs while the actor runs inference on the other half.
    Gymnasium's synchronous vector env steps all envs in ``recv``.
    """

    def __init__(self, env, num_envs: int):
        self.env = env
        self.native = hasattr(env, "send") and hasattr(env, "recv")
        self.all_ids = np.arange(num_envs)
        self.actions = None

    def reset(self, seed: int):
        obs, info = self.env.reset(seed=seed)
        ids = np.asarray(info["env_id"], dtype=np.int64) if self.native else self.all_ids
        return ids, obs

    def send(self, actions: np.ndarray) -> None:
        if self.native:
            self.env.send(actions)
        else:
            self.actions = actions

    def recv(self):
        if self.native:
            obs, reward, terminated, truncated, info = self.env.recv()
            return np.asarray(info["env_id"], dtype=np.int64), obs, reward, terminated, truncated, info
        obs, reward, terminated, truncated, info = self.env.step(self.actions)
        return self.all_ids, obs, reward, terminated, truncated, info


class _EnvSlots:
    """Where each of an actor's ``n`` environments is in its slot, and the slots the actor holds.

    Attributes:
        slot: ``[n] int64``, each env's current slot, -1 before its first observation is acted on.
        row: ``[n] int64``, the row each env's next observation goes to (0..T).
        version: ``[n] int64``, the policy version each env's current slot started with.
        held: the slot indices this actor owns (returned to the free queue on any exit).
        stage: the small keys (every key but ``obs``) as local ``[n, T+1, ...]`` tensors, written a
            batch at a time and copied into the slots once per unroll.
    """

    def __init__(self, actor_id: int, ctx: ActorContext, held: list[int]):
        self.actor_id = actor_id
        self.ctx = ctx
        n = ctx.num_envs
        self.slot = np.full(n, -1, dtype=np.int64)
        self.row = np.zeros(n, dtype=np.int64)
        self.version = np.zeros(n, dtype=np.int64)
        self.held = held
        # Observations go straight into each env's shared slot (one memcpy per env and step).
        # Staging them too would stream every frame through memory twice and, with the larger
        # working set, evict the model's weights from the cache between forward passes.
        self.stage = {key: torch.zeros((n, *ctx.buffers[key].shape[1:]), dtype=ctx.buffers[key].dtype)
                      for key in (*ACTED_KEYS, *STEPPED_KEYS) if key != "obs"}

    def start(self, i: int, core_before: tuple) -> None:
        """Give env ``i`` a free slot whose row 0 is the row the env has just staged; with an LSTM
        core, the slot's initial state is the env's state before that row (``core_before``)."""
        ch = self.ctx.channels
        while True:
            if _should_stop(self.ctx):
                raise _Stopped
            try:
                slot = ch.free_queue.get(timeout=POLL_SECONDS)
                break
            except queue.Empty:
                continue
        ch.owner[slot] = self.actor_id
        self.held.append(slot)
        self.slot[i] = slot
        self.version[i] = ch.policy_version.value
        if core_before:
            self.ctx.buffers["core_h"][slot].copy_(core_before[0][:, i])
            self.ctx.buffers["core_c"][slot].copy_(core_before[1][:, i])

    def finish(self, envs: np.ndarray) -> None:
        """Copy the staged keys of ``envs`` (``[k] int64`` env indices at row T) into their slots,
        hand the slots to the learners, and move the last staged row to row 0 for the next slots."""
        slots = self.slot[envs]
        slots_t, envs_t = torch.from_numpy(slots), torch.from_numpy(envs)
        buf = self.ctx.buffers
        for key, value in self.stage.items():  # one indexed copy per key for all envs
            buf[key].index_copy_(0, slots_t, value.index_select(0, envs_t))
            value[envs_t, 0] = value[envs_t, -1]
        buf["policy_version"].index_copy_(0, slots_t, torch.from_numpy(self.version[envs]))
        for slot in slots.tolist():
            self.held.remove(slot)
            self.ctx.channels.owner[slot] = NO_OWNER
            self.ctx.channels.full_queue.put(slot)
        self.slot[envs] = -1
        self.row[envs] = 0
        if _should_stop(self.ctx):
            raise _Stopped

    def write_obs(self, envs: np.ndarray, obs: torch.Tensor) -> None:
        """``obs [k, *obs_shape]`` into each env's slot at its row: one memcpy each (an indexed
        put of uint8 images is many times slower)."""
        obs_slots = self.ctx.buffers["obs"]
        for j, (slot, t) in enumerate(zip(self.slot[envs].tolist(), self.row[envs].tolist(), strict=True)):
            obs_slots[slot, t].copy_(obs[j])

    def at(self, ids: np.ndarray) -> tuple:
        """Index of the (env, row) pairs of ``ids`` in a stage tensor: a slice and an int when the
        envs are consecutive and at the same row (the usual case, and much cheaper to write
        through), else two index tensors."""
        rows = self.row[ids]
        if (rows == rows[0]).all() and (ids[1:] - ids[:-1] == 1).all():
            return slice(int(ids[0]), int(ids[-1]) + 1), int(rows[0])
        return torch.from_numpy(ids), torch.from_numpy(rows)


class _Episodes:
    """Running return and length of each env's episode; finished ones go to the episode queue."""

    def __init__(self, actor_id: int, ctx: ActorContext):
        self.actor_id, self.queue = actor_id, ctx.channels.episode_queue
        self.total = np.zeros(ctx.num_envs, dtype=np.float64)
        self.length = np.zeros(ctx.num_envs, dtype=np.int64)

    def add(self, ids: np.ndarray, reward: np.ndarray, ended: np.ndarray) -> None:
        self.total[ids] += reward
        self.length[ids] += 1
        done = ids[ended]
        for i in done:
            self.queue.put((self.actor_id, float(self.total[i]), int(self.length[i])))
        self.total[done] = 0.0
        self.length[done] = 0


def act(actor_id: int, ctx: ActorContext, held: list[int]) -> None:
    """Fill storage slots with unrolls until stopped.

    Each step: run the model on the observations of a batch of envs (all of them, or half with
    async stepping), stage its output at each env's row and write the observation into the slot;
    hand in the slots that reached row T (their row T becomes the next slot's row 0); send the
    actions; receive the next batch and stage what the step gave (rewards, episode ends and,
    on truncation, the value of the final observation); advance the rows.

    ``held`` is kept equal to the slot indices this actor owns, so the caller can return them on
    any exit.
    """
    from omegaconf import OmegaConf

    from distrl.envs import make_vector_env

    env_cfg = OmegaConf.create(ctx.env_cfg)
    model, T = ctx.model, ctx.num_steps
    env = make_vector_env(env_cfg, ctx.num_envs, num_threads=1, async_step=bool(env_cfg.get("async_step", False)))
    stepper = _Stepper(env, ctx.num_envs)
    envs = _EnvSlots(actor_id, ctx, held)
    stage = envs.stage
    episodes = _Episodes(actor_id, ctx)
    core = model.initial_state(ctx.num_envs)
    core_before = core  # each env's LSTM state before its latest observation
    # the action each env was sent last, and the action and reward before its current observation
    sent = torch.zeros(ctx.num_envs, dtype=torch.int64)
    last_action = torch.zeros(ctx.num_envs, dtype=torch.int64)
    last_reward = torch.zeros(ctx.num_envs, dtype=torch.float32)
    try:
        ids, obs_np = stepper.reset(ctx.seed)
        first = torch.ones(len(ids), dtype=torch.bool)
        while True:
            ctx.channels.heartbeat[actor_id] = time.time()
            ids_t = torch.from_numpy(ids)
            obs = torch.from_numpy(np.asarray(obs_np))
            sub_core = tuple(c[:, ids_t] for c in core)
            prev_action, prev_reward = last_action[ids_t], last_reward[ids_t]
            out, new_core = model.act(obs, first, sub_core, False, prev_action, prev_reward)
            if core:
                core_before = tuple(b.index_copy(1, ids_t, c) for b, c in zip(core_before, sub_core, strict=True))
                core = tuple(c.index_copy(1, ids_t, nc) for c, nc in zip(core, new_core, strict=True))
            at = envs.at(ids)
            stage["first"][at] = first
            stage["last_action"][at] = prev_action
            stage["last_reward"][at] = prev_reward
            for key in ("action", "policy_logits", "baseline"):
                stage[key][at] = out[key]
            for i in ids[envs.slot[ids] < 0].tolist():  # each env's first observation
                envs.start(i, core_before)
            envs.write_obs(ids, obs)
            at_end = np.flatnonzero(envs.row[ids] == T)
            if len(at_end):
                full = ids[at_end]
                envs.finish(full)
                for i in full.tolist():
                    envs.start(i, core_before)
                envs.write_obs(full, obs[at_end])  # row 0 repeats row T
            stepper.send(out["action"].numpy())
            sent[ids_t] = out["action"]

            ids, obs_np, reward, terminated, truncated, info = stepper.recv()
            if (envs.slot[ids] < 0).any():  # with async stepping, the other half's reset observations
                first = torch.ones(len(ids), dtype=torch.bool)
                continue
            at = envs.at(ids)
            ids_t = torch.from_numpy(ids)
            reward_t = torch.from_numpy(np.asarray(reward, dtype=np.float32))
            stage["reward"][at] = reward_t
            stage["terminated"][at] = torch.from_numpy(terminated)
            stage["truncated"][at] = torch.from_numpy(truncated)
            stage["truncation_value"][at] = 0.0
            last_action[ids_t] = sent[ids_t]
            last_reward[ids_t] = reward_t
            if truncated.any():
                _stage_truncation_values(model, stage, envs, ids[truncated], core, info, truncated,
                                         last_action, last_reward)
            ended = terminated | truncated
            first = torch.from_numpy(ended)
            last_action[ids_t[first]] = 0  # a new episode starts with nothing before it
            last_reward[ids_t[first]] = 0.0
            episodes.add(ids, reward, ended)
            envs.row[ids] += 1
    finally:
        env.close()


def _stage_truncation_values(model, stage: dict, envs: _EnvSlots, cut: np.ndarray, core: tuple, info: dict,
                             truncated: np.ndarray, last_action: torch.Tensor, last_reward: torch.Tensor) -> None:
    """For envs ``cut`` whose episode hit its time limit: the behaviour baseline of the final
    observation, which V-trace bootstraps from instead of the next episode's first state
    (``last_action``/``last_reward``: ``[num_envs]``, what came before that observation)."""
    from distrl.envs import final_observations

    cut_t = torch.from_numpy(cut)
    final = torch.from_numpy(np.asarray(final_observations(info, truncated)))
    no_reset = torch.zeros(len(cut), dtype=torch.bool)
    values = model.act(final, no_reset, tuple(c[:, cut_t] for c in core), False,
                       last_action[cut_t], last_reward[cut_t])[0]["baseline"]
    stage["truncation_value"][cut_t, torch.from_numpy(envs.row[cut])] = values

"""The actor process loop.

Each actor steps ``envs_per_actor`` environments with one batched forward
pass of the shared-memory actor model per step and writes each
environment's unroll into its own storage slot. It uses one torch thread,
never touches CUDA, ignores SIGINT (the trainer stops it through
``stop_event``), exits when its parent is gone, and returns the slots it
holds to the free queue on the way out.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from distrl.engine.storage import PER_SLOT_KEYS

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5


@dataclass
class ActorContext:
    """Everything an actor process needs, as picklable plain values and shared objects.

    Attributes:
        env_cfg: the ``env`` config node as a plain dict (no Hydra objects in children).
        num_steps: unroll length T.
        num_envs: environments stepped by this actor.
        seed: seed of this actor's first environment; the others take the next ones.
        model: the shared-memory actor copy of the network (``ActorCritic``).
        buffers: the storages' shared tensors.
        free_queue, full_queue: slot index queues.
        episode_queue: where finished episodes go as ``(actor_id, return, length)``.
        error_queue: where an exception goes as ``(actor_id, traceback text)``.
        stop_event: set by the trainer to stop.
        policy_version: shared counter of learner updates.
        parent_pid: the trainer's pid; the actor exits when it is gone.
        log_level: logging level name for this process.
        log_file: a file this process also logs to (resolved by the parent: Hydra's
            logging setup does not reach spawned children), or None.
        cpu_affinity: the cores this process (and the env threads it starts) may run on, or
            None to leave it to the OS (``distrl.config.actor_cpu_affinity``).
    """

    env_cfg: dict
    num_steps: int
    num_envs: int
    seed: int
    model: Any
    buffers: dict
    free_queue: Any
    full_queue: Any
    episode_queue: Any
    error_queue: Any
    stop_event: Any
    policy_version: Any
    parent_pid: int
    log_level: str = "INFO"
    log_file: str | None = None
    cpu_affinity: tuple[int, ...] | None = None


class _Stopped(Exception):
    pass


def pin_process(cores: tuple[int, ...] | None) -> None:
    """Restrict the calling thread, and every thread it starts later (ale-py's env threads), to
    ``cores`` (core ids); None leaves it to the OS. Call it first thing in a process."""
    if cores:
        os.sched_setaffinity(0, cores)


def run_actor(actor_id: int, ctx: ActorContext) -> None:
    """Process entry point: run :func:`act` and report any exception on ``error_queue``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pin_process(ctx.cpu_affinity)
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if ctx.log_file:
        handlers.append(logging.FileHandler(ctx.log_file))
    logging.basicConfig(level=ctx.log_level, handlers=handlers,
                        format=f"[%(asctime)s][actor {actor_id}][%(levelname)s] - %(message)s")
    torch.set_num_threads(1)
    held: list[int] = []
    try:
        act(actor_id, ctx, held)
    except _Stopped:
        pass
    except Exception:
        log.exception("actor %d failed", actor_id)
        ctx.error_queue.put((actor_id, traceback.format_exc()))
        raise SystemExit(1) from None
    finally:
        orphaned = os.getppid() != ctx.parent_pid
        for index in held:
            ctx.free_queue.put(index)
        for q in (ctx.free_queue, ctx.full_queue, ctx.episode_queue, ctx.error_queue):
            q.close()
            if orphaned:  # nobody reads any more: never block on a full pipe
                q.cancel_join_thread()
            else:
                q.join_thread()


def _should_stop(ctx: ActorContext) -> bool:
    return ctx.stop_event.is_set() or os.getppid() != ctx.parent_pid


def _take_slot(ctx: ActorContext) -> int:
    while True:
        if _should_stop(ctx):
            raise _Stopped
        try:
            return ctx.free_queue.get(timeout=POLL_SECONDS)
        except queue.Empty:
            continue


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


def act(actor_id: int, ctx: ActorContext, held: list[int]) -> None:
    """Fill storage slots with unrolls until stopped.

    Each environment has its own slot and row counter; a batch of environments
    (all of them, or half with ``env.async_step``) is stepped, its rewards and
    episode ends written to the current rows, the model run on the new
    observations, and their rows advanced. An environment whose slot reaches
    row T hands it to the learners and starts the next slot with that row.

    ``held`` is kept equal to the slot indices this actor owns, so the caller
    can return them on any exit.
    """
    from omegaconf import OmegaConf

    from distrl.envs import final_observations, make_vector_env

    env_cfg = OmegaConf.create(ctx.env_cfg)
    n, T, model, buf = ctx.num_envs, ctx.num_steps, ctx.model, ctx.buffers
    # resolved by the trainer (distrl.config.actor_env_config): true only where it can happen
    env = make_vector_env(env_cfg, n, num_threads=1, async_step=bool(env_cfg.get("async_step", False)))
    stepper = _Stepper(env, n)
    # Observations go straight into each env's shared slot (one memcpy per env and step). The
    # small keys are staged in local [n, T+1, ...] tensors, written a batch at a time, and
    # copied into the slot once per unroll. Staging the observations too would stream every
    # frame through memory twice and, with the larger working set, evict the model's weights
    # from the cache between forward passes.
    obs_slots = buf["obs"]
    stage = {key: torch.zeros((n, *value.shape[1:]), dtype=value.dtype)
             for key, value in buf.items() if key not in PER_SLOT_KEYS and key != "obs"}
    row = np.zeros(n, dtype=np.int64)
    slot_of = np.full(n, -1, dtype=np.int64)  # -1 until the env's first observation is acted on
    version_of = np.zeros(n, dtype=np.int64)
    core = model.initial_state(n)
    core_before = core  # LSTM state before each env's latest observation
    episode_return = np.zeros(n, dtype=np.float64)
    episode_length = np.zeros(n, dtype=np.int64)
    try:
        ids, obs_np = stepper.reset(ctx.seed)
        first = torch.ones(len(ids), dtype=torch.bool)
        while True:
            ids_t = torch.from_numpy(ids)
            obs = torch.from_numpy(np.asarray(obs_np))
            sub_core = tuple(c[:, ids_t] for c in core)
            out, new_core = model.act(obs, first, sub_core)
            if core:
                core_before = tuple(b.index_copy(1, ids_t, c) for b, c in zip(core_before, sub_core, strict=True))
                core = tuple(c.index_copy(1, ids_t, nc) for c, nc in zip(core, new_core, strict=True))
            rows = row[ids]
            _stage_row(stage, _at(ids, rows), first, out)
            for i in ids[slot_of[ids] < 0].tolist():  # each env's first observation
                _start_slot(ctx, held, slot_of, version_of, core_before, i)
            _write_obs(obs_slots, slot_of[ids], rows, obs)
            at_end = np.flatnonzero(rows == T)
            if len(at_end):
                done = ids[at_end]
                _finish_slots(ctx, held, stage, slot_of, version_of, done)
                row[done] = 0
                for i in done.tolist():
                    _start_slot(ctx, held, slot_of, version_of, core_before, i)
                _write_obs(obs_slots, slot_of[done], row[done], obs[at_end])  # row 0 repeats row T
            stepper.send(out["action"].numpy())

            ids, obs_np, reward, terminated, truncated, info = stepper.recv()
            if (slot_of[ids] < 0).any():  # with async_step, the other half's reset observations
                first = torch.ones(len(ids), dtype=torch.bool)
                continue
            at = _at(ids, row[ids])
            ended = terminated | truncated
            stage["reward"][at] = torch.from_numpy(np.asarray(reward, dtype=np.float32))
            stage["terminated"][at] = torch.from_numpy(terminated)
            stage["truncated"][at] = torch.from_numpy(truncated)
            stage["truncation_value"][at] = 0.0
            if truncated.any():
                cut = ids[truncated]
                cut_t = torch.from_numpy(cut)
                final = torch.from_numpy(np.asarray(final_observations(info, truncated)))
                final_core = tuple(c[:, cut_t] for c in core)
                no_reset = torch.zeros(len(cut), dtype=torch.bool)
                values = model.act(final, no_reset, final_core)[0]["baseline"]
                stage["truncation_value"][cut_t, torch.from_numpy(row[cut])] = values

            episode_return[ids] += reward
            episode_length[ids] += 1
            ended_ids = ids[ended]
            for i in ended_ids:
                ctx.episode_queue.put((actor_id, float(episode_return[i]), int(episode_length[i])))
            episode_return[ended_ids] = 0.0
            episode_length[ended_ids] = 0
            row[ids] += 1
            first = torch.from_numpy(ended)
    finally:
        env.close()


def _start_slot(ctx, held, slot_of, version_of, core_before, i: int) -> None:
    """Give env ``i`` a free slot whose row 0 is the row the env has just staged."""
    slot = _take_slot(ctx)
    held.append(slot)
    slot_of[i] = slot
    version_of[i] = ctx.policy_version.value
    if core_before:
        ctx.buffers["core_h"][slot].copy_(core_before[0][:, i])
        ctx.buffers["core_c"][slot].copy_(core_before[1][:, i])


def _finish_slots(ctx, held, stage, slot_of, version_of, envs: np.ndarray) -> None:
    """Copy the staged keys of ``envs`` (``[k] int64`` env indices whose slots are at row T)
    into their slots, hand the slots to the learners and move the last staged row to row 0
    for the next slots."""
    slots = slot_of[envs]
    slots_t, envs_t = torch.from_numpy(slots), torch.from_numpy(envs)
    buf = ctx.buffers
    for key, value in stage.items():  # small keys: one indexed copy per key for all envs
        buf[key].index_copy_(0, slots_t, value.index_select(0, envs_t))
        value[envs_t, 0] = value[envs_t, -1]
    buf["policy_version"].index_copy_(0, slots_t, torch.from_numpy(version_of[envs]))
    for slot in slots.tolist():
        held.remove(slot)
        ctx.full_queue.put(slot)
    slot_of[envs] = -1
    if _should_stop(ctx):
        raise _Stopped


def _write_obs(obs_slots: torch.Tensor, slots: np.ndarray, rows: np.ndarray, obs: torch.Tensor) -> None:
    """``obs_slots[slots[j], rows[j]] = obs[j]`` for the storage's ``[S, T+1, *obs_shape]``
    observations, ``slots``/``rows`` ``[k] int64`` and ``obs [k, *obs_shape]``: one memcpy each
    (an indexed put of uint8 images is many times slower)."""
    for j, (slot, t) in enumerate(zip(slots.tolist(), rows.tolist(), strict=True)):
        obs_slots[slot, t].copy_(obs[j])


def _at(ids: np.ndarray, rows: np.ndarray) -> tuple:
    """Index of the (env, row) pairs in a ``[n, T+1, ...]`` stage tensor: a slice and an int when
    the envs are consecutive and at the same row (the usual case, and much cheaper to write
    through), else two index tensors."""
    if (rows == rows[0]).all() and (ids[1:] - ids[:-1] == 1).all():
        return slice(int(ids[0]), int(ids[-1]) + 1), int(rows[0])
    return torch.from_numpy(ids), torch.from_numpy(rows)


def _stage_row(stage: dict, at: tuple, first, out) -> None:
    stage["first"][at] = first
    stage["action"][at] = out["action"]
    stage["policy_logits"][at] = out["policy_logits"]
    stage["baseline"][at] = out["baseline"]

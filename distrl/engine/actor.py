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


class _Stopped(Exception):
    pass


def run_actor(actor_id: int, ctx: ActorContext) -> None:
    """Process entry point: run :func:`act` and report any exception on ``error_queue``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
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


def _take_slots(ctx: ActorContext, held: list[int]) -> torch.Tensor:
    while len(held) < ctx.num_envs:
        if _should_stop(ctx):
            raise _Stopped
        try:
            held.append(ctx.free_queue.get(timeout=POLL_SECONDS))
        except queue.Empty:
            continue
    return torch.as_tensor(held, dtype=torch.int64)


def act(actor_id: int, ctx: ActorContext, held: list[int]) -> None:
    """Fill storage slots with unrolls until stopped.

    ``held`` is kept equal to the slot indices this actor owns, so the caller
    can return them on any exit.
    """
    from omegaconf import OmegaConf

    from distrl.envs import final_observations, make_vector_env

    env_cfg = OmegaConf.create(ctx.env_cfg)
    n, T, model, buf = ctx.num_envs, ctx.num_steps, ctx.model, ctx.buffers
    env = make_vector_env(env_cfg, n, num_threads=1)
    try:
        obs_np, _ = env.reset(seed=ctx.seed)
        obs = torch.from_numpy(np.asarray(obs_np))
        first = torch.ones(n, dtype=torch.bool)
        core = model.initial_state(n)
        core_before = core
        out, core = model.act(obs, first, core)
        episode_return = np.zeros(n, dtype=np.float64)
        episode_length = np.zeros(n, dtype=np.int64)
        # The unroll is staged in local [n, T+1, ...] tensors (plain slice writes each step),
        # then copied into the shared slots once per unroll.
        stage = {key: torch.zeros((n, *buf[key].shape[1:]), dtype=buf[key].dtype) for key in TIME_KEYS}

        while True:
            slots = _take_slots(ctx, held)
            version = ctx.policy_version.value
            if core_before:
                buf["core_h"].index_copy_(0, slots, core_before[0].transpose(0, 1))
                buf["core_c"].index_copy_(0, slots, core_before[1].transpose(0, 1))
            _stage_row(stage, 0, obs, first, out)
            for t in range(T):
                obs_np, reward, terminated, truncated, info = env.step(out["action"].numpy())
                ended = terminated | truncated
                stage["reward"][:, t] = torch.from_numpy(np.asarray(reward, dtype=np.float32))
                stage["terminated"][:, t] = torch.from_numpy(terminated)
                stage["truncated"][:, t] = torch.from_numpy(truncated)
                stage["truncation_value"][:, t] = 0.0
                if truncated.any():
                    index = np.flatnonzero(truncated)
                    final = torch.from_numpy(np.asarray(final_observations(info, truncated)))
                    sub_core = tuple(s[:, index] for s in core)
                    no_reset = torch.zeros(len(index), dtype=torch.bool)
                    values = model.act(final, no_reset, sub_core)[0]["baseline"]
                    stage["truncation_value"][torch.from_numpy(index), t] = values

                episode_return += reward
                episode_length += 1
                for i in np.flatnonzero(ended):
                    ctx.episode_queue.put((actor_id, float(episode_return[i]), int(episode_length[i])))
                episode_return[ended] = 0.0
                episode_length[ended] = 0

                obs = torch.from_numpy(np.asarray(obs_np))
                first = torch.from_numpy(ended)
                core_before = core
                out, core = model.act(obs, first, core)
                _stage_row(stage, t + 1, obs, first, out)
            for key, value in stage.items():  # per-slot memcpy: index_copy_ is ~15x slower on uint8
                for i, slot in enumerate(held):
                    buf[key][slot].copy_(value[i])
            buf["policy_version"][slots] = version
            for index in held:
                ctx.full_queue.put(index)
            held.clear()
            if _should_stop(ctx):
                raise _Stopped
    finally:
        env.close()


TIME_KEYS = ("obs", "first", "action", "policy_logits", "baseline", "reward", "terminated", "truncated",
             "truncation_value")


def _stage_row(stage: dict, t: int, obs, first, out) -> None:
    stage["obs"][:, t] = obs
    stage["first"][:, t] = first
    stage["action"][:, t] = out["action"]
    stage["policy_logits"][:, t] = out["policy_logits"]
    stage["baseline"][:, t] = out["baseline"]

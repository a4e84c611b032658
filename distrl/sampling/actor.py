"""The actor process: step envs with the behaviour policy and fill rollout slots (step 3 of
:mod:`distrl.sampling`).

Each actor steps ``envs_per_actor`` environments with one batched forward pass of the shared-memory
actor copy of the network per step (:func:`distrl.sampling.policy.step_policy`) and writes each
environment's unroll into its own slots. It uses one torch thread, never touches CUDA,
ignores SIGINT, SIGTERM and SIGUSR1 (the trainer stops it through ``stop_event``), exits when its
parent is gone, and returns the slots it holds to the free queue on the way out. Its log records go
to the trainer through a queue (:mod:`distrl.sampling.logs`).
"""

from __future__ import annotations

import logging
import os
import signal
import time
import traceback

import numpy as np
import torch

from distrl.envs import clips_actions, env_seed, make_vector_env
from distrl.intrinsic import ActorBonus
from distrl.rollout import BEHAVIOUR_PREACTIVATIONS
from distrl.sampling.context import ActorContext, ActorEnvs, ActorProcess, Collection
from distrl.sampling.logs import log_to_queue
from distrl.sampling.policy import AgentState, final_values, step_policy
from distrl.sampling.queues import PIPE_BUF
from distrl.sampling.slots import NO_OWNER, Channels, Slots
from distrl.sampling.stepper import VectorStepper, final_observations
from distrl.sampling.writer import Episodes, SlotWriter, Stopped

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def actor_contexts(cfg, placement, model, slots: Slots, channels: Channels,
                   log_level: str | None = None, first_actor: int = 0,
                   bonus: ActorBonus | None = None) -> list[ActorContext]:
    """One :class:`ActorContext` per actor of a run: train config ``cfg`` placed by ``placement``.
    ``first_actor``: the run-wide id of this rank's first actor (its env seeds follow from it);
    ``bonus``: the actors' part of an intrinsic reward computed in the actors (E3B's), or None."""
    collection = Collection(
        cfg.num_steps, placement.actors.precision,
        float(cfg.agent.discount) if cfg.agent.get("normalize_rewards", False) else None,
        cfg.batch_size // placement.stepping if cfg.train.get("sync", False) else 0)
    return [
        ActorContext(
            ActorEnvs(placement.actors.env_cfg, placement.actors.envs_per_actor,
                      env_seed(cfg.seed, first_actor + actor_id, placement.actors.envs_per_actor)),
            collection, model, slots.tensors, channels,
            ActorProcess(os.getpid(), log_level or cfg.log_level, placement.actors.cores[actor_id]), bonus,
        )
        for actor_id in range(placement.actors.count)
    ]


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
    pin_process(ctx.process.cpu_affinity)
    ch = ctx.channels
    log_to_queue(ch.reports.logs, ctx.process.log_level, actor=actor_id)
    torch.set_num_threads(1)
    held: list[int] = []
    try:
        act(actor_id, ctx, held)
    except Stopped:
        pass
    except Exception:
        log.exception("actor %d failed", actor_id)
        # the end says what failed; a message must fit one atomic pipe write (PIPE_BUF bytes)
        trace = traceback.format_exc().encode()[-(PIPE_BUF // 2):].decode(errors="ignore")
        ch.reports.errors.put((actor_id, trace))
        raise SystemExit(1) from None
    finally:
        for index in held:
            ch.owner[index] = NO_OWNER
            ch.free_queue.put(index)


def _should_stop(ctx: ActorContext) -> bool:
    return ctx.channels.stop_event.is_set() or os.getppid() != ctx.process.parent_pid


def act(actor_id: int, ctx: ActorContext, held: list[int]) -> None:
    """Fill slots with unrolls until stopped.

    Each step: the policy acts on a batch of envs (all of them, or half with async stepping); what
    it saw and did is written at each env's row (:meth:`SlotWriter.write_acted`, which hands in the
    slots that reached row T); the actions go to the envs; what the envs gave back is written at the
    same rows (:meth:`SlotWriter.write_stepped`) and the rows advance. With synchronous collection
    (``train.sync``), a step that handed in the envs' last rollouts of a batch waits for the learner's
    update on them and acts again with the new weights: that step is row 0 of the next slots, so every
    step of a batch is acted with the weights of the update before it (policy lag 0).

    ``held`` is kept equal to the slot indices this actor owns, so the caller can return them on
    any exit.
    """
    from omegaconf import OmegaConf

    env_cfg, num_envs, precision = OmegaConf.create(ctx.envs.env_cfg), ctx.envs.num_envs, ctx.collection.precision
    model = ctx.model
    preactivations = BEHAVIOUR_PREACTIVATIONS in ctx.slot_tensors  # PFO's anchor, stored where the slots hold it
    env = VectorStepper(make_vector_env(env_cfg, num_envs, num_threads=1,
                                        async_step=bool(env_cfg.get("async_step", False))), num_envs)
    writer = SlotWriter(actor_id, ctx, held, lambda: _should_stop(ctx))
    episodes = Episodes(actor_id, ctx)
    state = AgentState(model, num_envs)
    space, clip = model.action_space, clips_actions(env_cfg)
    bonus = ctx.bonus.start(num_envs) if ctx.bonus is not None else None
    try:
        ids, obs = env.reset(ctx.envs.seed)
        while True:
            if _should_stop(ctx):  # at once, not at the slots' end (a slow env's rollout)
                raise Stopped
            ctx.channels.reports.heartbeat[actor_id] = time.time()
            ids_t, obs_t = torch.from_numpy(ids), torch.from_numpy(np.asarray(obs))
            out, seen = step_policy(model, obs_t, state, ids_t, precision=precision, preactivations=preactivations)
            if bonus is not None:
                out["intrinsic_bonus"] = bonus(obs_t, seen.first, ids_t)
            if writer.write_acted(ids, obs_t, out, seen) and writer.update_due():  # act again, updated
                writer.await_new_weights(ids)
                state.restore_core(ids_t, seen.core)
                out = {**out, **step_policy(model, obs_t, state, ids_t, precision=precision,
                                            preactivations=preactivations)[0]}
                writer.restage(ids, out)
            env.send(space.to_env(out["action"], clip))  # clipped with env.clip_actions; the sample is stored

            ids, obs, reward, terminated, truncated, info = env.recv()
            if writer.waiting_for_first_step(ids):  # async stepping: the other half's reset observations
                continue
            ids_t = torch.from_numpy(ids)
            actions, rewards = writer.actions(ids), torch.from_numpy(np.asarray(reward, dtype=np.float32))
            values = None
            if truncated.any():
                cut = torch.from_numpy(np.flatnonzero(truncated))
                values = final_values(model, _final_obs(info, truncated), state, ids_t[cut], actions[cut],
                                      rewards[cut], precision)
            writer.write_stepped(ids, rewards, terminated, truncated, values)
            ended = terminated | truncated
            state.after_env_step(actions, rewards, ended, ids_t)
            episodes.add(ids, reward, ended)
            writer.advance(ids)
    finally:
        env.close()


def _final_obs(info: dict, truncated: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(final_observations(info, truncated)))

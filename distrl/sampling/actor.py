"""The actor process: step envs with the behaviour policy and fill rollout slots (step 3 of
:mod:`distrl.sampling`).

Each actor steps ``envs_per_actor`` environments with one batched forward pass of the shared-memory
actor copy of the network per step (:func:`distrl.sampling.policy.step_policy`) and writes each
environment's unroll into its own slots slot. It uses one torch thread, never touches CUDA,
ignores SIGINT, SIGTERM and SIGUSR1 (the trainer stops it through ``stop_event``), exits when its
parent is gone, and returns the slots it holds to the free queue on the way out. Its log records go
to the trainer through a queue (:mod:`distrl.sampling.logs`).
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

from distrl.envs import env_seed, make_vector_env
from distrl.intrinsic import ActorBonus
from distrl.rollout import ACTED_KEYS, STEPPED_KEYS
from distrl.sampling.logs import log_to_queue
from distrl.sampling.policy import AgentState, StepInputs, final_values, step_policy
from distrl.sampling.queues import PIPE_BUF
from distrl.sampling.slots import NO_OWNER, Channels, Slots
from distrl.sampling.stepper import VectorStepper, final_observations

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


@dataclass
class ActorContext:
    """Everything an actor process needs, as picklable plain values and shared objects.

    Attributes:
        env_cfg: the ``env`` config node as a plain dict, ``async_step`` resolved
            (:class:`distrl.config.placement.Placement`); no Hydra objects in children.
        num_steps: unroll length T.
        num_envs: environments stepped by this actor.
        seed: seed of this actor's first environment (:func:`distrl.envs.env_seed`).
        model: the shared-memory actor copy of the network (``ActorCritic``).
        buffers: the storages' shared tensors.
        channels: queues, stop event and policy version shared with the trainer.
        parent_pid: the trainer's pid; the actor exits when it is gone.
        log_level: logging level name for this process.
        cpu_affinity: the cores this process (and the env threads it starts) may run on, or
            None to leave it to the OS.
        precision: the inference's arithmetic, ``fp32`` or ``bf16`` (:func:`distrl.nn.precision.autocast`);
            the stored behaviour logits and baselines are float32 either way.
        bonus: an intrinsic bonus the actor computes for each observation (E3B's:
            :class:`distrl.intrinsic.ActorBonus`), or None.
        return_discount: with ``agent.normalize_returns``, the discount of the return each env's
            ``discounted_return`` follows (``agent.discount``); None: not recorded.
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
    cpu_affinity: tuple[int, ...] | None = None
    precision: str = "fp32"
    bonus: ActorBonus | None = None
    return_discount: float | None = None


def actor_contexts(cfg, placement, model, slots: Slots, channels: Channels,
                   log_level: str | None = None, first_actor: int = 0,
                   bonus: ActorBonus | None = None) -> list[ActorContext]:
    """One :class:`ActorContext` per actor of a run: train config ``cfg`` placed by ``placement``.
    ``first_actor``: the run-wide id of this rank's first actor (its env seeds follow from it);
    ``bonus``: the actors' part of an intrinsic reward computed in the actors (E3B's), or None."""
    return [
        ActorContext(
            env_cfg=placement.env_cfg, num_steps=cfg.num_steps, num_envs=placement.envs_per_actor,
            seed=env_seed(cfg.seed, first_actor + actor_id, placement.envs_per_actor), model=model,
            buffers=slots.buffers, channels=channels, parent_pid=os.getpid(),
            log_level=log_level or cfg.log_level, cpu_affinity=placement.actor_cores[actor_id],
            precision=placement.actor_precision, bonus=bonus,
            return_discount=float(cfg.agent.discount) if cfg.agent.get("normalize_returns", False) else None,
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
    ch = ctx.channels
    log_to_queue(ch.log_queue, ctx.log_level, actor=actor_id)
    torch.set_num_threads(1)
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


def _should_stop(ctx: ActorContext) -> bool:
    return ctx.channels.stop_event.is_set() or os.getppid() != ctx.parent_pid


def act(actor_id: int, ctx: ActorContext, held: list[int]) -> None:
    """Fill slots slots with unrolls until stopped.

    Each step: the policy acts on a batch of envs (all of them, or half with async stepping); what
    it saw and did is written at each env's row (:meth:`SlotWriter.write_acted`, which hands in the
    slots that reached row T); the actions go to the envs; what the envs gave back is written at the
    same rows (:meth:`SlotWriter.write_stepped`) and the rows advance.

    ``held`` is kept equal to the slot indices this actor owns, so the caller can return them on
    any exit.
    """
    from omegaconf import OmegaConf

    env_cfg = OmegaConf.create(ctx.env_cfg)
    model = ctx.model
    env = VectorStepper(make_vector_env(env_cfg, ctx.num_envs, num_threads=1,
                                        async_step=bool(env_cfg.get("async_step", False))), ctx.num_envs)
    slots = SlotWriter(actor_id, ctx, held)
    episodes = _Episodes(actor_id, ctx)
    state = AgentState(model, ctx.num_envs)
    space = model.action_space
    bonus = ctx.bonus.start(ctx.num_envs) if ctx.bonus is not None else None
    try:
        ids, obs = env.reset(ctx.seed)
        while True:
            ctx.channels.heartbeat[actor_id] = time.time()
            ids_t, obs_t = torch.from_numpy(ids), torch.from_numpy(np.asarray(obs))
            out, seen = step_policy(model, obs_t, state, ids_t, precision=ctx.precision)
            if bonus is not None:
                out["intrinsic_bonus"] = bonus(obs_t, seen.first, ids_t)
            slots.write_acted(ids, obs_t, out, seen)
            env.send(space.to_env(out["action"]))  # a Box's sample clipped to its bounds; the sample is stored

            ids, obs, reward, terminated, truncated, info = env.recv()
            if slots.waiting_for_first_step(ids):  # async stepping: the other half's reset observations
                continue
            ids_t = torch.from_numpy(ids)
            actions, rewards = slots.actions(ids), torch.from_numpy(np.asarray(reward, dtype=np.float32))
            values = None
            if truncated.any():
                cut = torch.from_numpy(np.flatnonzero(truncated))
                values = final_values(model, _final_obs(info, truncated), state, ids_t[cut], actions[cut],
                                      rewards[cut], ctx.precision)
            slots.write_stepped(ids, rewards, terminated, truncated, values)
            ended = terminated | truncated
            state.after_env_step(actions, rewards, ended, ids_t)
            episodes.add(ids, reward, ended)
            slots.advance(ids)
    finally:
        env.close()


def _final_obs(info: dict, truncated: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(final_observations(info, truncated)))


class SlotWriter:
    """Writes an actor's envs' unrolls into slots: where each env is in its slot, and the slots the
    actor holds.

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
        self.T = ctx.num_steps
        n = ctx.num_envs
        self.slot = np.full(n, -1, dtype=np.int64)
        self.row = np.zeros(n, dtype=np.int64)
        self.version = np.zeros(n, dtype=np.int64)
        self.held = held
        # each env's discounted return so far (agent.normalize_returns), restarted at episode ends
        self.discounted_return = np.zeros(n, dtype=np.float64) if ctx.return_discount is not None else None
        # Observations go straight into each env's shared slot (one memcpy per env and step).
        # Staging them too would stream every frame through memory twice and, with the larger
        # working set, evict the model's weights from the cache between forward passes.
        self.stage = {key: torch.zeros((n, *ctx.buffers[key].shape[1:]), dtype=ctx.buffers[key].dtype)
                      for key in (*ACTED_KEYS, *STEPPED_KEYS) if key != "obs" and key in ctx.buffers}

    def write_acted(self, ids: np.ndarray, obs: torch.Tensor, out: dict, seen: StepInputs) -> None:
        """Row ``t`` of envs ``ids`` (``[k] int64``): the observation ``obs [k, ...]``, what the
        policy saw besides it and what it did. An env's first observation takes it a slot; an env at
        row T hands its slot to the learners and starts the next one with this row as row 0."""
        at = self._at(ids)
        stage = self.stage
        stage["first"][at] = seen.first
        stage["last_action"][at] = seen.last_action
        stage["last_reward"][at] = seen.last_reward
        for key in ("action", "policy_params", "baseline", "intrinsic_bonus"):
            if key in stage:
                stage[key][at] = out[key]
        for j in np.flatnonzero(self.slot[ids] < 0).tolist():  # each env's first observation
            self._start(int(ids[j]), seen.core, j)
        self._write_obs(ids, obs)
        at_end = np.flatnonzero(self.row[ids] == self.T)
        if len(at_end):
            full = ids[at_end]
            self._finish(full)
            for j in at_end.tolist():
                self._start(int(ids[j]), seen.core, j)
            self._write_obs(full, obs[at_end])  # row 0 repeats row T

    def actions(self, ids: np.ndarray) -> torch.Tensor:
        """``[k, *action_shape]``: the actions just sampled for envs ``ids`` (staged at their current row)."""
        return self.stage["action"][torch.from_numpy(ids), torch.from_numpy(self.row[ids])]

    def waiting_for_first_step(self, ids: np.ndarray) -> bool:
        """Whether envs ``ids`` have not been acted on yet (with async stepping, the second half's
        reset observations arrive after the first half was sent its actions)."""
        return bool((self.slot[ids] < 0).any())

    def write_stepped(self, ids: np.ndarray, rewards: torch.Tensor, terminated: np.ndarray,
                      truncated: np.ndarray, truncation_values: torch.Tensor | None) -> None:
        """What stepping envs ``ids`` gave, at their current row: ``rewards [k]``, episode ends and,
        for the envs cut by a time limit (``truncated``), the value of their final observation."""
        at = self._at(ids)
        stage = self.stage
        stage["reward"][at] = rewards
        stage["terminated"][at] = torch.from_numpy(terminated)
        stage["truncated"][at] = torch.from_numpy(truncated)
        stage["truncation_value"][at] = 0.0
        if self.discounted_return is not None:
            returns = self.discounted_return
            returns[ids] = returns[ids] * self.ctx.return_discount + rewards.numpy()
            stage["discounted_return"][at] = torch.from_numpy(returns[ids].astype(np.float32))
            returns[ids[terminated | truncated]] = 0.0
        if truncation_values is not None:
            cut = ids[truncated]
            stage["truncation_value"][torch.from_numpy(cut), torch.from_numpy(self.row[cut])] = truncation_values

    def advance(self, ids: np.ndarray) -> None:
        self.row[ids] += 1

    def _start(self, i: int, core_before: tuple, j: int) -> None:
        """Give env ``i`` a free slot whose row 0 is the row the env has just staged; with an LSTM
        core, the slot's initial state is the env's state before that row (``core_before[:, j]``)."""
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
            self.ctx.buffers["core_h"][slot].copy_(core_before[0][:, j])
            self.ctx.buffers["core_c"][slot].copy_(core_before[1][:, j])

    def _finish(self, envs: np.ndarray) -> None:
        """Copy the staged keys of ``envs`` (``[k] int64`` env indices at row T) into their slots,
        hand the slots to the learners, and move the last staged row to row 0 for the next slots."""
        slots = self.slot[envs]
        slots_t, envs_t = torch.from_numpy(slots), torch.from_numpy(envs)
        buf = self.ctx.buffers
        for key, value in self.stage.items():  # one indexed copy per key for all envs
            buf[key].index_copy_(0, slots_t, value.index_select(0, envs_t))
            value[envs_t, 0] = value[envs_t, -1]
        buf["policy_version"].index_copy_(0, slots_t, torch.from_numpy(self.version[envs]))
        buf["env_id"].index_copy_(0, slots_t, envs_t + self.actor_id * self.ctx.num_envs)
        for slot in slots.tolist():
            self.held.remove(slot)
            self.ctx.channels.owner[slot] = NO_OWNER
            self.ctx.channels.full_queue.put(slot)
        self.slot[envs] = -1
        self.row[envs] = 0
        if _should_stop(self.ctx):
            raise _Stopped

    def _write_obs(self, envs: np.ndarray, obs: torch.Tensor) -> None:
        """``obs [k, *obs_shape]`` into each env's slot at its row: one memcpy each (an indexed
        put of uint8 images is many times slower)."""
        obs_slots = self.ctx.buffers["obs"]
        for j, (slot, t) in enumerate(zip(self.slot[envs].tolist(), self.row[envs].tolist(), strict=True)):
            obs_slots[slot, t].copy_(obs[j])

    def _at(self, ids: np.ndarray) -> tuple:
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

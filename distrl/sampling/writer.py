"""The actor's slot writer (step 4 of :mod:`distrl.sampling`): each env's steps written into that
env's slot, row by row, the slot put on the full queue once it holds T steps and the bootstrap
row, and the finished episodes reported (:class:`SlotWriter`)."""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable

import numpy as np
import torch

from distrl.rollout import Rows, declared
from distrl.sampling.context import ActorContext
from distrl.sampling.policy import StepInputs
from distrl.sampling.slots import NO_OWNER

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5  # the longest a wait (for a free slot, for new weights) goes without looking at the stop event


class Stopped(Exception):
    """The actor was asked to stop (or its parent is gone) while it waited."""


class SlotWriter:
    """Writes an actor's envs' unrolls into slots: where each env is in its slot, and the slots the
    actor holds.

    Attributes:
        slot: ``[n] int64``, each env's current slot, -1 before its first observation is acted on.
        row: ``[n] int64``, the row each env's next observation goes to (0..T).
        version: ``[n] int64``, the policy version each env's current slot started with.
        handed_version: the version the slots last handed in started with (-1: none yet).
        handed_rollouts: rollouts of its envs handed in since the last update it waited for
            (synchronous collection, :meth:`update_due`).
        held: the slot indices this actor owns (returned to the free queue on any exit).
        stage: the small keys with a row per step (every such key of the slots but ``obs``;
            :data:`distrl.rollout.KEYS`) as local ``[n, T+1, ...]`` tensors, written a batch at a time and
            copied into the slots once per unroll.
    """

    def __init__(self, actor_id: int, ctx: ActorContext, held: list[int], should_stop: Callable[[], bool]):
        self.actor_id = actor_id
        self.ctx = ctx
        self.should_stop = should_stop
        self.T = ctx.collection.num_steps
        n = ctx.envs.num_envs
        self.slot = np.full(n, -1, dtype=np.int64)
        self.row = np.zeros(n, dtype=np.int64)
        self.version = np.zeros(n, dtype=np.int64)
        self.handed_version = -1
        self.handed_rollouts = 0
        self.held = held
        # each env's discounted return so far (agent.normalize_rewards), restarted at episode ends
        self.discounted_return = np.zeros(n, dtype=np.float64) if ctx.collection.return_discount is not None else None
        # Observations go straight into each env's shared slot (one memcpy per env and step).
        # Staging them too would stream every frame through memory twice and, with the larger
        # working set, evict the model's weights from the cache between forward passes.
        self.stage = {key: torch.zeros((n, *tensor.shape[1:]), dtype=tensor.dtype)
                      for key, tensor in ctx.slot_tensors.items()
                      if key != "obs" and declared(key).rows is Rows.T_PLUS_1}

    def write_acted(self, ids: np.ndarray, obs: torch.Tensor, out: dict, seen: StepInputs) -> bool:
        """Row ``t`` of envs ``ids`` (``[k] int64``): the observation ``obs [k, ...]``, what the
        policy saw besides it and what it did (``out``, every key one :data:`distrl.rollout.KEYS` declares,
        ``[k, ...]``). An env's first observation takes it a slot; an env at row T hands its slot to the
        learners and starts the next one with this row as row 0. Returns whether any slot was handed in.

        Raises:
            KeyError: a key of ``out`` that is not declared, or that this run's slots do not store.
        """
        at = self._at(ids)
        stage = self.stage
        stage["first"][at] = seen.first
        stage["last_action"][at] = seen.last_action
        stage["last_reward"][at] = seen.last_reward
        self._write_out(at, out)
        for j in np.flatnonzero(self.slot[ids] < 0).tolist():  # each env's first observation
            self._start(int(ids[j]), seen.core, j)
        self._write_obs(ids, obs)
        at_end = np.flatnonzero(self.row[ids] == self.T)
        if len(at_end):
            full = ids[at_end]
            self.handed_version = int(self.version[full].max())
            self.handed_rollouts += 1
            self._finish(full)
            for j in at_end.tolist():
                self._start(int(ids[j]), seen.core, j)
            self._write_obs(full, obs[at_end])  # row 0 repeats row T
        return bool(len(at_end))

    def update_due(self) -> bool:
        """Synchronous collection: whether the envs' rollouts handed in make their share of a batch
        (``rollouts_per_update`` of :class:`distrl.sampling.context.Collection`), so that the
        learner's next update needs them all; never with asynchronous collection. Envs hand in
        together there (same rows, no async stepping), so one hand-in is one rollout of every env."""
        per_update = self.ctx.collection.rollouts_per_update
        due = per_update > 0 and self.handed_rollouts >= per_update
        if due:
            self.handed_rollouts = 0
        return due

    def await_new_weights(self, ids: np.ndarray) -> None:
        """Synchronous collection (``train.sync``): wait until the learner has updated past the version
        the slots just handed in were acted with (:attr:`handed_version`; an update needs all of them),
        asleep until the learner publishes them (:meth:`distrl.sampling.queues.PolicyVersion.publish`),
        keeping the heartbeat; the new slots of envs ``ids`` then count the new version.

        Raises:
            Stopped: the actor was asked to stop while it waited.
        """
        ch = self.ctx.channels
        while not ch.policy_version.wait_past(self.handed_version, self.actor_id, POLL_SECONDS):
            if self.should_stop():
                raise Stopped
            ch.reports.heartbeat[self.actor_id] = time.time()
        self.version[ids] = ch.policy_version.value

    def restage(self, ids: np.ndarray, out: dict) -> None:
        """Overwrite what was acted at the current row of envs ``ids`` (row 0 of their new slots) with
        ``out`` (the same step acted again with new weights, :meth:`await_new_weights`): every key of
        ``out``, as :meth:`write_acted` writes them."""
        self._write_out(self._at(ids), out)

    def _write_out(self, at: tuple, out: dict) -> None:
        for key, value in out.items():
            staged = self.stage.get(key)
            if staged is None:  # undeclared (UndeclaredKeyError), or declared for other runs
                raise KeyError(f"{key!r} is not stored by this run's slots (when: {declared(key).when})")
            staged[at] = value

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
            returns[ids] = returns[ids] * self.ctx.collection.return_discount + rewards.numpy()
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
            if self.should_stop():
                raise Stopped
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
            self.ctx.slot_tensors["core_h"][slot].copy_(core_before[0][:, j])
            self.ctx.slot_tensors["core_c"][slot].copy_(core_before[1][:, j])

    def _finish(self, envs: np.ndarray) -> None:
        """Copy the staged keys of ``envs`` (``[k] int64`` env indices at row T) into their slots,
        hand the slots to the learners, and move the last staged row to row 0 for the next slots."""
        slots = self.slot[envs]
        slots_t, envs_t = torch.from_numpy(slots), torch.from_numpy(envs)
        tensors = self.ctx.slot_tensors
        for key, value in self.stage.items():  # one indexed copy per key for all envs
            tensors[key].index_copy_(0, slots_t, value.index_select(0, envs_t))
            value[envs_t, 0] = value[envs_t, -1]
        tensors["policy_version"].index_copy_(0, slots_t, torch.from_numpy(self.version[envs]))
        tensors["env_id"].index_copy_(0, slots_t, envs_t + self.actor_id * self.ctx.envs.num_envs)
        for slot in slots.tolist():
            self.held.remove(slot)
            self.ctx.channels.owner[slot] = NO_OWNER
            self.ctx.channels.full_queue.put(slot)
        self.slot[envs] = -1
        self.row[envs] = 0
        if self.should_stop():
            raise Stopped

    def _write_obs(self, envs: np.ndarray, obs: torch.Tensor) -> None:
        """``obs [k, *obs_shape]`` into each env's slot at its row: vectors in one indexed put, images
        one memcpy each (an indexed put of uint8 images is many times slower)."""
        obs_slots = self.ctx.slot_tensors["obs"]
        if obs.dim() == 2:  # [k, D] vectors: one call instead of k
            where = (torch.from_numpy(self.slot[envs]), torch.from_numpy(self.row[envs]))
            obs_slots.index_put_(where, obs.to(obs_slots.dtype))
            return
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


class Episodes:
    """Running return and length of each env's episode; finished ones go to the episode queue."""

    def __init__(self, actor_id: int, ctx: ActorContext):
        self.actor_id, self.queue = actor_id, ctx.channels.reports.episodes
        self.total = np.zeros(ctx.envs.num_envs, dtype=np.float64)
        self.length = np.zeros(ctx.envs.num_envs, dtype=np.int64)

    def add(self, ids: np.ndarray, reward: np.ndarray, ended: np.ndarray) -> None:
        self.total[ids] += reward
        self.length[ids] += 1
        done = ids[ended]
        for i in done:
            self.queue.put((self.actor_id, float(self.total[i]), int(self.length[i])))
        self.total[done] = 0.0
        self.length[done] = 0

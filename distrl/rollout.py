"""The rollout: what one environment's unroll of ``T`` steps holds, row by row (a slot), and every key a
learner's batch carries, each declared once (:data:`KEYS`).

A slot holds one environment's unroll of ``T`` steps in ``T + 1`` rows; the learner reads ``[T+1, B]``
batches of ``B`` slots, takes the loss on rows ``0..T-1`` (:data:`STEPS`, the T steps) and bootstraps
from row T (:data:`BOOTSTRAP`). Row 0 of a slot repeats the previous slot's row T, so a slot is a
self-contained unroll with its bootstrap observation in row T.

Every key of a batch is a :class:`BatchKey` in :data:`KEYS`: its rows (:class:`Rows`), its shape and
dtype per row, who writes it (:class:`Writer`) and when a run has it. The slots allocate the keys the
actors write (:meth:`RolloutLayout.specs`), the actor's slot writer stages them
(:mod:`distrl.sampling.writer`), the learner's batch is gathered by them (:mod:`distrl.sampling.slots`)
and cut into minibatches by their rows (:mod:`distrl.learning.plan`, :mod:`distrl.learning.split`). A
key that is not declared is refused with its name (:func:`declared`), never dropped. A new per-step
quantity is one :class:`BatchKey` here (or :func:`declare`) and the part that writes it: an entry of
the policy's output (:func:`distrl.sampling.policy.step_policy`) for one the actors store, a key the
learner adds before its optimizer steps for one it computes.

The slots themselves (shared memory, free and full queues) are :mod:`distrl.sampling.slots`'s.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:  # the layout reads a space's shapes; it imports nothing above it
    from distrl.nn.distributions import ActionSpace

Specs = dict[str, tuple[tuple[int, ...], torch.dtype]]

# a [T+1, B] batch of slots (or a minibatch of it) as the learner reads it: key -> tensor
Batch = dict[str, torch.Tensor]
STEPS = slice(0, -1)  # rows 0..T-1 of a [T+1, ...] batch: the steps the loss is computed on
BOOTSTRAP = -1        # row T: the observation whose value bootstraps the unroll


class Rows(enum.Enum):
    """How many rows a key has in a ``[T+1, B]`` batch."""

    T_PLUS_1 = "T+1"   # one per step t = 0..T: ``[T+1, B, *shape]``
    T = "T"            # one per step t = 0..T-1: ``[T, B, *shape]``
    UNROLL = "unroll"  # one per unroll: ``[B]`` for a number, ``[1, B, H]`` for an LSTM state


class Writer(enum.Enum):
    """Who writes a key."""

    ACTING = "acting"      # the actor at row t, from the observation and the policy's output at it;
                           # synchronous collection writes the policy's output of a re-acted row again
    STEPPING = "stepping"  # the actor at row t, from what stepping the env with action_t gave (row T unused:
                           # the next slot's row 0 is that step)
    SLOT = "slot"          # the actor, once per slot
    LEARNER = "learner"    # the learner, before its optimizer steps (never stored in a slot)


# a stored key's per-row shape names the layout resolves: the observation's shape, the action's, the width
# of the policy's parameters, the LSTM state's (1, H), the encoder's width F; a dtype's: the observation's,
# the action's. (The learner's keys name theirs for the reader: "heads", the value heads.)
SHAPES = ("obs", "action", "params", "core", "features")
DTYPES = ("obs", "action")


@dataclass(frozen=True)
class BatchKey:
    """One key of a batch.

    Attributes:
        name: the key.
        rows: its rows (:class:`Rows`).
        writer: who writes it (:class:`Writer`).
        shape: one row's shape: ints, or one of :data:`SHAPES`, which the layout resolves.
        dtype: a torch dtype, or one of :data:`DTYPES`.
        when: for a stored key, the :class:`RolloutLayout` attribute that says whether a run stores it
            (true or not None); None: every run (and every learner's key: its ``doc`` says when).
        doc: what it holds.
    """

    name: str
    rows: Rows
    writer: Writer
    shape: tuple[int | str, ...] = ()
    dtype: torch.dtype | str = torch.float32
    when: str | None = None
    doc: str = ""

    @property
    def stored(self) -> bool:
        """Whether the actors write it into the slots (every writer but the learner)."""
        return self.writer is not Writer.LEARNER

    @property
    def unroll_dim(self) -> int:
        """The dimension of a batch's tensor that indexes its ``B`` unrolls: 0 for a number per
        unroll (``[B]``), 1 for every other key."""
        return 0 if self.rows is Rows.UNROLL and not self.shape else 1


# PFO's anchor as the actors store it (agent.pfo_anchor=behaviour): the one key an actor, the network's
# acting step and the penalty that reads it name
BEHAVIOUR_PREACTIVATIONS = "behaviour_preactivations"

_F32, _BOOL, _I64 = torch.float32, torch.bool, torch.int64
_T1, _T, _UNROLL = Rows.T_PLUS_1, Rows.T, Rows.UNROLL
_ACTING, _STEPPING, _SLOT, _LEARNER = Writer.ACTING, Writer.STEPPING, Writer.SLOT, Writer.LEARNER

KEYS: dict[str, BatchKey] = {key.name: key for key in (
    BatchKey("obs", _T1, _ACTING, ("obs",), "obs", doc="the observation x_t (uint8 images, float32 vectors)"),
    BatchKey("first", _T1, _ACTING, (), _BOOL, doc="whether x_t starts an episode"),
    BatchKey("last_action", _T1, _ACTING, ("action",), "action", doc="the action taken before x_t (0 where first)"),
    BatchKey("last_reward", _T1, _ACTING, (), _F32, doc="the raw reward it gave (0 where first)"),
    BatchKey("action", _T1, _ACTING, ("action",), "action",
             doc="the behaviour policy's action at x_t, the sample as drawn (step_policy)"),
    BatchKey("policy_params", _T1, _ACTING, ("params",), _F32,
             doc="the behaviour distribution's parameters at x_t (distrl.nn.distributions; step_policy)"),
    BatchKey("baseline", _T1, _ACTING, (), _F32, doc="the behaviour policy's value of x_t (step_policy)"),
    BatchKey(BEHAVIOUR_PREACTIVATIONS, _T1, _ACTING, ("features",), _F32, "behaviour_features",
             doc="the behaviour policy's encoder pre-activations at x_t, PFO's anchor with agent.pfo_anchor=behaviour "
                 "(ActorCritic.act; distrl.learning.losses.penalties.FeatureDrift)"),
    BatchKey("intrinsic_bonus", _T1, _ACTING, (), _F32, "actor_bonus",
             doc="the bonus the actor gave x_t (intrinsic=e3b; distrl.intrinsic.e3b); the intrinsic reward of "
                 "step t is row t+1's"),
    BatchKey("reward", _T1, _STEPPING, (), _F32, doc="the raw reward of step t"),
    BatchKey("terminated", _T1, _STEPPING, (), _BOOL, doc="step t ended its episode in a terminal state"),
    BatchKey("truncated", _T1, _STEPPING, (), _BOOL, doc="step t ended its episode at a time limit"),
    BatchKey("truncation_value", _T1, _STEPPING, (), _F32,
             doc="on truncation, the behaviour baseline of the episode's final observation (else 0)"),
    BatchKey("discounted_return", _T1, _STEPPING, (), _F32, "returns",
             doc="the env's discounted return so far, restarted at every episode end (agent.normalize_rewards: "
                 "its running variance scales the rewards)"),
    BatchKey("policy_version", _UNROLL, _SLOT, (), _I64, doc="the policy version the unroll started with"),
    BatchKey("env_id", _UNROLL, _SLOT, (), _I64,
             doc="the env that wrote it: actor x envs_per_actor + env, numbered within a rank"),
    BatchKey("core_h", _UNROLL, _SLOT, ("core",), _F32, "core_size", doc="the LSTM core's h before row 0"),
    BatchKey("core_c", _UNROLL, _SLOT, ("core",), _F32, "core_size", doc="the LSTM core's c before row 0"),
    BatchKey("intrinsic_reward", _T, _LEARNER, (), _F32,
             doc="step t's normalised intrinsic reward, with an intrinsic reward (distrl.intrinsic)"),
    BatchKey("advantages", _T, _LEARNER, (), _F32,
             doc="the batch's advantages, before the epochs, with agent.minibatch=steps (AgentLoss.batch_targets)"),
    BatchKey("value_targets", _T, _LEARNER, ("heads",), _F32,
             doc="the batch's value targets, [T, B, H] for H value heads, with agent.minibatch=steps "
                 "(AgentLoss.batch_targets)"),
    BatchKey("preactivations_old", _T1, _LEARNER, ("features",), _F32,
             doc="the encoder's pre-activations at the update's start, PFO's anchor, with agent.pfo_coef > 0 "
                 "(distrl.learning.losses.penalties.FeatureDrift)"),
)}


class UndeclaredKeyError(KeyError):
    """A batch key that :data:`KEYS` does not declare."""


def declared(name: str) -> BatchKey:
    """The declaration of batch key ``name``.

    Raises:
        UndeclaredKeyError: ``name`` is not in :data:`KEYS`.
    """
    try:
        return KEYS[name]
    except KeyError:
        raise UndeclaredKeyError(
            f"batch key {name!r} is not declared: add a BatchKey for it to distrl.rollout.KEYS (or "
            f"distrl.rollout.declare) with its rows, shape, dtype and writer; declared: {', '.join(KEYS)}") from None


def declare(key: BatchKey) -> BatchKey:
    """Add ``key`` to :data:`KEYS` (a key of a user's own part; the actors of a run are new processes
    and see only what importing its module declares). Declaring the same key again is a no-op.

    Raises:
        ValueError: another key of that name is declared.
    """
    known = KEYS.setdefault(key.name, key)
    if known != key:
        raise ValueError(f"batch key {key.name!r} is declared already, as {known}")
    return key


@dataclass(frozen=True)
class RolloutLayout:
    """Shape and dtype of every key of a slot (see the module docstring for the rows).

    Attributes:
        num_steps: unroll length T; time-indexed keys have ``T + 1`` rows.
        obs_shape: one observation's shape.
        obs_dtype: ``torch.uint8`` for images, ``torch.float32`` for vectors.
        action_space: the actions' space (:class:`distrl.nn.distributions.ActionSpace`): the shape
            and dtype of ``action`` and ``last_action``, the width of ``policy_params``.
        core_size: the LSTM core's hidden size H, or None without a core.
        actor_bonus: the actors store an intrinsic bonus per row (``intrinsic=e3b``).
        returns: the actors store each env's discounted return (``agent.normalize_rewards``).
        behaviour_features: the encoder's width F where the actors store their pre-activations (PFO with
            ``agent.pfo_anchor=behaviour``); None: they do not.
    """

    num_steps: int
    obs_shape: tuple[int, ...]
    obs_dtype: torch.dtype
    action_space: ActionSpace
    core_size: int | None = None
    actor_bonus: bool = False
    returns: bool = False
    behaviour_features: int | None = None

    @classmethod
    def for_run(cls, cfg, spec) -> RolloutLayout:
        """The layout of a train config ``cfg`` on env ``spec`` (a :class:`distrl.envs.EnvSpec`)."""
        return cls(cfg.num_steps, tuple(spec.obs_shape),
                   torch.uint8 if spec.obs_dtype == np.uint8 else torch.float32, spec.action_space,
                   cfg.model.feature_dim if cfg.model.use_lstm else None, cfg.intrinsic.name == "e3b",
                   bool(cfg.agent.get("normalize_rewards", False)),
                   cfg.model.feature_dim if behaviour_anchor(cfg.agent) else None)

    def nbytes(self, num_slots: int) -> int:
        """Bytes of shared memory ``num_slots`` slots of this layout take."""
        per_slot = sum(math.prod(shape) * dtype.itemsize for shape, dtype in self.specs().values())
        return per_slot * num_slots

    def specs(self) -> Specs:
        """``{key: (per-slot shape, dtype)}`` of every stored key of :data:`KEYS` this run has, without the
        leading slot dimension: ``(T+1, *row shape)`` for a key with a row per step, the row shape for one
        per unroll."""
        return {key.name: self.spec(key) for key in KEYS.values() if key.stored and self.has(key)}

    def has(self, key: BatchKey) -> bool:
        """Whether a run of this layout stores ``key`` (its ``when`` attribute true or not None)."""
        if key.when is None:
            return True
        value = getattr(self, key.when)
        return value is not None and value is not False

    def spec(self, key: BatchKey) -> tuple[tuple[int, ...], torch.dtype]:
        """The per-slot shape and dtype of the stored ``key``.

        Raises:
            ValueError: a shape or dtype name the layout does not know (:data:`SHAPES`, :data:`DTYPES`).
        """
        space = self.action_space
        shapes = {"obs": self.obs_shape, "action": tuple(space.action_shape), "params": (space.param_size,),
                  "core": (1, self.core_size), "features": (self.behaviour_features,)}
        dtypes = {"obs": self.obs_dtype, "action": space.action_dtype}
        try:
            row = tuple(d for part in key.shape for d in (shapes[part] if isinstance(part, str) else (part,)))
            dtype = dtypes[key.dtype] if isinstance(key.dtype, str) else key.dtype
        except KeyError as exc:
            raise ValueError(f"batch key {key.name!r}: the layout resolves the shapes {SHAPES} and the dtypes "
                             f"{DTYPES}, not {exc.args[0]!r}") from None
        return ((self.num_steps + 1, *row) if key.rows is Rows.T_PLUS_1 else row), dtype


def behaviour_anchor(agent) -> bool:
    """Whether PFO anchors the features to the behaviour policy's, which the actors store
    (``agent.pfo_coef > 0`` and ``agent.pfo_anchor=behaviour``)."""
    return float(agent.get("pfo_coef", 0.0)) > 0 and agent.get("pfo_anchor", "update") == "behaviour"

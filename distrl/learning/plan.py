"""The plan of one learner update: which minibatches its optimizer steps take from a ``[T+1, B]``
batch, and what is computed once, before the first step (step 4 of :mod:`distrl.learning`).

An update makes ``agent.num_epochs`` passes over its batch, each cut into ``agent.num_minibatches``
minibatches (CleanRL's ``for epoch: for minibatch:``):

- ``agent.minibatch=unrolls`` (:class:`Unrolls`): a random permutation of the ``B`` unrolls cut into
  equal parts; the loss runs the estimator on each minibatch with the network of that step
  (:meth:`distrl.learning.losses.base.AgentLoss.unroll_targets`);
- ``agent.minibatch=steps`` (:class:`Steps`): a random permutation of the batch's ``T x B`` steps cut
  into equal parts, each a ``[1, n]`` minibatch whose rows are steps, on the targets the estimator
  gave once for the whole batch before the first step (:meth:`~distrl.learning.losses.base.AgentLoss.batch_targets`,
  as PPO computes GAE once per rollout).

With ``agent.shuffle_minibatches=false`` neither is permuted: the parts are the same contiguous slices
every epoch, of the unrolls in the batch's order, or of the steps unroll by unroll (unroll 0's T
steps, then unroll 1's, ...), so that a minibatch of steps is whole unrolls where the parts divide
``B``: Sample Factory 2.1.1's ``shuffle_minibatches=False`` (``sample_factory/algo/learning/learner.py``,
``_get_minibatches``: ``arange`` slices of its ``[trajectories x T]`` flattened batch), its MuJoCo
recipe's choice.

Computed once before the first step, with the network of the update's start and without gradient,
each where the config asks for it: the step targets (``agent.minibatch=steps``) and PFO's anchor, the
encoder's pre-activations (``agent.pfo_coef > 0``; :class:`~distrl.learning.losses.penalties.FeatureDrift`).
Every choice is made at construction (:meth:`UpdatePlan.for_agent`); the keys a minibatch takes are
named by the rollout's layout (:mod:`distrl.rollout`), never read off the tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from omegaconf import DictConfig

from distrl.learning.losses import AgentLoss, Outputs
from distrl.learning.losses.base import BATCH_TARGETS
from distrl.learning.losses.penalties import OLD_PREACTIVATIONS
from distrl.rollout import ACTED_KEYS, SLOT_SCALARS, STEPPED_KEYS, STEPS, Batch

# a [T+1, B] batch's keys with a row per step t = 0..T (T + 1 rows), and those with a row per step
# t = 0..T-1 (T rows) that the learner adds; the others (SLOT_KEYS) hold one value per unroll
ROWS_T_PLUS_1 = (*ACTED_KEYS, *STEPPED_KEYS, OLD_PREACTIVATIONS)
ROWS_T = (*BATCH_TARGETS, "intrinsic_reward")


class Unrolls:
    """Minibatches of whole unrolls: the ``B`` columns in a random order (with ``shuffle``, else in
    order) cut into ``parts`` equal parts (validation makes them divide ``B``); one part is the batch
    itself."""

    def __init__(self, parts: int, shuffle: bool = True):
        self.parts, self.shuffle = parts, shuffle

    def split(self, batch: Batch, generator: torch.Generator) -> list[Batch]:
        if self.parts == 1:
            return [batch]
        unrolls = batch["action"].shape[1]
        order = torch.randperm(unrolls, generator=generator) if self.shuffle else torch.arange(unrolls)
        # the unrolls' dimension: 0 of a per-slot scalar ([B]), 1 of every other key ([T+1, B, ...]
        # rows, [T, B] intrinsic rewards, the [1, B, H] LSTM state)
        return [{key: value.index_select(0 if key in SLOT_SCALARS else 1, part.to(value.device))
                 for key, value in batch.items()}
                for part in order.chunk(self.parts)]


class Steps:
    """Minibatches of single steps: the batch's ``T x B`` steps (rows ``0..T-1`` of every per-step key;
    the slots' own keys left out) in a random order (with ``shuffle``; else unroll by unroll, each
    unroll's steps in time order) cut into ``parts`` equal parts (validation makes them divide
    ``T x B``), each a ``[1, n]`` minibatch whose rows are steps."""

    def __init__(self, parts: int, shuffle: bool = True):
        self.parts, self.shuffle = parts, shuffle

    def split(self, batch: Batch, generator: torch.Generator) -> list[Batch]:
        steps = batch["action"].shape[0] - 1
        flat = {}
        for key, value in batch.items():
            if key in ROWS_T_PLUS_1:
                value = value[STEPS]
            elif key not in ROWS_T:
                continue  # one value per slot (policy_version, env_id): no step's
            flat[key] = value.reshape(steps * value.shape[1], *value.shape[2:])
        unrolls = batch["action"].shape[1]
        if self.shuffle:
            order = torch.randperm(steps * unrolls, generator=generator)
        else:  # flat index t x B + b, taken unroll by unroll
            order = torch.arange(steps * unrolls).view(steps, unrolls).t().reshape(-1)
        return [{key: value.index_select(0, part.to(value.device)).unsqueeze(0) for key, value in flat.items()}
                for part in order.chunk(self.parts)]


class UpdatePlan:
    """The optimizer steps of one update (module docstring).

    Args:
        loss: the agent's loss, whose :meth:`~distrl.learning.losses.base.AgentLoss.batch_targets` the
            step targets are.
        num_epochs: passes over the batch.
        minibatches: :class:`Unrolls` or :class:`Steps`.
        step_targets: compute the targets once per batch (``agent.minibatch=steps``).
        anchor_features: keep the encoder's pre-activations of the update's start (PFO).

    Attributes:
        generator: the minibatches' order, seeded from the run's seed (``torch.manual_seed``).
    """

    def __init__(self, loss: AgentLoss, num_epochs: int, minibatches: Unrolls | Steps, step_targets: bool,
                 anchor_features: bool):
        self.loss, self.num_epochs, self.minibatches_of = loss, num_epochs, minibatches
        self.before_first_step: list[Callable[[Batch, Outputs, float], Batch]] = [
            part for part, wanted in ((self._anchor, anchor_features), (self._step_targets, step_targets)) if wanted]
        self.generator = torch.Generator().manual_seed(torch.initial_seed())

    @classmethod
    def for_agent(cls, agent: DictConfig, loss: AgentLoss) -> UpdatePlan:
        """The plan of the ``agent`` config node (``num_epochs``, ``num_minibatches``, ``minibatch``,
        ``shuffle_minibatches``, ``pfo_coef``)."""
        steps = agent.minibatch == "steps"
        parts, shuffle = int(agent.num_minibatches), bool(agent.shuffle_minibatches)
        minibatches = Steps(parts, shuffle) if steps else Unrolls(parts, shuffle)
        return cls(loss, int(agent.num_epochs), minibatches, steps, agent.pfo_coef > 0)

    def prepare(self, batch: Batch, forward: Callable[[Batch], Outputs], intrinsic_coef: float) -> Batch:
        """``batch`` with what is computed once before the first optimizer step, by ``forward`` (the
        learner network) without gradient; ``batch`` itself when nothing is."""
        if not self.before_first_step:
            return batch
        with torch.no_grad():
            outputs = forward(batch)
        for part in self.before_first_step:
            batch = {**batch, **part(batch, outputs, intrinsic_coef)}
        return batch

    def minibatches(self, batch: Batch) -> Iterator[Batch]:
        """Every optimizer step's minibatch, in order: ``num_epochs`` passes, each in a new random order."""
        for _ in range(self.num_epochs):
            yield from self.minibatches_of.split(batch, self.generator)

    def _anchor(self, batch: Batch, outputs: Outputs, intrinsic_coef: float) -> Batch:
        return {OLD_PREACTIVATIONS: outputs.preactivations.float()}

    def _step_targets(self, batch: Batch, outputs: Outputs, intrinsic_coef: float) -> Batch:
        return self.loss.batch_targets(batch, outputs.params, outputs.values, intrinsic_coef)

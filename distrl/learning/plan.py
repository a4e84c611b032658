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

Computed once before the first step, with the network of the update's start and without gradient:
what the loss asks for (:meth:`~distrl.learning.losses.base.AgentLoss.prepare`: the step targets with
``agent.minibatch=steps``, a penalty's anchor such as PFO's).
Every choice is made at construction (:meth:`UpdatePlan.for_agent`); how a key is cut is its
declaration's (:data:`distrl.rollout.KEYS`: its rows), never read off the tensors, and a key without
one is refused with its name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from omegaconf import DictConfig

from distrl.learning.losses import AgentLoss, Outputs
from distrl.rollout import STEPS, Batch, Rows, declared


class Unrolls:
    """Minibatches of whole unrolls: the ``B`` columns in a random order (with ``shuffle``, else in
    order) cut into ``parts`` equal parts (validation makes them divide ``B``); one part is the batch
    itself.

    Raises:
        distrl.rollout.UndeclaredKeyError: a key of the batch that :data:`distrl.rollout.KEYS` does not declare.
    """

    def __init__(self, parts: int, shuffle: bool = True):
        self.parts, self.shuffle = parts, shuffle

    def split(self, batch: Batch, generator: torch.Generator) -> list[Batch]:
        if self.parts == 1:
            return [batch]
        unrolls = batch["action"].shape[1]
        order = torch.randperm(unrolls, generator=generator) if self.shuffle else torch.arange(unrolls)
        dims = {key: declared(key).unroll_dim for key in batch}
        return [{key: value.index_select(dims[key], part.to(value.device)) for key, value in batch.items()}
                for part in order.chunk(self.parts)]


class Steps:
    """Minibatches of single steps: the batch's ``T x B`` steps (rows ``0..T-1`` of every per-step key;
    the slots' own keys left out) in a random order (with ``shuffle``; else unroll by unroll, each
    unroll's steps in time order) cut into ``parts`` equal parts (validation makes them divide
    ``T x B``), each a ``[1, n]`` minibatch whose rows are steps.

    Raises:
        distrl.rollout.UndeclaredKeyError: a key of the batch that :data:`distrl.rollout.KEYS` does not declare.
    """

    def __init__(self, parts: int, shuffle: bool = True):
        self.parts, self.shuffle = parts, shuffle

    def split(self, batch: Batch, generator: torch.Generator) -> list[Batch]:
        steps = batch["action"].shape[0] - 1
        flat = {}
        for key, value in batch.items():
            rows = declared(key).rows
            if rows is Rows.UNROLL:
                continue  # one value per unroll (policy_version, env_id, the LSTM state): no step's
            if rows is Rows.T_PLUS_1:
                value = value[STEPS]
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
        loss: the agent's loss, whose :meth:`~distrl.learning.losses.base.AgentLoss.prepare` is
            computed once before the first step.
        num_epochs: passes over the batch.
        minibatches: :class:`Unrolls` or :class:`Steps`.

    Attributes:
        generator: the minibatches' order, seeded from the run's seed (``torch.manual_seed``).
    """

    def __init__(self, loss: AgentLoss, num_epochs: int, minibatches: Unrolls | Steps):
        self.loss, self.num_epochs, self.minibatches_of = loss, num_epochs, minibatches
        self.generator = torch.Generator().manual_seed(torch.initial_seed())

    @classmethod
    def for_agent(cls, agent: DictConfig, loss: AgentLoss) -> UpdatePlan:
        """The plan of the ``agent`` config node (``num_epochs``, ``num_minibatches``, ``minibatch``,
        ``shuffle_minibatches``)."""
        parts, shuffle = int(agent.num_minibatches), bool(agent.shuffle_minibatches)
        minibatches = Steps(parts, shuffle) if agent.minibatch == "steps" else Unrolls(parts, shuffle)
        return cls(loss, int(agent.num_epochs), minibatches)

    def prepare(self, batch: Batch, forward: Callable[[Batch], Outputs], intrinsic_coef: float) -> Batch:
        """``batch`` with what the loss computes once before the first optimizer step, from ``forward``
        (the learner network) without gradient; ``batch`` itself when it computes nothing."""
        if not self.loss.prepares:
            return batch
        with torch.no_grad():
            outputs = forward(batch)
        return self.loss.prepare(batch, outputs, intrinsic_coef)

    def minibatches(self, batch: Batch) -> Iterator[Batch]:
        """Every optimizer step's minibatch, in order: ``num_epochs`` passes, each in a new random order."""
        for _ in range(self.num_epochs):
            yield from self.minibatches_of.split(batch, self.generator)

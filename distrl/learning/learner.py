"""The learner: learn from a batch of B full slots, publish the weights (step 3 of
:mod:`distrl.learning`).

A learner thread loops over :meth:`distrl.learning.batches.BatchSource.next` (B full slots copied
into a ``[T+1, B]`` batch, the slots freed; with ``train.prefetch`` the next batch is copied beside
the update) and :meth:`Learner.update`: ``agent.num_epochs`` passes over the batch, each in
``agent.num_minibatches`` minibatches (of whole unrolls, or with ``agent.minibatch=steps`` of single
steps), one optimizer step per minibatch on the agent's loss (:mod:`distrl.learning.losses`: IMPALA's
policy gradient or APPO's clipped surrogate, on the targets of the return estimator, V-trace by
default, computed with the network of that step, or with ``steps`` once per batch), then
the new weights published into the actors' copy. With an intrinsic reward (:mod:`distrl.intrinsic`)
its rewards are computed once per batch and its module trained after the optimizer steps. The
learning rate, the entropy cost and the intrinsic reward's weight of each update come from
:class:`distrl.learning.schedule.Schedule` at the learner's update count, the one counter of a run.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

import torch
from omegaconf import DictConfig

from distrl.intrinsic import IntrinsicReward
from distrl.learning.distributed import Ranks
from distrl.learning.losses import LossTerms, make_loss
from distrl.learning.losses.base import OLD_PREACTIVATIONS
from distrl.learning.schedule import Position, Schedule
from distrl.learning.split import SplitStep
from distrl.nn.actor_learner import ActorLearner
from distrl.nn.normalization import normalise_batch
from distrl.nn.precision import autocast

log = logging.getLogger(__name__)

LOSS_NAMES = ("total", "policy", "value", "entropy", "grad_norm")
LAST_STEP_SCALARS = ("feature_drift",)  # reported from an update's last optimizer step, the rest from its first


def make_optimizer(policy: ActorLearner, agent: DictConfig) -> torch.optim.Optimizer:
    """The optimizer over the learner copy: ``agent.optimizer`` is ``rmsprop`` (IMPALA's; decay
    ``alpha``, ``eps``, ``momentum``) or ``adam`` (betas 0.9, 0.999 and ``eps``), at ``agent.lr``.

    Raises:
        ValueError: another optimizer name (validation refuses it first).
    """
    params = policy.learner.parameters()
    if agent.optimizer == "rmsprop":
        return torch.optim.RMSprop(params, lr=agent.lr, alpha=agent.alpha, eps=agent.eps, momentum=agent.momentum)
    if agent.optimizer == "adam":
        return torch.optim.Adam(params, lr=agent.lr, eps=agent.eps)
    raise ValueError(f"agent.optimizer={agent.optimizer!r}: use rmsprop or adam")


class Learner:
    """Runs the agent's updates on the learner copy and publishes the weights to the actors.

    Args:
        policy: the actor/learner pair; its learner copy is on ``device``.
        optimizer: from :func:`make_optimizer`.
        schedule: the run's schedule; the learning rate and entropy cost of every update follow
            from :attr:`updates`.
        agent: the ``agent`` config node.
        device: the learner copy's device.
        compile: ``torch.compile`` :meth:`loss`, the learner network's forward pass and the
            agent's loss as one graph (their backward pass with them). A subclass's own
            :meth:`loss` is not compiled; ``Learner.loss``, which it may call, is.
        compile_mode: ``torch.compile``'s ``mode`` with ``compile``: ``default``,
            ``reduce-overhead`` (the forward and backward graphs replayed as CUDA graphs on a GPU:
            one launch for each instead of one per operator) or ``max-autotune``.
        ranks: with several ranks, gradients are averaged across them before every step
            (:mod:`distrl.learning.distributed`).
        intrinsic: an intrinsic reward module on ``device``, trained after each update; None: none.
        pretraining: the extrinsic reward is left out of the loss (reward-free training).
        precision: ``bf16``: the network's forward under ``torch.autocast`` in bfloat16 (the weights,
            the optimizer state and the gradients stay fp32; the heads' outputs are cast back to
            fp32, so V-trace, the log-softmax, the importance ratios, the losses and the gradient
            clip are fp32); ``fp32``: no autocast.

    Attributes:
        agent_loss: the agent's loss (:func:`distrl.learning.losses.make_loss` of ``agent``).
        updates: updates made (the skipped non-finite ones included, so that the schedule follows
            the agent steps); a resumed run sets it. Guarded by ``lock`` with the weights.
    """

    def __init__(self, policy: ActorLearner, optimizer: torch.optim.Optimizer, schedule: Schedule,
                 agent: DictConfig, device: torch.device, compile: bool = False, ranks: Ranks | None = None,
                 intrinsic: IntrinsicReward | None = None, pretraining: bool = False, precision: str = "fp32",
                 compile_mode: str = "default", split: SplitStep | None = None):
        self.policy = policy
        self.precision = precision
        self.intrinsic = intrinsic
        self.ranks = ranks or Ranks()
        self.optimizer = optimizer
        self.schedule = schedule
        self.agent = agent
        self.agent_loss = make_loss(agent, policy.learner.action_space, pretraining)
        self.pfo = self.agent_loss.pfo_coef > 0  # the network also gives its pre-activations (AgentLoss.feature_drift)
        # the minibatches' order (agent.num_minibatches), from the run's seed (torch.manual_seed)
        self.generator = torch.Generator().manual_seed(torch.initial_seed())
        self.device = device
        self._loss = self._compiled_loss(device, compile_mode) if compile else self._network_loss
        # CUDA graphs (reduce-overhead) may overwrite a replay's outputs at the next replay: each
        # optimizer step is one step of torch's CUDA graph trees and reads its losses within it
        self._cuda_graph_steps = compile and compile_mode == "reduce-overhead"
        # the network's work of a step in parts on threads; not compiled, not for a subclass's own loss
        self.split = split if not compile and type(self).loss is Learner.loss else None
        self.lock = threading.RLock()  # held for an update, so that a checkpoint sees one moment
        self.updates = 0
        self.last_obs: torch.Tensor | None = None  # the last batch's observations [T+1, B, ...] (dormant units)
        self.stop: threading.Event | None = None  # the running learner thread's (step), for an override's update

    @property
    def updates(self) -> int:
        return self._updates

    @updates.setter
    def updates(self, value: int) -> None:
        """Set the count; the optimizer's learning rate becomes that of the next update (as a
        resumed run's optimizer holds the rate of its last one)."""
        self._updates = value
        for group in self.optimizer.param_groups:
            group["lr"] = self.schedule.at(value).learning_rate

    @property
    def position(self) -> Position:
        """Where the run is now (:meth:`Schedule.at` of :attr:`updates`)."""
        return self.schedule.at(self.updates)

    def step(self, batch: dict[str, torch.Tensor], stop: threading.Event | None = None) -> dict[str, float]:
        """What a learner thread calls for each batch: :meth:`update` (the seeds' adapter,
        :mod:`distrl.compat.rllte`, puts a user's ``update`` here, which reaches :meth:`update` without
        ``stop``: it is kept in :attr:`stop`)."""
        self.stop = stop
        return self.update(batch, stop)

    def update(self, batch: dict[str, torch.Tensor], stop: threading.Event | None = None) -> dict[str, float]:
        """``agent.num_epochs x agent.num_minibatches`` optimizer steps on one ``[T+1, B]`` batch from
        :func:`get_batch`, then the new weights go to the actors and :attr:`updates` advances by one
        (whatever the epochs).

        After the first step the batch is off-policy by the steps before it as well as by the
        actors' lag; V-trace corrects for both against the behaviour logits the actors stored, as
        for IMPALA's experience replay (Espeholt et al. 2018, Table 2). With several ranks the
        gradients are averaged across them first (every rank calls this once per update and makes
        the same steps; ``stop`` ends the wait for the others). A non-finite loss or gradient norm
        skips that optimizer step and the steps after it (the weights and the optimizer state stay
        as the last finite step left them; the count still advances).

        With an intrinsic reward module, its rewards are computed once, before the epochs, and the
        module is trained on the batch after them (not after a non-finite update). The network's
        running statistics are updated from the batch first (:func:`distrl.nn.normalization.normalise_batch`).
        With PFO (``agent.pfo_coef > 0``) the encoder's pre-activations on the batch are taken before
        the first optimizer step: the anchor of :meth:`distrl.learning.losses.base.AgentLoss.feature_drift`.

        Returns:
            ``{"total", "policy", "value", "entropy", "grad_norm", "learning_rate", "entropy_cost",
            "finite", "publish_seconds"}`` and the loss's diagnostics (APPO's ``clip_fraction`` and
            ``approx_kl``; with PFO ``feature_drift``): the first optimizer step's losses, gradient
            norm and diagnostics (the batch against the weights it found: for APPO's, how far the
            learner's policy has moved from the behaviour policy that acted; PFO's drift the last
            step's, how far the features moved within the update), or those of the non-finite
            epoch, floats;
            ``learning_rate`` and ``entropy_cost`` those this update used; ``finite`` a bool;
            ``publish_seconds`` the wall time of copying the weights to the actors. With an
            intrinsic reward also ``intrinsic_reward_raw`` and ``intrinsic_reward`` (mean per step,
            before and after normalisation), ``intrinsic_coef``, ``intrinsic_share`` (the weighted
            bonus's share of the reward paid,
            :meth:`distrl.learning.losses.base.AgentLoss.intrinsic_share`) and ``intrinsic_loss``
            (the module's own loss; 0 for a module that trains nothing).
        """
        stop = stop if stop is not None else self.stop
        with self.lock:
            position = self.position
            self.last_obs = batch["obs"]
            batch = normalise_batch(self.policy.learner, batch, self.ranks.sum_ if self.ranks.enabled else None, stop)
            intrinsic = {}
            if self.intrinsic is not None:
                raw, normalised = self.intrinsic.rewards(batch)
                batch = {**batch, "intrinsic_reward": normalised}
                intrinsic = {"intrinsic_reward_raw": raw.mean().item(), "intrinsic_reward": normalised.mean().item(),
                             "intrinsic_coef": position.intrinsic_coef,
                             "intrinsic_share": self.agent_loss.intrinsic_share(batch, position.intrinsic_coef)}
            if self.agent_loss.minibatch == "steps" or self.pfo:  # the targets, PFO's anchor: the weights of now
                with torch.no_grad():
                    params, values, *preactivations = self._forward(batch)
                if self.pfo:
                    batch = {**batch, OLD_PREACTIVATIONS: preactivations[0].float()}
                if self.agent_loss.minibatch == "steps":
                    batch = {**batch, **self.agent_loss.batch_targets(batch, params, values, position.intrinsic_coef)}
            plan = (minibatch for _ in range(self.agent_loss.num_epochs)
                    for minibatch in self.agent_loss.minibatches(batch, self.generator))
            for step, minibatch in enumerate(plan):
                scalars, finite = self._optimizer_step(minibatch, position.entropy_cost, stop, position.intrinsic_coef)
                if step == 0 or not finite:
                    reported = scalars
                else:  # PFO's drift is 0 at the first step, by construction: the last step's says how far it went
                    reported.update({key: scalars[key] for key in LAST_STEP_SCALARS if key in scalars})
                if not finite:
                    break
            steps = step + finite  # optimizer steps made
            publish_start = time.perf_counter()
            if steps > 0:  # at least one optimizer step was made
                self.policy.publish()
            publish_seconds = time.perf_counter() - publish_start
            if intrinsic:
                loss = self.intrinsic.update(batch) if finite else None
                intrinsic["intrinsic_loss"] = 0.0 if loss is None else loss
            self.updates += 1
        return {**reported, "learning_rate": position.learning_rate,
                "entropy_cost": position.entropy_cost, "finite": finite, "publish_seconds": publish_seconds,
                **intrinsic}

    def loss(self, batch: dict[str, torch.Tensor], entropy_cost: float,
             intrinsic_coef: float = 0.0) -> LossTerms:
        """The agent's loss on ``batch`` (a ``[T+1, B]`` batch or a minibatch of it):
        ``(total, policy, value, entropy, diagnostics)`` (:class:`distrl.learning.losses.LossTerms`), scalar
        tensors averaged over its ``T x B`` steps.

        The network runs on all T+1 rows with the weights of this moment; :attr:`agent_loss`
        (:mod:`distrl.learning.losses`) computes the loss from its outputs. Compiled with ``compile``.
        """
        return self._loss(batch, entropy_cost, intrinsic_coef)

    def _compiled_loss(self, device: torch.device,
                       mode: str) -> Callable[[dict[str, torch.Tensor], float, float], LossTerms]:
        """:meth:`_network_loss` through ``torch.compile`` in ``mode``, its two floats passed as 0-d
        tensors on ``device``: inputs of one graph, not constants that a new value would compile
        again."""
        compiled = torch.compile(self._network_loss, mode=None if mode == "default" else mode)
        return lambda batch, entropy_cost, intrinsic_coef: compiled(
            batch, torch.tensor(entropy_cost, device=device), torch.tensor(intrinsic_coef, device=device))

    def _network_loss(self, batch: dict[str, torch.Tensor], entropy_cost: float | torch.Tensor,
                      intrinsic_coef: float | torch.Tensor) -> LossTerms:
        """:meth:`loss` uncompiled; the two coefficients as floats or 0-d tensors (:meth:`_compiled_loss`)."""
        params, values, *preactivations = self._forward(batch)
        return self.agent_loss(batch, params, values, entropy_cost, intrinsic_coef, *preactivations)

    def _forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The learner network on every row of ``batch`` (``[T+1, B]``, or a ``[1, n]`` minibatch of
        steps): its policy parameters and values, with the run's precision; with PFO
        (``agent.pfo_coef > 0``) also the encoder's pre-activations, ``[rows, B, feature_dim]``."""
        core = (batch["core_h"], batch["core_c"]) if "core_h" in batch else ()
        with autocast(self.precision, self.device):
            params, values, _, *preactivations = self.policy.learner(
                batch["obs"], batch["first"], core, batch.get("last_action"), batch.get("last_reward"),
                with_preactivations=self.pfo)
        return params, values, *preactivations

    def _optimizer_step(self, batch: dict[str, torch.Tensor], entropy_cost: float,
                        stop: threading.Event | None, intrinsic_coef: float = 0.0) -> tuple[dict[str, float], bool]:
        """One optimizer step on ``batch``, skipped if the loss or the gradient norm is not finite.
        Returns ``{total, policy, value, entropy, grad_norm}`` (the norm before clipping) and the
        loss's diagnostics (:class:`distrl.learning.losses.LossTerms`), floats, and whether the step was made."""
        if self._cuda_graph_steps:
            torch.compiler.cudagraph_mark_step_begin()
        parameters = list(self.policy.learner.parameters())
        self.optimizer.zero_grad(set_to_none=True)
        if self.split is not None:
            terms = self.split.loss_and_gradients(
                self._forward, lambda params, values, *pre: self.agent_loss(batch, params, values, entropy_cost,
                                                                            intrinsic_coef, *pre), batch, parameters)
        else:
            terms = self.loss(batch, entropy_cost, intrinsic_coef)
            terms[0].backward()
        # an override's loss (distrl.compat.rllte) may give 4 terms, without the diagnostics
        total, policy, value, entropy, *rest = terms
        diagnostics = (rest[0] if rest else None) or {}
        if self.ranks.enabled:
            self.ranks.average_gradients(parameters, stop)
        grad_norm = torch.nn.utils.clip_grad_norm_(parameters, self.agent.max_grad_norm)
        terms = [total, policy, value, entropy, grad_norm, *diagnostics.values()]
        values = torch.stack([term.detach().float() for term in terms]).tolist()  # one sync
        scalars = dict(zip((*LOSS_NAMES, *diagnostics), values, strict=True))
        finite = math.isfinite(scalars["total"]) and math.isfinite(scalars["grad_norm"])
        if finite:
            self.optimizer.step()
        return scalars, finite

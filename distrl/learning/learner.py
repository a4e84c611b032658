"""The learner: learn from a batch of B full slots, publish the weights (step 3 of
:mod:`distrl.learning`).

A learner thread loops over :meth:`distrl.learning.batches.BatchSource.next` (B full slots copied
into a ``[T+1, B]`` batch, the slots freed; with ``train.prefetch`` the next batch is copied beside
the update) and :meth:`Learner.update`, which reads top to bottom: the network's running statistics
updated from the batch (the rewards scaled with ``agent.normalize_rewards``); with an intrinsic
reward (:mod:`distrl.intrinsic`) its rewards; what the plan computes once (:mod:`distrl.learning.plan`),
the value targets then normalised with ``agent.normalize_values``;
the plan's optimizer steps (:mod:`distrl.learning.step`, each on the agent's loss,
:mod:`distrl.learning.losses`); the new weights published into the actors' copy; the intrinsic
module trained. The learning rate, the entropy cost and the intrinsic reward's weight of each
update come from :class:`distrl.learning.schedule.Schedule` at the learner's update count, the one
counter of a run. :func:`make_learner` assembles a learner from the config's values.
"""

from __future__ import annotations

import threading
import time

import torch
from omegaconf import DictConfig

from distrl.intrinsic import IntrinsicReward
from distrl.learning.distributed import Ranks
from distrl.learning.losses import make_loss
from distrl.learning.plan import UpdatePlan
from distrl.learning.schedule import Position, Schedule
from distrl.learning.step import NetworkForward, OptimizerStep, StepOptions, make_step, run_steps
from distrl.nn.actor_learner import ActorLearner
from distrl.nn.normalization import normalize_batch, normalize_value_targets
from distrl.rollout import Batch


def make_optimizer(networks: ActorLearner, agent: DictConfig) -> torch.optim.Optimizer:
    """The optimizer over the learner copy: ``agent.optimizer`` is ``rmsprop`` (IMPALA's; decay
    ``alpha``, ``eps``, ``momentum``) or ``adam`` (betas 0.9, 0.999 and ``eps``), at ``agent.lr``.

    Adam runs PyTorch's fused kernel, one pass over all tensors: on the Atari network's 1.7M parameters
    a step takes 0.65 ms against the loop's 2.7 ms (``scripts/optimizer_step.py``, 2-core AMD EPYC with
    AVX512-BF16, 2026-12-08), and its parameters equal the loop's within float rounding (1.5e-8 after 50
    steps). It pairs a parameter's elements with its gradient's by memory order, so every gradient
    must be laid out as its parameter, as ``backward`` leaves it (the split step ensures it too).

    Raises:
        ValueError: another optimizer name (validation refuses it first).
    """
    params = networks.learner.parameters()
    if agent.optimizer == "rmsprop":
        return torch.optim.RMSprop(params, lr=agent.lr, alpha=agent.alpha, eps=agent.eps, momentum=agent.momentum)
    if agent.optimizer == "adam":
        return torch.optim.Adam(params, lr=agent.lr, eps=agent.eps, fused=True)
    raise ValueError(f"agent.optimizer={agent.optimizer!r}: use rmsprop or adam")


class Learner:
    """Runs the agent's updates on the learner copy and publishes the weights to the actors.

    Args:
        networks: the actor and learner copies of the network; ``optimizer_step`` trains the learner copy.
        optimizer_step: one optimizer step (:mod:`distrl.learning.step`).
        plan: the update's minibatches and what is computed before them (:mod:`distrl.learning.plan`).
        schedule: the run's schedule; the learning rate, entropy cost and intrinsic weight of every
            update follow from :attr:`updates`.
        intrinsic: an intrinsic reward module on the learner's device, trained after each update; None: none.

    Attributes:
        updates: updates made (the skipped non-finite ones included, so that the schedule follows
            the agent steps); a resumed run sets it. Guarded by ``lock`` with the weights.
        lock: held for an update, so that a checkpoint sees one moment.
        last_obs: the last batch's observations ``[T+1, B, ...]`` (for the dormant units' report).
    """

    def __init__(self, networks: ActorLearner, optimizer_step: OptimizerStep, plan: UpdatePlan, schedule: Schedule,
                 intrinsic: IntrinsicReward | None = None):
        self.networks, self.optimizer_step, self.plan = networks, optimizer_step, plan
        self.schedule, self.intrinsic = schedule, intrinsic
        self.lock = threading.RLock()
        self.updates = 0
        self.last_obs: torch.Tensor | None = None

    @property
    def ranks(self) -> Ranks:
        return self.optimizer_step.ranks

    @property
    def device(self) -> torch.device:
        return self.optimizer_step.forward.device

    def resume_at(self, updates: int) -> None:
        """Continue a run from its update count: :attr:`updates`, and the optimizer's learning rate
        that of the next update (as the run's own optimizer would hold it)."""
        self.updates = updates
        self.optimizer_step.set_learning_rate(self.position.learning_rate)

    @property
    def position(self) -> Position:
        """Where the run is now (:meth:`Schedule.at` of :attr:`updates`)."""
        return self.schedule.at(self.updates)

    def update(self, batch: Batch, stop: threading.Event | None = None) -> dict[str, float]:
        """One update on a ``[T+1, B]`` batch from :class:`distrl.learning.batches.BatchSource`: the
        plan's optimizer steps, then the new weights go to the actors and :attr:`updates` advances by
        one (whatever the epochs). ``stop`` ends a wait for the other ranks (every rank calls this
        once per update and makes the same steps).

        After the first step the batch is off-policy by the steps before it as well as by the
        actors' lag; V-trace corrects for both against the behaviour policy the actors stored, as
        for IMPALA's experience replay (Espeholt et al. 2018, Table 2). A non-finite loss or
        gradient norm skips that optimizer step and the steps after it (the weights and the
        optimizer state stay as the last finite step left them; the count still advances), and the
        intrinsic module is not trained on that batch.

        Returns:
            ``{"total", "policy", "value", "entropy", "grad_norm", "learning_rate", "entropy_cost",
            "finite", "publish_seconds"}`` and the loss's diagnostics (APPO's ``clip_fraction`` and
            ``approx_kl``; with PFO ``feature_drift``): the first optimizer step's losses, gradient
            norm and diagnostics (the batch against the weights it found), PFO's drift the last
            step's, or those of the non-finite step, floats; ``learning_rate`` and
            ``entropy_cost`` those this update used; ``finite`` a bool; ``publish_seconds`` the wall
            time of copying the weights to the actors. With an intrinsic reward also
            ``intrinsic_reward_raw`` and ``intrinsic_reward`` (mean per step, before and after
            normalisation), ``intrinsic_coef``, ``intrinsic_share`` (the weighted bonus's share of the
            reward paid, :meth:`distrl.learning.losses.base.AgentLoss.intrinsic_share`) and
            ``intrinsic_loss`` (the module's own loss; 0 for a module that trains nothing).
        """
        with self.lock:
            position = self.position
            self.optimizer_step.set_learning_rate(position.learning_rate)
            self.last_obs = batch["obs"]
            sum_across_ranks = self.ranks.sum_ if self.ranks.enabled else None
            batch = normalize_batch(self.networks.learner, batch, sum_across_ranks, stop)
            batch, intrinsic = self._intrinsic_rewards(batch, position)
            batch = self.plan.prepare(batch, self.optimizer_step.forward, position.intrinsic_coef)
            batch = normalize_value_targets(self.networks.learner, batch, sum_across_ranks, stop)
            reported, optimizer_steps, finite = run_steps(self.optimizer_step, self.plan.minibatches(batch),
                                                position.entropy_cost, position.intrinsic_coef, stop)
            publish_start = time.perf_counter()
            if optimizer_steps > 0:
                self.networks.publish()
            publish_seconds = time.perf_counter() - publish_start
            if self.intrinsic is not None:
                loss = self.intrinsic.update(batch) if finite else None
                intrinsic["intrinsic_loss"] = 0.0 if loss is None else loss
            self.updates += 1
        return {**reported, "learning_rate": position.learning_rate, "entropy_cost": position.entropy_cost,
                "finite": finite, "publish_seconds": publish_seconds, **intrinsic}

    def _intrinsic_rewards(self, batch: Batch, position: Position) -> tuple[Batch, dict[str, float]]:
        """``batch`` with its normalised intrinsic rewards (``intrinsic_reward [T, B]``) and their
        figures; ``batch`` itself and nothing without an intrinsic module."""
        if self.intrinsic is None:
            return batch, {}
        raw, normalised = self.intrinsic.rewards(batch)
        batch = {**batch, "intrinsic_reward": normalised}
        return batch, {"intrinsic_reward_raw": raw.mean().item(), "intrinsic_reward": normalised.mean().item(),
                       "intrinsic_coef": position.intrinsic_coef,
                       "intrinsic_share": self.optimizer_step.loss.intrinsic_share(batch, position.intrinsic_coef)}


def make_learner(networks: ActorLearner, optimizer: torch.optim.Optimizer, schedule: Schedule, agent: DictConfig,
                 options: StepOptions, *, ranks: Ranks | None = None, intrinsic: IntrinsicReward | None = None,
                 pretraining: bool = False) -> Learner:
    """The learner of a run, every choice made here from the config's values.

    Args:
        networks: the actor and learner copies of the network; its learner copy is on ``options.device``.
        optimizer: from :func:`make_optimizer`.
        schedule: the run's schedule.
        agent: the ``agent`` config node: the loss (:func:`distrl.learning.losses.make_loss`), the plan
            (:meth:`UpdatePlan.for_agent`) and ``max_grad_norm``.
        options: how the steps are computed (:class:`distrl.learning.step.StepOptions`: the device, the
            precision, compiled or split).
        ranks: the run's ranks; None: one.
        intrinsic: an intrinsic reward module on the device; None: none.
        pretraining: the extrinsic reward is left out of the loss (reward-free training).
    """
    net = networks.learner
    loss = make_loss(agent, net.action_space, value_heads=1 if net.intrinsic_baseline is None else 2,
                     intrinsic=intrinsic is not None, pretraining=pretraining, value_norm=net.value_norm)
    forward = NetworkForward(net, options.precision, options.device, preactivations=loss.reads_preactivations)
    optimizer_step = make_step(forward, loss, optimizer, agent.max_grad_norm, ranks or Ranks(), options)
    return Learner(networks, optimizer_step, UpdatePlan.for_agent(agent, loss), schedule, intrinsic)

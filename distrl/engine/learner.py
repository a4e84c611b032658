"""One learner update (batch -> V-trace loss -> optimizer step -> publish) and the learner thread.

The loss is IMPALA's (Espeholt et al. 2018, Section 4.2): policy gradient
with V-trace advantages, ``baseline_cost`` x the squared error to the
V-trace targets ``vs``, and ``entropy_cost`` x the negative entropy, each
averaged over the ``T x B`` steps of the batch (IMPALA sums them; see
:mod:`distrl.vtrace` for why distrl averages). Rewards are clipped to
``[-reward_clip, reward_clip]`` in the loss only. The learning rate warms up
linearly over ``lr_warmup_steps`` and decays linearly to 0 over ``num_train_steps``
agent steps, ``T x B`` per update; the entropy cost decays with it under
``entropy_schedule: linear`` or follows a list of points (:func:`entropy_factor`).
An update makes ``num_epochs`` optimizer steps on its batch.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from omegaconf import DictConfig

from distrl import vtrace
from distrl.distributed import Ranks
from distrl.engine.storage import BOOTSTRAP, STEPS, RolloutStorage
from distrl.policy import DistributedActorLearner

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5


def make_optimizer(policy: DistributedActorLearner, agent: DictConfig) -> torch.optim.Optimizer:
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


def make_scheduler(optimizer: torch.optim.Optimizer, steps_per_update: int, num_train_steps: int,
                   warmup_steps: int = 0) -> torch.optim.lr_scheduler.LambdaLR:
    """The learning rate's schedule: a linear warm-up from 0 over the first ``warmup_steps``
    agent steps, times a linear decay to 0 at ``num_train_steps`` agent steps.

    The scheduler counts updates; each consumes ``steps_per_update = T x B`` agent steps. Its
    factor function carries the decay alone as ``.decay(updates)`` (for the entropy schedule).

    Why the warm-up: torch's RMSProp starts its running mean of squared gradients at 0, so its
    first step moves every weight by ``lr / sqrt(1 - alpha)`` (10 x lr at alpha 0.99) in the sign
    of its gradient, whatever the gradient's size. On Pong that first step alone took the
    policy's entropy from ln 6 (1.79) to 0.13 and left 8 of the first layer's 32 filters dead,
    4 more than at initialisation (docs/learning.md, "The first updates").
    """
    def decay(updates: int) -> float:
        return max(0.0, 1.0 - updates * steps_per_update / num_train_steps)

    def factor(updates: int) -> float:
        warmup = min(1.0, (updates + 1) * steps_per_update / warmup_steps) if warmup_steps > 0 else 1.0
        return warmup * decay(updates)

    factor.decay = decay
    factor.steps_per_update = steps_per_update
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def entropy_factor(points: Sequence[Sequence[float]], agent_steps: int) -> float:
    """The factor on ``agent.entropy_cost`` at ``agent_steps`` under a list of
    ``[agent_steps, factor]`` points (``agent.entropy_schedule``, validated by
    :mod:`distrl.config`): 1 until the first point, linear between consecutive points, the last
    point's factor after it; where two points share a step the factor jumps there. So
    ``[[2500000, 1.0], [3000000, 0.2]]`` holds the entropy cost to 2.5M agent steps and brings it
    to a fifth by 3M; ``[[3000000, 1.0], [3000000, 0.2]]`` is a step at 3M. A factor rather
    than a cost, so that ``agent.entropy_cost`` stays the knob to sweep; piecewise linear like
    RLlib's ``entropy_coeff_schedule`` (which gives costs)."""
    x, y = 0.0, 1.0
    for step, factor in points:
        if agent_steps < step:
            return y + (factor - y) * (agent_steps - x) / (step - x)
        x, y = float(step), float(factor)
    return y


class Learner:
    """Runs IMPALA updates on the learner copy and publishes weights to the actors.

    Args:
        policy: the actor/learner pair; its learner copy is on ``device``.
        optimizer, scheduler: from :func:`make_optimizer` / :func:`make_scheduler`.
        agent: the ``agent`` config node.
        device: the learner copy's device.
        compile: wrap the learner network in ``torch.compile``.
        ranks: with several ranks, gradients are averaged across them before every step
            (:mod:`distrl.distributed`).
    """

    def __init__(self, policy: DistributedActorLearner, optimizer, scheduler, agent: DictConfig,
                 device: torch.device, compile: bool = False, ranks: Ranks | None = None):
        self.policy = policy
        self.ranks = ranks or Ranks()
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.agent = agent
        self.device = device
        self.network = torch.compile(policy.learner) if compile else policy.learner
        self.lock = threading.RLock()  # held for an update and its counters (run_learner_thread)

    def update(self, batch: dict[str, torch.Tensor], stop: threading.Event | None = None) -> dict[str, float]:
        """``agent.num_epochs`` optimizer steps on one ``[T+1, B]`` batch from
        :meth:`RolloutStorage.gather`, then the new weights go to the actors and the learning-rate
        schedule advances by the batch's ``T x B`` agent steps (once, whatever the epochs).

        Each epoch runs the network on all T+1 rows with the weights of that moment; the loss
        uses rows :data:`STEPS` and bootstraps from the value of row :data:`BOOTSTRAP` (the layout
        is :mod:`distrl.engine.storage`'s). From the second epoch on the batch is off-policy by the
        epochs before it as well as by the actors' lag; V-trace corrects for both against the
        behaviour logits the actors stored, as for IMPALA's experience replay (Espeholt et al.
        2018, Table 2), which learns from old batches the same way.

        With several ranks the gradients are averaged across them first (every rank calls this
        once per update and makes the same epochs; ``stop`` ends the wait for the others).

        A non-finite loss or gradient norm skips that optimizer step and the epochs after it (the
        weights and the optimizer state stay as the last finite step left them; the schedule still
        advances) and returns ``finite=False``.

        Returns:
            ``{"total", "policy", "value", "entropy", "grad_norm", "learning_rate", "entropy_cost",
            "finite", "publish_seconds"}``: the first epoch's losses and gradient norm (the batch
            against the weights it found), or those of the non-finite epoch, floats;
            ``learning_rate`` and ``entropy_cost`` those this update used; ``finite`` a bool;
            ``publish_seconds`` the wall time of copying the weights to the actors.
        """
        with self.lock:
            learning_rate = self.optimizer.param_groups[0]["lr"]
            entropy_cost = self.entropy_cost()
            for epoch in range(self.agent.num_epochs):
                scalars, finite = self._step(batch, entropy_cost, stop)
                if epoch == 0 or not finite:
                    reported = scalars
                if not finite:
                    break
            publish_start = time.perf_counter()
            if finite or epoch > 0:  # at least one optimizer step was made
                self.policy.publish()
            publish_seconds = time.perf_counter() - publish_start
            self.scheduler.step()
        names = ("total", "policy", "value", "entropy", "grad_norm")
        return {**dict(zip(names, reported, strict=True)), "learning_rate": learning_rate,
                "entropy_cost": entropy_cost, "finite": finite, "publish_seconds": publish_seconds}

    def _step(self, batch: dict[str, torch.Tensor], entropy_cost: float,
              stop: threading.Event | None) -> tuple[list[float], bool]:
        """One optimizer step on ``batch`` (see :meth:`update`), skipped if the loss or the gradient
        norm is not finite. Returns ``[total, policy, value, entropy, grad_norm]`` (the loss terms
        averaged over the ``T x B`` steps, the norm before clipping) and whether the step was made."""
        agent = self.agent
        core = (batch["core_h"], batch["core_c"]) if "core_h" in batch else ()
        logits, values, _ = self.network(batch["obs"], batch["first"], core,  # all T+1 rows
                                         batch.get("last_action"), batch.get("last_reward"))
        logits, baseline = logits[STEPS], values[STEPS]
        rewards = batch["reward"][STEPS]
        if agent.reward_clip is not None:
            rewards = rewards.clamp(-agent.reward_clip, agent.reward_clip)
        actions = batch["action"][STEPS]
        targets = vtrace.vtrace_from_logits(
            behaviour_logits=batch["policy_logits"][STEPS],
            target_logits=logits,
            actions=actions,
            rewards=rewards,
            terminated=batch["terminated"][STEPS],
            truncated=batch["truncated"][STEPS],
            values=baseline,
            bootstrap_value=values[BOOTSTRAP],
            truncation_values=batch["truncation_value"][STEPS],
            discount=agent.discount,
            rho_bar=agent.rho_bar,
            c_bar=agent.c_bar,
        )
        pg_loss = vtrace.policy_gradient_loss(logits, actions, targets.pg_advantages)
        value_loss = vtrace.baseline_loss(targets.vs - baseline)
        entropy_loss = vtrace.entropy_loss(logits)
        total = pg_loss + agent.baseline_cost * value_loss + entropy_cost * entropy_loss

        self.optimizer.zero_grad(set_to_none=True)
        total.backward()
        if self.ranks.enabled:
            self.ranks.average_gradients(self.policy.learner.parameters(), stop)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.learner.parameters(), agent.max_grad_norm)
        scalars = torch.stack([total, pg_loss, value_loss, entropy_loss, grad_norm]).detach().tolist()  # one sync
        finite = math.isfinite(scalars[0]) and math.isfinite(scalars[-1])
        if finite:
            self.optimizer.step()
        return scalars, finite

    def entropy_cost(self) -> float:
        """The entropy cost of the next update: ``agent.entropy_cost`` with ``entropy_schedule:
        constant``; times the learning rate's decay factor (1 at the start, 0 at
        ``num_train_steps``; no warm-up) with ``linear``; with a list of points,
        times :func:`entropy_factor` at the agent steps consumed so far."""
        schedule = self.agent.entropy_schedule
        lr_factor = self.scheduler.lr_lambdas[0]  # make_scheduler's: carries .decay and .steps_per_update
        updates = self.scheduler.last_epoch
        if schedule == "constant":
            return self.agent.entropy_cost
        if schedule == "linear":
            return self.agent.entropy_cost * lr_factor.decay(updates)
        return self.agent.entropy_cost * entropy_factor(schedule, updates * lr_factor.steps_per_update)


@dataclass
class LearnerStats:
    """What the learner threads report, read by the trainer's schedule.

    ``agent_steps``: agent steps consumed (``T x B`` per update); ``updates``: learner updates
    (the skipped non-finite ones included, so that the learning rate follows the agent steps);
    ``policy_lag``: learner updates between acting and learning, mean over the last batch;
    ``last``: the last update's losses (:meth:`Learner.update`);
    ``seconds``: wall time the learner threads spent, summed over threads and updates, in
    ``wait`` (for full slots: the actors are behind), ``gather`` (copying B slots into a batch on
    the learner's device), ``step`` (the optimizer steps: forward, V-trace, backward, clip, step)
    and ``publish`` (the new weights to the actors);
    ``nonfinite_updates``: updates skipped for a non-finite loss or gradient;
    ``activity``: per learner thread name, what it is doing (for the stall report).
    """

    agent_steps: int = 0
    updates: int = 0
    last: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=lambda: dict.fromkeys(("wait", "gather", "step", "publish"), 0.0))
    policy_lag: float = 0.0
    nonfinite_updates: int = 0
    activity: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class NonFiniteError(RuntimeError):
    """Too many learner updates in a row had a non-finite loss or gradient."""


def run_learner_thread(learner: Learner, *, storage: RolloutStorage, stats: LearnerStats, batch_size: int,
                       num_train_steps: int, policy_version, stop: threading.Event, errors: list,
                       max_nonfinite_updates: int = 10, check_interval: int = 100,
                       exchange_interval: int = 8) -> None:
    """Loop: take ``B`` full slots, gather the batch, free the slots, update, until ``stats.agent_steps``
    reaches ``num_train_steps``. Each update consumes ``T x B`` agent steps.

    Every wait polls ``stop``, so the thread never blocks forever. An exception is appended to
    ``errors`` and sets ``stop``; ``max_nonfinite_updates`` skipped updates in a row raise
    :class:`NonFiniteError` that way. With several ranks (``learner.ranks``) the update count is the
    same on every rank, each update consumes ``T x B x world_size`` global agent steps, the weights
    are compared across ranks every ``check_interval`` updates and finished episodes go to rank 0
    every ``exchange_interval`` updates.
    """
    ranks = learner.ranks
    steps_per_update = storage.layout.num_steps * batch_size * ranks.world_size
    name = threading.current_thread().name
    held: list[int] = []
    nonfinite_in_a_row = 0
    try:
        while not stop.is_set():
            with stats.lock:
                done = stats.agent_steps >= num_train_steps
            if done:
                stats.activity[name] = "done: the budget is consumed"
                if ranks.enabled:  # every rank is here at the same update
                    ranks.exchange_episodes(stop)
                    with learner.lock:
                        ranks.check_identical(list(learner.policy.learner.parameters()), stop)
                return
            wait_start = time.perf_counter()
            while len(held) < batch_size and not stop.is_set():
                stats.activity[name] = f"waiting for full slots ({len(held)} of {batch_size} held)"
                try:
                    held.append(storage.full_queue.get(timeout=POLL_SECONDS))
                except queue.Empty:
                    continue
            if stop.is_set():
                return
            stats.activity[name] = "updating"
            gather_start = time.perf_counter()
            batch = storage.gather(held, learner.device)
            for index in held:
                storage.free_queue.put(index)
            held.clear()
            start = time.perf_counter()
            with learner.lock:  # a checkpoint sees the weights and the counters of one moment
                losses = learner.update(batch, stop)
                finite = losses.pop("finite")
                with stats.lock:
                    lag = stats.updates - batch["policy_version"].float().mean().item()
                    stats.updates += 1
                    stats.agent_steps += steps_per_update
                    policy_version.value = stats.updates
                    stats.policy_lag = lag
                    publish_seconds = losses.pop("publish_seconds")
                    stats.last = losses
                    seconds = stats.seconds
                    seconds["wait"] += gather_start - wait_start
                    seconds["gather"] += start - gather_start
                    seconds["step"] += time.perf_counter() - start - publish_seconds
                    seconds["publish"] += publish_seconds
            if ranks.enabled:
                if stats.updates % exchange_interval == 0:
                    ranks.exchange_episodes(stop)
                if stats.updates % check_interval == 0:
                    with learner.lock:
                        ranks.check_identical(list(learner.policy.learner.parameters()), stop)
            if finite:
                nonfinite_in_a_row = 0
                continue
            nonfinite_in_a_row += 1
            with stats.lock:
                stats.nonfinite_updates += 1
            log.warning("update %d skipped: non-finite loss %s or gradient norm %s (%d in a row)",
                        stats.updates, losses["total"], losses["grad_norm"], nonfinite_in_a_row)
            if nonfinite_in_a_row >= max_nonfinite_updates:
                raise NonFiniteError(
                    f"{nonfinite_in_a_row} updates in a row had a non-finite loss or gradient "
                    f"(train.max_nonfinite_updates={max_nonfinite_updates}); the weights are those "
                    f"before the first of them")
    except Exception as exc:  # reported by the trainer, which stops everything
        errors.append(exc)
        stop.set()
    finally:
        for index in held:
            storage.free_queue.put(index)

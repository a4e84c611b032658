"""Where a run is and what is due: everything follows from one counter, the learner's updates.

:meth:`Schedule.at` turns the number of updates into agent steps, frames, the policy version, the
learning rate and the entropy cost of the next update; nothing else keeps any of them. The
trainer's loop asks each :class:`Every` whether its work is due (log, evaluate, save);
:class:`Throughput` gives agent steps per second over the last few seconds, so the progress bar's
SPS is right from the first updates.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf


@dataclass(frozen=True)
class Position:
    """A run after ``updates`` learner updates.

    Attributes:
        updates: learner updates made (the skipped non-finite ones included).
        agent_steps: agent steps consumed, ``updates x T x B x ranks``.
        frames: ``agent_steps x frameskip``.
        policy_version: the version of the weights the actors act with (= ``updates``).
        learning_rate: the learning rate of the next update.
        entropy_cost: the entropy cost of the next update.
        intrinsic_coef: the weight of the normalised intrinsic reward in the next update.
    """

    updates: int
    agent_steps: int
    frames: int
    policy_version: int
    learning_rate: float
    entropy_cost: float
    intrinsic_coef: float = 0.0


class Scheduled(NamedTuple):
    """A coefficient and its schedule: ``constant``, ``linear`` (the entropy cost only) or a tuple of
    ``(agent_steps, factor)`` points (:func:`piecewise_factor`)."""

    value: float
    schedule: Any


@dataclass(frozen=True)
class Schedule:
    """The constants of a run's schedule.

    Attributes:
        steps_per_update: agent steps an update consumes, ``T x B x ranks`` (global, so that the
            budget and every interval mean the same on any number of ranks).
        num_train_steps: the budget in agent steps; the learning rate reaches 0 there.
        frameskip: frames per agent step.
        lr: ``agent.lr``, the peak learning rate.
        lr_warmup_steps: agent steps of linear warm-up from 0.
        entropy: ``agent.entropy_cost`` on ``agent.entropy_schedule``: ``constant``, ``linear`` or a
            list of ``[agent_steps, factor]`` points (:func:`piecewise_factor`).
        intrinsic: ``intrinsic.coef`` (0 without an intrinsic reward) on ``intrinsic.coef_schedule``:
            ``constant`` or a list of points.
    """

    steps_per_update: int
    num_train_steps: int
    frameskip: int
    lr: float
    lr_warmup_steps: int
    entropy: Scheduled
    intrinsic: Scheduled = Scheduled(0.0, "constant")

    @classmethod
    def for_run(cls, cfg: DictConfig, world_size: int = 1, frameskip: int = 1) -> Schedule:
        """The schedule of train config ``cfg`` on ``world_size`` ranks."""
        intrinsic = cfg.get("intrinsic") or {"name": "none"}
        coef = 0.0 if intrinsic["name"] == "none" else intrinsic["coef"]
        entropy = Scheduled(cfg.agent.entropy_cost, _points(cfg.agent.entropy_schedule))
        bonus = Scheduled(coef, _points(intrinsic.get("coef_schedule", "constant")))
        return cls(cfg.num_steps * cfg.batch_size * world_size, cfg.train.num_train_steps, frameskip,
                   cfg.agent.lr, cfg.agent.lr_warmup_steps, entropy, bonus)

    def at(self, updates: int) -> Position:
        """Where the run is after ``updates`` updates, and the learning rate and entropy cost of
        the next one.

        The learning rate is ``lr`` x a linear warm-up from 0 over the first ``lr_warmup_steps``
        agent steps (counting the next update's) x a linear decay to 0 at ``num_train_steps``
        (docs/lab/learning.md, "The first updates", says why the warm-up). The entropy cost is
        ``entropy_cost`` with ``constant``, times that decay (not the warm-up) with ``linear``,
        times :func:`piecewise_factor` at the agent steps consumed with a list of points; the
        intrinsic reward's weight follows its own list of points the same way.
        """
        agent_steps = updates * self.steps_per_update
        decay = max(0.0, 1.0 - agent_steps / self.num_train_steps)
        warmup = 1.0
        if self.lr_warmup_steps > 0:
            warmup = min(1.0, (agent_steps + self.steps_per_update) / self.lr_warmup_steps)
        entropy = self.entropy.value
        if self.entropy.schedule == "linear":
            entropy *= decay
        elif self.entropy.schedule != "constant":
            entropy *= piecewise_factor(self.entropy.schedule, agent_steps)
        coef = self.intrinsic.value
        if self.intrinsic.schedule != "constant":
            coef *= piecewise_factor(self.intrinsic.schedule, agent_steps)
        return Position(updates, agent_steps, agent_steps * self.frameskip, updates, self.lr * (warmup * decay),
                        entropy, coef)

    def updates_at(self, agent_steps: int) -> int:
        """The updates that consume ``agent_steps`` here (a checkpoint's agent steps are global; a
        resumed run may have another ``T x B x ranks``): rounded down to a whole update."""
        return agent_steps // self.steps_per_update


def _points(schedule: Any) -> Any:
    """A schedule's name, or its list of points as a tuple of tuples (hashable, comparable)."""
    if OmegaConf.is_config(schedule):
        schedule = OmegaConf.to_container(schedule)
    if isinstance(schedule, list):
        return tuple(tuple(point) for point in schedule)
    return schedule


def piecewise_factor(points: Sequence[Sequence[float]], agent_steps: int) -> float:
    """The factor on ``agent.entropy_cost`` (``agent.entropy_schedule``) or on ``intrinsic.coef``
    (``intrinsic.coef_schedule``) at ``agent_steps`` under a list of ``[agent_steps, factor]``
    points (validated by :mod:`distrl.config.validation`): 1 until the first point, linear between
    consecutive points, the last point's factor after it; where two points share a step the factor jumps there. So
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


@dataclass
class Every:
    """Work that is due once ``interval`` agent steps have passed since it last ran (at ``last``)."""

    interval: int
    last: int = 0

    def due(self, step: int) -> bool:
        return step - self.last >= self.interval

    def ran(self, step: int) -> None:
        self.last = step


class Throughput:
    """Agent steps per second over a sliding window of ``window`` seconds."""

    def __init__(self, step: int, window: float = 10.0):
        self.window = window
        self.points: deque[tuple[float, int]] = deque([(time.perf_counter(), step)])

    def add(self, step: int) -> float:
        """Record ``step`` now; the rate since the oldest point in the window (0 before any progress)."""
        now = time.perf_counter()
        self.points.append((now, step))
        while len(self.points) > 2 and now - self.points[1][0] >= self.window:
            self.points.popleft()
        (t0, s0), (t1, s1) = self.points[0], self.points[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0

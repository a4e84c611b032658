"""Periodic work in agent steps, and a throughput meter.

The trainer's loop asks each :class:`Every` whether its work is due (log, evaluate, save);
:class:`Throughput` gives agent steps per second over the last few seconds, so the progress
bar's SPS is right from the first updates.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass


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

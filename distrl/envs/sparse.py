"""A sparse-reward diagnostic: a chain where random play almost never finds the one reward.

``distrl/SparseChain-v1``: ``length`` cells (40), the agent starts in cell 0; each step, one of the
two actions moves it one cell on and the other one cell back (back stays put in cell 0). Which
action moves on differs from cell to cell, a fixed pattern (:data:`FORWARD`), so that no policy
that ignores the observation (always the same action, or alternating) gets through: a combination
lock. Reaching the last cell pays +1 and ends the episode; nothing else pays. Episodes are cut at 80
steps (the registered limit). The observation is the cell, one-hot, ``[length] float32``.

v0 moved on with action 1 in every cell, so a policy that collapsed early onto action 1 (RMSProp's
first large steps can do that, without any exploration) solved it; v1 closes that door.

Random play reaches the last cell of 40 within 80 steps in about 1 episode of 70,000 (a reflected
random walk, 39 cells in 80 steps; see ``tests/test_exploration.py``), so an agent that explores by
its policy's entropy alone does not find the reward in a short budget; an intrinsic reward for new
cells leads it there. Best return 1.

Registered with Gymnasium when :mod:`distrl.envs` is imported; use it with ``env=sparse_chain``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


def forward_actions(length: int) -> np.ndarray:
    """The action that moves on in each cell, ``[length] int64`` of 0 and 1: a fixed pattern (numpy's
    generator seeded with 0), neither constant nor alternating."""
    return np.random.default_rng(0).integers(0, 2, length)


class SparseChain(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, length: int = 40, render_mode: str | None = None):
        if length < 2:
            raise ValueError(f"length={length}: use 2 or more")
        self.length = length
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(0.0, 1.0, (length,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.forward = forward_actions(length)
        self.cell = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.length, np.float32)
        obs[self.cell] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cell = 0
        return self._obs(), {}

    def step(self, action):
        on = int(action) == self.forward[self.cell]
        self.cell = min(self.length - 1, self.cell + 1) if on else max(0, self.cell - 1)
        reached = self.cell == self.length - 1
        return self._obs(), float(reached), reached, False, {}


def register() -> None:
    """Register ``distrl/SparseChain-v1`` with Gymnasium (idempotent)."""
    if "distrl/SparseChain-v1" not in gym.registry:
        gym.register("distrl/SparseChain-v1", entry_point=f"{__name__}:SparseChain", max_episode_steps=80)

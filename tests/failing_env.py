"""Real Gymnasium envs that fail: one raises after a few steps (an actor that raises), one cannot be created
(a config error before any process starts), one stops answering (a hung emulator), one pays NaN rewards.

Registered as ``FailsAfterSteps-v0``, ``FailsOnCreation-v0``, ``HangsAfterSteps-v0`` and
``NanRewardsAfterSteps-v0``, and a slow one, ``SlowSteps-v0``; use ``env.id=failing_env:<id>`` with
``tests/`` on the path.
"""

import time

import gymnasium as gym
import numpy as np


class FailsAfterSteps(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, fail_at: int = 300, render_mode=None):
        self.fail_at = fail_at
        self.render_mode = render_mode
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.steps += 1
        if self.steps >= self.fail_at:
            raise RuntimeError(f"the emulator broke at step {self.steps}")
        return np.zeros(3, np.float32), 1.0, self.steps % 50 == 0, False, {}


class FailsOnCreation(gym.Env):
    """A registered env whose constructor raises (a missing ROM, a broken install)."""

    def __init__(self):
        raise RuntimeError("the emulator cannot start\nsecond line")


class HangsAfterSteps(FailsAfterSteps):
    """Never returns from ``step`` once ``fail_at`` steps are done."""

    def step(self, action):
        self.steps += 1
        while self.steps >= self.fail_at:
            time.sleep(3600)
        return np.zeros(3, np.float32), 1.0, self.steps % 50 == 0, False, {}


class NanRewardsAfterSteps(FailsAfterSteps):
    """Pays NaN from step ``fail_at`` on (a broken reward function)."""

    def step(self, action):
        self.steps += 1
        reward = float("nan") if self.steps >= self.fail_at else 1.0
        return np.zeros(3, np.float32), reward, self.steps % 50 == 0, False, {}


class SlowSteps(FailsAfterSteps):
    """Takes 200 ms a step (a slow simulator), and never fails."""

    def step(self, action):
        time.sleep(0.2)
        self.steps += 1
        return np.zeros(3, np.float32), 1.0, self.steps % 50 == 0, False, {}


gym.register("HangsAfterSteps-v0", entry_point=HangsAfterSteps)
gym.register("SlowSteps-v0", entry_point=SlowSteps)
gym.register("NanRewardsAfterSteps-v0", entry_point=NanRewardsAfterSteps, kwargs={"fail_at": 1000})
gym.register("FailsAfterSteps-v0", entry_point=FailsAfterSteps)
gym.register("FailsOnCreation-v0", entry_point=FailsOnCreation)

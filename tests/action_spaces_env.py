"""Small Gymnasium envs for the action and observation spaces distrl models or refuses, registered on
import (``env.id=action_spaces_env:<Id>`` imports this module, in the actor processes too).

- ``MultiDiscreteCue-v0``: a vector cue of two one-hot parts; the reward is 0.5 per dimension of the
  MultiDiscrete([3, 4]) action that names its part.
- ``BoxTarget-v0``: a vector target in [-1, 1]^2; the reward is minus the squared distance of the
  Box action (clipped to [-1, 1] by distrl) from it.
- ``DictObs-v0`` and ``MultiBinary-v0``: spaces distrl refuses.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class _OneStep(gym.Env):
    """Episodes of ``length`` steps, each with a fresh observation drawn by ``_draw``."""

    length = 8
    metadata = {"render_modes": []}

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._draw(), {}

    def step(self, action):
        reward = self._reward(action)
        self._t += 1
        return self._draw(), reward, False, self._t >= self.length, {}


class MultiDiscreteCue(_OneStep):
    NVEC = (3, 4)

    def __init__(self, render_mode=None):
        super().__init__(render_mode)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (sum(self.NVEC),), np.float32)
        self.action_space = gym.spaces.MultiDiscrete(self.NVEC)

    def _draw(self):
        self._cue = [int(self.np_random.integers(n)) for n in self.NVEC]
        obs = np.zeros(sum(self.NVEC), np.float32)
        obs[self._cue[0]] = obs[self.NVEC[0] + self._cue[1]] = 1.0
        return obs

    def _reward(self, action):
        return 0.5 * sum(int(a) == c for a, c in zip(action, self._cue, strict=True))


class BoxTarget(_OneStep):
    def __init__(self, render_mode=None):
        super().__init__(render_mode)
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def _draw(self):
        self._target = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self._target.copy()

    def _reward(self, action):
        assert np.all(np.abs(action) <= 1.0), "distrl sends a Box action clipped to the bounds"
        return -float(np.sum((np.asarray(action) - self._target) ** 2))


class DictObs(BoxTarget):
    def __init__(self, render_mode=None):
        super().__init__(render_mode)
        self.observation_space = gym.spaces.Dict({"target": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)})

    def _draw(self):
        return {"target": super()._draw()}


class MultiBinaryActions(BoxTarget):
    def __init__(self, render_mode=None):
        super().__init__(render_mode)
        self.action_space = gym.spaces.MultiBinary(2)

    def _reward(self, action):
        return 0.0


for name, cls in (("MultiDiscreteCue-v0", MultiDiscreteCue), ("BoxTarget-v0", BoxTarget), ("DictObs-v0", DictObs),
                  ("MultiBinary-v0", MultiBinaryActions)):
    if name not in gym.registry:
        gym.register(name, entry_point=cls)

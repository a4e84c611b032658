"""Image-observation diagnostic environments: Atari-sized frames whose drawn cue says which action pays.

They check the image path (uint8 frames, frame stacking, the row alignment of
observation, action and reward in the storages, the bootstrap, the weights
the actors act with) in about a minute, where a defect would otherwise show
only as a Pong run that never leaves random play.

Observations are ``[4, 84, 84] uint8``, a stack of the last 4 frames, oldest
first (as in distrl's Atari envs). A cue is a bright block in one of
``num_actions`` vertical bands of the frame.

- ``distrl/ImageCue-v0``: every step shows a new random cue; the action of
  the cue's band pays +1, any other 0. 20 steps an episode: best return 20,
  random play 20 / 6 = 3.33. A bar across the top grows with the step, so that
  the value (the reward still to come) is a function of the observation.
  Solving it needs the newest frame read right and each reward credited to the
  action taken on that frame.
- ``distrl/ImageCueMemory-v0``: the cue is shown on the first step only;
  ``delay`` blank frames follow (by default 3, so the cue has left the stack of
  4), then a query frame (a bar across the bottom) where the action of the
  first step's band pays +1. Best return 1, random 1/6; a feed-forward
  network cannot do better than random, an LSTM can.

Registered with Gymnasium when :mod:`distrl.envs` is imported; use them with
``env=image_cue`` / ``env=image_cue_memory``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

SIZE = 84
STACK = 4


class _CueFrames(gym.Env):
    """Frame drawing, stacking and the first (cue) frame; subclasses decide the later frames and rewards."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, num_actions: int = 6, render_mode: str | None = None):
        if not 2 <= num_actions <= SIZE:
            raise ValueError(f"num_actions={num_actions}: use 2..{SIZE}")
        self.num_actions = num_actions
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(0, 255, (STACK, SIZE, SIZE), np.uint8)
        self.action_space = gym.spaces.Discrete(num_actions)
        self._stack = np.zeros((STACK, SIZE, SIZE), np.uint8)
        self._band = SIZE // num_actions

    def _frame(self, cue: int | None = None, query: bool = False, timer: float = 0.0) -> np.ndarray:
        """One ``[84, 84] uint8`` frame: black, a 255 block in band ``cue``, a bar across the
        bottom if ``query``, and a bar across the top over the fraction ``timer`` of the width."""
        frame = np.zeros((SIZE, SIZE), np.uint8)
        if cue is not None:
            frame[28:56, cue * self._band:(cue + 1) * self._band] = 255
        if query:
            frame[76:80, :] = 128
        frame[4:8, :round(timer * SIZE)] = 96
        return frame

    def _push(self, frame: np.ndarray) -> np.ndarray:
        self._stack[:-1] = self._stack[1:]
        self._stack[-1] = frame
        return self._stack.copy()

    def _start(self, frame: np.ndarray) -> np.ndarray:
        self._stack[:] = 0
        return self._push(frame)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Start an episode: step 0, a random cue drawn in the first frame of an empty stack."""
        super().reset(seed=seed)
        self._t = 0
        self._cue = int(self.np_random.integers(self.num_actions))
        return self._start(self._frame(self._cue)), {}

    def render(self) -> np.ndarray:
        """The newest frame as ``[84, 84, 3] uint8`` RGB."""
        return np.repeat(self._stack[-1][:, :, None], 3, axis=2)


class ImageCue(_CueFrames):
    """A new cue every step; the cue's action pays +1 (see the module docstring)."""

    def __init__(self, num_actions: int = 6, episode_steps: int = 20, render_mode: str | None = None):
        super().__init__(num_actions, render_mode)
        self.episode_steps = episode_steps

    def step(self, action):
        reward = float(int(action) == self._cue)
        self._t += 1
        self._cue = int(self.np_random.integers(self.num_actions))
        frame = self._frame(self._cue, timer=self._t / self.episode_steps)
        return self._push(frame), reward, self._t >= self.episode_steps, False, {}


class ImageCueMemory(_CueFrames):
    """The cue on the first frame only; its action pays +1 at the query frame ``delay + 1`` steps later."""

    def __init__(self, num_actions: int = 6, delay: int = STACK - 1, render_mode: str | None = None):
        super().__init__(num_actions, render_mode)
        self.delay = delay

    def step(self, action):
        at_query = self._t == self.delay + 1
        reward = float(at_query and int(action) == self._cue)
        self._t += 1
        obs = self._push(self._frame(query=self._t == self.delay + 1))
        return obs, reward, at_query, False, {}


def register() -> None:
    """Register the diagnostic ids with Gymnasium (idempotent)."""
    for name, cls in (("ImageCue-v0", ImageCue), ("ImageCueMemory-v0", ImageCueMemory)):
        env_id = f"distrl/{name}"
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=f"{__name__}:{cls.__name__}")

"""How an actor steps its envs (step 1 of :mod:`distrl.sampling`): :class:`VectorStepper` gives the
two kinds of vector env :mod:`distrl.envs` builds (ale-py's, which steps half its envs while the
caller works on the other half, and Gymnasium's) one ``send``/``recv`` interface, and
:func:`final_observations` picks the last observations of the episodes that just ended."""

from __future__ import annotations

import numpy as np


def final_observations(info: dict, done: np.ndarray) -> np.ndarray:
    """The last observations of the sub-environments whose episode just ended.

    Args:
        info: the ``info`` dict of a ``SameStep`` vector env's ``step``.
        done: ``[N] bool``, terminated or truncated.

    Returns:
        ``[done.sum(), *obs_shape]``, in the order of ``np.flatnonzero(done)``.
    """
    final = info["final_obs"]
    index = np.flatnonzero(done)
    if final.dtype == object:  # Gymnasium's sync vector env: None where not done
        return np.stack([final[i] for i in index])
    return final[index]


class VectorStepper:
    """One interface over the two kinds of vector env: ``send`` actions for the envs of the last
    batch, ``recv`` the next batch as ``(env_ids [k] int64, obs, reward, terminated, truncated,
    info)``.

    ale-py's ``AtariVectorEnv`` has real ``send``/``recv``: with ``batch_size = num_envs / 2``
    its thread steps one half of the envs while the caller runs inference on the other half.
    Gymnasium's synchronous vector env steps all envs in ``recv``.
    """

    def __init__(self, env, num_envs: int):
        self.env = env
        self.native = hasattr(env, "send") and hasattr(env, "recv")
        self.all_ids = np.arange(num_envs)
        self.actions = None

    def reset(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Reset every env; returns the ids and observations of the first batch."""
        obs, info = self.env.reset(seed=seed)
        ids = np.asarray(info["env_id"], dtype=np.int64) if self.native else self.all_ids
        return ids, obs

    def send(self, actions: np.ndarray) -> None:
        if self.native:
            self.env.send(actions)
        else:
            self.actions = actions

    def recv(self):
        if self.native:
            obs, reward, terminated, truncated, info = self.env.recv()
            return np.asarray(info["env_id"], dtype=np.int64), obs, reward, terminated, truncated, info
        obs, reward, terminated, truncated, info = self.env.step(self.actions)
        return self.all_ids, obs, reward, terminated, truncated, info

    def close(self) -> None:
        self.env.close()

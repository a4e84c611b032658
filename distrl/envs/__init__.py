"""Environment factories: ALE Atari and any Gymnasium id, as vector envs.

Every factory returns a Gymnasium ``VectorEnv`` in ``SameStep`` autoreset
mode: when a sub-environment's episode ends, ``step`` already returns the
first observation of the next episode and puts the last one in
``info["final_obs"]``, which is what a truncated trajectory bootstraps from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from omegaconf import DictConfig

from distrl.envs import atari, diagnostic, gym_env

diagnostic.register()


@dataclass(frozen=True)
class EnvSpec:
    """What the model and the storages need to know of an environment.

    Attributes:
        obs_shape: one observation's shape, e.g. ``(4, 84, 84)`` for Atari.
        obs_dtype: numpy dtype of observations (``uint8`` for Atari, ``float32`` otherwise).
        num_actions: size of the discrete action space.
        frameskip: emulator frames per agent step (1 for non-Atari envs).
    """

    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    num_actions: int
    frameskip: int


def known_env_id_error(kind: str, env_id: str) -> str | None:
    """Why ``env_id`` cannot be used with env kind ``kind``, or None if it can."""
    return (atari if kind == "atari" else gym_env).id_error(env_id)


def make_vector_env(env_cfg: DictConfig, num_envs: int, num_threads: int = 1, async_step: bool = False):
    """Build ``num_envs`` environments as one ``SameStep`` vector env.

    Args:
        env_cfg: the ``env`` node of the config.
        num_envs: how many sub-environments.
        num_threads: worker threads of ale-py's native vector env (Atari only).
        async_step: ale-py's vector env returns half of the envs per ``recv`` (``batch_size
            = num_envs / 2``), so that they step while the caller works on the other half.
            Ignored for other envs (``distrl.engine.placement.plan`` says when it applies).

    Raises:
        ValueError: ``async_step`` with the vector Atari backend and an odd ``num_envs``.
    """
    if env_cfg.kind == "atari":
        return atari.make_vector_env(env_cfg, num_envs, num_threads, async_step)
    return gym_env.make_vector_env(env_cfg, num_envs)


def make_render_env(env_cfg: DictConfig):
    """One environment, preprocessed as in training, whose ``render()`` gives RGB frames
    ``[H, W, 3] uint8`` (for videos). Atari goes through Gymnasium's wrappers here."""
    if env_cfg.kind == "atari":
        return atari.make_single_env(env_cfg, render_mode="rgb_array")
    return gym_env.make_single_env(env_cfg, render_mode="rgb_array")


def env_spec(env_cfg: DictConfig) -> EnvSpec:
    """Observation and action facts of the configured env (builds one env briefly)."""
    env = make_vector_env(env_cfg, 1)
    try:
        space = env.single_observation_space
        frameskip = env_cfg.frameskip if env_cfg.kind == "atari" else 1
        dtype = np.dtype(np.uint8) if space.dtype == np.uint8 else np.dtype(np.float32)
        return EnvSpec(tuple(space.shape), dtype, int(env.single_action_space.n), frameskip)
    finally:
        env.close()


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

"""Environment factories: ALE Atari and any Gymnasium id, as vector envs; their seeds.

Every factory returns a Gymnasium ``VectorEnv`` in ``SameStep`` autoreset
mode: when a sub-environment's episode ends, ``step`` already returns the
first observation of the next episode and puts the last one in
``info["final_obs"]``, which is what a truncated trajectory bootstraps from
(:mod:`distrl.sampling.stepper` steps them for the actors).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from omegaconf import DictConfig

from distrl.envs import atari, diagnostic, gym_env, sparse
from distrl.nn.distributions import ActionSpace

diagnostic.register()
sparse.register()


@dataclass(frozen=True)
class EnvSpec:
    """What the model and the storages need to know of an environment.

    Attributes:
        obs_shape: one observation's shape, e.g. ``(4, 84, 84)`` for Atari.
        obs_dtype: numpy dtype of observations (``uint8`` for Atari, ``float32`` otherwise).
        action_space: the actions (:class:`distrl.nn.distributions.ActionSpace`).
        frameskip: emulator frames per agent step (1 for non-Atari envs).
    """

    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    action_space: ActionSpace
    frameskip: int

    @property
    def is_image(self) -> bool:
        """Whether observations are ``[C, H, W] uint8`` images (for the CNN encoders)."""
        return self.obs_dtype == np.uint8 and len(self.obs_shape) == 3


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
            Ignored for other envs (``distrl.config.placement.plan`` says when it applies).

    Raises:
        ValueError: ``async_step`` with the vector Atari backend and an odd ``num_envs``.
    """
    if env_cfg.kind == "atari":
        return atari.make_vector_env(env_cfg, num_envs, num_threads, async_step)
    return gym_env.make_vector_env(env_cfg, num_envs)


def clips_actions(env_cfg: DictConfig | dict) -> bool:
    """Whether a Box's sampled actions reach the env clipped to its bounds (``env.clip_actions`` of the
    ``env`` node or its plain dict; true where it has no such key: Atari's, whose actions are discrete,
    and the configs of runs saved before the key existed)."""
    return bool(env_cfg.get("clip_actions", True))


def make_render_env(env_cfg: DictConfig):
    """One environment, preprocessed as in training, whose ``render()`` gives RGB frames
    ``[H, W, 3] uint8`` (for videos). Atari goes through Gymnasium's wrappers here."""
    if env_cfg.kind == "atari":
        return atari.make_single_env(env_cfg, render_mode="rgb_array")
    return gym_env.make_single_env(env_cfg, render_mode="rgb_array")


class SpaceError(ValueError):
    """An env whose observation or action space distrl cannot model (the message names it)."""


def env_spec(env_cfg: DictConfig) -> EnvSpec:
    """Observation and action facts of the configured env (builds one env briefly).

    Raises:
        SpaceError: observations that are not a Box of rank 1 (vectors) or ``[C, H, W] uint8`` images,
            or actions :class:`ActionSpace` does not model.
    """
    import gymnasium as gym

    env = make_vector_env(env_cfg, 1)
    try:
        space = env.single_observation_space
        if not (isinstance(space, gym.spaces.Box) and (len(space.shape) == 1 or gym_env.is_image(space))):
            raise SpaceError(f"observation space {space}: distrl models a Box of rank 1 (vectors) or "
                             f"[C, H, W] uint8 images")
        try:
            actions = ActionSpace.from_gym(env.single_action_space)
        except ValueError as exc:
            raise SpaceError(str(exc)) from None
        frameskip = env_cfg.frameskip if env_cfg.kind == "atari" else 1
        dtype = np.dtype(np.uint8) if space.dtype == np.uint8 else np.dtype(np.float32)
        return EnvSpec(tuple(space.shape), dtype, actions, frameskip)
    finally:
        env.close()


def env_seed(run_seed: int, actor_id: int, envs_per_actor: int, restart: int = 0, num_actors: int = 1) -> int:
    """Seed of an actor's first environment; its others take the next ones, so no two envs of a
    run share a seed (and evaluation seeds, :func:`eval_seed`, lie apart). The ``restart``-th
    restart of an actor seeds as if it were actor ``actor_id + restart x num_actors``: fresh
    seeds, none shared with another actor."""
    return run_seed * 100_003 + (actor_id + restart * num_actors) * envs_per_actor


def eval_seed(run_seed: int, agent_steps: int) -> int:
    """Seed of the first evaluation env of a run's evaluation at ``agent_steps``: varies with the
    step, and lies apart from the actors' env seeds (:func:`env_seed`)."""
    return run_seed * 100_003 + 50_000 + agent_steps % 10_000

"""ALE Atari following Machado et al. (2018), "Revisiting the ALE".

v5 ids, sticky actions (0.25), frameskip 4 applied once, max-pool over the
last two frames, 84x84 grayscale, a stack of 4, up to 30 no-op starts, the
minimal action set and no life-loss episode ends. Rewards are the raw game
score; clipping happens in the loss, not here.

Two backends give the same observations: ``vector`` (default) is ale-py's
native C++ ``AtariVectorEnv``; ``gymnasium`` is ``gym.make`` with
frameskip 1 under Gymnasium's ``AtariPreprocessing`` and
``FrameStackObservation`` in a synchronous vector env.
"""

from __future__ import annotations

import ale_py
import gymnasium as gym
from gymnasium.vector import AutoresetMode
from omegaconf import DictConfig

gym.register_envs(ale_py)


def rom_name(env_id: str) -> str:
    """The ROM name of a registered ALE id, e.g. ``ALE/Pong-v5`` -> ``pong``.

    Raises:
        gymnasium.error.Error: the id is not registered.
    """
    return gym.spec(env_id).kwargs["game"]


def id_error(env_id: str) -> str | None:
    """Why ``env_id`` is not a usable ALE id, or None."""
    if env_id not in gym.registry:
        return "not a registered Gymnasium id; Atari ids look like ALE/Pong-v5, ALE/Breakout-v5"
    if "game" not in gym.spec(env_id).kwargs:
        return "not an ALE Atari id; use env=gym env.id=... model=mlp for other Gymnasium envs"
    if not env_id.endswith("-v5"):
        return "use a v5 id (ALE/<Game>-v5), whose sticky actions and frameskip follow Machado et al. 2018"
    return None


def make_vector_env(cfg: DictConfig, num_envs: int, num_threads: int = 1, async_step: bool = False):
    """``num_envs`` preprocessed Atari games in one ``SameStep`` vector env (see
    :func:`distrl.envs.make_vector_env` for ``async_step``)."""
    if cfg.backend == "vector":
        from ale_py.vector_env import AtariVectorEnv

        if async_step and num_envs % 2:
            raise ValueError(f"async_step needs an even number of envs, got {num_envs}")

        return AtariVectorEnv(
            rom_name(cfg.id),
            num_envs,
            batch_size=num_envs // 2 if async_step else 0,
            num_threads=num_threads,
            max_num_frames_per_episode=cfg.max_episode_steps * cfg.frameskip,
            repeat_action_probability=cfg.repeat_action_probability,
            full_action_space=cfg.full_action_space,
            autoreset_mode=AutoresetMode.SAME_STEP,
            img_height=cfg.img_size,
            img_width=cfg.img_size,
            stack_num=cfg.frame_stack,
            frameskip=cfg.frameskip,
            noop_max=cfg.noop_max,
            episodic_life=cfg.episodic_life,
            reward_clipping=False,
            use_fire_reset=cfg.use_fire_reset,
        )
    return gym.vector.SyncVectorEnv(
        [lambda: make_single_env(cfg) for _ in range(num_envs)],
        autoreset_mode=AutoresetMode.SAME_STEP,
    )


def make_single_env(cfg: DictConfig, render_mode: str | None = None) -> gym.Env:
    """One preprocessed game through Gymnasium's wrappers; ``render_mode="rgb_array"``
    renders the full-colour 210x160 screen."""
    env = gym.make(
        cfg.id,
        render_mode=render_mode,
        frameskip=1,  # AtariPreprocessing skips (once) and max-pools
        repeat_action_probability=cfg.repeat_action_probability,
        full_action_space=cfg.full_action_space,
        max_num_frames_per_episode=cfg.max_episode_steps * cfg.frameskip,
    )
    env = gym.wrappers.AtariPreprocessing(
        env,
        noop_max=cfg.noop_max,
        frame_skip=cfg.frameskip,
        screen_size=cfg.img_size,
        terminal_on_life_loss=cfg.episodic_life,
        grayscale_obs=True,
    )
    return gym.wrappers.FrameStackObservation(env, cfg.frame_stack)

"""Any registered Gymnasium id: flat (vector) observations, e.g. CartPole-v1 or MuJoCo's HalfCheetah-v5, or
``[C, H, W] uint8`` images, e.g. the diagnostic ``distrl/ImageCue-v0``. MiniGrid's ids (the Farama
``minigrid`` package, registered on import here) give their partial view, ``[3, 7, 7] uint8``
(object, colour and state indices of the 7 x 7 cells in front of the agent), without the mission
text."""

from __future__ import annotations

import base64
import importlib
import logging
import pickle
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from omegaconf import DictConfig

try:  # registers the MiniGrid-* ids
    import minigrid
    from minigrid.wrappers import ImgObsWrapper
except ImportError:  # pragma: no cover - minigrid is a dependency; an environment without it lacks those ids
    minigrid = None


log = logging.getLogger(__name__)
_mujoco_warnings_routed = False


def route_mujoco_warnings() -> None:
    """Send MuJoCo's warnings to this module's logger (debug level) instead of stdout and a
    ``MUJOCO_LOG.TXT`` in the working directory (Gymnasium's v5 models use attributes MuJoCo 4
    deprecates, one warning per env built). Once per process; nothing without the mujoco package."""
    global _mujoco_warnings_routed
    if _mujoco_warnings_routed:
        return
    _mujoco_warnings_routed = True
    try:
        import mujoco
    except ImportError:
        return
    mujoco.set_mju_user_warning(lambda message: log.debug("MuJoCo: %s", message))


def _is_mujoco(cfg: DictConfig) -> bool:
    """Whether ``cfg.id`` is one of Gymnasium's MuJoCo tasks (importing mujoco starts a process that
    asks for glfw's version: only for these)."""
    env_id = cfg.id.split(":", 1)[-1]
    spec = gym.registry.get(env_id)
    return spec is not None and str(spec.entry_point).startswith("gymnasium.envs.mujoco")


def id_error(env_id: str) -> str | None:
    """Why ``env_id`` is not a usable Gymnasium id for this env kind, or None.

    ``module:EnvId`` (Gymnasium's syntax) imports ``module`` first, so that it can
    register a custom env; the actor processes import it the same way.
    """
    if ":" in env_id:
        module, env_id = env_id.split(":", 1)
        try:
            importlib.import_module(module)
        except ImportError as exc:
            return f"cannot import module {module!r} ({exc})"
    if env_id not in gym.registry:
        return "not a registered Gymnasium id (e.g. CartPole-v1, Acrobot-v1, or module:MyEnv-v0)"
    if "game" in gym.spec(env_id).kwargs:
        return "an ALE Atari id: use env=atari env.id=" + env_id
    return None


def make_vector_env(cfg: DictConfig, num_envs: int):
    """``num_envs`` copies of ``cfg.id`` in a synchronous ``SameStep`` vector env (the spaces are checked
    by :func:`distrl.envs.env_spec`)."""
    return gym.vector.SyncVectorEnv(
        [lambda: make_single_env(cfg) for _ in range(num_envs)],
        autoreset_mode=AutoresetMode.SAME_STEP,
    )


def is_image(space: gym.Space) -> bool:
    """Whether observations of ``space`` are ``[C, H, W] uint8`` images (for the CNN encoders)."""
    return isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3


def decode_factory(text: str) -> Any:
    """The env factory a Python-API run pickled into ``env.factory``
    (:func:`distrl.compat.env_objects.encode_factory`): base64 text back to the callable."""
    return pickle.loads(base64.b64decode(text.encode("ascii")))


def make_single_env(cfg: DictConfig, render_mode: str | None = None) -> gym.Env:
    """One env of ``cfg.id`` (``render_mode`` as in ``gym.make``), or of ``cfg.spec`` or
    ``cfg.factory`` where the Python API set them (:mod:`distrl.compat.env_objects`): uint8 images are
    kept as they are, any other observation becomes float32."""
    kwargs = {} if cfg.max_episode_steps is None else {"max_episode_steps": cfg.max_episode_steps}
    if _is_mujoco(cfg):
        route_mujoco_warnings()
    if cfg.get("factory"):  # a Python-API env factory (distrl.compat.env_objects)
        env = decode_factory(cfg.factory)()
        if cfg.max_episode_steps is not None:
            env = gym.wrappers.TimeLimit(env, cfg.max_episode_steps)
    elif cfg.get("spec"):  # a Python-API env made by gymnasium.make: its spec, kwargs and wrappers
        env = gym.make(gym.envs.registration.EnvSpec.from_json(cfg.spec), render_mode=render_mode, **kwargs)
    else:
        env = gym.make(cfg.id, render_mode=render_mode, **kwargs)
    if minigrid is not None and isinstance(env.unwrapped, minigrid.minigrid_env.MiniGridEnv):
        env = ImgObsWrapper(env)  # the view alone: [7, 7, 3] uint8
        view = env.observation_space
        channels_first = gym.spaces.Box(0, 255, (view.shape[2], *view.shape[:2]), np.uint8)
        return gym.wrappers.TransformObservation(env, lambda obs: np.ascontiguousarray(obs.transpose(2, 0, 1)),
                                                 channels_first)
    if is_image(env.observation_space) or not isinstance(env.observation_space, gym.spaces.Box):
        return env  # a space distrl cannot model is refused by distrl.envs.env_spec
    space = env.observation_space
    if space.dtype == np.float32:
        return env
    # the float32 space built from float32 bounds (Gymnasium warns when it casts float64 bounds itself)
    floats = gym.spaces.Box(space.low.astype(np.float32), space.high.astype(np.float32), space.shape, np.float32)
    return gym.wrappers.TransformObservation(env, lambda obs: np.asarray(obs, dtype=np.float32), floats)

"""Environments passed as Python objects (the seeds' API, :mod:`distrl.compat`), turned into env
config values that every actor process can rebuild them from.

Actors are spawned processes, so an env object cannot be shared with them; what travels is how to
make it again:

- a Gymnasium id (``"CartPole-v1"``, ``"ALE/Pong-v5"``): the id itself;
- an env or vector env made by ``gymnasium.make`` / ``make_vec``: its ``EnvSpec`` as JSON in
  ``env.spec`` (``gymnasium.make(spec)`` in each actor: the same entry point, kwargs and recorded
  wrappers); a vector env's number of sub-envs becomes ``envs_per_actor``;
- a picklable zero-argument callable that returns an env: pickled into ``env.factory`` and called in
  each actor (:func:`distrl.envs.gym_env.decode_factory`).

ALE Atari envs become ``env=atari`` with the id's sticky-action probability, frameskip and action
set, and distrl's own Atari preprocessing (Machado et al. 2018), which a wrapped ALE env would
duplicate: one with wrappers is refused.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import pickle
from typing import Any

import gymnasium as gym
from omegaconf import DictConfig, OmegaConf

from distrl.config.compose import compose

# ids whose tuned preset (conf/experiment/) a Python-API run starts from
PRESETS = {"CartPole-v1": "cartpole", "distrl/SparseChain-v1": "sparse_chain", "distrl/ImageCue-v0": "image_cue",
           "distrl/ImageCueMemory-v0": "image_cue_memory"}

# keys a vector env's spec adds to the single env's kwargs
_VECTOR_KWARGS = ("num_envs", "vectorization_mode", "vector_kwargs", "wrappers", "max_episode_steps")


class EnvObjectError(ValueError):
    """An env argument distrl cannot rebuild in its actor processes; the message says what to pass."""


@dataclasses.dataclass
class EnvChoice:
    """How a run makes its environments.

    Attributes:
        overrides: Hydra overrides that choose the env group, preset or model (``env=atari``, ...).
        values: keys of the ``env`` node to set after composing (``id``, ``spec``, ``factory``, ...).
        num_envs: the sub-envs of a vector env (for ``envs_per_actor``); None for one env.
    """

    overrides: list[str] = dataclasses.field(default_factory=list)
    values: dict[str, Any] = dataclasses.field(default_factory=dict)
    num_envs: int | None = None


def encode_factory(factory: Any) -> str:
    """``factory`` pickled, as base64 text (the value of ``env.factory``).

    Raises:
        EnvObjectError: it cannot be pickled (a lambda, a closure, a function defined inside another).
    """
    try:
        return base64.b64encode(pickle.dumps(factory)).decode("ascii")
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise EnvObjectError(
            f"the env factory {factory!r} cannot be pickled for the actor processes ({exc}): pass a function "
            f"defined at the top level of a module (or functools.partial of one), a Gymnasium id, or an env made "
            f"by gymnasium.make") from None


def env_choice(env: Any, role: str = "env") -> EnvChoice:
    """What makes ``env`` (an id, a ``gymnasium.make`` env or vector env, or a zero-argument factory)
    in the actors. ``role`` names the argument in errors.

    Raises:
        EnvObjectError: an env that cannot be rebuilt (no spec, a spec that is not JSON-serialisable,
            a wrapped ALE env, an unpicklable factory), with what to pass instead.
    """
    if isinstance(env, str):
        return _from_id(env)
    if isinstance(env, (gym.Env, gym.vector.VectorEnv)):
        return _from_object(env, role)
    if callable(env):
        return _from_factory(env, role)
    raise EnvObjectError(f"{role}={env!r}: pass a Gymnasium id, an env made by gymnasium.make or make_vec, or a "
                         f"picklable zero-argument function that returns an env")


def _is_ale(spec: gym.envs.registration.EnvSpec) -> bool:
    return isinstance(spec.entry_point, str) and spec.entry_point.startswith("ale_py") or "game" in spec.kwargs


def _from_id(env_id: str) -> EnvChoice:
    if env_id in gym.registry and _is_ale(gym.spec(env_id)):
        return EnvChoice(["env=atari"], {"id": env_id})
    if env_id in PRESETS:
        return EnvChoice([f"experiment={PRESETS[env_id]}"], {"id": env_id})
    if env_id.startswith("MiniGrid-"):
        return EnvChoice(["experiment=minigrid"], {"id": env_id})
    return EnvChoice(_gym_overrides(gym.make(env_id) if env_id in gym.registry else None), {"id": env_id})


def _gym_overrides(env: gym.Env | None) -> list[str]:
    """``env=gym`` with ``model=mlp`` for flat observations (the default Nature CNN takes images);
    ``experiment=mujoco``, the continuous-control preset, for flat observations and Box actions."""
    if env is None:
        return ["env=gym"]
    try:
        if len(env.observation_space.shape or ()) == 3:
            return ["env=gym"]
        if isinstance(env.action_space, gym.spaces.Box):
            return ["experiment=mujoco"]
        return ["env=gym", "model=mlp"]
    finally:
        env.close()


def _from_object(env: gym.Env | gym.vector.VectorEnv, role: str) -> EnvChoice:
    vector = isinstance(env, gym.vector.VectorEnv)
    sub_envs = getattr(env, "envs", None)  # a SyncVectorEnv's own envs carry the single env's spec
    spec = sub_envs[0].spec if vector and sub_envs else env.spec
    num_envs = int(env.num_envs) if vector else None
    if spec is None:
        raise EnvObjectError(f"{role}: {type(env).__name__} has no spec (it was not made by gymnasium.make), so the "
                             f"actor processes cannot rebuild it: pass its Gymnasium id, or a picklable "
                             f"zero-argument function that returns it")
    kwargs = {k: v for k, v in spec.kwargs.items() if k not in _VECTOR_KWARGS}
    if _is_ale(spec):
        if spec.additional_wrappers:
            names = ", ".join(w.name for w in spec.additional_wrappers)
            raise EnvObjectError(f"{role}: an ALE env with wrappers ({names}): distrl applies its own Atari "
                                 f"preprocessing; pass the id ({spec.id!r}) or the bare gymnasium.make env")
        values = {"id": spec.id}
        for key in ("repeat_action_probability", "frameskip", "full_action_space"):
            if key in kwargs:
                values[key] = kwargs[key]
        return EnvChoice(["env=atari"], values, num_envs)
    single = dataclasses.replace(spec, kwargs=kwargs, vector_entry_point=None)
    try:
        text = single.to_json()
    except (ValueError, TypeError) as exc:
        raise EnvObjectError(f"{role}: the spec of {spec.id!r} cannot be written for the actor processes ({exc}): "
                             f"pass a picklable zero-argument function that returns the env") from None
    if spec.id in PRESETS or spec.id.startswith("MiniGrid-"):
        overrides = _from_id(spec.id).overrides
    else:
        overrides = _gym_overrides(gym.make(single))
    return EnvChoice(overrides, {"id": spec.id, "spec": text}, num_envs)


def _from_factory(factory: Any, role: str) -> EnvChoice:
    text = encode_factory(factory)
    env = factory()
    if isinstance(env, gym.vector.VectorEnv):
        env.close()
        raise EnvObjectError(f"{role}: the factory returns a vector env; return one env (distrl batches them)")
    if not isinstance(env, gym.Env):
        raise EnvObjectError(f"{role}: the factory returned {type(env).__name__}, not a Gymnasium env")
    name = env.spec.id if env.spec is not None else getattr(factory, "__qualname__", type(env).__name__)
    overrides = _gym_overrides(env)
    return EnvChoice(overrides, {"id": name, "factory": text})


def env_node(env: Any, role: str = "env", choice: EnvChoice | None = None) -> tuple[DictConfig, int | None]:
    """The ``env`` config node that rebuilds ``env`` in the actors (:func:`distrl.compat.env_objects.env_choice`)
    and, for a vector env, its number of sub-envs (for ``envs_per_actor``).

    Raises:
        EnvObjectError: ``env`` cannot be rebuilt in another process (the message says what to pass).
    """
    choice = choice or env_choice(env, role)
    node = compose(choice.overrides).env
    with writable(node):
        for key, value in choice.values.items():
            node[key] = value
    return node, choice.num_envs


class writable:
    """Lift a DictConfig's struct flag for a block (Hydra composes configs in struct mode)."""

    def __init__(self, cfg: DictConfig):
        self.cfg = cfg

    def __enter__(self):
        OmegaConf.set_struct(self.cfg, False)

    def __exit__(self, *exc):
        OmegaConf.set_struct(self.cfg, True)


def with_env_objects(cfg: DictConfig, train_env: Any, test_env: Any) -> tuple[DictConfig, DictConfig | None]:
    """``cfg`` with its ``env`` node (and, for a vector env, ``envs_per_actor``) made for ``train_env``
    (if given), and the ``env`` node of ``test_env`` for evaluation (None: the training env). Only
    the env changes: the model and agent values stay ``cfg``'s (validation says if the model does
    not fit the env)."""
    cfg = copy.deepcopy(cfg)
    if train_env is not None:
        node, num_envs = env_node(train_env, "train_env")
        OmegaConf.set_struct(cfg, False)
        cfg.env = node
        if num_envs is not None:
            cfg.envs_per_actor = num_envs
        OmegaConf.set_struct(cfg, True)
    return cfg, None if test_env is None else env_node(test_env, "test_env")[0]

"""Typed schema of the config tree and ``validate(cfg)``.

The dataclasses are stored in Hydra's ``ConfigStore`` and used as the base of
``conf/train.yaml`` and of each config group option, so a misspelt key or a
string where a number belongs fails at compose time with the key's name.
``validate`` then checks the values that a type cannot express (ranges, env
ids, devices) and raises :class:`ConfigError` with the key and the allowed
values, before any process is started.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf


class ConfigError(ValueError):
    """A config value is not allowed; the message names the key and what is allowed."""


@dataclass
class AtariEnvConfig:
    """ALE Atari with Machado et al. (2018) preprocessing; see conf/env/atari.yaml."""

    kind: str = "atari"
    id: str = "ALE/Pong-v5"
    backend: str = "vector"  # vector: ale-py AtariVectorEnv | gymnasium: wrapper path
    repeat_action_probability: float = 0.25
    frameskip: int = 4
    noop_max: int = 30
    frame_stack: int = 4
    img_size: int = 84
    episodic_life: bool = False
    full_action_space: bool = False
    use_fire_reset: bool = False
    max_episode_steps: int = 27000  # agent steps (= 108,000 frames at frameskip 4)
    async_step: Any = "auto"  # true | false | auto (see resolve_async_step)


@dataclass
class GymEnvConfig:
    """Any registered Gymnasium id with a flat observation; see conf/env/cartpole.yaml."""

    kind: str = "gym"
    id: str = "CartPole-v1"
    max_episode_steps: int | None = None  # None: the id's registered limit


@dataclass
class AgentConfig:
    """IMPALA hyperparameters; see conf/agent/impala.yaml for how the Atari values were measured."""

    name: str = "impala"
    optimizer: str = "adam"  # rmsprop | adam
    lr: float = 3e-4
    alpha: float = 0.99  # RMSProp decay
    eps: float = 1e-8
    momentum: float = 0.0
    entropy_cost: float = 0.01
    baseline_cost: float = 0.5
    discount: float = 0.99
    reward_clip: float | None = 1.0  # rewards clipped to [-x, x] in the loss; null: no clipping
    rho_bar: float = 1.0
    c_bar: float = 1.0
    max_grad_norm: float = 0.5


@dataclass
class ModelConfig:
    """Network: encoder, optional LSTM core, policy and baseline heads."""

    encoder: str = "nature_cnn"  # nature_cnn | impala_resnet | mlp
    feature_dim: int = 512
    hidden_dim: int = 64
    init_fn: str = "orthogonal"  # orthogonal | xavier_uniform | default
    use_lstm: bool = False


@dataclass
class TrainBlock:
    """Schedule of a run; every step count and interval is in agent steps."""

    num_train_steps: int = 10_000_000
    init_model_path: str | None = None
    log_interval: int = 20_000
    eval_interval: int = 500_000
    save_interval: int = 500_000
    num_eval_episodes: int = 10
    keep_checkpoints: int = 5
    th_compile: bool = False


@dataclass
class TrainConfig:
    """Top level of ``conf/train.yaml``; names follow the seed API."""

    env: Any = MISSING
    agent: AgentConfig = MISSING
    model: ModelConfig = MISSING
    train: TrainBlock = field(default_factory=TrainBlock)
    tag: str = ""
    seed: int = 1
    device: str = "auto"
    num_steps: int = 5  # unroll length T
    num_actors: Any = "auto"  # int >= 1, or auto (see resolve_num_actors)
    num_learners: int = 1
    num_storages: Any = "auto"  # int, or auto: 2 x environments stepping at once + batch_size
    batch_size: int = 16  # B
    envs_per_actor: int = 16
    learner_threads: Any = "auto"  # torch threads of the learner process; auto: the cores the actors leave
    pin_actors: Any = "auto"  # true | false | auto (see actor_cpu_affinity)
    log_level: str = "INFO"
    resume: Any = "auto"  # auto: continue from the run dir's latest.pt if any | false | a checkpoint or run dir


@dataclass
class EvalEnvOverrides:
    """Env settings ``distrl eval`` may change at test time; None keeps the checkpoint's value."""

    repeat_action_probability: float | None = None
    noop_max: int | None = None
    max_episode_steps: int | None = None


@dataclass
class EvalConfig:
    """Top level of ``conf/eval.yaml``."""

    ckpt: str = MISSING
    num_episodes: int = 10
    deterministic: bool = False
    device: str = "cpu"
    seed: int = 0
    video: bool = False
    video_fps: int = 30
    env: EvalEnvOverrides = field(default_factory=EvalEnvOverrides)
    log_level: str = "INFO"


def register_configs() -> None:
    """Store the schemas in Hydra's ConfigStore and register the ``distrl_tag`` resolver (idempotent)."""
    OmegaConf.register_new_resolver("distrl_tag", lambda tag: f"_{tag}" if tag else "", replace=True)
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="eval_schema", node=EvalConfig)
    cs.store(group="env", name="atari_schema", node=AtariEnvConfig)
    cs.store(group="env", name="gym_schema", node=GymEnvConfig)
    cs.store(group="agent", name="impala_schema", node=AgentConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)


OPTIMIZERS = ("rmsprop", "adam")
ENCODERS = ("nature_cnn", "impala_resnet", "mlp")
INIT_FNS = ("orthogonal", "xavier_uniform", "default")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def cpu_count() -> int:
    """Cores this process may run on (the affinity mask, not the machine total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is not allowed: {allowed}")


def _positive_int(cfg: DictConfig, key: str) -> None:
    value = _select(cfg, key)
    _check(isinstance(value, int) and value > 0, key, value, "must be an integer >= 1")


def _select(cfg: DictConfig, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = node[part]
    return node


def _auto_or_positive_int(value: Any, key: str) -> None:
    _check(
        value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value > 0),
        key, value, "'auto' or an integer >= 1",
    )


def resolve_num_actors(cfg: DictConfig) -> int:
    """``num_actors`` as an int.

    ``auto``: with the learner on CUDA, one actor process per available core but one
    (kept for the trainer process); with the learner on the CPU, half the cores (at
    least 1), since on CPU the learner needs as many cores as the actors
    (README, "Throughput").
    """
    if cfg.num_actors != "auto":
        return int(cfg.num_actors)
    cores = cpu_count()
    if resolve_device(cfg.device).type == "cuda":
        return max(1, cores - 1)
    return max(1, cores // 2)


def resolve_learner_threads(cfg: DictConfig) -> int:
    """``learner_threads`` as an int: ``auto`` is the cores the actors leave (at least 1)."""
    if cfg.learner_threads != "auto":
        return int(cfg.learner_threads)
    return max(1, cpu_count() - resolve_num_actors(cfg))


def resolve_async_step(cfg: DictConfig) -> bool:
    """Whether actors step their envs asynchronously: ``env.async_step`` (``auto`` is true with
    the learner on CUDA, false on the CPU), and only where it can happen, i.e. the ``vector``
    Atari backend with an even ``envs_per_actor`` (each half steps while the other is inferred);
    otherwise stepping is synchronous whatever the key says.

    Stepping half of an actor's Atari envs in ale-py's thread while the actor runs inference on
    the other half keeps two cores busy per actor: it raises sampling throughput (about 1.4x on
    the 2-core development machine) but takes cores a CPU learner needs (end to end it gave
    757 agent steps/s there against 812 without; README, "Throughput").
    """
    value = cfg.env.get("async_step", False)
    if value == "auto":
        value = resolve_device(cfg.device).type == "cuda"
    possible = cfg.env.get("backend") == "vector" and cfg.envs_per_actor % 2 == 0
    return bool(value) and possible


def actor_cpu_affinity(cfg: DictConfig) -> list[tuple[int, ...] | None]:
    """The cores each actor process is pinned to (``os.sched_setaffinity``): one entry per actor,
    a tuple of core ids, or None where the actor is not pinned.

    ``pin_actors=auto`` pins when env stepping is synchronous and not with ``env.async_step``
    (whose env thread should run on a core of its own). A pinned actor with synchronous stepping
    gets one core and ale-py's env thread shares it: the thread hand-off each step then stays
    on one core, which raised sampling from 0.72 to 0.83 of the limit 1/(1/E + 1/I) on the
    2-core development machine (README, "Throughput"). With
    ``pin_actors=true`` and ``env.async_step``, each actor gets two cores. Cores are the ones
    this process may use (its affinity mask: taskset, SLURM cpusets), handed out in order and
    round-robin when the actors need more than there are.
    """
    n = resolve_num_actors(cfg)
    pin = cfg.pin_actors
    stepping_async = resolve_async_step(cfg)
    if pin is False or (pin == "auto" and stepping_async) or not hasattr(os, "sched_setaffinity"):
        return [None] * n
    cores = sorted(os.sched_getaffinity(0))
    width = 2 if stepping_async else 1
    return [tuple(sorted({cores[(width * i + k) % len(cores)] for k in range(width)})) for i in range(n)]


def actor_env_config(cfg: DictConfig) -> dict:
    """The ``env`` node as a plain dict for actor processes, with ``async_step`` resolved."""
    env = OmegaConf.to_container(cfg.env, resolve=True)
    if "async_step" in env:
        env["async_step"] = resolve_async_step(cfg)
    return env


def resolve_num_storages(cfg: DictConfig) -> int:
    """``num_storages`` as an int: ``auto`` is 2 x the environments stepping at once + B."""
    if cfg.num_storages != "auto":
        return int(cfg.num_storages)
    return 2 * resolve_num_actors(cfg) * cfg.envs_per_actor + cfg.batch_size * cfg.num_learners


def resolve_device(name: str):
    """``device`` as a ``torch.device``: ``auto`` is ``cuda`` when available, else ``cpu``.

    Raises:
        ConfigError: unknown device string, or CUDA asked for but unavailable.
    """
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device={name!r} is not allowed: auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"device={name!r} is not allowed: auto, cpu, cuda or cuda:N")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device={name!r} is not allowed: CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(
                f"device={name!r} is not allowed: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    return device


def validate_env(env: DictConfig) -> None:
    """Check an env config: a known id and sane preprocessing values.

    Raises:
        ConfigError: naming ``env.<key>``.
    """
    from distrl.envs import known_env_id_error

    _check(env.kind in ("atari", "gym"), "env.kind", env.kind, "atari or gym")
    problem = known_env_id_error(env.kind, env.id)
    if problem:
        raise ConfigError(f"env.id={env.id!r} is not allowed: {problem}")
    if env.kind == "atari":
        _check(env.backend in ("vector", "gymnasium"), "env.backend", env.backend, "vector or gymnasium")
        _check(not (env.use_fire_reset and env.backend == "gymnasium"), "env.use_fire_reset",
               env.use_fire_reset, "false with env.backend=gymnasium (only the vector backend has it)")
        _check(0.0 <= env.repeat_action_probability <= 1.0, "env.repeat_action_probability",
               env.repeat_action_probability, "a probability in [0, 1]")
        for key in ("frameskip", "frame_stack", "img_size", "max_episode_steps"):
            _check(env[key] >= 1, f"env.{key}", env[key], "must be an integer >= 1")
        _check(env.noop_max >= 0, "env.noop_max", env.noop_max, "must be an integer >= 0")
        _check(env.async_step in (True, False, "auto"), "env.async_step", env.async_step, "true, false or auto")
    elif env.max_episode_steps is not None:
        _check(env.max_episode_steps >= 1, "env.max_episode_steps", env.max_episode_steps,
               "null or an integer >= 1")


def env_creation_error(env_id: str, exc: Exception) -> ConfigError:
    """The one-line error for an env id that is registered but cannot be created."""
    first_line = str(exc).splitlines()[0] if str(exc) else ""
    return ConfigError(f"env.id={env_id!r} is not allowed: creating it failed: {type(exc).__name__}: {first_line}")


def _image_observations(env: DictConfig) -> bool:
    """Whether the env gives image observations (Atari always; a Gymnasium id is built once).

    Raises:
        ConfigError: the Gymnasium env cannot be created.
    """
    if env.kind == "atari":
        return True
    from distrl.envs.gym_env import has_image_observations

    try:
        return has_image_observations(env.id)
    except Exception as exc:
        raise env_creation_error(env.id, exc) from exc


def validate_eval(cfg: DictConfig) -> None:
    """Check an eval config (the checkpoint itself is checked when it is loaded).

    Raises:
        ConfigError: the first bad value, naming its key and what is allowed.
    """
    if OmegaConf.is_missing(cfg, "ckpt"):
        raise ConfigError("ckpt is missing: give the checkpoint to score, e.g. distrl eval ckpt=PATH/latest.pt")
    _check(cfg.num_episodes >= 1, "num_episodes", cfg.num_episodes, "must be an integer >= 1")
    _check(cfg.video_fps >= 1, "video_fps", cfg.video_fps, "must be an integer >= 1")
    _check(cfg.log_level in LOG_LEVELS, "log_level", cfg.log_level, ", ".join(LOG_LEVELS))
    resolve_device(cfg.device)


def validate(cfg: DictConfig) -> None:
    """Check every value of a composed train config.

    Raises:
        ConfigError: the first bad value, naming its key and what is allowed.
    """
    validate_env(cfg.env)
    resolve_device(cfg.device)
    _auto_or_positive_int(cfg.num_actors, "num_actors")
    _auto_or_positive_int(cfg.num_storages, "num_storages")
    _auto_or_positive_int(cfg.learner_threads, "learner_threads")
    _check(cfg.pin_actors in (True, False, "auto"), "pin_actors", cfg.pin_actors, "true, false or auto")
    for key in ("num_steps", "num_learners", "batch_size", "envs_per_actor",
                "train.num_train_steps", "train.log_interval", "train.eval_interval",
                "train.save_interval", "train.keep_checkpoints"):
        _positive_int(cfg, key)
    value = cfg.train.num_eval_episodes
    _check(value >= 0, "train.num_eval_episodes", value, "must be an integer >= 0")
    _check(cfg.log_level in LOG_LEVELS, "log_level", cfg.log_level, ", ".join(LOG_LEVELS))
    _check(cfg.resume is False or cfg.resume is None or isinstance(cfg.resume, str), "resume", cfg.resume,
           "auto, false, or the path of a checkpoint or run directory")

    stepping = resolve_num_actors(cfg) * cfg.envs_per_actor
    num_storages = resolve_num_storages(cfg)
    need = max(cfg.batch_size, stepping + 1)
    _check(
        num_storages >= need, "num_storages", num_storages,
        f"must be >= batch_size ({cfg.batch_size}) and > num_actors x envs_per_actor "
        f"({stepping}, the environments stepping at once): use at least {need}",
    )

    agent = cfg.agent
    _check(agent.optimizer in OPTIMIZERS, "agent.optimizer", agent.optimizer, ", ".join(OPTIMIZERS))
    for key in ("lr", "eps", "rho_bar", "c_bar", "max_grad_norm"):
        _check(agent[key] > 0, f"agent.{key}", agent[key], "must be > 0")
    for key in ("entropy_cost", "baseline_cost", "momentum"):
        _check(agent[key] >= 0, f"agent.{key}", agent[key], "must be >= 0")
    _check(0 <= agent.discount <= 1, "agent.discount", agent.discount, "a number in [0, 1]")
    _check(0 <= agent.alpha < 1, "agent.alpha", agent.alpha, "a number in [0, 1)")
    _check(agent.reward_clip is None or agent.reward_clip > 0, "agent.reward_clip",
           agent.reward_clip, "null or a number > 0")

    model = cfg.model
    _check(model.encoder in ENCODERS, "model.encoder", model.encoder, ", ".join(ENCODERS))
    _check(model.init_fn in INIT_FNS, "model.init_fn", model.init_fn, ", ".join(INIT_FNS))
    for key in ("feature_dim", "hidden_dim"):
        _positive_int(model, key)
    _check(
        (model.encoder != "mlp") == _image_observations(cfg.env), "model.encoder", model.encoder,
        "nature_cnn or impala_resnet for image observations (env=atari, env=image_cue), mlp for flat ones",
    )
    path = cfg.train.init_model_path
    _check(path is None or os.path.isfile(path), "train.init_model_path", path,
           "null or the path of an existing checkpoint file")

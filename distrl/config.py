"""Typed schema of the config tree and ``validate(cfg)``.

The dataclasses are stored in Hydra's ``ConfigStore`` and used as the base of
``conf/train.yaml`` and of each config group option, so a misspelt key or a
string where a number belongs fails at compose time with the key's name.
``validate`` then checks the values that a type cannot express (ranges, env
ids, devices) and raises :class:`ConfigError` with the key and the allowed
values, before any process is started.
"""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass, fields
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf


class ConfigError(ValueError):
    """A config value is not allowed; the message names the key and what is allowed."""


@dataclass
class AtariEnvConfig:
    """ALE Atari with Machado et al. (2018) preprocessing; values in conf/env/atari.yaml."""

    kind: str = MISSING
    id: str = MISSING
    backend: str = MISSING  # vector: ale-py AtariVectorEnv | gymnasium: wrapper path
    repeat_action_probability: float = MISSING
    frameskip: int = MISSING
    noop_max: int = MISSING
    frame_stack: int = MISSING
    img_size: int = MISSING
    episodic_life: bool = MISSING
    full_action_space: bool = MISSING
    use_fire_reset: bool = MISSING
    max_episode_steps: int = MISSING  # agent steps
    async_step: Any = MISSING  # true | false | auto (see distrl.engine.placement)


@dataclass
class GymEnvConfig:
    """Any registered Gymnasium id with discrete actions; values in conf/env/gym.yaml."""

    kind: str = MISSING
    id: str = MISSING
    max_episode_steps: int | None = MISSING  # None: the id's registered limit


@dataclass
class AgentConfig:
    """IMPALA hyperparameters; values (and how they were measured) in conf/agent/impala.yaml."""

    name: str = MISSING
    optimizer: str = MISSING  # rmsprop | adam
    lr: float = MISSING
    lr_warmup_steps: int = MISSING  # agent steps of linear warm-up from 0
    alpha: float = MISSING  # RMSProp decay
    eps: float = MISSING
    momentum: float = MISSING
    entropy_cost: float = MISSING
    # constant | linear (to 0 over train.num_train_steps, like lr) | [[agent_steps, factor], ...]
    entropy_schedule: Any = MISSING
    baseline_cost: float = MISSING
    discount: float = MISSING
    reward_clip: float | None = MISSING  # rewards clipped to [-x, x] in the loss; null: no clipping
    rho_bar: float = MISSING
    c_bar: float = MISSING
    max_grad_norm: float = MISSING
    num_epochs: int = MISSING  # optimizer steps on each batch


@dataclass
class ModelConfig:
    """Network: encoder, optional LSTM core, policy and baseline heads; values in conf/model/."""

    encoder: str = MISSING  # nature_cnn | impala_resnet | mlp
    feature_dim: int = MISSING
    hidden_dim: int = MISSING
    init_fn: str = MISSING  # orthogonal | xavier_uniform | default
    use_lstm: bool = MISSING
    last_action_reward: bool = MISSING  # the previous action and reward as inputs beside the features


@dataclass
class TrainBlock:
    """Schedule of a run; every step count and interval is in agent steps."""

    num_train_steps: int = MISSING
    init_model_path: str | None = MISSING
    log_interval: int = MISSING
    eval_interval: int = MISSING
    save_interval: int = MISSING
    num_eval_episodes: int = MISSING
    keep_checkpoints: int = MISSING
    th_compile: bool = MISSING
    stall_timeout: float = MISSING  # seconds
    max_actor_restarts: int = MISSING
    actor_restart_window: float = MISSING  # seconds
    max_nonfinite_updates: int = MISSING


@dataclass
class DistributedConfig:
    """Several ranks (``torchrun``, or ``nproc_per_node`` started here); values in conf/train.yaml."""

    nproc_per_node: int = MISSING
    backend: str = MISSING  # auto | gloo | nccl
    timeout: float = MISSING  # seconds
    check_interval: int = MISSING  # updates
    max_restarts: int = MISSING


@dataclass
class TrainConfig:
    """Top level of ``conf/train.yaml`` (which holds the values); names follow the seed API."""

    env: Any = MISSING
    agent: AgentConfig = MISSING
    model: ModelConfig = MISSING
    train: TrainBlock = MISSING
    distributed: DistributedConfig = MISSING
    tag: str = MISSING
    seed: int = MISSING
    device: str = MISSING
    num_steps: int = MISSING  # unroll length T
    num_actors: Any = MISSING  # int >= 1 or auto
    num_learners: int = MISSING
    num_storages: Any = MISSING  # int >= 1 or auto
    batch_size: int = MISSING  # B
    envs_per_actor: int = MISSING
    learner_threads: Any = MISSING  # int >= 1 or auto
    pin_actors: Any = MISSING  # true | false | auto
    log_level: str = MISSING
    resume: Any = MISSING  # auto | false | a checkpoint file or run directory


@dataclass
class EvalEnvOverrides:
    """Env settings ``distrl eval`` may change at test time; None keeps the checkpoint's value."""

    repeat_action_probability: float | None = MISSING
    noop_max: int | None = MISSING
    max_episode_steps: int | None = MISSING


@dataclass
class EvalConfig:
    """Top level of ``conf/eval.yaml`` (which holds the values)."""

    ckpt: str = MISSING
    num_episodes: int = MISSING
    deterministic: bool = MISSING
    device: str = MISSING
    seed: int = MISSING
    video: bool = MISSING
    video_fps: int = MISSING
    env: EvalEnvOverrides = MISSING
    log_level: str = MISSING


def _nested_schemas(cfg: DictConfig, schema: type) -> dict[str, type]:
    if schema is TrainConfig:
        env = AtariEnvConfig if cfg.get("env", {}).get("kind") == "atari" else GymEnvConfig
        return {"env": env, "agent": AgentConfig, "model": ModelConfig, "train": TrainBlock,
                "distributed": DistributedConfig}
    if schema is EvalConfig:
        return {"env": EvalEnvOverrides}
    return {}


def unknown_keys(cfg: DictConfig, schema: type, prefix: str = "") -> list[tuple[str, str | None]]:
    """Keys of ``cfg`` that ``schema`` (a config dataclass) does not have, as ``(key, the closest
    known key or None)``. Hydra's ``+key=value`` adds a key to any config; this finds it."""
    known = [f.name for f in fields(schema)]
    nested = _nested_schemas(cfg, schema)
    found = []
    for key in cfg.keys():
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            found.append((f"{prefix}{key}", f"{prefix}{close[0]}" if close else None))
        elif key in nested and isinstance(cfg[key], DictConfig):
            found += unknown_keys(cfg[key], nested[key], f"{prefix}{key}.")
    return found


def _check_keys(cfg: DictConfig, schema: type) -> None:
    unknown = unknown_keys(cfg, schema)
    if unknown:
        key, close = unknown[0]
        hint = f" (did you mean {close}?)" if close else ""
        raise ConfigError(f"{key} is not a key of this config{hint}: a key added with + is refused too; "
                          f"`distrl train --help` lists the keys")


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


def compose_config(overrides: list[str] | tuple[str, ...] = (), config_name: str = "train",
                   check: bool = True) -> DictConfig:
    """The config ``distrl train`` (or ``distrl eval``, ``config_name="eval"``) would run with these
    command-line overrides, composed by Hydra from ``conf/`` and, if ``check``, validated.

    Example: ``compose_config(["experiment=cartpole", "train.num_train_steps=100000"])``.

    Raises:
        ConfigError: a bad value (the same one-line message as the command's).
        hydra.errors.ConfigCompositionException: an unknown key or group option, or a value of
            the wrong type.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from distrl.hydra_app import config_dir

    register_configs()
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose(config_name, overrides=list(overrides))
    if check:
        (validate if config_name == "train" else validate_eval)(cfg)
    return cfg


OPTIMIZERS = ("rmsprop", "adam")
ENTROPY_SCHEDULES = ("constant", "linear")
ENCODERS = ("nature_cnn", "impala_resnet", "mlp")
INIT_FNS = ("orthogonal", "xavier_uniform", "default")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is not allowed: {allowed}")


def _validate_entropy_schedule(schedule: Any) -> None:
    allowed = (f"{' or '.join(ENTROPY_SCHEDULES)}, or a non-empty list of [agent_steps, factor] points, "
               f"agent_steps whole numbers >= 0 in non-decreasing order, factors on agent.entropy_cost >= 0: "
               f"e.g. [[2500000,1.0],[3000000,0.2]]")
    if isinstance(schedule, str):
        _check(schedule in ENTROPY_SCHEDULES, "agent.entropy_schedule", schedule, allowed)
        return
    points = OmegaConf.to_container(schedule) if OmegaConf.is_config(schedule) else schedule
    ok = isinstance(points, list) and len(points) > 0 and all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(x, int | float) and not isinstance(x, bool)
                                                    and x >= 0 for x in p) and float(p[0]).is_integer()
        for p in points)
    ok = ok and all(a[0] <= b[0] for a, b in zip(points[:-1], points[1:], strict=True))
    _check(ok, "agent.entropy_schedule", schedule, allowed)


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
    _check_keys(cfg, EvalConfig)
    if OmegaConf.is_missing(cfg, "ckpt"):
        raise ConfigError("ckpt is missing: give the checkpoint to score, e.g. distrl eval ckpt=PATH/latest.pt")
    _check(cfg.num_episodes >= 1, "num_episodes", cfg.num_episodes, "must be an integer >= 1")
    _check(cfg.video_fps >= 1, "video_fps", cfg.video_fps, "must be an integer >= 1")
    _check(cfg.log_level in LOG_LEVELS, "log_level", cfg.log_level, ", ".join(LOG_LEVELS))
    resolve_device(cfg.device)


def process_limit() -> int:
    """How many more processes this user may start (RLIMIT_NPROC less those running), or a large number."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft == resource.RLIM_INFINITY:
        soft = 4_194_304  # the kernel's pid_max ceiling
    try:
        with open("/proc/sys/kernel/threads-max") as f:
            soft = min(soft, int(f.read()))
    except OSError:  # pragma: no cover - not Linux
        pass
    return soft


# Memory of one actor process, a lower bound used to refuse impossible sizes only. A Pong actor of
# 16 envs (1 actor, 2-core AMD EPYC, commit c215880) had 379 MiB RSS, 277 MiB PSS and 177 MiB
# Private_Dirty (/proc/PID/smaps_rollup); no actor needs less than 128 MiB of its own.
ACTOR_PROCESS_BYTES = 128 * 2**20


def _check_sizes(cfg: DictConfig, placement) -> None:
    """Refuse sizes that cannot run here before anything is allocated: more actor processes than
    the process limit or than memory holds, more slots than a slot queue holds."""
    from distrl.engine.pipes import max_indices

    limit = process_limit()
    _check(placement.num_actors <= limit, "num_actors", placement.num_actors,
           f"at most {limit} processes may be started here (RLIMIT_NPROC, /proc/sys/kernel/threads-max)")
    available = _available_memory()
    need = placement.num_actors * ACTOR_PROCESS_BYTES
    _check(need <= available, "num_actors", placement.num_actors,
           f"{placement.num_actors} actor processes need about {need / 2**30:.1f} GiB, more than the "
           f"{available / 2**30:.1f} GiB of memory available")
    most = max_indices()
    _check(placement.num_storages <= most, "num_storages", placement.num_storages,
           f"at most {most} slots (a slot queue is a pipe of /proc/sys/fs/pipe-max-size bytes, 8 per slot)")


def _available_memory() -> int:
    """Bytes of memory available to new allocations (MemAvailable), or a large number if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - not Linux
        pass
    return 1 << 62


def slots_memory_error(nbytes: int, num_storages: int) -> ConfigError | None:
    """The error for rollout slots of ``nbytes`` in all that shared memory cannot hold, or None."""
    import shutil

    try:
        shm_free = shutil.disk_usage("/dev/shm").free
    except OSError:  # pragma: no cover - no /dev/shm
        shm_free = 1 << 62
    room = min(shm_free, _available_memory())
    if nbytes <= room:
        return None
    return ConfigError(f"num_storages={num_storages} is not allowed: the slots need {nbytes / 2**30:.1f} GiB of "
                       f"shared memory, more than the {room / 2**30:.1f} GiB free here (/dev/shm, MemAvailable)")


def world_size(cfg: DictConfig) -> int:
    """Ranks of the run: ``torchrun``'s ``WORLD_SIZE``, else ``distributed.nproc_per_node``."""
    return int(os.environ.get("WORLD_SIZE", cfg.distributed.nproc_per_node))


def _validate_distributed(cfg: DictConfig, placement) -> None:
    dist = cfg.distributed
    _positive_int(cfg, "distributed.nproc_per_node")
    _positive_int(cfg, "distributed.check_interval")
    _check(dist.backend in ("auto", "gloo", "nccl"), "distributed.backend", dist.backend, "auto, gloo or nccl")
    _check(dist.timeout > 0, "distributed.timeout", dist.timeout, "a number of seconds > 0")
    _check(dist.max_restarts >= 0, "distributed.max_restarts", dist.max_restarts, "an integer >= 0")
    _check(dist.backend != "nccl" or placement.device.type == "cuda", "distributed.backend", dist.backend,
           "auto or gloo with a CPU learner (nccl moves CUDA tensors only)")
    if world_size(cfg) == 1:
        return
    _check(cfg.num_learners == 1, "num_learners", cfg.num_learners,
           "1 with several ranks (each rank's one learner joins the gradient all-reduce)")
    if "WORLD_SIZE" in os.environ:  # under torchrun: this rank's share is checked by the rank itself
        return
    from distrl.engine.placement import cpu_count

    nproc = dist.nproc_per_node
    cores = cpu_count()
    _check(nproc <= cores, "distributed.nproc_per_node", nproc,
           f"at most the {cores} cores this command may use (each rank needs a core of its own)")
    if placement.device.type == "cuda":
        import torch

        _check(nproc <= torch.cuda.device_count(), "distributed.nproc_per_node", nproc,
               f"at most one rank per GPU with device={cfg.device}: this machine has {torch.cuda.device_count()}")


def validate(cfg: DictConfig) -> None:
    """Check every value of a composed train config.

    Raises:
        ConfigError: the first bad value, naming its key and what is allowed.
    """
    _check_keys(cfg, TrainConfig)
    validate_env(cfg.env)
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
    _positive_int(cfg, "train.max_nonfinite_updates")
    value = cfg.train.max_actor_restarts
    _check(isinstance(value, int) and value >= 0, "train.max_actor_restarts", value, "must be an integer >= 0")
    for key in ("stall_timeout", "actor_restart_window"):
        value = cfg.train[key]
        _check(value > 0 and math.isfinite(value), f"train.{key}", value, "a number of seconds > 0")
    _check(cfg.log_level in LOG_LEVELS, "log_level", cfg.log_level, ", ".join(LOG_LEVELS))
    _check(cfg.resume is False or cfg.resume is None or isinstance(cfg.resume, str), "resume", cfg.resume,
           "auto, false, or the path of a checkpoint or run directory")

    from distrl.engine.placement import plan

    placement = plan(cfg)
    _check_sizes(cfg, placement)
    # Every stepping env always holds a slot; each learner must be able to collect B more. With
    # fewer, async stepping (half the envs hand in slots at a time) or several learners (each
    # holding a partial batch) wait on each other forever.
    need = placement.stepping + cfg.batch_size * cfg.num_learners
    _check(
        placement.num_storages >= need, "num_storages", placement.num_storages,
        f"must be >= num_actors x envs_per_actor + batch_size x num_learners "
        f"({placement.stepping} + {cfg.batch_size} x {cfg.num_learners}): use at least {need}",
    )

    _validate_distributed(cfg, placement)

    agent = cfg.agent
    _check(agent.optimizer in OPTIMIZERS, "agent.optimizer", agent.optimizer, ", ".join(OPTIMIZERS))
    _validate_entropy_schedule(agent.entropy_schedule)
    for key in ("lr", "eps", "rho_bar", "c_bar", "max_grad_norm"):
        _check(agent[key] > 0, f"agent.{key}", agent[key], "must be > 0")
    _positive_int(cfg, "agent.num_epochs")
    _check(agent.lr_warmup_steps >= 0, "agent.lr_warmup_steps", agent.lr_warmup_steps, "must be >= 0")
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
        "nature_cnn or impala_resnet for image observations (env=atari, env=image_cue), "
        "mlp for flat ones (env=gym: add model=mlp, or use experiment=cartpole)",
    )
    path = cfg.train.init_model_path
    _check(path is None or os.path.isfile(path), "train.init_model_path", path,
           "null or the path of an existing checkpoint file")

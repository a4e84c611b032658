"""The checks every command shares: one bad value, one line (:func:`check`), and the checks of the
``env`` node, of an eval config and of bf16 on a device. The train config's own are
:mod:`distrl.config.validation`'s."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from distrl.config import host
from distrl.config.schema import ConfigError, EvalConfig, check_keys
from distrl.envs import SpaceError, known_env_id_error

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
PRECISIONS = ("auto", "fp32", "bf16")


def check(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raise ``ConfigError("<key>=<value> is not allowed: <allowed>")`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key}={value!r} is not allowed: {allowed}")


def positive_int(cfg: DictConfig, key: str) -> None:
    value = OmegaConf.select(cfg, key)
    check(isinstance(value, int) and value > 0, key, value, "must be an integer >= 1")


def auto_or_positive_int(value: Any, key: str) -> None:
    check(
        value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value > 0),
        key, value, "'auto' or an integer >= 1",
    )


def validate_env(env: DictConfig) -> None:
    """Check an env config: a known id and sane preprocessing values.

    Raises:
        ConfigError: naming ``env.<key>``.
    """
    check(env.kind in ("atari", "gym"), "env.kind", env.kind, "atari or gym")
    rebuilt = env.kind == "gym" and (env.get("spec") or env.get("factory"))  # the id only names it
    problem = None if rebuilt else known_env_id_error(env.kind, env.id)
    if problem:
        raise ConfigError(f"env.id={env.id!r} is not allowed: {problem}")
    if env.kind == "atari":
        check(env.backend in ("vector", "gymnasium"), "env.backend", env.backend, "vector or gymnasium")
        check(not (env.use_fire_reset and env.backend == "gymnasium"), "env.use_fire_reset",
               env.use_fire_reset, "false with env.backend=gymnasium (only the vector backend has it)")
        check(0.0 <= env.repeat_action_probability <= 1.0, "env.repeat_action_probability",
               env.repeat_action_probability, "a probability in [0, 1]")
        for key in ("frameskip", "frame_stack", "img_size", "max_episode_steps"):
            check(env[key] >= 1, f"env.{key}", env[key], "must be an integer >= 1")
        check(env.noop_max >= 0, "env.noop_max", env.noop_max, "must be an integer >= 0")
        check(env.async_step in (True, False, "auto"), "env.async_step", env.async_step, "true, false or auto")
    elif env.max_episode_steps is not None:
        check(env.max_episode_steps >= 1, "env.max_episode_steps", env.max_episode_steps,
               "null or an integer >= 1")


def env_creation_error(env_id: str, exc: Exception) -> ConfigError:
    """The one-line error for an env id that is registered but cannot be created."""
    first_line = str(exc).splitlines()[0] if str(exc) else ""
    return ConfigError(f"env.id={env_id!r} is not allowed: creating it failed: {type(exc).__name__}: {first_line}")


def validate_eval(cfg: DictConfig) -> None:
    """Check an eval config (the checkpoint itself is checked when it is loaded).

    Raises:
        ConfigError: the first bad value, naming its key and what is allowed.
    """
    check_keys(cfg, EvalConfig)
    if OmegaConf.is_missing(cfg, "ckpt"):
        raise ConfigError("ckpt is missing: give the checkpoint to score, e.g. distrl eval ckpt=PATH/latest.pt")
    check(cfg.num_episodes >= 1, "num_episodes", cfg.num_episodes, "must be an integer >= 1")
    check(cfg.video_fps >= 1, "video_fps", cfg.video_fps, "must be an integer >= 1")
    check(cfg.log_level in LOG_LEVELS, "log_level", cfg.log_level, ", ".join(LOG_LEVELS))
    device = host.resolve_device(cfg.device)
    check(cfg.precision is None or cfg.precision in PRECISIONS[1:], "precision", cfg.precision,
           "null (the checkpoint's), fp32 or bf16")
    validate_bf16_device(cfg.precision, device)


def validate_bf16_device(precision: str | None, device) -> None:
    """bf16 on a CUDA device needs one that computes it (Ampere or newer).

    Raises:
        ConfigError: ``precision`` is bf16 and ``device`` a CUDA device without it (key ``precision``).
    """
    import torch

    if precision == "bf16" and device.type == "cuda":
        check(torch.cuda.is_bf16_supported(), "precision", precision,
               f"fp32 or auto: {torch.cuda.get_device_name(device)} does not compute bf16")


def env_spec_error(env_id: str, exc: Exception) -> ConfigError:
    """The one-line error for an env :func:`distrl.envs.env_spec` could not probe: spaces distrl
    cannot model (``SpaceError``), or an env that could not be created."""
    if isinstance(exc, SpaceError):
        return ConfigError(f"env.id={env_id!r} is not allowed: {exc}")
    return env_creation_error(env_id, exc)

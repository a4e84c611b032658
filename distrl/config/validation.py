"""Every bad value of a composed config becomes one clear error before any process starts
(:func:`distrl.runtime.preflight.validate` runs these checks around probing the env once).

The schema (:mod:`distrl.config`) refuses unknown keys and wrong types; this module checks what a
type cannot express (ranges, env ids, devices, sizes that this machine cannot hold) and raises
:class:`~distrl.config.ConfigError` naming the key and what is allowed. It builds nothing; what
depends on the env's spaces is :mod:`distrl.config.fits`'.
"""

from __future__ import annotations

import math
import os
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf

from distrl.config import host
from distrl.config.checks import (
    LOG_LEVELS,
    PRECISIONS,
    auto_or_positive_int,
    check,
    positive_int,
    validate_bf16_device,
    validate_env,
)
from distrl.config.host import max_indices
from distrl.config.placement import Placement, plan
from distrl.config.schema import (
    AGENT_SCHEMAS,
    CLIP_RANGES,
    ESTIMATORS,
    MINIBATCHES,
    PFO_ANCHORS,
    TrainConfig,
    check_keys,
)
from distrl.envs import EnvSpec

OPTIMIZERS = ("rmsprop", "adam")
ENTROPY_SCHEDULES = ("constant", "linear")
ENCODERS = ("nature_cnn", "impala_resnet", "minigrid_cnn", "mlp")
INIT_FNS = ("orthogonal", "xavier_uniform", "default", "torch_default")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")  # torch.compile's modes (train.compile_mode)


def validate_schedule_points(schedule: Any, key: str = "agent.entropy_schedule",
                               names: tuple[str, ...] = ENTROPY_SCHEDULES, on: str = "agent.entropy_cost") -> None:
    allowed = (f"{' or '.join(names)}, or a non-empty list of [agent_steps, factor] points, "
               f"agent_steps whole numbers >= 0 in non-decreasing order, factors on {on} >= 0: "
               f"e.g. [[2500000,1.0],[3000000,0.2]]")
    if isinstance(schedule, str):
        check(schedule in names, key, schedule, allowed)
        return
    points = OmegaConf.to_container(schedule) if OmegaConf.is_config(schedule) else schedule
    ok = isinstance(points, list) and len(points) > 0 and all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(x, int | float) and not isinstance(x, bool)
                                                    and x >= 0 for x in p) and float(p[0]).is_integer()
        for p in points)
    ok = ok and all(a[0] <= b[0] for a, b in zip(points[:-1], points[1:], strict=True))
    check(ok, key, schedule, allowed)


# Memory of one actor process, a lower bound used to refuse impossible sizes only. A Pong actor of
# 16 envs (1 actor, 2-core AMD EPYC, commit c215880) had 379 MiB RSS, 277 MiB PSS and 177 MiB
# Private_Dirty (/proc/PID/smaps_rollup); no actor needs less than 128 MiB of its own.
ACTOR_PROCESS_BYTES = 128 * 2**20


def _check_sizes(cfg: DictConfig, placement: Placement) -> None:
    """Refuse sizes that cannot run here before anything is allocated: more actor processes than
    the process limit or than memory holds, more slots than a slot queue holds."""
    limit = host.process_limit()
    check(placement.actors.count <= limit, "num_actors", placement.actors.count,
           f"at most {limit} processes may be started here (RLIMIT_NPROC, /proc/sys/kernel/threads-max)")
    available = host.available_memory()
    need = placement.actors.count * ACTOR_PROCESS_BYTES
    check(need <= available, "num_actors", placement.actors.count,
           f"{placement.actors.count} actor processes need about {need / 2**30:.1f} GiB, more than the "
           f"{available / 2**30:.1f} GiB of memory available")
    most = max_indices()
    check(placement.num_slots <= most, "num_slots", placement.num_slots,
           f"at most {most} slots (a slot queue is a pipe of /proc/sys/fs/pipe-max-size bytes, 8 per slot)")


def _validate_distributed(cfg: DictConfig, placement: Placement) -> None:
    dist = cfg.distributed
    positive_int(cfg, "distributed.nproc_per_node")
    positive_int(cfg, "distributed.check_interval")
    check(dist.backend in ("auto", "gloo", "nccl"), "distributed.backend", dist.backend, "auto, gloo or nccl")
    check(dist.timeout > 0, "distributed.timeout", dist.timeout, "a number of seconds > 0")
    check(dist.max_restarts >= 0, "distributed.max_restarts", dist.max_restarts, "an integer >= 0")
    check(dist.backend != "nccl" or placement.device.type == "cuda", "distributed.backend", dist.backend,
           "auto or gloo with a CPU learner (nccl moves CUDA tensors only)")
    if host.world_size(cfg) == 1:
        return
    check(cfg.num_learners == 1, "num_learners", cfg.num_learners,
           "1 with several ranks (each rank's one learner joins the gradient all-reduce)")
    if "WORLD_SIZE" in os.environ:  # under torchrun: this rank's share is checked by the rank itself
        return
    nproc = dist.nproc_per_node
    cores = host.cpu_count()
    check(nproc <= cores, "distributed.nproc_per_node", nproc,
           f"at most the {cores} cores this command may use (each rank needs a core of its own)")
    if placement.device.type == "cuda":
        import torch

        check(nproc <= torch.cuda.device_count(), "distributed.nproc_per_node", nproc,
               f"at most one rank per GPU with device={cfg.device}: this machine has {torch.cuda.device_count()}")


class Validated(NamedTuple):
    """What validating a train config found out, so that nothing is probed twice.

    Attributes:
        placement: the resolved sizing (:func:`distrl.config.placement.plan`).
        spec: the env's observation and action facts (one env was built to learn them).
    """

    placement: Placement
    spec: EnvSpec


def validate_config(cfg: DictConfig) -> Placement:
    """Check every value of a composed train config that can be checked without its env, in the
    order the command reports them; the env's own facts are checked by :func:`validate_with_spec`
    once :func:`distrl.envs.env_spec` has probed it (:func:`distrl.runtime.preflight.validate` runs
    the three). Builds nothing, starts nothing.

    Returns:
        The placement (:func:`distrl.config.placement.plan`).

    Raises:
        ConfigError: the first bad value, naming its key and what is allowed.
    """
    check_keys(cfg, TrainConfig)
    validate_env(cfg.env)
    _validate_run(cfg)
    placement = plan(cfg)
    validate_bf16_device(cfg.precision, placement.device)
    _validate_sizes(cfg, placement)
    _validate_distributed(cfg, placement)
    _validate_agent(cfg.agent, cfg.batch_size, cfg.num_steps, cfg.model.use_lstm)
    intrinsic_head = cfg.intrinsic.name != "none" and not cfg.intrinsic.get("episodic", True)
    check(not (cfg.agent.normalize_values and intrinsic_head), "agent.normalize_values", cfg.agent.normalize_values,
          f"false with intrinsic={cfg.intrinsic.name} (its value head learns a return of its own, not normalised)")
    _validate_model(cfg)
    return placement


def _validate_logger(logger: DictConfig) -> None:
    check(logger.name in ("tensorboard", "wandb"), "logger", logger.name, "tensorboard, wandb")
    if logger.name == "wandb":
        check(logger.mode in (None, "online", "offline", "disabled"), "logger.mode", logger.mode,
               "null, online, offline, disabled")
        try:
            import wandb  # noqa: F401
        except ImportError:
            check(False, "logger", "wandb", "the wandb package is not installed (pip install wandb; make install "
                   "installs it with the sweeps extra)")


def _validate_run(cfg: DictConfig) -> None:
    """The top-level sizes and the ``train`` block."""
    auto_or_positive_int(cfg.num_actors, "num_actors")
    auto_or_positive_int(cfg.num_slots, "num_slots")
    auto_or_positive_int(cfg.learner_threads, "learner_threads")
    auto_or_positive_int(cfg.learner_split, "learner_split")
    check(cfg.pin_actors in (True, False, "auto"), "pin_actors", cfg.pin_actors, "true, false or auto")
    check(cfg.precision in PRECISIONS, "precision", cfg.precision, ", ".join(PRECISIONS))
    check(isinstance(cfg.objective, str) and bool(cfg.objective.strip()), "objective", cfg.objective,
           "a key of metrics.jsonl, e.g. eval/mean_return or charts/episodic_return")
    _validate_logger(cfg.logger)
    for key in ("num_steps", "num_learners", "batch_size", "envs_per_actor",
                "train.num_train_steps", "train.log_interval", "train.eval_interval",
                "train.save_interval", "train.keep_checkpoints"):
        positive_int(cfg, key)
    value = cfg.train.num_eval_episodes
    check(value >= 0, "train.num_eval_episodes", value, "must be an integer >= 0")
    positive_int(cfg, "train.max_nonfinite_updates")
    mode = cfg.train.compile_mode
    check(mode in COMPILE_MODES, "train.compile_mode", mode, ", ".join(COMPILE_MODES))
    check(mode == "default" or cfg.train.th_compile, "train.compile_mode", mode,
           "default, unless train.th_compile=true (the mode is torch.compile's)")
    check(cfg.learner_split in (1, "auto") or not cfg.train.th_compile, "learner_split", cfg.learner_split,
          "1 or auto with train.th_compile=true (the compiled step is not split)")
    value = cfg.train.max_actor_restarts
    check(isinstance(value, int) and value >= 0, "train.max_actor_restarts", value, "must be an integer >= 0")
    for key in ("stall_timeout", "actor_restart_window"):
        value = cfg.train[key]
        check(value > 0 and math.isfinite(value), f"train.{key}", value, "a number of seconds > 0")
    check(cfg.log_level in LOG_LEVELS, "log_level", cfg.log_level, ", ".join(LOG_LEVELS))
    check(cfg.resume is False or cfg.resume is None or isinstance(cfg.resume, str), "resume", cfg.resume,
           "auto, false, or the path of a checkpoint or run directory")


def _validate_sizes(cfg: DictConfig, placement: Placement) -> None:
    _check_sizes(cfg, placement)
    if cfg.train.sync:  # each update takes rollouts of every env, all acted with the weights before it
        check(cfg.batch_size % placement.stepping == 0, "train.sync", cfg.train.sync,
              f"true only with batch_size a multiple of num_actors x envs_per_actor (here {placement.actors.count} x "
              f"{cfg.envs_per_actor} = {placement.stepping}, batch_size={cfg.batch_size})")
        check(cfg.num_learners == 1, "train.sync", cfg.train.sync, "true only with num_learners=1")
        check(not placement.actors.async_step, "train.sync", cfg.train.sync,
              "true only with env.async_step=false (every env hands in its rollout at once)")
    # Every stepping env always holds a slot; each learner must be able to collect B more. With
    # fewer, async stepping (half the envs hand in slots at a time) or several learners (each
    # holding a partial batch) wait on each other forever.
    need = placement.stepping + cfg.batch_size * cfg.num_learners
    check(
        placement.num_slots >= need, "num_slots", placement.num_slots,
        f"must be >= num_actors x envs_per_actor + batch_size x num_learners "
        f"({placement.stepping} + {cfg.batch_size} x {cfg.num_learners}): use at least {need}",
    )


def _validate_agent(agent: DictConfig, batch_size: int, num_steps: int, use_lstm: bool) -> None:
    check(agent.name in AGENT_SCHEMAS, "agent", agent.name, ", ".join(AGENT_SCHEMAS))
    check(agent.optimizer in OPTIMIZERS, "agent.optimizer", agent.optimizer, ", ".join(OPTIMIZERS))
    check(agent.estimator in ESTIMATORS, "agent.estimator", agent.estimator, ", ".join(ESTIMATORS))
    validate_schedule_points(agent.entropy_schedule)
    for key in ("lr", "eps", "rho_bar", "c_bar", "max_grad_norm"):
        check(agent[key] > 0, f"agent.{key}", agent[key], "must be > 0")
    check(0 < agent.trace_lambda <= 1, "agent.trace_lambda", agent.trace_lambda, "a number in (0, 1]")
    for key in ("num_epochs", "num_minibatches"):
        check(isinstance(agent[key], int) and agent[key] > 0, f"agent.{key}", agent[key], "must be an integer >= 1")
    check(agent.minibatch in MINIBATCHES, "agent.minibatch", agent.minibatch, ", ".join(MINIBATCHES))
    if agent.minibatch == "unrolls":
        check(batch_size % agent.num_minibatches == 0, "agent.num_minibatches", agent.num_minibatches,
               f"must divide batch_size={batch_size} (a minibatch is whole unrolls)")
    else:
        check(not use_lstm, "agent.minibatch", agent.minibatch,
               "unrolls with model.use_lstm=true (the LSTM core needs whole unrolls)")
        check(num_steps * batch_size % agent.num_minibatches == 0, "agent.num_minibatches", agent.num_minibatches,
               f"must divide num_steps x batch_size = {num_steps * batch_size} (agent.minibatch=steps)")
    if agent.name == "appo":
        check(agent.clip > 0, "agent.clip", agent.clip, "must be > 0")
        check(agent.clip_range in CLIP_RANGES, "agent.clip_range", agent.clip_range, " or ".join(CLIP_RANGES))
        clamp = agent.ratio_clamp
        check(clamp is None or (OmegaConf.is_list(clamp) and len(clamp) == 2
                                and all(isinstance(v, int | float) and not isinstance(v, bool) for v in clamp)
                                and 0 < clamp[0] < 1 < clamp[1] and math.isfinite(clamp[1])),
              "agent.ratio_clamp", clamp, "null or [low, high] with 0 < low < 1 < high (Sample Factory's: [0.05, 20])")
        check(agent.value_clip is None or agent.value_clip > 0, "agent.value_clip", agent.value_clip,
               "null or a number > 0")
    check(agent.lr_warmup_steps >= 0, "agent.lr_warmup_steps", agent.lr_warmup_steps, "must be >= 0")
    for key in ("entropy_cost", "baseline_cost", "momentum"):
        check(agent[key] >= 0, f"agent.{key}", agent[key], "must be >= 0")
    check(0 <= agent.discount <= 1, "agent.discount", agent.discount, "a number in [0, 1]")
    check(0 <= agent.alpha < 1, "agent.alpha", agent.alpha, "a number in [0, 1)")
    check(agent.reward_clip is None or agent.reward_clip > 0, "agent.reward_clip",
           agent.reward_clip, "null or a number > 0")
    check(agent.reward_scale > 0 and math.isfinite(agent.reward_scale), "agent.reward_scale", agent.reward_scale,
          "a number > 0")
    check(agent.reward_scale == 1 or not agent.normalize_rewards, "agent.reward_scale", agent.reward_scale,
          "1 with agent.normalize_rewards=true (the rewards are divided by their own return's std: a scale "
          "would cancel)")
    for key in ("normalize_rewards", "normalize_values", "shuffle_minibatches"):
        check(isinstance(agent[key], bool), f"agent.{key}", agent[key], "true or false")
    check(not agent.normalize_values or agent.minibatch == "steps", "agent.normalize_values", agent.normalize_values,
          "true only with agent.minibatch=steps (the value targets are normalised once per batch, before the "
          "first optimizer step)")
    for key in ("pfo_coef", "kl_cost"):
        check(agent[key] >= 0 and math.isfinite(agent[key]), f"agent.{key}", agent[key], "a number >= 0")
    check(agent.pfo_anchor in PFO_ANCHORS, "agent.pfo_anchor", agent.pfo_anchor, " or ".join(PFO_ANCHORS))
    check(agent.pfo_coef == 0 or agent.pfo_anchor == "behaviour" or agent.num_epochs * agent.num_minibatches > 1,
          "agent.pfo_coef", agent.pfo_coef, "0 with one optimizer step a batch (agent.num_epochs x "
          "agent.num_minibatches = 1) and agent.pfo_anchor=update: the features cannot drift from the update's "
          "start before its only step")


def _validate_model(cfg: DictConfig) -> None:
    """The model's keys (whether its encoder fits the env's observations: :func:`_validate_model_fits`)."""
    model = cfg.model
    check(model.encoder in ENCODERS, "model.encoder", model.encoder, ", ".join(ENCODERS))
    check(model.init_fn in INIT_FNS, "model.init_fn", model.init_fn, ", ".join(INIT_FNS))
    check(not (model.layer_norm and model.encoder == "impala_resnet"), "model.layer_norm", model.layer_norm,
           "true only with model.encoder nature_cnn, minigrid_cnn or mlp (impala_resnet has none)")
    for key in ("feature_dim", "hidden_dim"):
        positive_int(cfg, f"model.{key}")
    check(not (model.separate_critic and model.use_lstm), "model.separate_critic", model.separate_critic,
           "false with model.use_lstm=true (the critic's own encoder has no core)")
    check(-5.0 <= model.log_std_init <= 2.0, "model.log_std_init", model.log_std_init, "a number in [-5, 2]")
    check(model.obs_clip > 0 and math.isfinite(model.obs_clip), "model.obs_clip", model.obs_clip, "a number > 0")

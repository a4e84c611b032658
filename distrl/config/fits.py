"""The checks of a train config against its env's spaces (an :class:`distrl.envs.EnvSpec`, probed once
by :func:`distrl.runtime.preflight.validate`): whether the model's encoder fits the observations,
whether the values suit the actions (Box actions on the Atari values are refused), the intrinsic
module, the slots' memory and the initial weights' file. :mod:`distrl.config.validation` checks what
needs no env.
"""

from __future__ import annotations

import math

from omegaconf import DictConfig

from distrl.config import host
from distrl.config.checks import check, positive_int
from distrl.config.placement import Placement
from distrl.config.schema import ConfigError
from distrl.config.validation import validate_schedule_points
from distrl.envs import EnvSpec
from distrl.intrinsic import NAMES, NORMALIZATIONS
from distrl.nn.encoders import MIN_IMAGE_SIDE
from distrl.rollout import RolloutLayout
from distrl.utils.checkpoint import checkpoint_file


def validate_with_spec(cfg: DictConfig, placement: Placement, spec: EnvSpec) -> None:
    """Check what depends on the env's observations and actions (``spec``, probed once): the model's
    encoder, the intrinsic module, the slots' memory, and ``train.init_model_path``.

    Raises:
        ConfigError: the first bad value, naming its key and what is allowed.
    """
    _validate_model_fits(cfg.model, spec)
    _validate_continuous_protocol(cfg, spec)
    _validate_intrinsic(cfg, spec)
    _validate_slots_memory(cfg, placement, spec)
    path = cfg.train.init_model_path
    check(path is None or checkpoint_file(path).is_file(), "train.init_model_path", path,
           "null, a checkpoint file, or a run directory with checkpoints/latest.pt")


def _validate_model_fits(model: DictConfig, spec: EnvSpec) -> None:
    """Whether the model's encoder fits the env's observations."""
    flat = ("mlp for flat ones: experiment=mujoco for continuous control (Box actions), or add model=mlp"
            if spec.action_space.kind == "box"
            else "mlp for flat ones (env=gym: add model=mlp, or use experiment=cartpole)")
    check(
        (model.encoder != "mlp") == spec.is_image, "model.encoder", model.encoder,
        f"nature_cnn, impala_resnet or minigrid_cnn for image observations (env=atari, env=image_cue, env=minigrid), "
        f"{flat}",
    )
    check(not (model.normalize_obs and spec.is_image), "model.normalize_obs", model.normalize_obs,
           "false for image observations (they are scaled to [0, 1] by the encoder)")
    if spec.is_image:
        side = min(spec.obs_shape[1:])
        fitting = [name for name, least in MIN_IMAGE_SIDE.items() if side >= least]
        check(side >= MIN_IMAGE_SIDE[model.encoder], "model.encoder", model.encoder,
               f"one that takes images of {side} pixels a side: {', '.join(fitting)}")


def _validate_continuous_protocol(cfg: DictConfig, spec: EnvSpec) -> None:
    """Box actions with rewards clipped to [-1, 1] and raw observations, the values of the Atari agents
    (conf/agent/appo.yaml, impala.yaml) with no preset, are refused: a continuous-control reward
    clipped so carries little of its signal (Pendulum-v1, 300k agent steps, seed 1: best evaluation
    -1,086 on that path, random play's level, against -102 with CleanRL's values, now
    ``experiment=mujoco_1m``, and -234 with Sample Factory's, ``experiment=mujoco``; docs/lab/mujoco.md,
    docs/lab/runs/pendulum/). ``experiment=mujoco`` sets continuous control's values; either key set
    otherwise keeps these values on purpose.

    Raises:
        ConfigError: Box actions with ``agent.reward_clip`` set and ``model.normalize_obs=false``.
    """
    atari_protocol = cfg.agent.reward_clip is not None and not cfg.model.normalize_obs
    if spec.action_space.kind == "box" and atari_protocol:
        raise ConfigError(
            f"env.id={cfg.env.id!r} has {spec.action_space.describe()} actions, and agent.reward_clip="
            f"{cfg.agent.reward_clip} with model.normalize_obs=false is the Atari protocol, which does not learn "
            f"continuous control: add experiment=mujoco (continuous control's preset), or set agent.reward_clip=null "
            f"or model.normalize_obs=true to train with these values anyway")


def _validate_intrinsic(cfg: DictConfig, spec: EnvSpec) -> None:
    """The ``intrinsic`` group, ``train.pretraining``, and whether a module's encoder fits the observations."""
    intrinsic = cfg.intrinsic
    check(intrinsic.name in NAMES, "intrinsic.name", intrinsic.name, ", ".join(NAMES))
    check(intrinsic.coef >= 0 and math.isfinite(intrinsic.coef), "intrinsic.coef", intrinsic.coef,
           "a number >= 0")
    validate_schedule_points(intrinsic.coef_schedule, "intrinsic.coef_schedule", ("constant",), "intrinsic.coef")
    for key in ("embed_dim", "k", "memory"):
        positive_int(cfg, f"intrinsic.{key}")
    check(intrinsic.lr > 0 and math.isfinite(intrinsic.lr), "intrinsic.lr", intrinsic.lr, "a number > 0")
    check(intrinsic.ridge > 0 and math.isfinite(intrinsic.ridge), "intrinsic.ridge", intrinsic.ridge, "a number > 0")
    check(intrinsic.minibatch_size is None or (isinstance(intrinsic.minibatch_size, int)
                                               and intrinsic.minibatch_size > 0),
          "intrinsic.minibatch_size", intrinsic.minibatch_size, "null or an integer > 0")
    check(intrinsic.encoder in ("own", "model"), "intrinsic.encoder", intrinsic.encoder, "own or model")
    check(intrinsic.normalize in NORMALIZATIONS, "intrinsic.normalize", intrinsic.normalize,
           " or ".join(NORMALIZATIONS))
    check(intrinsic.clip is None or (intrinsic.clip > 0 and math.isfinite(intrinsic.clip)), "intrinsic.clip",
           intrinsic.clip, "null or a number > 0")
    check(not (intrinsic.obs_norm and intrinsic.name == "e3b"), "intrinsic.obs_norm", intrinsic.obs_norm,
           "false with e3b: its actors compute the bonus on the unstandardised inputs")
    check(intrinsic.name != "e3b" or spec.action_space.is_discrete, "intrinsic", intrinsic.name,
           f"none, rnd or re3 for {spec.action_space.describe()} actions (e3b's inverse dynamics predicts one "
           f"discrete action)")
    if intrinsic.name == "re3":
        most = cfg.num_steps - 1
        check(intrinsic.k <= most, "intrinsic.k", intrinsic.k,
               f"at most num_steps - 1 = {most}: an env's first unroll's neighbours are its other observations")
    check(not cfg.train.pretraining or intrinsic.name != "none", "train.pretraining", cfg.train.pretraining,
           "true needs an intrinsic reward to train on: add intrinsic=rnd, intrinsic=re3 or intrinsic=e3b")
    if intrinsic.name != "none":
        check(len(spec.obs_shape) in (1, 3), "intrinsic", intrinsic.name,
               f"none for observations of shape {tuple(spec.obs_shape)}: its encoders take [C, H, W] images "
               f"or flat vectors")


def _validate_slots_memory(cfg: DictConfig, placement: Placement, spec: EnvSpec) -> None:
    """The rollout slots must fit in the shared memory this machine has free."""
    nbytes = RolloutLayout.for_run(cfg, spec).nbytes(placement.num_slots)
    room = host.shared_memory_room()
    check(nbytes <= room, "num_slots", placement.num_slots,
           f"the slots need {nbytes / 2**30:.1f} GiB of shared memory, more than the {room / 2**30:.1f} GiB "
           f"free here (/dev/shm, MemAvailable)")

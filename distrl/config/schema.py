"""The typed schema of the config tree.

The dataclasses are stored in Hydra's ``ConfigStore`` and used as the base of
``conf/train.yaml`` and of each config group option, so a misspelt key or a
string where a number belongs fails at compose time with the key's name.
:mod:`distrl.config.validation` then checks the values that a type cannot express.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf


class ConfigError(ValueError):
    """A config value is not allowed; the message names the key and what is allowed."""


RENAMED = {"num_storages": "num_slots", "agent.normalize_returns": "agent.normalize_rewards"}  # docs/architecture.md


def renamed_message(key: str) -> str:
    """The one line that refuses a renamed key (:data:`RENAMED`) and names its new name."""
    return f"{key} is now {RENAMED[key]}: give {RENAMED[key]}=VALUE (docs/configuration.md)"


ESTIMATORS = ("vtrace", "gae")  # agent.estimator (distrl/learning/losses/returns.py)
MINIBATCHES = ("unrolls", "steps")  # agent.minibatch (distrl/learning/losses/base.py)
CLIP_RANGES = ("symmetric", "reciprocal")  # agent.clip_range (distrl/learning/losses/appo.py)
PFO_ANCHORS = ("update", "behaviour")  # agent.pfo_anchor (distrl/learning/losses/penalties.py)


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
    async_step: Any = MISSING  # true | false | auto (see distrl.config.placement)


@dataclass
class GymEnvConfig:
    """Any registered Gymnasium id; values in conf/env/gym.yaml."""

    kind: str = MISSING
    id: str = MISSING
    max_episode_steps: int | None = MISSING  # None: the id's registered limit
    spec: str | None = MISSING  # set by the Python API: a gymnasium.make env's EnvSpec as JSON
    factory: str | None = MISSING  # set by the Python API: a zero-argument env factory, pickled (base64)
    success_above: float | None = MISSING  # an episode whose return is above this succeeded (charts/success_rate)
    clip_actions: bool = MISSING  # Box actions: the env gets the sample clipped to its bounds (false: raw)


@dataclass
class AgentConfig:
    """The keys every agent has (:mod:`distrl.learning.losses`); IMPALA's values in conf/agent/impala.yaml (how
    they were measured: docs/lab/learning.md)."""

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
    reward_scale: float = MISSING  # the extrinsic rewards times x in the loss, before the clip; 1: as the env pays
    reward_clip: float | None = MISSING  # rewards clipped to [-x, x] in the loss; null: no clipping
    estimator: str = MISSING  # the return estimator: vtrace | gae (distrl/learning/losses/returns.py)
    rho_bar: float = MISSING
    c_bar: float = MISSING
    trace_lambda: float = MISSING  # V-trace's c_s = lambda min(c_bar, rho_s), in (0, 1]; GAE's lambda
    max_grad_norm: float = MISSING
    num_epochs: int = MISSING  # passes over each batch
    num_minibatches: int = MISSING  # minibatches each pass splits the batch into
    minibatch: str = MISSING  # unrolls (targets on each) | steps (random steps, targets once a batch): losses/base.py
    # true: each epoch a new random order; false: the same contiguous slices every epoch, steps taken
    # unroll by unroll (Sample Factory's shuffle_minibatches=False; distrl/learning/plan.py)
    shuffle_minibatches: bool = MISSING
    normalize_advantages: bool = MISSING  # the policy gradient's advantages standardised over each (mini)batch
    # rewards divided by the running std of the discounted return (clipped to [-10, 10]) before the
    # reward clip; the statistics are the learner's, saved in checkpoints (distrl/nn/normalization.py)
    normalize_rewards: bool = MISSING
    # the critic learns value targets normalised by their running mean and std, clipped to [-5, 5]
    # (Sample Factory's normalize_returns; distrl/nn/normalization.py, normalize_value_targets)
    normalize_values: bool = MISSING
    # PFO (Moalla et al. 2024): the weight of the encoder's feature drift, 0: none; from the features of
    # the update's start or of the behaviour policy's (penalties.py, FeatureDrift)
    pfo_coef: float = MISSING
    pfo_anchor: str = MISSING
    # the weight of the mean KL(pi || mu) to the behaviour policy, 0: none (penalties.py, KLPenalty)
    kl_cost: float = MISSING


@dataclass
class AppoConfig(AgentConfig):
    """APPO (:mod:`distrl.learning.losses.appo`): the keys of every agent and the clips; values in
    conf/agent/appo.yaml."""

    clip: float = MISSING  # the policy ratio's clip, > 0
    clip_range: str = MISSING  # symmetric: [1 - clip, 1 + clip] | reciprocal: [1 / (1 + clip), 1 + clip]
    ratio_clamp: Any = MISSING  # null, or [low, high]: the ratio clamped there before the surrogate
    value_clip: float | None = MISSING  # the value's clip around the behaviour value; null: none


AGENT_SCHEMAS = {"impala": AgentConfig, "appo": AppoConfig}


@dataclass
class ModelConfig:
    """Network: encoder, optional LSTM core, policy and baseline heads; values in conf/model/."""

    encoder: str = MISSING  # nature_cnn | impala_resnet | minigrid_cnn | mlp
    feature_dim: int = MISSING
    hidden_dim: int = MISSING
    init_fn: str = MISSING  # orthogonal | xavier_uniform | default | torch_default (torch's weights, zero biases)
    use_lstm: bool = MISSING
    last_action_reward: bool = MISSING  # the previous action and reward as inputs beside the features
    layer_norm: bool = MISSING  # a LayerNorm before each activation of the encoder (not impala_resnet)
    normalize_obs: bool = MISSING  # vector observations normalised by running statistics (mlp only)
    obs_clip: float = MISSING  # the normalised observations clipped to [-obs_clip, obs_clip]
    separate_critic: bool = MISSING  # the baseline reads an encoder of its own (not with use_lstm)
    log_std_init: float = MISSING  # Box actions: the Gaussian's state-independent log-std at the start


@dataclass
class IntrinsicConfig:
    """An intrinsic reward for exploration (:mod:`distrl.intrinsic`); values in conf/intrinsic/."""

    name: str = MISSING  # none | rnd | re3 | e3b
    coef: float = MISSING  # the intrinsic reward's weight beside the extrinsic one
    coef_schedule: Any = MISSING  # constant | [[agent_steps, factor], ...] on coef
    embed_dim: int = MISSING  # the random network's output features
    lr: float = MISSING  # the trained networks' Adam learning rate (rnd, e3b)
    k: int = MISSING  # the nearest neighbour whose distance is the reward (re3)
    memory: int = MISSING  # the last observations of each env among the neighbours (re3)
    ridge: float = MISSING  # the initial diagonal of each episode's covariance (e3b)
    unit_embedding: bool = MISSING  # e3b: the bonus of phi / |phi|, at most 1 / ridge
    minibatch_size: int | None = MISSING  # e3b: null, one step on each batch; n, one pass in shuffled steps of n
    encoder: str = MISSING  # e3b's embedding: own (distrl/intrinsic/base.py) | model (model.encoder's layers)
    obs_norm: bool = MISSING  # inputs standardised per element by running stats, clipped to [-5, 5] (rnd, re3)
    episodic: bool = MISSING  # true: one value head, an episode's end cuts the intrinsic return too
    normalize: str = MISSING  # returns | rewards: whose running std the rewards are divided by
    clip: float | None = MISSING  # null, or the most a normalised intrinsic reward may be


@dataclass
class TrainBlock:
    """Schedule of a run; every step count and interval is in agent steps."""

    num_train_steps: int = MISSING
    init_model_path: str | None = MISSING
    log_interval: int = MISSING
    eval_interval: int = MISSING
    save_interval: int = MISSING
    num_eval_episodes: int = MISSING
    eval_deterministic: bool = MISSING  # evaluations act with the distribution's mode, not a sample
    keep_checkpoints: int = MISSING
    th_compile: bool = MISSING
    compile_mode: str = MISSING  # torch.compile's mode: default | reduce-overhead | max-autotune
    prefetch: bool = MISSING  # the next batch copied beside the update
    sync: bool = MISSING  # synchronous collection: every rollout acted with the latest update's weights
    stall_timeout: float = MISSING  # seconds
    max_actor_restarts: int = MISSING
    actor_restart_window: float = MISSING  # seconds
    max_nonfinite_updates: int = MISSING
    pretraining: bool = MISSING  # reward-free: the intrinsic reward alone


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
    agent: Any = MISSING  # conf/agent/: AGENT_SCHEMAS[name]
    model: ModelConfig = MISSING
    intrinsic: IntrinsicConfig = MISSING
    train: TrainBlock = MISSING
    distributed: DistributedConfig = MISSING
    tag: str = MISSING
    seed: int = MISSING
    device: str = MISSING
    num_steps: int = MISSING  # unroll length T
    num_actors: Any = MISSING  # int >= 1 or auto
    num_learners: int = MISSING
    num_slots: Any = MISSING  # int >= 1 or auto
    batch_size: int = MISSING  # B
    envs_per_actor: int = MISSING
    learner_threads: Any = MISSING  # int >= 1 or auto
    learner_split: Any = MISSING  # int >= 1 or auto
    pin_actors: Any = MISSING  # true | false | auto
    log_level: str = MISSING
    resume: Any = MISSING  # auto | false | a checkpoint file or run directory
    precision: str = MISSING  # auto | fp32 | bf16
    objective: str = MISSING  # a metrics.jsonl key: what a multirun job returns to its sweeper
    logger: Any = MISSING  # conf/logger/: tensorboard | wandb


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
    deterministic: bool | None = MISSING
    device: str = MISSING
    seed: int = MISSING
    video: bool = MISSING
    video_fps: int = MISSING
    precision: str | None = MISSING  # None: the checkpoint's | fp32 | bf16
    env: EvalEnvOverrides = MISSING
    log_level: str = MISSING


def _nested_schemas(cfg: DictConfig, schema: type) -> dict[str, type]:
    if schema is TrainConfig:
        env = AtariEnvConfig if cfg.get("env", {}).get("kind") == "atari" else GymEnvConfig
        agent = AGENT_SCHEMAS.get(cfg.get("agent", {}).get("name"), AgentConfig)
        return {"env": env, "agent": agent, "model": ModelConfig, "intrinsic": IntrinsicConfig,
                "train": TrainBlock, "distributed": DistributedConfig}
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


def check_keys(cfg: DictConfig, schema: type) -> None:
    """Raise :class:`ConfigError` for the first key of ``cfg`` that ``schema`` does not have."""
    unknown = unknown_keys(cfg, schema)
    if unknown:
        key, close = unknown[0]
        if key in RENAMED:
            raise ConfigError(renamed_message(key))
        hint = f" (did you mean {close}?)" if close else ""
        raise ConfigError(f"{key} is not a key of this config{hint}: a key added with + is refused too; "
                          f"`distrl train --help` lists the keys")


def config_dir() -> str:
    """``conf/``: packaged beside the code in a wheel (``distrl/conf``), else the repository root's."""
    package = Path(__file__).resolve().parent.parent
    packaged = package / "conf"
    if (packaged / "train.yaml").is_file():
        return str(packaged)
    return str(package.parent / "conf")


def run_dir_suffix(*tag: str, _root_: DictConfig) -> str:
    """``${distrl_tag:}`` in ``hydra.run.dir``: ``_<tag>`` for a run with ``tag=<tag>``, else ``""``.

    The tag is read from the config's root; Hydra's ``--cfg hydra --resolve`` resolves its own node
    alone, and there the tag is found among the command line's overrides. (A positional tag, as in
    ``${distrl_tag:${tag}}`` of configs saved before, is taken as given.)"""
    if tag:
        value = tag[0]
    elif "tag" in _root_:
        value = _root_.tag
    else:
        given = OmegaConf.select(_root_, "hydra.overrides.task", default=None) or []
        value = next((o.split("=", 1)[1] for o in given if o.split("=", 1)[0].lstrip("+~") == "tag"), "")
    return f"_{value}" if value else ""


def register_configs() -> None:
    """Store the schemas in Hydra's ConfigStore and register the ``distrl_tag`` resolver (idempotent)."""
    OmegaConf.register_new_resolver("distrl_tag", run_dir_suffix, replace=True)
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="eval_schema", node=EvalConfig)
    cs.store(group="env", name="atari_schema", node=AtariEnvConfig)
    cs.store(group="env", name="gym_schema", node=GymEnvConfig)
    cs.store(group="agent", name="impala_schema", node=AgentConfig)
    cs.store(group="agent", name="appo_schema", node=AppoConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="intrinsic", name="intrinsic_schema", node=IntrinsicConfig)

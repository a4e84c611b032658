"""Every config group composes through Hydra's compose API, and validation rejects each bad value
with its key, before any process starts."""

import os
from pathlib import Path

import pytest
import torch
from conftest import compose_train
from omegaconf import OmegaConf

from distrl.config.compose import compose_or_refuse
from distrl.config.placement import plan
from distrl.config.schema import RENAMED, ConfigError, config_dir
from distrl.runtime.preflight import validate

CONF = Path(config_dir())


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def test_the_config_groups_are_there():
    assert {"atari", "gym", "image_cue", "image_cue_memory"} <= set(options("env"))
    assert {"cartpole", "image_cue", "image_cue_memory"} <= set(options("experiment"))
    assert {"nature_cnn", "impala_resnet", "mlp"} <= set(options("model"))
    assert {"impala", "appo"} <= set(options("agent"))


@pytest.mark.parametrize("env", options("env"))
@pytest.mark.parametrize("agent", options("agent"))
def test_every_env_and_agent_composes_and_validates(env, agent):
    # env=mujoco with the Atari agents' values is refused unless one of them is changed (test_cli's box-plain)
    model = {"gym": ["model=mlp"], "sparse_chain": ["model=mlp"], "mujoco": ["model=mlp", "model.normalize_obs=true"],
             "minigrid": ["model=minigrid_cnn"]}.get(env, [])
    cfg = compose_train([f"env={env}", f"agent={agent}", *model])
    validate(cfg)
    assert cfg.env.kind in ("atari", "gym")


@pytest.mark.parametrize("model", options("model"))
def test_every_model_composes_with_a_matching_env(model):
    envs = {"mlp": ["gym", "sparse_chain", "mujoco"], "minigrid_cnn": ["minigrid"],
            "impala_resnet": ["atari", "image_cue", "image_cue_memory", "minigrid"]}.get(
        model, ["atari", "image_cue", "image_cue_memory"])
    for env in envs:
        cfg = compose_train([f"env={env}", f"model={model}", *(["agent=appo_mujoco"] if env == "mujoco" else [])])
        validate(cfg)
        assert cfg.model.encoder == model


@pytest.mark.parametrize("experiment", options("experiment"))
def test_every_experiment_preset_composes_and_validates(experiment):
    cfg = compose_train([f"experiment={experiment}"])
    validate(cfg)
    defaults = compose_train([])
    assert cfg != defaults  # a preset that changes nothing is not a preset


def test_defaults_follow_the_issue_and_the_paper():
    cfg = compose_train([])
    assert cfg.env.id == "ALE/Pong-v5" and cfg.env.frameskip == 4 and cfg.env.repeat_action_probability == 0.25
    assert cfg.num_steps == 32 and cfg.batch_size == 32 and cfg.envs_per_actor == 16 and cfg.num_actors == "auto"
    assert cfg.model.encoder == "nature_cnn"
    # APPO at CleanRL PPO's Atari values (docs/lab/atari5.md, "The fourth session of screening")
    agent = cfg.agent
    assert agent.name == "appo" and agent.optimizer == "adam" and agent.lr == 0.00025
    assert (agent.clip, agent.num_epochs, agent.num_minibatches, agent.trace_lambda) == (0.1, 4, 4, 0.95)
    assert cfg.agent.discount == 0.99 and cfg.agent.baseline_cost == 0.5 and cfg.agent.entropy_cost == 0.01
    impala = compose_train(["agent=impala"])  # IMPALA's loss at the sizing measured on Pong
    assert (impala.num_steps, impala.batch_size, impala.agent.lr, impala.agent.eps) == (20, 4, 0.0007, 1.25e-7)
    cartpole = compose_train(["experiment=cartpole"])
    assert cartpole.model.encoder == "mlp" and cartpole.num_steps == 16 and cartpole.agent.lr == 0.005
    assert cartpole.env.kind == "gym" and cartpole.env.id == "CartPole-v1"


def test_pfo_is_the_atari_default_and_the_presets_measured_without_it_keep_it_off():
    """conf/agent/appo.yaml ships PFO (measured on Atari: docs/lab/atari5.md); the presets that
    inherit it and were measured without it say 0 (the image diagnostic too: PFO slows its 50k agent
    steps), and IMPALA's one optimizer step a batch cannot take it."""
    assert compose_train([]).agent.pfo_coef == 1.0
    assert compose_train(["env.id=ALE/Qbert-v5"]).agent.pfo_coef == 1.0
    for preset in ("experiment=minigrid", "experiment=minigrid_rlexplore", "experiment=mujoco", "experiment=mujoco_1m",
                   "experiment=image_cue", "agent=impala"):
        assert compose_train([preset]).agent.pfo_coef == 0.0, preset


# experiment=mujoco as measured: Hopper-v4 at 3M, seeds 1-4, docs/lab/runs/hopper-v4/Hopper-v4-base-s{1..4}.csv.gz
# (mean training return 2,413 against Sample Factory's 2,146, docs/lab/runs/sf/Hopper-v4-sf-s{1..4}.csv.gz), and
# HalfCheetah at 10M, docs/lab/runs/sf/HalfCheetah-sfrecipe-s{1,2}.csv.gz (docs/lab/mujoco.md, issue 91). A change
# to any of these is a new measurement, not an edit of this table.
MUJOCO_PRESET = {
    "num_steps": 64, "batch_size": 64, "num_actors": 2, "envs_per_actor": 32, "precision": "fp32",
    "train.sync": True, "train.num_train_steps": 10_000_000, "train.eval_deterministic": True,
    "env.clip_actions": True,
    "model.encoder": "mlp", "model.feature_dim": 64, "model.hidden_dim": 64, "model.init_fn": "default",
    "model.normalize_obs": True, "model.obs_clip": 5.0, "model.separate_critic": True, "model.log_std_init": 0.0,
    "agent.name": "appo", "agent.optimizer": "adam", "agent.lr": 0.00295, "agent.lr_warmup_steps": 0,
    "agent.eps": 1e-6, "agent.entropy_cost": 0.0, "agent.baseline_cost": 2.6, "agent.discount": 0.99,
    "agent.reward_clip": None, "agent.estimator": "gae", "agent.trace_lambda": 0.95, "agent.max_grad_norm": 3.5,
    "agent.num_epochs": 2, "agent.num_minibatches": 4, "agent.minibatch": "steps", "agent.shuffle_minibatches": True,
    "agent.normalize_advantages": True, "agent.normalize_rewards": False, "agent.normalize_values": True,
    "agent.pfo_coef": 0.0, "agent.kl_cost": 0.1, "agent.clip": 0.2, "agent.clip_range": "reciprocal",
    "agent.ratio_clamp": [0.05, 20], "agent.value_clip": 1.0,
}


def test_the_mujoco_preset_is_the_one_its_records_measured():
    from omegaconf import OmegaConf

    cfg = compose_train(["experiment=mujoco"])
    got = {key: OmegaConf.select(cfg, key) for key in MUJOCO_PRESET}
    got["agent.ratio_clamp"] = list(got["agent.ratio_clamp"])
    assert got == MUJOCO_PRESET


# experiment=minigrid_rlexplore: RLeXplore's MiniGrid setup, each value as the `reward` branch of
# RLE-Foundation/rllte at e26d1b2 has it (src/utils.py, rllte/env/minigrid/__init__.py; issue 95)
RLEXPLORE_PRESET = {
    "env.id": "MiniGrid-DoorKey-16x16-v0", "model.encoder": "minigrid_cnn", "model.feature_dim": 512,
    "precision": "fp32", "num_steps": 32, "batch_size": 256, "train.sync": True, "train.num_train_steps": 10_000_000,
    "agent.name": "appo", "agent.lr": 2.5e-4, "agent.eps": 1e-5, "agent.entropy_cost": 0.01, "agent.baseline_cost": 0.5,
    "agent.discount": 0.99, "agent.reward_scale": 100.0, "agent.reward_clip": None, "agent.estimator": "gae",
    "agent.trace_lambda": 0.95, "agent.normalize_advantages": True, "agent.num_epochs": 4, "agent.num_minibatches": 8,
    "agent.minibatch": "steps", "agent.max_grad_norm": 0.5, "agent.clip": 0.1, "agent.clip_range": "symmetric",
    "agent.value_clip": 0.1, "agent.pfo_coef": 0.0, "agent.kl_cost": 0.0, "agent.normalize_rewards": False,
    "agent.normalize_values": False, "intrinsic.name": "e3b", "intrinsic.coef": 0.25,
    "intrinsic.coef_schedule": "constant",
    "intrinsic.embed_dim": 512, "intrinsic.lr": 1e-3, "intrinsic.minibatch_size": 256, "intrinsic.ridge": 0.1,
    "intrinsic.k": 5, "intrinsic.memory": 1000, "intrinsic.episodic": True, "intrinsic.normalize": "rewards",
    "intrinsic.clip": None, "intrinsic.unit_embedding": False, "intrinsic.encoder": "model",
}


def test_the_rlexplore_preset_is_its_reference_setup_for_each_intrinsic_reward():
    from omegaconf import OmegaConf

    cfg = compose_train(["experiment=minigrid_rlexplore"])
    assert {key: OmegaConf.select(cfg, key) for key in RLEXPLORE_PRESET} == RLEXPLORE_PRESET
    assert cfg.num_actors * cfg.envs_per_actor == cfg.batch_size  # every env's rollout in each batch
    assert cfg.batch_size * cfg.num_steps // cfg.agent.num_minibatches == 1024  # its --batch_size
    for intrinsic in ("e3b", "re3", "none"):
        validate(compose_train(["experiment=minigrid_rlexplore", f"intrinsic={intrinsic}"]))


def test_each_agent_brings_its_own_unroll_and_batch_and_the_command_line_still_wins():
    """T and B live with the loss (conf/agent/): IMPALA's 20 x 4, APPO's PPO sizing 32 x 32; a
    preset's and the command line's values beat the agent's."""
    appo = compose_train(["agent=appo"])
    assert (appo.agent.name, appo.num_steps, appo.batch_size) == ("appo", 32, 32)
    assert (compose_train(["agent=appo", "num_steps=8"]).num_steps, appo.batch_size) == (8, 32)
    cartpole = compose_train(["experiment=cartpole", "agent=appo"])
    assert (cartpole.agent.name, cartpole.num_steps, cartpole.batch_size) == ("appo", 16, 4)


def test_the_command_line_beats_the_experiment_preset():
    cfg = compose_train(["experiment=cartpole", "num_steps=7", "agent.lr=0.001", "train.eval_interval=123"])
    assert (cfg.num_steps, cfg.agent.lr, cfg.train.eval_interval) == (7, 0.001, 123)


def test_another_gymnasium_id_is_an_env_choice_only():
    """env=gym chooses the env and nothing else: the agent's values stay the defaults."""
    cfg = compose_train(["env=gym", "env.id=Acrobot-v1", "model=mlp"])
    validate(cfg)
    defaults = compose_train([])
    assert cfg.agent == defaults.agent and cfg.num_steps == defaults.num_steps
    assert cfg.env.id == "Acrobot-v1"


def test_every_default_lives_in_the_yaml_alone():
    """The dataclasses give types only: every field of every schema is MISSING."""
    import dataclasses

    from distrl.config import schema as config

    schemas = [config.AtariEnvConfig, config.GymEnvConfig, config.AgentConfig, config.ModelConfig,
               config.TrainBlock, config.TrainConfig, config.EvalEnvOverrides, config.EvalConfig,
               config.DistributedConfig, config.AppoConfig]
    for schema in schemas:
        for f in dataclasses.fields(schema):
            assert f.default == "???" and f.default_factory is dataclasses.MISSING, f"{schema.__name__}.{f.name}"


BAD = [
    (["num_actors=0"], "num_actors"),
    (["num_slots=4", "batch_size=8"], "num_slots"),
    (["num_slots=8", "num_actors=2", "envs_per_actor=4"], "num_slots"),
    # measured to hang before they were refused: async halves and partial batches of two learners
    (["num_actors=1", "envs_per_actor=8", "env.async_step=true", "batch_size=8", "num_slots=9"], "num_slots"),
    (["num_actors=1", "envs_per_actor=8", "num_learners=2", "batch_size=8", "num_slots=16"], "num_slots"),
    (["env.id=ALE/NoSuchGame-v5"], "env.id"),
    (["experiment=cartpole", "env.id=NoSuchEnv-v0"], "env.id"),
    (["experiment=cartpole", "env.id=ALE/Pong-v5"], "env.id"),
    (["device=tpu"], "device"),
    (["device=banana:3"], "device"),
    (["train.eval_interval=0"], "train.eval_interval"),
    (["train.save_interval=-5"], "train.save_interval"),
    (["train.log_interval=0"], "train.log_interval"),
    (["train.num_train_steps=0"], "train.num_train_steps"),
    (["num_steps=0"], "num_steps"),
    (["batch_size=0"], "batch_size"),
    (["model=mlp"], "model.encoder"),
    (["experiment=cartpole", "model=nature_cnn"], "model.encoder"),
    (["env=gym"], "model.encoder"),
    (["agent.discount=1.5"], "agent.discount"),
    (["env.async_step=sometimes"], "env.async_step"),
    (["pin_actors=sometimes"], "pin_actors"),
    (["agent.lr=0"], "agent.lr"),
    (["agent.optimizer=sgd"], "agent.optimizer"),
    (["agent.num_epochs=0"], "agent.num_epochs"),
    (["agent.num_minibatches=0"], "agent.num_minibatches"),
    (["batch_size=8", "agent.num_minibatches=3"], "agent.num_minibatches"),  # must divide B
    (["agent.trace_lambda=0"], "agent.trace_lambda"),
    (["agent.trace_lambda=1.5"], "agent.trace_lambda"),
    (["agent=appo", "agent.clip=0"], "agent.clip"),
    (["agent=appo", "agent.value_clip=-0.1"], "agent.value_clip"),
    (["agent=appo", "agent.num_epochs=0"], "agent.num_epochs"),
    (["agent=appo", "batch_size=6"], "agent.num_minibatches"),
    (["agent.entropy_schedule=cosine"], "agent.entropy_schedule"),
    (["agent.entropy_schedule=[]"], "agent.entropy_schedule"),
    (["agent.entropy_schedule=[[3000000,0.01],[2000000,0.002]]"], "agent.entropy_schedule"),  # steps go back
    (["agent.entropy_schedule=[[3000000,-0.01]]"], "agent.entropy_schedule"),
    (["agent.entropy_schedule=[[2500.5,0.01]]"], "agent.entropy_schedule"),
    (["agent.entropy_schedule=[[3000000]]"], "agent.entropy_schedule"),
    (["env=image_cue", "model=mlp"], "model.encoder"),
    (["experiment=cartpole", "env.id=failing_env:FailsOnCreation-v0"], "env.id"),
    (["train.init_model_path=/no/such/file.pt"], "train.init_model_path"),
    (["train.stall_timeout=0"], "train.stall_timeout"),
    (["agent.estimator=td"], "agent.estimator"),
    (["experiment=mujoco", "model.init_fn=zero"], "model.init_fn"),
    (["train.max_actor_restarts=-1"], "train.max_actor_restarts"),
    (["train.max_nonfinite_updates=0"], "train.max_nonfinite_updates"),
    (["train.th_compile=true", "train.compile_mode=fast"], "train.compile_mode"),
    (["train.compile_mode=reduce-overhead"], "train.compile_mode"),  # without th_compile it would do nothing
    (["distributed.nproc_per_node=100000"], "distributed.nproc_per_node"),
    (["distributed.nproc_per_node=2", "num_learners=2"], "num_learners"),
    (["distributed.backend=mpi"], "distributed.backend"),
    (["distributed.backend=nccl", "device=cpu"], "distributed.backend"),
]
if not torch.cuda.is_available():
    BAD.append((["device=cuda"], "device"))


@pytest.mark.parametrize("overrides,key", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_validation_names_the_key(overrides, key):
    with pytest.raises(ConfigError) as info:
        validate(compose_train(overrides))
    assert str(info.value).startswith(f"{key}=")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("override, message", [
    ("num_actors=100000", "num_actors=100000 is not allowed"),
    ("num_slots=100000000", "num_slots=100000000 is not allowed: at most"),
])
def test_impossible_sizes_are_refused(override, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        validate(compose_train(["env=atari", "num_actors=2", "envs_per_actor=2", override]))


def test_slots_larger_than_shared_memory_are_refused():
    with pytest.raises(ConfigError) as info:  # 130,000 Pong slots of T=200: about 2.2 TB
        validate(compose_train(["num_steps=200", "num_slots=130000"]))
    assert str(info.value).startswith("num_slots=130000 is not allowed: the slots need") and "GiB" in str(info.value)


@pytest.mark.parametrize("old, new", sorted(RENAMED.items()))
def test_a_renamed_key_is_refused_with_its_new_name(old, new):
    with pytest.raises(ConfigError) as info:
        compose_or_refuse([f"{old}=1"])
    assert str(info.value) == f"{old} is now {new}: give {new}=VALUE (docs/configuration.md)"
    assert OmegaConf.select(compose_train([f"{new}=1"]), new) in (1, True)  # the new key takes the value


@pytest.mark.parametrize("override, message", [
    ("+foo=1", "foo is not a key of this config"),
    ("+train.num_train_step=2000", "train.num_train_step is not a key of this config (did you mean "
                                   "train.num_train_steps?)"),
    ("+agent.lr_decay=0.5", "agent.lr_decay is not a key"),
    ("+num_storages=12", "num_storages is now num_slots: give num_slots=VALUE"),  # renamed
])
def test_keys_added_with_plus_are_refused(override, message):
    with pytest.raises(ConfigError) as info:
        validate(compose_train(["experiment=cartpole", override]))
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def actor_cores(cfg) -> list:
    return list(plan(cfg).actors.cores)


def test_actors_are_pinned_to_the_cores_this_process_may_use():
    allowed = sorted(os.sched_getaffinity(0))
    many = len(allowed) + 1  # more actors than cores: round-robin
    pinned = actor_cores(compose_train([f"num_actors={many}", "env.async_step=false"]))
    assert pinned == [(allowed[i % len(allowed)],) for i in range(many)]
    # async stepping wants a core for ale-py's env thread: not pinned by default, two cores when asked
    assert actor_cores(compose_train(["num_actors=2", "env.async_step=true"])) == [None, None]
    two = actor_cores(compose_train(["num_actors=1", "env.async_step=true", "pin_actors=true"]))[0]
    assert set(two) <= set(allowed) and len(two) == min(2, len(allowed))
    assert actor_cores(compose_train(["num_actors=2", "pin_actors=false"])) == [None, None]

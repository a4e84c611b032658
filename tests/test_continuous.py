"""Box and MultiDiscrete actions through the whole run: validation, the network, the running
statistics, the actors' discounted returns, a MuJoCo run trained, resumed and evaluated."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import compose_train, metrics, run_distrl, tensorboard_scalars

from distrl.config.schema import ConfigError
from distrl.learning.losses.returns import GAE, NormalizedValues, Stream, VTrace
from distrl.nn.actor_critic import ActorCritic
from distrl.nn.actor_learner import ActorLearner
from distrl.nn.distributions import ActionSpace
from distrl.nn.normalization import RunningMeanStd, normalize_batch, normalize_value_targets, value_statistics
from distrl.runtime.preflight import validate
from distrl.sampling.policy import AgentState, step_policy
from distrl.utils.checkpoint import load_checkpoint

MJ = ["experiment=mujoco", "num_actors=1", "envs_per_actor=8", "num_steps=16", "batch_size=8",
      "agent.num_minibatches=4", "agent.num_epochs=2"]


@pytest.mark.parametrize(("env_id", "what"), [("action_spaces_env:DictObs-v0", "observation space Dict"),
                                              ("action_spaces_env:MultiBinary-v0", "action space MultiBinary")])
def test_a_space_distrl_cannot_model_is_refused_in_one_line_naming_it(env_id, what):
    cfg = compose_train(["env=gym", "model=mlp", f"env.id={env_id}"])
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    message = str(info.value)
    assert message.startswith(f"env.id={env_id!r} is not allowed: {what}") and "\n" not in message


def test_the_preset_takes_any_box_env_and_e3b_is_refused_for_it():
    for env_id in ("Pendulum-v1", "Hopper-v5", "action_spaces_env:BoxTarget-v0"):
        spec = validate(compose_train(["experiment=mujoco", f"env.id={env_id}"])).spec
        assert spec.action_space.kind == "box"
    with pytest.raises(ConfigError, match="intrinsic='e3b' is not allowed: none, rnd or re3 for Box"):
        validate(compose_train(["experiment=mujoco", "intrinsic=e3b"]))


@pytest.mark.parametrize("space", [ActionSpace("box", (), (-1.0, -2.0), (1.0, 2.0)),
                                   ActionSpace("multi_discrete", (3, 4))])
def test_the_previous_action_is_an_input_for_every_kind_and_the_state_keeps_its_shape(space):
    cfg = compose_train(["experiment=mujoco", "model.last_action_reward=true", "model.separate_critic=false"])
    model = ActorCritic((5,), space, cfg.model)
    state = AgentState(model, 3)
    assert state.last_action.shape == (3, *space.action_shape) and state.last_action.dtype == space.action_dtype
    out, _ = step_policy(model, torch.randn(3, 5), state)
    assert out["action"].shape == (3, *space.action_shape) and out["policy_params"].shape == (3, space.param_size)
    state.after_env_step(out["action"], [1.0, 0.5, 0.0], [False, True, False])
    assert torch.equal(state.last_action[1], torch.zeros_like(state.last_action[1]))  # an episode's start
    assert torch.equal(state.last_action[0], out["action"][0].to(state.last_action.dtype))
    params, values, _ = model(torch.randn(4, 3, 5), torch.zeros(4, 3, dtype=torch.bool), (),
                              state.last_action.expand(4, *state.last_action.shape), torch.zeros(4, 3))
    assert params.shape == (4, 3, space.param_size) and values.shape == (4, 3)


def test_running_statistics_merge_batches_as_one_and_reach_the_actor_copy():
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(9, 4, 3, generator=g) * 3 + 1 for _ in range(5)]
    norm = RunningMeanStd((3,))
    for batch in batches:
        norm.update(norm.moments(batch, 1))
    everything = torch.cat([b.reshape(-1, 3) for b in batches]).double()
    torch.testing.assert_close(norm.mean, everything.mean(0), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(norm.var, everything.var(0, correction=0), rtol=1e-4, atol=1e-4)

    cfg = compose_train(["experiment=mujoco"])
    pair = ActorLearner((3,), ActionSpace("box", (), (-1.0,), (1.0,)), cfg.model, return_norm=True)
    pair.share_actor()
    batch = {"obs": torch.randn(5, 2, 3, generator=g) + 4, "discounted_return": torch.randn(5, 2, generator=g) * 10,
             "reward": torch.ones(5, 2)}
    seen = normalize_batch(pair.learner, batch)
    assert pair.learner.obs_norm.count > 8 and pair.actor.obs_norm.count < 1  # not yet published
    expected = 1 / torch.sqrt(pair.learner.return_norm.var + 1e-8)
    torch.testing.assert_close(seen["reward"], torch.full((5, 2), float(expected)))
    pair.publish()
    for actor_b, learner_b in zip(pair.actor.buffers(), pair.learner.buffers(), strict=True):
        assert torch.equal(actor_b, learner_b)


@pytest.mark.long
def test_a_mujoco_run_trains_resumes_and_is_evaluated_with_the_gaussians_mean(tmp_path):
    run = tmp_path / "hopper"
    args = [*MJ, "env.id=Hopper-v5", "train.num_train_steps=2048", "train.eval_interval=2048",
            "train.num_eval_episodes=2", f"hydra.run.dir={run}"]
    assert run_distrl(["train", *args]).returncode == 0
    state = load_checkpoint(run / "checkpoints" / "latest.pt")
    assert state["action_space"]["kind"] == "box" and len(state["action_space"]["low"]) == 3
    steps = state["model"]["obs_norm.count"].item()
    assert steps > 1024 and state["model"]["value_norm.count"].item() > 1024
    assert run_distrl(["train", *args[:-2], "train.num_train_steps=4096", f"hydra.run.dir={run}"]).returncode == 0
    resumed = load_checkpoint(run / "checkpoints" / "latest.pt")
    assert resumed["model"]["obs_norm.count"].item() > steps + 1024  # the statistics went on from the checkpoint
    assert max(r["agent_steps"] for r in metrics(run)) >= 4096
    done = run_distrl(["eval", f"ckpt={run}/checkpoints/latest.pt", "num_episodes=2", f"hydra.run.dir={tmp_path}/e"])
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "e" / "results.json").read_text())
    assert result["deterministic"] is True and len(result["returns"]) == 2
    assert np.isfinite(result["mean_return"])
    # a video renders offscreen (no display here: EGL)
    done = run_distrl(["eval", f"ckpt={run}", "num_episodes=1", "video=true", f"hydra.run.dir={tmp_path}/v"],
                      env={"DISPLAY": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "v" / "video.mp4").stat().st_size > 1000


@pytest.mark.long
@pytest.mark.parametrize(("env_id", "goal"), [("MultiDiscreteCue-v0", 0.9), ("BoxTarget-v0", -0.1)])
def test_the_cue_envs_are_learned(tmp_path, env_id, goal):
    """MultiDiscrete: both parts named (reward 1 per step, random 0.29); Box: the action within about
    0.2 of the target (random play about -1.3 per step with the clip)."""
    run = tmp_path / env_id
    done = run_distrl(["train", *MJ, f"env.id=action_spaces_env:{env_id}", "env.max_episode_steps=null",
                       "train.num_train_steps=60000", "train.eval_interval=60000", "agent.lr=0.001",
                       "model.separate_critic=false", f"hydra.run.dir={run}"], timeout=400,
                      env={"PYTHONPATH": str(Path(__file__).parent)})
    assert done.returncode == 0, done.stderr[-2000:]
    evals = [r["eval/mean_return"] for r in metrics(run) if "eval/mean_return" in r]
    assert evals[-1] / 8 >= goal, evals


def _stream(g: torch.Generator, values: torch.Tensor) -> Stream:
    T, B = values.shape[0] - 1, values.shape[1]
    ended = torch.rand(T, B, generator=g) < 0.1
    truncated = ended & (torch.rand(T, B, generator=g) < 0.5)
    return Stream(torch.randn(T, B, generator=g) * 3, ended & ~truncated, truncated, values[:-1], values[-1],
                  torch.where(truncated, values[:-1] + 1.0, torch.zeros(T, B)))


@pytest.mark.parametrize("estimator", [GAE(0.99, 0.95), VTrace(0.99, trace_lambda=0.95)])
def test_an_estimator_on_normalised_values_gives_the_raw_targets(estimator):
    """agent.normalize_values: the critic's outputs are normalised values; the estimator sees them
    denormalised (advantages and targets in the rewards' units, time-outs bootstrapped in raw units)."""
    g = torch.Generator().manual_seed(0)
    stats = value_statistics()
    stats.update_from(torch.randn(4096, generator=g) * 40 + 120)
    raw_values = torch.randn(9, 4, generator=g) * 40 + 120  # within the clip of +-5 std
    normalised = stats.normalize(raw_values)
    torch.testing.assert_close(stats.denormalize(normalised), raw_values, rtol=1e-5, atol=1e-4)  # a round trip
    log_rhos = torch.randn(8, 4, generator=g) * 0.1
    raw = _stream(g, raw_values)
    on_normalised = raw._replace(values=normalised[:-1], bootstrap_value=normalised[-1],
                                 truncation_values=stats.normalize(raw.truncation_values))
    expected, got = estimator(log_rhos, raw), NormalizedValues(estimator, stats)(log_rhos, on_normalised)
    torch.testing.assert_close(got.advantages, expected.advantages, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(got.targets, expected.targets, rtol=1e-4, atol=1e-3)


def _merged_with_prior(samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and variance (float64) of ``samples`` merged with value_statistics()' prior, one sample of
    mean 0 and variance 1, by Chan et al.'s formula written out."""
    x, n = samples.double().reshape(-1), samples.numel()
    return x.sum() / (1 + n), (1 + x.var(correction=0) * n + x.mean() ** 2 * n / (1 + n)) / (1 + n)


def test_value_targets_update_the_statistics_then_are_normalised_with_them():
    cfg = compose_train(["experiment=mujoco"])
    net = ActorCritic((3,), ActionSpace("box", (), (-1.0,), (1.0,)), cfg.model, value_norm=True)
    g = torch.Generator().manual_seed(1)
    targets = torch.randn(16, 8, 1, generator=g) * 50 + 300
    seen = normalize_value_targets(net, {"value_targets": targets})
    everything = torch.cat([torch.zeros(1), targets.reshape(-1)]).double()  # the prior: one sample of 0 ...
    assert net.value_norm.count.item() == 1 + 16 * 8
    torch.testing.assert_close(net.value_norm.mean, everything.mean())
    torch.testing.assert_close(net.value_norm.var, _merged_with_prior(targets)[1])
    expected = ((targets - net.value_norm.mean.float()) / torch.sqrt(net.value_norm.var.float() + 1e-5)).clamp(-5, 5)
    torch.testing.assert_close(seen["value_targets"], expected)
    plain = ActorCritic((3,), ActionSpace("box", (), (-1.0,), (1.0,)), cfg.model)
    batch = {"value_targets": targets}
    assert normalize_value_targets(plain, batch) is batch and plain.value_norm is None


def test_the_critic_regresses_the_value_targets_normalised_with_the_statistics_they_updated():
    """agent.normalize_values through Learner.update: the first optimizer step's value loss is
    0.5 mean (V - clip((v - mean) / sqrt(var + 1e-5), -5, 5))^2, V the critic's (normalised) outputs and
    v GAE's raw targets on the denormalised values, mean and var the statistics after merging those
    targets (a prior of one sample of mean 0, variance 1). Raw targets of tens to hundreds against outputs near
    0 (40 to 300): a learner that regressed the raw targets would report a loss thousands of times larger."""
    from test_learner import learner_for

    cfg = compose_train(["experiment=mujoco", "model.normalize_obs=false", "agent.value_clip=null",
                         "agent.num_epochs=1", "agent.num_minibatches=1"])
    T, B = 8, 4
    space = ActionSpace("box", (), (-1.0, -1.0), (1.0, 1.0))
    torch.manual_seed(0)
    policy = ActorLearner((3,), space, cfg.model, value_norm=True)
    policy.share_actor()
    learner = learner_for(cfg, policy, steps_per_update=T * B)
    g = torch.Generator().manual_seed(2)
    obs = torch.randn(T + 1, B, 3, generator=g)
    first = torch.zeros(T + 1, B, dtype=torch.bool)
    with torch.no_grad():
        params, values, _ = policy.learner(obs, first)
    never = torch.zeros(T + 1, B, dtype=torch.bool)
    batch = {"obs": obs, "first": first, "action": torch.randn(T + 1, B, 2, generator=g), "policy_params": params,
             "baseline": values, "reward": 40 + 10 * torch.rand(T + 1, B, generator=g), "terminated": never,
             "truncated": never, "truncation_value": torch.zeros(T + 1, B),
             "policy_version": torch.zeros(B, dtype=torch.int64), "env_id": torch.arange(B)}
    raw_values = values.clamp(-5, 5) * math.sqrt(1 + 1e-5)  # the prior's denormalisation: mean 0, var 1
    stream = Stream(batch["reward"][:T], never[:T], never[:T], raw_values[:T], raw_values[T], torch.zeros(T, B))
    targets = GAE(cfg.agent.discount, cfg.agent.trace_lambda)(torch.zeros(T, B), stream).targets.double()
    mean, var = _merged_with_prior(targets)
    normalised = ((targets - mean) / torch.sqrt(var + 1e-5)).clamp(-5, 5).float()
    losses = learner.update(batch)
    assert targets.min() > 40  # raw targets far from the critic's outputs
    assert losses["value"] == pytest.approx((0.5 * (values[:T] - normalised) ** 2).mean().item(), rel=1e-4)
    torch.testing.assert_close(policy.learner.value_norm.mean, mean)


def test_the_observation_clip_is_the_models():
    cfg = compose_train(["experiment=mujoco", "model.obs_clip=5"])
    net = ActorCritic((3,), ActionSpace("box", (), (-1.0,), (1.0,)), cfg.model)
    net.obs_norm.update_from(torch.randn(1000, 3))
    params, _, _ = net(torch.full((1, 1, 3), 100.0), torch.zeros(1, 1, dtype=torch.bool))
    assert net.obs_norm.clip == 5.0 and net.obs_norm.normalize(torch.full((1, 3), 100.0)).max().item() == 5.0


def test_torch_default_keeps_torchs_weights_and_zeroes_every_bias():
    """model.init_fn=torch_default (Sample Factory's policy_initialization=torch_default): the weights
    torch's own initialisation draws (as model.init_fn=default from the same seed), every bias 0."""
    nets = {}
    for init_fn in ("default", "torch_default"):
        cfg = compose_train(["experiment=mujoco", f"model.init_fn={init_fn}"])
        torch.manual_seed(3)
        nets[init_fn] = ActorCritic((11,), ActionSpace("box", (), (-1.0,) * 3, (1.0,) * 3), cfg.model)
    default, zeroed = (dict(nets[k].named_parameters()) for k in ("default", "torch_default"))
    biases = [name for name in zeroed if name.endswith("bias")]
    assert len(biases) == 6  # the actor's and the critic's two layers each, the policy and value heads
    for name, value in zeroed.items():
        if name in biases:
            assert not value.any() and default[name].abs().min() > 0, name
        else:
            torch.testing.assert_close(value, default[name], rtol=0, atol=0)


def test_a_box_action_reaches_the_env_clipped_or_raw_as_env_clip_actions_says():
    """env.clip_actions: the sample clipped to the Box's bounds (CleanRL's ClipAction) or sent as
    sampled (Sample Factory's), in evaluation as in the actors (both call ActionSpace.to_env)."""
    from distrl.envs import clips_actions
    from distrl.runtime.evaluator import evaluate

    envs = {clip: compose_train(["experiment=mujoco", "env.id=Hopper-v4", f"env.clip_actions={clip}"]).env
            for clip in (True, False)}
    assert clips_actions(envs[True]) and not clips_actions(envs[False]) and clips_actions(compose_train([]).env)
    space = ActionSpace("box", (), (-1.0,) * 3, (1.0,) * 3)  # Hopper's 3 controls
    sent = {clip: space.to_env(torch.tensor([[2.5, -0.5, 0.0]]), clips_actions(env)) for clip, env in envs.items()}
    np.testing.assert_array_equal(sent[True], [[1.0, -0.5, 0.0]])
    np.testing.assert_array_equal(sent[False], [[2.5, -0.5, 0.0]])
    # Hopper's control cost (1e-3 sum a^2) sees what was sent: a mean far outside the bounds costs more raw
    net = ActorCritic((11,), space, compose_train(["experiment=mujoco"]).model)
    with torch.no_grad():
        net.policy.bias.fill_(3.0)
        net.policy.weight.zero_()
    returns = {clip: evaluate(net, env, num_episodes=1, seed=0, deterministic=True).returns[0]
               for clip, env in envs.items()}
    assert returns[False] < returns[True]


@pytest.mark.parametrize(("overrides", "line"), [
    (["agent.normalize_values=true", "agent.minibatch=unrolls", "agent.num_minibatches=4"],
     "agent.normalize_values=True is not allowed: true only with agent.minibatch=steps"),
    (["agent.normalize_values=true", "intrinsic=rnd"],
     "agent.normalize_values=True is not allowed: false with intrinsic=rnd"),
    (["train.sync=true", "envs_per_actor=48"],
     "train.sync=True is not allowed: true only with batch_size a multiple of num_actors x envs_per_actor"),
    (["train.sync=true", "envs_per_actor=32", "num_learners=2"], "train.sync=True is not allowed: true only with "
                                                                    "num_learners=1"),
    (["model.obs_clip=0"], "model.obs_clip=0.0 is not allowed: a number > 0"),
])
def test_sample_factorys_parts_refuse_what_they_cannot_do_in_one_line(overrides, line):
    with pytest.raises(ConfigError) as info:
        validate(compose_train(["experiment=mujoco", "num_actors=1", *overrides]))
    assert str(info.value).startswith(line) and "\n" not in str(info.value)


@pytest.mark.long
def test_synchronous_collection_learns_from_the_newest_weights_only(tmp_path):
    """train.sync=true: every rollout acted with the weights of the update before it, so the learner
    reports a policy lag of 0 (read back from TensorBoard); here each env hands in two rollouts a
    batch (2 actors x 2 envs, B=8). The value statistics count every step. How many of the 12
    updates' lags are logged depends on the schedule's ticks (a fast machine runs several updates
    a tick; CI logged 2): each one logged is the last batch's, and must be 0."""
    run = tmp_path / "sync"
    done = run_distrl(["train", "experiment=mujoco", "env.id=Pendulum-v1", "num_actors=2", "envs_per_actor=2",
                       "num_steps=16", "batch_size=8", "train.sync=true", "agent.normalize_values=true",
                       "agent.num_minibatches=4", "agent.num_epochs=2", "train.num_train_steps=1536",
                       "train.log_interval=128", "train.num_eval_episodes=0", f"hydra.run.dir={run}"])
    assert done.returncode == 0, done.stderr[-3000:]
    lags = tensorboard_scalars(run, "charts/policy_lag")
    assert lags and all(lag == 0 for lag in lags)
    state = load_checkpoint(run / "checkpoints" / "latest.pt")
    assert state["updates"] == 12 and state["model"]["value_norm.count"].item() == 1 + 12 * 16 * 8

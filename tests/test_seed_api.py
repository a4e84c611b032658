"""The seeds' Python API shapes (distrl/compat/, docs/api.md): rllte's IMPALA / DistributedAgent and
DistributedActorLearner, Hsuanwu's DistributedTrainer(cfgs, train_env, test_env), rlpack's
SimulatorDistributed, and envs passed as objects."""

import functools
import json
import subprocess

import gymnasium as gym
import pytest
import torch
from conftest import DISTRL, metrics

from distrl import IMPALA, DistributedActorLearner, DistributedAgent, DistributedTrainer, SimulatorDistributed
from distrl.compat.env_objects import EnvObjectError
from distrl.config.schema import ConfigError
from distrl.runtime.preflight import compose_config


def short_cartpole(limit: int) -> gym.Env:
    """A picklable env factory (with functools.partial): CartPole cut at ``limit`` steps."""
    return gym.make("CartPole-v1", max_episode_steps=limit)


SMALL = {"num_actors": 1, "num_learners": 1}


def test_rllte_arguments_map_to_distrl_keys_with_their_units():
    agent = IMPALA(env=gym.make_vec("CartPole-v1", num_envs=4), tag="seed", seed=7, num_steps=10, num_actors=1,
                   num_learners=2, num_storages=30, batch_size=2, feature_dim=32, hidden_dim=48, lr=0.002, eps=0.01,
                   ent_coef=0.02, baseline_coef=0.25, max_grad_norm=40.0, discount=0.95, init_fn="identity")
    cfg = agent.cfg
    sizes = (cfg.seed, cfg.tag, cfg.num_steps, cfg.num_actors, cfg.num_learners, cfg.num_slots)
    assert sizes == (7, "seed", 10, 1, 2, 30)
    assert (cfg.batch_size, cfg.envs_per_actor, cfg.model.feature_dim, cfg.model.hidden_dim) == (2, 4, 32, 48)
    assert (cfg.model.encoder, cfg.model.init_fn, cfg.env.id) == ("mlp", "default", "CartPole-v1")
    agent_cfg = cfg.agent
    costs = (agent_cfg.lr, agent_cfg.entropy_cost, agent_cfg.baseline_cost, agent_cfg.discount)
    assert costs == (0.002, 0.02, 0.25, 0.95)
    # rllte sums the loss over the T x B = 20 steps of a batch; distrl averages: eps and the clip scale by 1/20
    assert agent_cfg.eps == pytest.approx(0.01 / 20) and agent_cfg.max_grad_norm == pytest.approx(2.0)
    assert json.loads(cfg.env.spec)["id"] == "CartPole-v1"

    pretraining = DistributedAgent("CartPole-v1", pretraining=True, overrides=["intrinsic=rnd"])
    assert pretraining.cfg.train.pretraining and pretraining.cfg.intrinsic.name == "rnd"
    with pytest.raises(ConfigError, match="train.pretraining"):
        DistributedAgent("CartPole-v1", pretraining=True)
    defaults = DistributedAgent("CartPole-v1")  # unset sizes: distrl's own (auto), not rllte's 45 actors
    assert (defaults.cfg.num_actors, defaults.cfg.num_slots, defaults.cfg.num_steps) == ("auto", "auto", 16)
    # the seeds' IMPALA trains IMPALA's loss with IMPALA's own values, also where the env's preset
    # trains another agent (MiniGrid: APPO at its own lr)
    impala_on_minigrid, impala = IMPALA("MiniGrid-DoorKey-5x5-v0").cfg, compose_config(["agent=impala"])
    assert impala_on_minigrid.agent == impala.agent
    assert (impala_on_minigrid.num_steps, impala_on_minigrid.batch_size) == (impala.num_steps, impala.batch_size)
    minigrid = compose_config(["experiment=minigrid"]).agent
    appo = compose_config([]).agent
    assert minigrid.name == "appo"
    assert (minigrid.lr, minigrid.normalize_advantages, minigrid.entropy_cost) == (2.5e-4, False, 1e-3)
    assert (appo.lr, appo.normalize_advantages, appo.entropy_cost) == (2.5e-4, True, 0.01)
    assert IMPALA("MiniGrid-DoorKey-5x5-v0", overrides=["agent=appo"]).cfg.agent.name == "appo"


@pytest.mark.parametrize("call, error, match", [
    (lambda: IMPALA("CartPole-v1", learning_rate=0.1), TypeError, "learning_rate"),
    (lambda: IMPALA("CartPole-v1", batch_size=0), ConfigError, "batch_size=0"),
    (lambda: IMPALA("CartPole-v1", init_fn="kaiming"), ConfigError, "init_fn='kaiming'"),
    (lambda: IMPALA(lambda: gym.make("CartPole-v1")), EnvObjectError, "cannot be pickled"),
    (lambda: IMPALA(gym.make("CartPole-v1").unwrapped.__class__()), EnvObjectError, "has no spec"),
    (lambda: IMPALA(gym.wrappers.ClipReward(gym.make("ALE/Pong-v5"), -1, 1)), EnvObjectError, "ALE env with wrappers"),
    (lambda: IMPALA(42), EnvObjectError, "pass a Gymnasium id"),
    (lambda: SimulatorDistributed(2, {"env": "CartPole-v1"}, backend="mpi"), ConfigError, "backend='mpi'"),
    (lambda: SimulatorDistributed(0, {"env": "CartPole-v1"}), ConfigError, "n_procs=0"),
])
def test_what_distrl_cannot_do_is_refused_before_any_process_starts(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_an_actor_loop_override_is_refused():
    class OwnActors(IMPALA):
        def run(self, env, actor_idx):
            pass

    with pytest.raises(TypeError, match="overrides run"):
        OwnActors("CartPole-v1")


class Regularised(IMPALA):
    """Overrides both extension points: ``loss`` adds an L2 term, ``update`` counts and reports it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.updates_seen = 0
        self.l2_terms = 0

    def loss(self, batch, entropy_cost, intrinsic_coef=0.0):
        total, *rest = super().loss(batch, entropy_cost, intrinsic_coef)
        self.l2_terms += 1
        l2 = sum(p.pow(2).sum() for p in self.policy.learner.parameters())
        return (total + 1e-4 * l2, *rest)

    def update(self, batch):
        self.updates_seen += 1
        metrics = super().update(batch)
        metrics["l2_terms"] = float(self.l2_terms)
        return metrics


@pytest.mark.long
def test_a_subclass_update_and_loss_train_in_the_learner_and_envs_are_rebuilt_in_the_actors(tmp_path, monkeypatch):
    """rllte's script shape end to end: a factory env cut at 20 steps (rebuilt in the actor
    process), an eval env made by gymnasium.make and cut at 9, the overrides in the learner."""
    monkeypatch.chdir(tmp_path)
    agent = Regularised(env=functools.partial(short_cartpole, 20), tag="sub", **SMALL,
                        eval_env=gym.make("CartPole-v1", max_episode_steps=9))
    counters = agent.train(num_train_steps=3000, eval_interval=100, num_eval_episodes=3)
    assert counters["agent_steps"] >= 3000 and agent.updates_seen == counters["updates"] > 0
    assert agent.l2_terms == agent.updates_seen  # one optimizer step an update
    records = metrics(agent.run_dir)
    lengths = [r["charts/episodic_length"] for r in records if "charts/episodic_length" in r]
    assert lengths and max(lengths) <= 20
    assert any(r.get("losses/l2_terms", 0) > 0 for r in records)
    assert agent.run_dir.name.endswith("_sub")
    result = agent.eval(num_eval_episodes=4)
    assert len(result["returns"]) == len(result["lengths"]) == 4 and max(result["lengths"]) <= 9
    assert result["episode_rewards"] == pytest.approx(sum(result["returns"]) / 4)

    # the factory is pickled in the run's config: `distrl eval` refuses to unpickle it from a file
    done = subprocess.run([*DISTRL, "eval", f"ckpt={agent.run_dir / 'checkpoints' / 'latest.pt'}"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Python env factory" in done.stderr, done.stderr[-2000:]


@pytest.mark.long
def test_hsuanwu_cfgs_from_hydras_own_api_with_env_objects(tmp_path, monkeypatch):
    """Hsuanwu's shape: cfgs composed with Hydra's API (nothing of distrl's called first), then
    DistributedTrainer(cfgs, train_env, test_env) positionally; test() and save() give what they say."""
    from hydra import compose, initialize_config_module

    monkeypatch.chdir(tmp_path)
    with initialize_config_module("distrl.conf", version_base="1.3"):
        cfgs = compose("train", overrides=["experiment=cartpole", "num_actors=1", "train.num_train_steps=2000",
                                           "train.num_eval_episodes=0"])
    trainer = DistributedTrainer(cfgs, gym.make("CartPole-v1", max_episode_steps=15),
                                 gym.make("CartPole-v1", max_episode_steps=6))
    assert trainer.run_dir.parts[0] == "outputs" and trainer.cfg.env.spec
    trainer.train()
    result = trainer.test()
    assert len(result.returns) == 10 and max(result.lengths) <= 6
    assert isinstance(result.mean_return, float) and isinstance(result.std_return, float)
    path = trainer.save()
    assert path.is_file() and path.parent == trainer.run_dir / "checkpoints"


class Scaled(torch.nn.Module):
    def forward(self, obs):
        return obs.float() / 255.0


def test_the_seed_shaped_actor_learner():
    space = gym.spaces.Box(0, 255, (4, 84, 84), dtype="uint8")
    pair = DistributedActorLearner(space, gym.spaces.Discrete(6), feature_dim=64, opt_class=torch.optim.RMSprop,
                                   opt_kwargs={"lr": 0.001}, init_fn="identity")
    assert "NatureCNN" in pair.describe() and isinstance(pair.optimizers["opt"], torch.optim.RMSprop)
    encoder = torch.nn.Sequential(Scaled(), torch.nn.Flatten(), torch.nn.Linear(4 * 84 * 84, 64), torch.nn.ReLU())
    pair.freeze(encoder=encoder, dist=torch.distributions.Categorical)
    actions = pair.explore(torch.zeros(2, 4, 84, 84, dtype=torch.uint8))
    assert actions.shape == (2,) and pair.learner.encoder is encoder
    with pytest.raises(ValueError, match="dist=Normal: the action space is 6 actions; use Categorical"):
        pair.freeze(dist=torch.distributions.Normal)
    with pytest.raises(ValueError, match="distrl models Discrete"):
        DistributedActorLearner(space, gym.spaces.MultiBinary(2), feature_dim=64)

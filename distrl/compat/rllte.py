"""rllte's Python API: ``DistributedAgent`` and ``IMPALA`` (a distrl run configured from their
arguments; a subclass's ``update`` and ``loss`` wrap the run's learner: :meth:`DistributedAgent.train`)
and ``DistributedActorLearner`` (:mod:`distrl.compat.actor_learner`), thin layers over distrl's
config and :class:`distrl.runtime.trainer.Trainer`.

Each turns its arguments into distrl config keys (the table is docs/api.md: units, conversions and
what is refused) and trains with :class:`distrl.runtime.trainer.Trainer`; nothing here
trains by itself. Hsuanwu's trainer is :mod:`distrl.compat.hsuanwu`, rlpack's
:mod:`distrl.compat.rlpack`.

Example (rllte's quick start with the import changed)::

    import gymnasium as gym
    from distrl import IMPALA

    if __name__ == "__main__":
        env = gym.make_vec("CartPole-v1", num_envs=4)
        agent = IMPALA(env=env, num_actors=1, num_learners=1, device="cpu")
        agent.train(num_train_steps=50000)
        print(agent.eval(num_eval_episodes=10))
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from distrl.compat.actor_learner import DistributedActorLearner
from distrl.compat.env_objects import env_choice, env_node, writable
from distrl.config.compose import compose
from distrl.config.schema import ConfigError
from distrl.learning.losses import LossTerms
from distrl.runtime.preflight import validate
from distrl.runtime.trainer import Trainer

__all__ = ["DistributedActorLearner", "DistributedAgent", "IMPALA"]

# rllte's keyword arguments (IMPALA's, rllte at ef55dda) -> distrl keys; eps and max_grad_norm are
# converted (rllte sums the loss over the T x B steps of a batch, distrl averages it; docs/api.md)
AGENT_KWARGS = {
    "batch_size": "batch_size",
    "feature_dim": "model.feature_dim",
    "hidden_dim": "model.hidden_dim",
    "use_lstm": "model.use_lstm",
    "lr": "agent.lr",
    "eps": "agent.eps",
    "ent_coef": "agent.entropy_cost",
    "baseline_coef": "agent.baseline_cost",
    "max_grad_norm": "agent.max_grad_norm",
    "discount": "agent.discount",
    "init_fn": "model.init_fn",
    "pretraining": "train.pretraining",  # in the seed's docs of DistributedAgent; needs overrides=["intrinsic=rnd"]
}
INIT_FNS = {"identity": "default", "orthogonal": "orthogonal", "xavier_uniform": "xavier_uniform"}
SUMMED_OVER_STEPS = ("eps", "max_grad_norm")


def hydra_value(value: Any) -> str:
    """A Python value as a Hydra override's right-hand side."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return repr(value)
    return str(value)


class DistributedAgent:
    """rllte's ``DistributedAgent(env, eval_env, tag, seed, device, num_steps, num_actors,
    num_learners, num_storages, **kwargs)``: a distrl run, configured from these arguments.

    Args:
        env: the training env: a Gymnasium id, an env or vector env made by ``gymnasium.make`` /
            ``make_vec`` (a vector env's ``num_envs`` becomes ``envs_per_actor``), or a picklable
            zero-argument function that returns an env.
        eval_env: the evaluation env, likewise; None: the training env's settings.
        tag: appended to the run directory's name, ``outputs/<date>/<time>_<tag>`` (``"default"``:
            no suffix).
        seed: ``seed``.
        device: the learner's device: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``.
        num_steps: the unroll length T; None: distrl's default (20, measured; rllte's is 80).
        num_actors: actor processes; None: ``auto`` (from the cores; rllte's default is 45).
        num_learners: learner threads; None: distrl's default (1; rllte's is 4).
        num_storages: rollout slots (``num_slots``); None: ``auto`` (rllte's default is 60).
        **kwargs: rllte's IMPALA keywords (``batch_size``, ``feature_dim``, ``hidden_dim``,
            ``use_lstm``, ``lr``, ``eps``, ``ent_coef``, ``baseline_coef``, ``max_grad_norm``,
            ``discount``, ``init_fn``; docs/api.md maps each), ``pretraining`` (the seed's
            reward-free training, with an intrinsic reward: ``overrides=["intrinsic=rnd"]``), plus
            ``overrides``: a list of distrl overrides (``["agent.rho_bar=0.9"]``) applied last.

    Raises:
        TypeError: a keyword rllte's IMPALA does not take (named).
        ConfigError: a value distrl refuses (the key and the allowed values), before any process starts.
        EnvObjectError: an env that cannot be rebuilt in the actor processes.

    Extension points: a subclass may override :meth:`update` (one learner update on a batch) and
    :meth:`loss` (the loss of each optimizer step, e.g. to add a term); both run in the learner.
    ``run`` (rllte's actor loop) cannot be overridden: distrl's actors are spawned processes that
    run its own loop (batched envs writing shared-memory slots); an env's behaviour is changed by
    passing a wrapped env or a factory instead (docs/api.md).
    """

    def __init__(self, env: Any, eval_env: Any = None, tag: str = "default", seed: int = 1, device: str = "cpu",
                 num_steps: int | None = None, num_actors: int | None = None, num_learners: int | None = None,
                 num_storages: int | None = None, **kwargs: Any):
        if hasattr(type(self), "run"):  # rllte's actor loop, overridden by a subclass
            raise TypeError(f"{type(self).__name__} overrides run(): distrl's actors run their own loop in spawned "
                            f"processes; wrap the env (or pass an env factory) to change what an actor's env does, "
                            f"and override update() or loss() to change learning (docs/api.md)")
        extra = list(kwargs.pop("overrides", []))
        unknown = sorted(set(kwargs) - set(AGENT_KWARGS))
        if unknown:
            raise TypeError(f"{type(self).__name__}() got keyword argument(s) {', '.join(unknown)} that rllte's IMPALA "
                            f"does not take; distrl's other keys go in overrides=[...] (`distrl train --help`)")
        self._env_choice = env_choice(env)
        # IMPALA's loss whatever the env's preset trains (experiment=minigrid: APPO)
        overrides = [*self._env_choice.overrides, "agent=impala", f"seed={int(seed)}", f"device={device}"]
        if tag and tag != "default":
            overrides.append(f"tag={tag}")
        for key, value in (("num_steps", num_steps), ("num_actors", num_actors), ("num_learners", num_learners),
                           ("num_slots", num_storages)):
            if value is not None:
                overrides.append(f"{key}={hydra_value(value)}")
        self.env, self.eval_env = env, eval_env
        self.kwargs = dict(kwargs)
        self.cfg = self._compose(overrides, extra)
        self.trainer = None
        self.run_dir: Path | None = None

    def _compose(self, overrides: list[str], extra: list[str]) -> DictConfig:
        sizes = [f"batch_size={hydra_value(self.kwargs['batch_size'])}"] if "batch_size" in self.kwargs else []
        cfg = compose([*overrides, *sizes, *extra])  # the T and B the run will have
        steps = max(1, cfg.num_steps * cfg.batch_size)  # (0 is refused by validation below)
        for name, value in self.kwargs.items():
            if name == "init_fn":
                if value not in INIT_FNS:
                    raise ConfigError(f"init_fn={value!r} is not allowed: use one of {', '.join(INIT_FNS)}")
                value = INIT_FNS[value]
            elif name in SUMMED_OVER_STEPS:
                value = float(value) / steps  # rllte's value is for the loss summed over T x B steps
            overrides.append(f"{AGENT_KWARGS[name]}={hydra_value(value)}")
        cfg = compose([*overrides, *extra])
        node, num_envs = env_node(self.env, choice=self._env_choice)
        with writable(cfg):
            cfg.env = node
            if num_envs is not None and not any(o.startswith("envs_per_actor=") for o in extra):
                cfg.envs_per_actor = num_envs
        validate(cfg)
        self.eval_env_cfg = None if self.eval_env is None else env_node(self.eval_env, "eval_env")[0]
        return cfg

    # ------------------------------------------------------------------ rllte's methods
    def train(self, num_train_steps: int, init_model_path: str | None = None, log_interval: int = 1,
              eval_interval: int = 5000, save_interval: int = 5000, num_eval_episodes: int = 10,
              th_compile: bool = False) -> dict[str, Any]:
        """Train for ``num_train_steps`` agent steps (rllte's unit too).

        ``log_interval``: every k-th of distrl's log records (``train.log_interval`` x k agent steps;
        rllte logs every k-th 5-second tick). ``eval_interval`` and ``save_interval`` count unrolls of
        ``num_steps`` (rllte's "episode" counter, which grows by ``batch_size`` a learner update), so
        they become ``x num_steps`` agent steps. ``init_model_path``: a checkpoint, a run directory
        or a file :meth:`DistributedActorLearner.save` wrote.

        Returns:
            The run's counters (``agent_steps``, ``updates``, ...). The run directory is :attr:`run_dir`.

        Raises:
            ConfigError: a value distrl refuses. distrl's training errors
            (:class:`distrl.runtime.trainer.TrainingError`) and KeyboardInterrupt (after a checkpoint).
        """
        cfg = copy.deepcopy(self.cfg)
        for name, value in (("log_interval", log_interval), ("eval_interval", eval_interval),
                            ("save_interval", save_interval)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name}={value!r} is not allowed: an integer >= 1")
        with writable(cfg):
            cfg.train.num_train_steps = int(num_train_steps)
            cfg.train.init_model_path = None if init_model_path is None else str(init_model_path)
            cfg.train.log_interval = cfg.train.log_interval * log_interval
            cfg.train.eval_interval = eval_interval * cfg.num_steps
            cfg.train.save_interval = save_interval * cfg.num_steps
            cfg.train.num_eval_episodes = int(num_eval_episodes)
            cfg.train.th_compile = bool(th_compile)
        validated = validate(cfg)
        self.trainer = Trainer(cfg, self.run_dir, validated=validated, eval_env=self.eval_env_cfg)
        self._wrap(self.trainer.learner)
        self.run_dir = self.trainer.run_dir  # a second train() continues in it (resume=auto)
        self.cfg = cfg
        return self.trainer.train()

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        """One learner update on ``batch`` (a ``[T+1, B]`` dict of tensors, the layout of
        :mod:`distrl.rollout`): IMPALA's (:meth:`distrl.learning.learner.Learner.update`).

        An override runs in the learner thread with the learner's lock held and must return the
        dict this returns (``super().update(batch)``), to which it may add float metrics: they are
        logged as ``losses/<name>``.
        """
        return self._distrl_update(batch)

    def loss(self, batch: dict[str, torch.Tensor], entropy_cost: float,
             intrinsic_coef: float = 0.0) -> tuple[torch.Tensor, ...]:
        """The loss of one optimizer step: ``(total, policy, value, entropy, diagnostics)``, scalar tensors
        (:class:`distrl.learning.losses.LossTerms`, the network's loss of the minibatch:
        :attr:`distrl.learning.step.OptimizerStep.loss_of`). An override may add a term to ``total``, e.g.
        ``total, *rest = super().loss(...); return (total + 1e-4 * l2, *rest)``, and may leave out
        the diagnostics."""
        return self._learner().optimizer_step.loss_of(batch, entropy_cost, intrinsic_coef)

    def _wrap(self, learner) -> None:
        """This agent's :meth:`update` and :meth:`loss` in the run's learner
        (:class:`distrl.learning.learner.Learner`) in place of distrl's: the learner thread's updates
        call :meth:`update`, whose ``super().update(batch)`` is distrl's, bound to that thread's stop;
        every optimizer step's gradient is that of :meth:`loss`
        (:meth:`distrl.learning.step.OptimizerStep.use_loss`)."""
        distrl_update = learner.update

        def update(batch: dict[str, torch.Tensor], stop=None) -> dict[str, Any]:
            self._distrl_update = functools.partial(distrl_update, stop=stop)
            return self.update(batch)

        learner.update = update
        learner.optimizer_step.use_loss(self._user_loss)

    def _user_loss(self, batch: dict[str, torch.Tensor], entropy_cost: float, intrinsic_coef: float) -> LossTerms:
        """The learner's loss: this agent's :meth:`loss`, its 4 or 5 terms as :class:`LossTerms`."""
        return LossTerms(*self.loss(batch, entropy_cost, intrinsic_coef))

    def eval(self, num_eval_episodes: int) -> dict[str, Any]:
        """Play ``num_eval_episodes`` episodes with the current weights on the evaluation env.

        Returns:
            rllte's keys, ``episode_rewards`` and ``episode_lengths`` (the means), and distrl's:
            ``returns`` and ``lengths`` (per episode), ``mean_return`` and ``std_return``.

        Raises:
            RuntimeError: before :meth:`train`.
        """
        if self.trainer is None:
            raise RuntimeError("eval() needs a trained agent: call train() first")
        result = self.trainer.test(int(num_eval_episodes))
        mean_length = float(sum(result.lengths)) / len(result.lengths)
        return {"episode_rewards": result.mean_return, "episode_lengths": mean_length,
                "returns": list(result.returns), "lengths": list(result.lengths),
                "mean_return": result.mean_return, "std_return": result.std_return}

    def _learner(self):
        if self.trainer is None:
            raise RuntimeError("the learner exists once train() has started")
        return self.trainer.learner

    @property
    def policy(self):
        """The ``DistributedActorLearner`` (after :meth:`train`)."""
        return None if self.trainer is None else self.trainer.networks


class IMPALA(DistributedAgent):
    """rllte's ``IMPALA``: the concrete :class:`DistributedAgent` (IMPALA is what distrl trains)."""

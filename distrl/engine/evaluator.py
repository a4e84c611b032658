"""Evaluation episodes with a frozen copy of the policy, on environments of their own.

Returns are the raw, unclipped game score of whole episodes. Episodes run
in parallel in one vector env; each sub-environment plays a quota fixed in
advance, so short episodes are not favoured over long ones.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from omegaconf import DictConfig

from distrl.envs import make_vector_env
from distrl.policy import ActorCritic

MAX_PARALLEL_ENVS = 16


@dataclass
class EvalResult:
    """``returns``/``lengths``: one entry per episode (raw score, agent steps)."""

    returns: list[float]
    lengths: list[int]

    @property
    def mean_return(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std_return(self) -> float:
        return float(np.std(self.returns))


@torch.no_grad()
def evaluate(model: ActorCritic, env_cfg: DictConfig, num_episodes: int, seed: int,
             deterministic: bool = False, stop: Callable[[], bool] = lambda: False) -> EvalResult:
    """Play ``num_episodes`` episodes with a CPU copy of ``model``.

    Args:
        model: the network to evaluate; it is copied, never changed.
        env_cfg: the ``env`` config node.
        num_episodes: episodes to play (>= 1).
        seed: seed of the first evaluation environment.
        deterministic: greedy actions instead of sampling from the policy.
        stop: polled every step; when it returns True the episodes finished so far are returned.
    """
    frozen = copy.deepcopy(model).cpu().eval()
    num_envs = min(num_episodes, MAX_PARALLEL_ENVS)
    quota = np.array([num_episodes // num_envs + (i < num_episodes % num_envs) for i in range(num_envs)])
    env = make_vector_env(env_cfg, num_envs, num_threads=1)
    returns: list[float] = []
    lengths: list[int] = []
    try:
        obs, _ = env.reset(seed=seed)
        first = torch.ones(num_envs, dtype=torch.bool)
        core = frozen.initial_state(num_envs)
        episode_return = np.zeros(num_envs)
        episode_length = np.zeros(num_envs, dtype=np.int64)
        while quota.sum() > 0 and not stop():
            out, core = frozen.act(torch.from_numpy(np.asarray(obs)), first, core, deterministic)
            obs, reward, terminated, truncated, _ = env.step(out["action"].numpy())
            ended = terminated | truncated
            episode_return += reward
            episode_length += 1
            for i in np.flatnonzero(ended):
                if quota[i] > 0:
                    quota[i] -= 1
                    returns.append(float(episode_return[i]))
                    lengths.append(int(episode_length[i]))
            episode_return[ended] = 0.0
            episode_length[ended] = 0
            first = torch.from_numpy(ended)
    finally:
        env.close()
    return EvalResult(returns, lengths)

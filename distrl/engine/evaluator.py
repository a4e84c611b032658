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


def eval_seed(run_seed: int, agent_steps: int) -> int:
    """Seed of the first evaluation env of a run's evaluation at ``agent_steps``: varies with the step,
    and lies apart from the actors' env seeds (:func:`distrl.engine.actor.env_seed`)."""
    return run_seed * 100_003 + 50_000 + agent_steps % 10_000


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
             deterministic: bool = False, stop: Callable[[], bool] = lambda: False,
             device: torch.device | str = "cpu") -> EvalResult:
    """Play ``num_episodes`` episodes with a CPU copy of ``model``.

    Args:
        model: the network to evaluate; it is copied, never changed.
        env_cfg: the ``env`` config node.
        num_episodes: episodes to play (>= 1).
        seed: seed of the first evaluation environment.
        deterministic: greedy actions instead of sampling from the policy.
        stop: polled every step; when it returns True the episodes finished so far are returned.
        device: where the frozen copy runs its forward passes.
    """
    frozen = copy.deepcopy(model).to(device).eval()
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
        last_action = torch.zeros(num_envs, dtype=torch.int64)
        last_reward = torch.zeros(num_envs, dtype=torch.float32)
        while quota.sum() > 0 and not stop():
            obs_t = torch.from_numpy(np.asarray(obs)).to(device)
            out, core = frozen.act(obs_t, first.to(device), core, deterministic,
                                   last_action.to(device), last_reward.to(device))
            last_action = out["action"].cpu()
            obs, reward, terminated, truncated, _ = env.step(last_action.numpy())
            last_reward = torch.as_tensor(reward, dtype=torch.float32)
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


@torch.no_grad()
def record_episodes(model: ActorCritic, env_cfg: DictConfig, num_episodes: int, seed: int, video_path: str,
                    fps: int = 30, deterministic: bool = False, device: torch.device | str = "cpu") -> EvalResult:
    """Play ``num_episodes`` episodes one after another on one rendering env and write them,
    frame by frame (one frame per agent step), to the MP4 file ``video_path``.

    The env is preprocessed as in training (for Atari through Gymnasium's wrappers),
    so the scores are comparable to :func:`evaluate`'s.
    """
    import imageio.v2 as imageio

    from distrl.envs import make_render_env

    frozen = copy.deepcopy(model).to(device).eval()
    env = make_render_env(env_cfg)
    returns: list[float] = []
    lengths: list[int] = []
    writer = imageio.get_writer(video_path, fps=fps, codec="libx264", macro_block_size=1)
    try:
        for episode in range(num_episodes):
            obs, _ = env.reset(seed=seed + episode)
            core = frozen.initial_state(1)
            first = torch.ones(1, dtype=torch.bool)
            writer.append_data(env.render())
            total, length, ended = 0.0, 0, False
            last_action = torch.zeros(1, dtype=torch.int64)
            last_reward = torch.zeros(1, dtype=torch.float32)
            while not ended:
                obs_t = torch.from_numpy(np.asarray(obs)).unsqueeze(0).to(device)
                out, core = frozen.act(obs_t, first.to(device), core, deterministic,
                                       last_action.to(device), last_reward.to(device))
                last_action = out["action"].cpu()
                obs, reward, terminated, truncated, _ = env.step(int(last_action[0]))
                last_reward = torch.tensor([float(reward)])
                writer.append_data(env.render())
                total += float(reward)
                length += 1
                ended = terminated or truncated
                first = torch.zeros(1, dtype=torch.bool)
            returns.append(total)
            lengths.append(length)
    finally:
        writer.close()
        env.close()
    return EvalResult(returns, lengths)

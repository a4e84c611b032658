"""Evaluation: episodes with a frozen copy of the policy, on environments of their own, and the
evaluations a training run makes in the background.

Returns are the raw, unclipped game score of whole episodes. Episodes run
in parallel in one vector env; each sub-environment plays a quota fixed in
advance, so short episodes are not favoured over long ones.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from omegaconf import DictConfig

from distrl.envs import clips_actions, eval_seed, make_render_env, make_vector_env
from distrl.nn.actor_critic import ActorCritic
from distrl.nn.precision import cast_matmul_weights
from distrl.sampling.policy import AgentState, step_policy

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


def inference_copy(model: ActorCritic, device: torch.device | str, precision: str) -> ActorCritic:
    """A copy of ``model`` on ``device`` in eval mode, with its matrix products' weights in bf16 for
    ``bf16`` (:func:`distrl.nn.precision.cast_matmul_weights`: what autocast computes, cast once)."""
    frozen = copy.deepcopy(model).to(device).eval()
    cast_matmul_weights(frozen, torch.bfloat16 if precision == "bf16" else torch.float32)
    return frozen


@torch.no_grad()
def evaluate(model: ActorCritic, env_cfg: DictConfig, num_episodes: int, seed: int,
             deterministic: bool = False, stop: Callable[[], bool] = lambda: False,
             device: torch.device | str = "cpu", precision: str = "fp32") -> EvalResult:
    """Play ``num_episodes`` episodes with a CPU copy of ``model``.

    Args:
        model: the network to evaluate; it is copied, never changed.
        env_cfg: the ``env`` config node.
        num_episodes: episodes to play (>= 1).
        seed: seed of the first evaluation environment.
        deterministic: greedy actions instead of sampling from the policy.
        stop: polled every step; when it returns True the episodes finished so far are returned.
        device: where the frozen copy runs its forward passes.
        precision: ``fp32`` or ``bf16`` (:func:`distrl.nn.precision.autocast`).
    """
    frozen = inference_copy(model, device, precision)
    num_envs = min(num_episodes, MAX_PARALLEL_ENVS)
    quota = np.array([num_episodes // num_envs + (i < num_episodes % num_envs) for i in range(num_envs)])
    env = make_vector_env(env_cfg, num_envs, num_threads=1)
    clip = clips_actions(env_cfg)
    returns: list[float] = []
    lengths: list[int] = []
    try:
        obs, _ = env.reset(seed=seed)
        state = AgentState(frozen, num_envs)
        episode_return = np.zeros(num_envs)
        episode_length = np.zeros(num_envs, dtype=np.int64)
        while quota.sum() > 0 and not stop():
            out, _ = step_policy(frozen, torch.from_numpy(np.asarray(obs)), state, deterministic=deterministic,
                                 precision=precision)
            obs, reward, terminated, truncated, _ = env.step(frozen.action_space.to_env(out["action"], clip))
            ended = terminated | truncated
            state.after_env_step(out["action"], reward, ended)
            episode_return += reward
            episode_length += 1
            for i in np.flatnonzero(ended):
                if quota[i] > 0:
                    quota[i] -= 1
                    returns.append(float(episode_return[i]))
                    lengths.append(int(episode_length[i]))
            episode_return[ended] = 0.0
            episode_length[ended] = 0
    finally:
        env.close()
    return EvalResult(returns, lengths)


@torch.no_grad()
def record_episodes(model: ActorCritic, env_cfg: DictConfig, num_episodes: int, seed: int, video_path: str,
                    fps: int = 30, deterministic: bool = False, device: torch.device | str = "cpu",
                    precision: str = "fp32") -> EvalResult:
    """Play ``num_episodes`` episodes one after another on one rendering env and write them,
    frame by frame (one frame per agent step), to the MP4 file ``video_path``.

    The env is preprocessed as in training (for Atari through Gymnasium's wrappers),
    so the scores are comparable to :func:`evaluate`'s.
    """
    import imageio.v2 as imageio

    frozen = inference_copy(model, device, precision)
    env = make_render_env(env_cfg)
    clip = clips_actions(env_cfg)
    returns: list[float] = []
    lengths: list[int] = []
    writer = imageio.get_writer(video_path, fps=fps, codec="libx264", macro_block_size=1)
    try:
        for episode in range(num_episodes):
            obs, _ = env.reset(seed=seed + episode)
            state = AgentState(frozen, 1)
            writer.append_data(env.render())
            total, length, ended = 0.0, 0, False
            while not ended:
                out, _ = step_policy(frozen, torch.from_numpy(np.asarray(obs)).unsqueeze(0), state,
                                     deterministic=deterministic, precision=precision)
                obs, reward, terminated, truncated, _ = env.step(frozen.action_space.to_env(out["action"], clip)[0])
                ended = terminated or truncated
                state.after_env_step(out["action"], [reward], [ended])
                writer.append_data(env.render())
                total += float(reward)
                length += 1
            returns.append(total)
            lengths.append(length)
    finally:
        writer.close()
        env.close()
    return EvalResult(returns, lengths)


class Evaluations:
    """The evaluations of a training run: one at a time, in a background thread, on the weights of
    a snapshot, with envs and seeds of their own (:func:`distrl.envs.eval_seed`).

    Args:
        model: a network of the run's shape (copied; its weights are replaced by each snapshot's).
        env_cfg: the ``env`` config node.
        num_episodes: episodes per evaluation.
        run_seed: the run's ``seed``.
        precision: the arithmetic of the evaluation's forward passes (the actors').
        deterministic: act with the policy's mode (``train.eval_deterministic``), not a sample.
    """

    def __init__(self, model: ActorCritic, env_cfg: DictConfig, num_episodes: int, run_seed: int,
                 precision: str = "fp32", deterministic: bool = False):
        self.precision = precision
        self.deterministic = deterministic
        self.template = copy.deepcopy(model).cpu()
        self.env_cfg = env_cfg
        self.num_episodes = num_episodes
        self.run_seed = run_seed
        self.stopping = False
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="distrl-eval")
        self.running: Future | None = None
        self.step = 0

    def start(self, snapshot: dict, step: int) -> None:
        """Evaluate the weights of ``snapshot`` (a checkpoint's state, taken at ``step`` agent steps)."""
        self.step = step
        self.running = self.pool.submit(self.run, snapshot, step)

    @property
    def busy(self) -> bool:
        return self.running is not None

    def finished(self, wait: bool = False) -> tuple[EvalResult, dict, int] | None:
        """The result, snapshot and step of the evaluation started last if it is done (or, with
        ``wait``, once it is), else None."""
        if self.running is None or not (wait or self.running.done()):
            return None
        result, snapshot = self.running.result()
        self.running = None
        return result, snapshot, self.step

    def run(self, snapshot: dict, step: int) -> tuple[EvalResult, dict]:
        """Evaluate the weights of ``snapshot`` now, in this thread; :meth:`stop` ends it early."""
        model = copy.deepcopy(self.template)
        model.load_state_dict(snapshot["model"])
        result = evaluate(model, self.env_cfg, self.num_episodes, eval_seed(self.run_seed, step),
                          self.deterministic, stop=lambda: self.stopping, precision=self.precision)
        return result, snapshot

    def stop(self) -> None:
        """End the running evaluation early and wait for its thread."""
        self.stopping = True
        self.pool.shutdown(wait=True)
        self.stopping = False

"""Where E3B's bonus scale comes from: one episode's bonuses under a checkpoint's embedding.

    python scripts/e3b_bonuses.py outputs/<run>[/checkpoints/step_N.pt] [--seed 123] [--steps 5000] \
        [--coef C --clip X]

Plays one episode of the checkpoint's own env with uniform random actions, computes each
observation's elliptical bonus ``b = phi(x)^T C^-1 phi(x)`` as the actors do
(:class:`distrl.intrinsic.e3b.EllipticalBonus`, with the checkpoint's ``phi`` and ``intrinsic.ridge``),
and prints one JSON line: the episode's length, the first observation's bonus (``|phi|^2 / ridge``,
never paid: the step that led to it ended the previous episode), the first 10 bonuses paid, the
median, 99th percentile and maximum after step 50, the share of the sum of squared bonuses in the
first 10 and 50 paid steps, and the std and mean of the paid bonuses: what the running std of
``intrinsic.normalize=rewards`` sees, against ``charts/intrinsic_reward_raw`` in TensorBoard.
Then what each step is paid, ``coef * min(b / sigma, clip)`` with ``sigma`` the checkpoint's running
std (``coef`` and ``clip`` the run's ``intrinsic.coef`` and ``intrinsic.clip`` unless given): its
median and 99th percentile after step 50 and its sum over the first 10 paid steps and over the rest.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from omegaconf import DictConfig

from distrl import runs
from distrl.envs import make_render_env
from distrl.intrinsic import E3B, make_intrinsic


def episode_bonuses(path: str, seed: int, max_steps: int) -> tuple[np.ndarray, float, DictConfig]:
    """The bonus of each observation of one random-action episode (or ``max_steps``), ``[n]`` float;
    the checkpoint's running std of the paid bonuses; its ``intrinsic`` config."""
    _, cfg, state = runs.load_policy(path)
    env = make_render_env(cfg.env)
    obs, _ = env.reset(seed=seed)
    module = make_intrinsic(tuple(obs.shape), cfg.intrinsic, num_envs=1, num_actions=int(env.action_space.n))
    if not isinstance(module, E3B):
        raise SystemExit(f"{path}: intrinsic.name is {cfg.intrinsic.name}, not e3b")
    module.load_checkpoint_state(state["intrinsic"])
    module.publish()
    bonus = module.actor_bonus.start(1)
    rng = np.random.default_rng(seed)
    out = []
    for step in range(max_steps):
        out.append(bonus(torch.as_tensor(obs)[None], torch.tensor([step == 0]), torch.tensor([0])).item())
        obs, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
        if terminated or truncated:
            break
    env.close()
    return np.asarray(out), float(module.reward_rms.std), cfg.intrinsic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ckpt", help="a checkpoint file, or a run directory (its checkpoints/latest.pt)")
    parser.add_argument("--seed", type=int, default=123, help="the env's reset seed and the actions' seed")
    parser.add_argument("--steps", type=int, default=5000, help="at most this many steps")
    parser.add_argument("--coef", type=float, default=None, help="the weight paid (default: the run's intrinsic.coef)")
    parser.add_argument("--clip", type=float, default=None, help="the clip on b / sigma (default: the run's)")
    args = parser.parse_args()
    b, sigma, intrinsic = episode_bonuses(args.ckpt, args.seed, args.steps)
    coef = intrinsic.coef if args.coef is None else args.coef
    clip = intrinsic.clip if args.clip is None else args.clip
    paid_out = coef * np.minimum(b[1:] / max(sigma, 1e-8), np.inf if clip is None else clip)
    paid = b[1:]
    squares = paid**2
    later = paid[50:] if len(paid) > 50 else paid
    print(json.dumps({
        "episode_steps": len(b), "first_bonus": round(float(b[0]), 4),
        "paid_first_10": [round(float(x), 4) for x in paid[:10]],
        "after_50": {"median": float(np.median(later)), "p99": float(np.quantile(later, 0.99)),
                     "max": float(later.max())},
        "square_share_first_10": float(squares[:10].sum() / squares.sum()),
        "square_share_first_50": float(squares[:50].sum() / squares.sum()),
        "std": float(paid.std()), "mean": float(paid.mean()),
        "running_std": sigma, "coef": coef, "clip": clip,
        "paid_after_50": {"median": float(np.median(paid_out[50:] if len(paid_out) > 50 else paid_out)),
                          "p99": float(np.quantile(paid_out[50:] if len(paid_out) > 50 else paid_out, 0.99))},
        "paid_sum": {"first_10": float(paid_out[:10].sum()), "rest": float(paid_out[10:].sum())},
    }))


if __name__ == "__main__":
    main()

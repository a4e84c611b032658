"""Where E3B's bonus scale comes from: one episode's bonuses under a checkpoint's embedding.

    python scripts/e3b_bonuses.py outputs/<run>[/checkpoints/step_N.pt] [--seed 123] [--steps 5000]

Plays one episode of the checkpoint's own env with uniform random actions, computes each
observation's elliptical bonus ``b = phi(x)^T C^-1 phi(x)`` as the actors do
(:class:`distrl.intrinsic.e3b.EllipticalBonus`, with the checkpoint's ``phi`` and ``intrinsic.ridge``),
and prints one JSON line: the episode's length, the first observation's bonus (``|phi|^2 / ridge``,
never paid: the step that led to it ended the previous episode), the first 10 bonuses paid, the
median, 99th percentile and maximum after step 50, the share of the sum of squared bonuses in the
first 10 and 50 paid steps, and the std and mean of the paid bonuses: what the running std of
``intrinsic.normalize=rewards`` sees, against ``charts/intrinsic_reward_raw`` in TensorBoard.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from distrl import runs
from distrl.envs import make_render_env
from distrl.intrinsic import E3B, make_intrinsic


def episode_bonuses(path: str, seed: int, max_steps: int) -> np.ndarray:
    """``[n]`` float: the bonus of each observation of one random-action episode (or ``max_steps``)."""
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
    return np.asarray(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ckpt", help="a checkpoint file, or a run directory (its checkpoints/latest.pt)")
    parser.add_argument("--seed", type=int, default=123, help="the env's reset seed and the actions' seed")
    parser.add_argument("--steps", type=int, default=5000, help="at most this many steps")
    args = parser.parse_args()
    b = episode_bonuses(args.ckpt, args.seed, args.steps)
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
    }))


if __name__ == "__main__":
    main()

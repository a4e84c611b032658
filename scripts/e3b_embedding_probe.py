"""E3B's bonus profile under an embedding trained offline, without a run: does the embedding's last
layer (linear, as distrl's was, or a ReLU, as E3B's and RLeXplore's) change how much of an
episode's bonus its first steps hold?

    python scripts/e3b_embedding_probe.py [--env MiniGrid-DoorKey-16x16-v0] [--updates 300 1000]

Plays 12 episodes of the env with uniform random actions, trains E3B's embedding (distrl's,
:func:`distrl.intrinsic.e3b.embedding_net`, with or without its final ReLU) and inverse dynamics on
their transitions (Adam at 1e-4, 1,024 transitions a step, as ``intrinsic.lr``), and after each
count of updates plays 3 more random episodes through :class:`distrl.intrinsic.e3b.EllipticalBonus`
(ridge 0.1). Prints one JSON line per embedding and count: the first observation's bonus, the first
10 paid, the median and 99th percentile after step 50, the share of the squared bonus in the first
10 paid steps, the std of the paid bonuses, and the median after step 50 over that std (what a step
there is paid, in units of the normaliser).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from distrl.config.compose import compose
from distrl.envs import gym_env
from distrl.intrinsic.base import orthogonal_init
from distrl.intrinsic.e3b import EllipticalBonus, embedding_net


def random_episode(env, rng: np.random.Generator, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Observations ``[n, *obs_shape] uint8`` and the actions taken from the first ``n - 1``."""
    obs, _ = env.reset(seed=seed)
    observations, actions = [obs], []
    while True:
        action = int(rng.integers(env.action_space.n))
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            return np.stack(observations), np.array(actions[: len(observations) - 1])
        actions.append(action)
        observations.append(obs)


def profile(encoder: nn.Module, dim: int, episodes: list[np.ndarray], ridge: float = 0.1) -> dict:
    rows = []
    for observations in episodes:
        bonus = EllipticalBonus(encoder, dim, 1, ridge, True, False)
        rows.append(np.array([bonus(torch.as_tensor(x)[None], torch.tensor([t == 0]), torch.tensor([0])).item()
                              for t, x in enumerate(observations)]))
    paid = np.concatenate([r[1:] for r in rows])
    later = np.concatenate([r[51:] for r in rows])
    return {"first_bonus": round(float(rows[0][0]), 2), "paid_first_10": [round(float(x), 3) for x in rows[0][1:11]],
            "after_50": {"median": float(np.median(later)), "p99": float(np.quantile(later, 0.99))},
            "square_share_first_10": float(np.mean([(r[1:11] ** 2).sum() / (r[1:] ** 2).sum() for r in rows])),
            "std": float(paid.std()), "median_after_50_over_std": float(np.median(later) / paid.std())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="MiniGrid-DoorKey-16x16-v0")
    parser.add_argument("--updates", type=int, nargs="+", default=[300, 1000])
    args = parser.parse_args()
    env = gym_env.make_single_env(compose(["experiment=minigrid", f"env.id={args.env}"]).env)
    rng = np.random.default_rng(0)
    train = [random_episode(env, rng, seed) for seed in range(12)]
    test = [random_episode(env, rng, 100 + seed)[0] for seed in range(3)]
    current = torch.as_tensor(np.concatenate([o[:-1] for o, _ in train]))
    following = torch.as_tensor(np.concatenate([o[1:] for o, _ in train]))
    actions = torch.as_tensor(np.concatenate([a for _, a in train]))
    obs_shape, dim, num_actions = tuple(current.shape[1:]), 128, int(env.action_space.n)
    for last in ("linear", "relu"):
        torch.manual_seed(0)
        encoder = embedding_net(obs_shape, dim)
        if last == "linear":
            encoder = encoder[:-1]
        inverse = nn.Sequential(nn.Linear(2 * dim, 256), nn.ReLU(), nn.Linear(256, num_actions))
        orthogonal_init(encoder), orthogonal_init(inverse)
        optimizer = torch.optim.Adam([*encoder.parameters(), *inverse.parameters()], lr=1e-4)
        for update in range(1, max(args.updates) + 1):
            i = torch.randint(len(current), (1024,))
            phi = encoder(torch.cat([current[i], following[i]]).float() / 255.0)
            loss = F.cross_entropy(inverse(torch.cat([phi[:1024], phi[1024:]], dim=-1)), actions[i])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if update in args.updates:
                with torch.no_grad():
                    print(json.dumps({"embedding_ends": last, "updates": update, "loss": round(loss.item(), 3),
                                      **profile(encoder.eval(), dim, test)}), flush=True)
                encoder.train()


if __name__ == "__main__":
    main()

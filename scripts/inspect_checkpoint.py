"""What a checkpoint's network sees and how its optimizer moves it, layer by layer.

    python scripts/inspect_checkpoint.py outputs/<run>/checkpoints/latest.pt [--steps 100]

Prints one JSON line per layer:

- ReLU layers of the encoder, on observations of the checkpoint's own env (8 envs,
  ``--steps`` random-action steps each): ``dead``, the share of units (channels
  for convolutions) that output 0 on every observation, and ``feature_std``, the
  mean over units of their standard deviation across observations. A network
  whose first layer is dead does not see the game.
- Parameters: ``rms_grad``, the median of the optimizer's running RMS of the
  gradient per weight (RMSProp's sqrt(square_avg); Adam's bias-corrected
  sqrt(exp_avg_sq)), ``below_eps``, the share of weights where that RMS is below
  ``agent.eps``, and ``step_scale``, the mean of ``rms / (rms + eps)``: 1 is a
  normalised step, 0.1 a step damped 10x by eps.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from omegaconf import OmegaConf

from distrl.checkpoint import load_checkpoint
from distrl.envs import make_vector_env
from distrl.policy import ActorCritic


def relu_activity(model: ActorCritic, obs: torch.Tensor) -> list[dict]:
    """``dead`` and ``feature_std`` of every ReLU of the encoder on ``obs [N, *obs_shape]``."""
    outputs: dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_hook(lambda _m, _i, out, name=name: outputs.__setitem__(name, out))
             for name, m in model.encoder.named_modules() if isinstance(m, torch.nn.ReLU)]
    with torch.no_grad():
        model.encoder(obs)
    for hook in hooks:
        hook.remove()
    rows = []
    for name, out in outputs.items():
        per_unit = out.transpose(0, 1).flatten(1) if out.dim() == 4 else out.T  # [units, N x positions]
        rows.append({"layer": f"encoder.{name}", "units": per_unit.shape[0],
                     "dead": round((per_unit.amax(dim=1) <= 0).float().mean().item(), 3),
                     "feature_std": round(out.std(0).mean().item(), 5)})
    return rows


def optimizer_scale(state: dict) -> list[dict]:
    """``rms_grad``, ``below_eps`` and ``step_scale`` of every parameter with optimizer state."""
    eps = state["config"]["agent"]["eps"]
    rows = []
    for index, name in enumerate(state["model"]):
        moments = state["optimizer"]["state"].get(index)
        if not moments:
            continue
        if "square_avg" in moments:
            rms = moments["square_avg"].sqrt()
        else:
            beta2 = state["optimizer"]["param_groups"][0]["betas"][1]
            rms = (moments["exp_avg_sq"] / (1 - beta2 ** float(moments["step"]))).sqrt()
        rows.append({"param": name, "numel": rms.numel(), "rms_grad": float(f"{rms.median().item():.3g}"),
                     "below_eps": round((rms < eps).float().mean().item(), 3),
                     "step_scale": round((rms / (rms + eps)).mean().item(), 3)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ckpt", help="a distrl checkpoint (.pt)")
    parser.add_argument("--steps", type=int, default=100, help="random-action steps of each of 8 envs")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    state = load_checkpoint(args.ckpt)
    cfg = OmegaConf.create(state["config"])
    model = ActorCritic(tuple(state["obs_shape"]), state["num_actions"], cfg.model)
    model.load_state_dict(state["model"])
    model.eval()
    env = make_vector_env(cfg.env, 8)
    rng = np.random.default_rng(args.seed)
    try:
        env.reset(seed=args.seed)
        frames = []
        for _ in range(args.steps):
            obs, *_ = env.step(rng.integers(0, state["num_actions"], 8))
            frames.append(np.asarray(obs).copy())
    finally:
        env.close()
    obs = torch.from_numpy(np.concatenate(frames))
    print(json.dumps({"ckpt": args.ckpt, "agent_steps": state["agent_steps"], "observations": len(obs)}))
    for row in relu_activity(model, obs) + optimizer_scale(state):
        print(json.dumps(row))


if __name__ == "__main__":
    main()

"""What a checkpoint's network sees and how its optimizer moves it, layer by layer.

    python scripts/inspect_checkpoint.py outputs/<run>/checkpoints/latest.pt [--steps 100] [--actions policy]

Observations come from the checkpoint's own env: 8 envs, ``--steps`` steps each, with
random actions or (``--actions policy``) actions sampled from the checkpoint's policy.
Prints one JSON line for the policy, then one per layer:

- The policy on those observations: ``entropy`` (mean, nats), ``entropy_of_max`` (that
  mean over ln(actions): 1 is uniform), and ``max_prob`` (mean, 10th, 50th and 90th
  percentiles of the probability of the most likely action; 1 / actions is uniform).
  A policy near uniform plays much worse with sampled actions than with greedy ones.
- ReLU layers of the encoder: ``dead``, the share of units (channels
  for convolutions) that output 0 on every observation; ``dormant``, the share of
  tau-dormant units (Sokar et al. 2023, tau 0.025: what training logs as ``dormant/``,
  there on a learner's batch; every dead unit is dormant); and ``feature_std``, the
  mean over units of their standard deviation across observations. A network
  whose first layer is dead does not see the game. Both shares depend on the
  observations: a few steps from the envs' reset show few distinct frames (Phoenix
  at 10M, ``--steps 2``: 0.73 of the encoder's output features dormant, where
  training logged 0.15).
- Parameters: ``rms_grad``, the median of the optimizer's running RMS of the
  gradient per weight (RMSProp's sqrt(square_avg); Adam's bias-corrected
  sqrt(exp_avg_sq)), ``below_eps``, the share of weights where that RMS is below
  ``agent.eps``, and ``step_scale``, the mean of ``rms / (rms + eps)``: 1 is a
  normalised step, 0.1 a step damped 10x by eps.
- Last, the encoder's output features (feed-forward models): ``value_weight_positive``, the
  share of dead and of live features whose weight into the value head is positive. When
  the value estimate must fall fast (Pong: from 0 to about -2 within 250k agent steps), units
  that raise it are pushed below zero; a share far above the live one says that is how
  they died.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from distrl import runs
from distrl.envs import make_vector_env
from distrl.nn.actor_critic import ActorCritic
from distrl.nn.dormant import dormant_fractions


def relu_activity(model: ActorCritic, obs: torch.Tensor) -> list[dict]:
    """``dead``, ``dormant`` and ``feature_std`` of every ReLU of the encoder on ``obs [N, *obs_shape]``."""
    dormant = dormant_fractions(model.encoder, obs)
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
                     "dormant": round(dormant[name], 3),
                     "feature_std": round(out.std(0).mean().item(), 5)})
    return rows


def value_weight_sign(model: ActorCritic, obs: torch.Tensor) -> dict:
    """How the encoder's output features died, from ``obs [N, *obs_shape]`` (uint8 frames).

    A feature is dead when it is 0 on all N observations. Returns ``dead`` (count) ``of``
    ``feature_dim``; ``value_weight_positive``, the share of the dead and of the live features
    whose weight into the value head (``model.baseline``) is positive (None for an empty
    group); and the value estimate's mean over ``obs`` and its bias (``value_mean``,
    ``value_bias``, in clipped-reward units).
    """
    with torch.no_grad():
        features = model.encoder(obs)  # [N, feature_dim]
        # the head's columns for the encoder's features (with model.last_action_reward the previous
        # action and reward follow them; the value here is the one at an episode's start)
        weight = model.baseline.weight[:, :features.shape[1]]
        value = (features @ weight.T + model.baseline.bias).mean().item()
    dead = features.amax(0) <= 0
    positive = weight.flatten() > 0
    share = {name: round(positive[mask].float().mean().item(), 3) if mask.any() else None
             for name, mask in (("dead", dead), ("live", ~dead))}
    return {"features": "encoder output", "dead": int(dead.sum()), "of": dead.numel(),
            "value_weight_positive": share, "value_mean": round(value, 3),
            "value_bias": round(model.baseline.bias.item(), 3)}


def policy_width(logits: torch.Tensor) -> dict:
    """``entropy``, ``entropy_of_max`` and ``max_prob`` quantiles of ``logits [N, A]``."""
    log_probs = torch.log_softmax(logits, dim=-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    max_prob = log_probs.exp().amax(-1)
    quantiles = [round(max_prob.quantile(q).item(), 3) for q in (0.1, 0.5, 0.9)]
    return {"policy": "on these observations", "actions": logits.shape[-1], "entropy": round(entropy.mean().item(), 3),
            "entropy_of_max": round(entropy.mean().item() / np.log(logits.shape[-1]), 3),
            "max_prob": {"mean": round(max_prob.mean().item(), 3), "p10_p50_p90": quantiles}}


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
    parser.add_argument("--steps", type=int, default=100, help="steps of each of 8 envs")
    parser.add_argument("--actions", choices=("random", "policy"), default="random",
                        help="how the envs are stepped: random actions, or sampled from the checkpoint's policy")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    model, cfg, state = runs.load_policy(args.ckpt)
    space = model.action_space
    env = make_vector_env(cfg.env, 8)
    env.single_action_space.seed(args.seed)
    torch.manual_seed(args.seed)
    try:
        obs, _ = env.reset(seed=args.seed)
        frames, logits = [], []
        core, first = model.initial_state(8), torch.ones(8, dtype=torch.bool)
        last_action = torch.zeros((8, *space.action_shape), dtype=space.action_dtype)
        last_reward = torch.zeros(8)
        for _ in range(args.steps):
            frames.append(np.asarray(obs).copy())
            out, core = model.act(torch.from_numpy(frames[-1]), first, core, False, last_action, last_reward)
            logits.append(out["policy_params"])
            sampled = out["action"] if args.actions == "policy" else torch.stack(
                [torch.as_tensor(env.single_action_space.sample()) for _ in range(8)]).to(space.action_dtype)
            obs, reward, terminated, truncated, _ = env.step(space.to_env(sampled))
            first = torch.from_numpy(np.logical_or(terminated, truncated))
            last_action = sampled.to(space.action_dtype)
            last_reward = torch.as_tensor(reward, dtype=torch.float32)
    finally:
        env.close()
    obs = torch.from_numpy(np.concatenate(frames))
    print(json.dumps({"ckpt": args.ckpt, "agent_steps": state["agent_steps"], "observations": len(obs),
                      "actions": args.actions}))
    print(json.dumps(policy_width(torch.cat(logits))))
    for row in relu_activity(model, obs) + optimizer_scale(state):
        print(json.dumps(row))
    if model.core is None:
        print(json.dumps(value_weight_sign(model, obs)))


if __name__ == "__main__":
    main()

"""Time one optimizer step of the learner's network with each of PyTorch's kernels: the loop over the
tensors (its CPU default; RMSprop's in :func:`distrl.learning.learner.make_optimizer`), the multi-tensor one
(``foreach``) and, for Adam, the fused one (make_optimizer's Adam); then how far each is from the loop's parameters.

    python scripts/optimizer_step.py                  # the default (Atari) network, Adam
    python scripts/optimizer_step.py experiment=cartpole agent=impala

Prints one JSON line per kernel: milliseconds a step (the median of ``--rounds`` of ``--steps`` steps,
after 20 warm-up steps) and the largest difference from the loop's parameters after ``--check`` steps
on the same gradients (0.0: bit for bit).

The gradients are random, laid out in memory as their parameters are (channels-last for the encoder's
convolutions), as backward passes leave them: PyTorch's fused CPU kernel pairs a parameter's elements
with its gradient's by memory order, so a gradient of other strides gives it wrong parameters without an
error (pytorch/pytorch#106951: on CUDA it raises). 2026-12-08: gradients in the default layout put the
fused kernel 0.011 from the loop after 50 steps; in the parameters' layout, within float rounding.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch
from hydra import compose, initialize_config_dir

from distrl.config.schema import config_dir, register_configs
from distrl.envs import env_spec
from distrl.nn.actor_learner import ActorLearner

KERNELS = {"loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def optimizer_of(name: str, params, agent, kernel: dict) -> torch.optim.Optimizer:
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=agent.lr, alpha=agent.alpha, eps=agent.eps, **kernel)
    return torch.optim.Adam(params, lr=agent.lr, eps=agent.eps, **kernel)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--check", type=int, default=50)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose("train", overrides=args.overrides)
    spec = env_spec(cfg.env)
    torch.manual_seed(0)
    net = ActorLearner(spec.obs_shape, spec.action_space, cfg.model).learner
    name = cfg.agent.optimizer
    kernels = {k: v for k, v in KERNELS.items() if name == "adam" or k != "fused"}
    nets = {k: copy.deepcopy(net) for k in kernels}
    optimizers = {k: optimizer_of(name, nets[k].parameters(), cfg.agent, v) for k, v in kernels.items()}
    generator = torch.Generator().manual_seed(1)
    for _ in range(args.check):  # the same gradients for every kernel
        grads = [torch.empty_like(p).copy_(torch.randn(p.shape, generator=generator)) for p in net.parameters()]
        for k, optimizer in optimizers.items():
            for p, g in zip(nets[k].parameters(), grads, strict=True):
                p.grad = g.clone()  # clone keeps g's strides, the parameter's
            optimizer.step()
    diffs = {k: max((a - b).abs().max().item()
                    for a, b in zip(nets["loop"].parameters(), nets[k].parameters(), strict=True)) for k in nets}
    for k, optimizer in optimizers.items():
        for _ in range(20):
            optimizer.step()
        rounds = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            for _ in range(args.steps):
                optimizer.step()
            rounds.append((time.perf_counter() - start) / args.steps * 1e3)
        print(json.dumps({"optimizer": name, "kernel": k, "ms_a_step": round(statistics.median(rounds), 3),
                          "rounds_ms": [round(r, 3) for r in rounds], "max_diff_from_loop": diffs[k],
                          "parameters": sum(p.numel() for p in net.parameters()), "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()

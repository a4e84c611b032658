"""The continuous-control table: each run's last evaluation (mean return of 10 episodes with the
Gaussian's mean) at or before the budget, its training return over the last 100 episodes, its
speed, against CleanRL's ppo_continuous_action at 1M and Sample Factory's table at 10M.

    python scripts/mujoco_table.py docs/lab/runs/mujoco/*.csv.gz [--budget 1000000]

Each argument is a run directory or a run record (:mod:`distrl.runs`). Prints a Markdown table, one
row per run, then one per task with the mean over its seeds.
"""

from __future__ import annotations

import argparse
import re
import statistics

from distrl import runs

# CleanRL ppo_continuous_action at 1M agent steps (its docs' benchmark table, MuJoCo v4) and Sample
# Factory's MuJoCo table at 10M (docs/09-environment-integrations/mujoco.md, v4)
ANCHORS = {1_000_000: {"HalfCheetah": 1442.6, "Walker2d": 2288.0, "Hopper": 2382.9},
           10_000_000: {"HalfCheetah": 6263.0, "Walker2d": 5488.0, "Hopper": 2793.0, "Ant": 5876.0,
                        "Humanoid": 5439.0}}


def row(path, budget: int) -> dict:
    records = [r for r in runs.metrics(path) if r["agent_steps"] <= budget * 1.01]
    evals = runs.values(records, "eval/mean_return")
    episodes = [r["charts/episodic_return"] for r in records if "charts/episodic_return" in r]
    sps = [r["charts/SPS"] for r in records if "charts/SPS" in r]
    times = [r["time"] for r in records]
    task = re.sub(r"-v\d+$", "", runs.env_id(path).split(":")[-1])
    return {"run": runs.name(path), "task": task, "seed": runs.config(path)["seed"],
            "eval": evals[-1][1] if evals else float("nan"), "eval_steps": evals[-1][0] if evals else 0,
            "train": statistics.fmean(episodes[-100:]) if episodes else float("nan"),
            "sps": statistics.median(sps) if sps else float("nan"),
            "minutes": (max(times) - min(times)) / 60 if times else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories or run records")
    parser.add_argument("--budget", type=int, default=1_000_000, help="agent steps")
    args = parser.parse_args()
    anchors = ANCHORS.get(args.budget, {})
    rows = sorted((row(path, args.budget) for path in args.runs), key=lambda r: (r["task"], r["seed"]))
    print("| task | seed | eval (agent steps) | training return, last 100 episodes | agent steps/s (median) "
          "| wall minutes | anchor |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        anchor = anchors.get(r["task"])
        print(f"| {r['task']} | {r['seed']} | {r['eval']:,.0f} ({r['eval_steps']:,}) | {r['train']:,.0f} | "
              f"{r['sps']:,.0f} | {r['minutes']:.1f} | {'' if anchor is None else f'{anchor:,.0f}'} |")
    for task in sorted({r["task"] for r in rows}):
        mine = [r for r in rows if r["task"] == task]
        anchor = anchors.get(task)
        evals = [r["eval"] for r in mine]
        passed = "" if anchor is None else f"; {sum(e >= anchor for e in evals)} of {len(evals)} seeds >= {anchor:,.0f}"
        print(f"| **{task}**, mean of {len(mine)} | | **{statistics.fmean(evals):,.0f}** | "
              f"{statistics.fmean(r['train'] for r in mine):,.0f} | | | {passed.lstrip('; ')} |")


if __name__ == "__main__":
    main()

"""The continuous-control table: each run's last evaluation (mean return of 10 episodes with the
Gaussian's mean) at or before the budget, its training return over the last 100 episodes, its
speed, against CleanRL's ppo_continuous_action at 1M and Sample Factory's table at 10M.

    python scripts/mujoco_table.py docs/lab/runs/mujoco/*.csv.gz [--budget 1000000]

Each argument is a run directory or a run record (:mod:`distrl.runs`), distrl's or Sample Factory's
(``scripts/sf_record.py``). Prints a Markdown table, one row per run (its name first), then one per
task and system with the mean over its seeds. Beside the last evaluation: the best one and the last's
share of it (a collapse shows as a share well under 1), and the speed as the median of the logged
agent steps/s and over the whole run (its last agent steps over its wall time). ``--at 1000000
3000000 10000000`` adds the training return at each of those agent steps (the mean of the last 100
episodes up to there; Sample Factory's own running mean of its recent episodes, its ``reward/reward``).
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


SF_TASKS = {"mujoco_halfcheetah": "HalfCheetah", "mujoco_hopper": "Hopper", "mujoco_walker": "Walker2d",
            "mujoco_ant": "Ant", "mujoco_humanoid": "Humanoid"}


def system_and_task(path) -> tuple[str, str]:
    """``("distrl", "Hopper")`` from a distrl run's ``env.id``, ``("sample-factory", "Hopper")`` from
    Sample Factory's ``env`` (``mujoco_hopper``)."""
    env = runs.config(path)["env"]
    if isinstance(env, str):
        return "sample-factory", SF_TASKS.get(env, env)
    return "distrl", re.sub(r"-v\d+$", "", str(env["id"]).split(":")[-1])


def training_return(records: list[dict], system: str, at: int) -> float:
    """The training return at ``at`` agent steps (1 % slack): distrl's mean of the last 100 episodes,
    Sample Factory's last logged running mean."""
    episodes = [r["charts/episodic_return"] for r in records
                if "charts/episodic_return" in r and r["agent_steps"] <= at * 1.01]
    if not episodes:
        return float("nan")
    return episodes[-1] if system == "sample-factory" else statistics.fmean(episodes[-100:])


def row(path, budget: int, at: list[int]) -> dict:
    everything = runs.metrics(path)
    records = [r for r in everything if r["agent_steps"] <= budget * 1.01]
    evals = runs.values(records, "eval/mean_return")
    sps = [r["charts/SPS"] for r in records if "charts/SPS" in r]
    times = [r["time"] for r in records]
    system, task = system_and_task(path)
    best = max(evals, key=lambda e: e[1]) if evals else (0, float("nan"))
    wall = max(times) - min(times) if times else float("nan")
    return {"run": runs.name(path), "system": system, "task": task, "seed": runs.config(path)["seed"],
            "eval": evals[-1][1] if evals else float("nan"), "eval_steps": evals[-1][0] if evals else 0,
            "best": best[1], "best_steps": best[0],
            "over_run": records[-1]["agent_steps"] / wall if times and wall > 0 else float("nan"),
            "train": training_return(records, system, budget),
            "at": [training_return(everything, system, n) for n in at],
            "sps": statistics.median(sps) if sps else float("nan"),
            "minutes": wall / 60}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories or run records")
    parser.add_argument("--budget", type=int, default=1_000_000, help="agent steps")
    parser.add_argument("--at", type=int, nargs="*", default=[], help="also the training return at these agent steps")
    args = parser.parse_args()
    anchors = ANCHORS.get(args.budget, {})
    rows = sorted((row(path, args.budget, args.at) for path in args.runs),
                  key=lambda r: (r["task"], r["system"], r["seed"]))
    at = "".join(f" training return at {n / 1e6:g}M |" for n in args.at)
    print(f"| run | task | system | seed | eval (agent steps) | best eval (agent steps) | last / best | "
          f"training return, last 100 episodes |{at} agent steps/s (median) | agent steps/s over the run | "
          "wall minutes | anchor |")
    print("| --- " * (12 + len(args.at)) + "|")
    for r in rows:
        anchor = anchors.get(r["task"])
        values = "".join(f" {v:,.0f} |" for v in r["at"])
        print(f"| {r['run']} | {r['task']} | {r['system']} | {r['seed']} | {r['eval']:,.0f} ({r['eval_steps']:,}) | "
              f"{r['best']:,.0f} ({r['best_steps']:,}) | {r['eval'] / r['best']:.2f} | "
              f"{r['train']:,.0f} |{values} {r['sps']:,.0f} | {r['over_run']:,.0f} | {r['minutes']:.1f} | "
              f"{'' if anchor is None else f'{anchor:,.0f}'} |")
    for task, system in sorted({(r["task"], r["system"]) for r in rows}):
        mine = [r for r in rows if (r["task"], r["system"]) == (task, system)]
        anchor = anchors.get(task)
        evals = [r["eval"] for r in mine]
        passed = "" if anchor is None else f"; {sum(e >= anchor for e in evals)} of {len(evals)} seeds >= {anchor:,.0f}"
        values = "".join(f" {statistics.fmean(r['at'][i] for r in mine):,.0f} |" for i in range(len(args.at)))
        print(f"| | **{task}**, mean of {len(mine)} | {system} | | **{statistics.fmean(evals):,.0f}** | | | "
              f"{statistics.fmean(r['train'] for r in mine):,.0f} |{values} | | | {passed.lstrip('; ')} |")


if __name__ == "__main__":
    main()

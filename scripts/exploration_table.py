"""The exploration table: for each MiniGrid (or sparse-chain) run, the agent steps to its first
evaluation at or above a target, against the run without an intrinsic reward on the same seed.

    python scripts/exploration_table.py outputs/dk8/* [--target 0.9] [--budget 2000000]

Each argument is a run directory or a run record (:mod:`distrl.runs`). Prints one Markdown row per
run, sorted by setting and seed: the env, the setting (``intrinsic`` with its ``coef``, ``episodic``
and ``normalize`` where it has one; the agent's entropy cost and whether it standardises
advantages), the seed, the agent steps reached, the first evaluation at or above ``--target``
(agent steps, or "not" within the budget), the best and last evaluation, the last logged
``charts/success_rate`` and ``charts/intrinsic_share`` (empty for a run that predates them), the
median agent steps/s and, for a run with an intrinsic reward, its steps to the target divided by
``intrinsic=none``'s on the same seed, env and agent (the no-harm ratio; empty without such a run,
"inf" where ``none`` solved it and the module did not). Then one row per setting: the seeds that
reached the target, the median steps of those that did.
"""

from __future__ import annotations

import argparse
import statistics

from distrl import runs


def intrinsic_setting(cfg: dict) -> str:
    """The intrinsic reward a run tried: its name with its ``coef``, ``episodic`` and ``normalize``."""
    intrinsic = cfg["intrinsic"]
    name = intrinsic["name"]
    if name != "none":
        name += f" coef={intrinsic['coef']:g}" + (" episodic" if intrinsic.get("episodic") else "")
        name += f" norm={intrinsic['normalize']}" if intrinsic.get("normalize") else ""
    return name + (" fine-tuned" if cfg.get("train", {}).get("init_model_path") else "")


def agent_setting(cfg: dict) -> str:
    """The agent's values that the exploration runs vary: its lr, entropy cost, raw advantages."""
    agent = cfg["agent"]
    return (f"{agent['name']} lr={agent['lr']:g} ent={agent['entropy_cost']:g}"
            + ("" if agent.get("normalize_advantages", True) else " raw-adv"))


def row(path, target: float, budget: int | None) -> dict:
    records = [r for r in runs.metrics(path) if budget is None or r["agent_steps"] <= budget]
    cfg = runs.config(path)
    evals = runs.values(records, "eval/mean_return")
    solved = next((step for step, value in evals if value >= target), None)
    last = {key: next((r[key] for r in reversed(records) if key in r), None)
            for key in ("charts/success_rate", "charts/intrinsic_share")}
    sps = [r["charts/SPS"] for r in records if "charts/SPS" in r]
    return {"run": runs.name(path), "env": runs.env_id(path).removeprefix("MiniGrid-").removesuffix("-v0"),
            "intrinsic": intrinsic_setting(cfg), "baseline": cfg["intrinsic"]["name"] == "none",
            "agent": agent_setting(cfg), "seed": cfg["seed"],
            "steps": records[-1]["agent_steps"] if records else 0, "solved": solved,
            "best": max((v for _, v in evals), default=None), "last": evals[-1][1] if evals else None,
            "success": last["charts/success_rate"], "share": last["charts/intrinsic_share"],
            "sps": statistics.median(sps) if sps else None}


def no_harm(r: dict, rows: list[dict]) -> str:
    """``r``'s steps to the target over ``intrinsic=none``'s on the same env, agent and seed."""
    if r["baseline"]:
        return ""
    base = next((b for b in rows if b["baseline"] and (b["env"], b["agent"], b["seed"]) ==
                 (r["env"], r["agent"], r["seed"])), None)
    if base is None or base["solved"] is None:
        return ""
    return "inf" if r["solved"] is None else f"{r['solved'] / base['solved']:.2f}"


def _number(value, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories or run records")
    parser.add_argument("--target", type=float, default=0.9, help="the evaluation mean return that counts as solved")
    parser.add_argument("--budget", type=int, default=None, help="only the records up to this many agent steps")
    args = parser.parse_args()
    rows = sorted((row(path, args.target, args.budget) for path in args.runs),
                  key=lambda r: (r["env"], r["intrinsic"], r["agent"], r["seed"]))
    print(f"| env | setting | agent | seed | agent steps | first eval >= {args.target:g} | best eval | last eval "
          "| success rate (last) | intrinsic share (last) | agent steps/s | steps / none's |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        solved = "not" if r["solved"] is None else f"{r['solved'] / 1e6:.2f}M"
        print(f"| {r['env']} | {r['intrinsic']} | {r['agent']} | {r['seed']} | {r['steps'] / 1e6:.2f}M | "
              f"{solved} | {_number(r['best'], '.2f')} | "
              f"{_number(r['last'], '.2f')} | {_number(r['success'], '.2f')} | {_number(r['share'], '.2f')} | "
              f"{_number(r['sps'], ',.0f')} | {no_harm(r, rows)} |")
    for env, intrinsic, agent in sorted({(r["env"], r["intrinsic"], r["agent"]) for r in rows}):
        mine = [r for r in rows if (r["env"], r["intrinsic"], r["agent"]) == (env, intrinsic, agent)]
        solved = [r["solved"] for r in mine if r["solved"] is not None]
        median = f"median {statistics.median(solved) / 1e6:.2f}M" if solved else ""
        print(f"| **{env}** | **{intrinsic}** | {agent} | {len(solved)} of {len(mine)} solved | | {median} "
              "| | | | | | |")


if __name__ == "__main__":
    main()

"""The screening table of Atari runs: per run, the training return per window of agent steps, the
dormant units, the policy's entropy and the speed (issue "An agent that learns the suite").

    python scripts/screening.py outputs/screen/* [--window 500000]

Each RUN_DIR is one ``distrl train`` run (``config.yaml``, ``metrics.jsonl``). Prints one Markdown
row per run: the game, the candidate (``agent.name`` with T, B, lr and the optimizer, and ``layer_norm`` where
``model.layer_norm`` is set, ``pfo=<coef>`` where ``agent.pfo_coef`` is), the seed,
the agent steps reached, the mean training return of the episodes that ended in each window
(``n/a`` for a window without one), the last evaluation, the last logged entropy of the policy in
nats (a uniform policy's is ``ln A``: 2.89 for 18 actions, 1.79 for 6), the last
``dormant/<layer>`` shares (Sokar et al. 2023's
tau-dormant units, tau 0.025, as distrl logs them), the last feature rank (``rank/features``,
Kumar et al. 2021's srank of the encoder's output; empty for a run that predates it) and the median SPS.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from distrl import runs


def read(run_dir: Path, window: int) -> dict:
    """One run's row: see the module docstring."""
    cfg = runs.config(run_dir)
    windows: dict[int, list[float]] = {}
    last = {"agent_steps": 0}
    evals, sps, entropy, dormant, rank = [], [], None, {}, None
    for record in runs.metrics(run_dir):
        last["agent_steps"] = max(last["agent_steps"], record.get("agent_steps", 0))
        if "charts/episodic_return" in record:
            windows.setdefault(record["agent_steps"] // window, []).append(record["charts/episodic_return"])
        if "eval/mean_return" in record:
            evals.append(record["eval/mean_return"])
        if "charts/SPS" in record:
            sps.append(record["charts/SPS"])
        if "losses/entropy" in record:
            entropy = -record["losses/entropy"]
        found = {k.split("/", 1)[1]: v for k, v in record.items() if k.startswith("dormant/")}
        if found:
            dormant = found
        rank = record.get("rank/features", rank)
    agent = cfg["agent"]
    return {
        "game": cfg["env"]["id"].split("/")[-1].removesuffix("-v5"),
        "candidate": (f"{agent['name']} T={cfg['num_steps']} B={cfg['batch_size']} {agent['optimizer']} "
                      f"lr={agent['lr']:g}"
                      + ("" if cfg.get("num_slots", "auto") == "auto" else f" slots={cfg['num_slots']}")
                      + (" layer_norm" if cfg.get("model", {}).get("layer_norm") else "")
                      + (f" pfo={agent['pfo_coef']:g}" if agent.get("pfo_coef") else "")),
        "seed": cfg["seed"],
        "agent_steps": last["agent_steps"],
        "windows": [statistics.fmean(windows[k]) if k in windows else None
                    for k in range(last["agent_steps"] // window + 1)],
        "eval": evals[-1] if evals else None,
        "entropy": entropy,
        "dormant": dormant,
        "rank": rank,
        "sps": statistics.median(sps) if sps else None,
    }


def _score(value: float) -> str:
    """A return as the table prints it: one decimal below 100 in magnitude (Pong's), none above."""
    return f"{value:.1f}" if abs(value) < 100 else f"{value:,.0f}"


def row(run: dict) -> str:
    windows = " / ".join("n/a" if w is None else _score(w) for w in run["windows"])
    entropy = "" if run["entropy"] is None else f"{run['entropy']:.2f}"
    dormant = ", ".join(f"{k} {v:.2f}" for k, v in run["dormant"].items())
    cells = [run["game"], run["candidate"], str(run["seed"]), f"{run['agent_steps'] / 1e6:.2f}M", windows,
             "" if run["eval"] is None else _score(run["eval"]), entropy, dormant,
             "" if run["rank"] is None else f"{run['rank']:.0f}", "" if run["sps"] is None else f"{run['sps']:,.0f}"]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories")
    parser.add_argument("--window", type=int, default=500_000, help="agent steps per window of training returns")
    args = parser.parse_args()
    print(f"| game | candidate | seed | agent steps | training return per {args.window / 1e6:g}M window | last eval "
          "| entropy (nats) | dormant (last) | feature rank (last) | SPS |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for run_dir in args.runs:
        print(row(read(run_dir, args.window)))


if __name__ == "__main__":
    main()

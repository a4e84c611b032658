"""How fast does ``distrl train experiment=cartpole`` learn? Agent steps and wall time to a target eval return.

Runs the real command once per seed, stops it (Ctrl-C, which saves a
checkpoint) as soon as an evaluation's mean return reaches the target, and
prints one JSON line per seed plus a summary line.

    python scripts/learn_cartpole.py --seeds 1 2 3 -- train.num_train_steps=500000

Everything after ``--`` is passed to ``distrl train`` as Hydra overrides.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from distrl import runs


def first_crossing(run_dir: Path, target: float):
    if not (run_dir / "metrics.jsonl").exists():
        return None
    for record in runs.metrics(run_dir):
        if record.get("eval/mean_return", float("-inf")) >= target:
            return record
    return None


def run(seed: int, target: float, overrides: list[str], out: Path, budget_s: float) -> dict:
    run_dir = out / f"seed{seed}"
    cmd = [sys.executable, "-m", "distrl", "train", "experiment=cartpole", f"seed={seed}", *overrides,
           f"hydra.run.dir={run_dir}"]
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    hit = None
    while proc.poll() is None and time.time() - start < budget_s:
        hit = first_crossing(run_dir, target)
        if hit:
            os.killpg(proc.pid, signal.SIGINT)
            break
        time.sleep(0.5)
    if proc.poll() is None and not hit:
        os.killpg(proc.pid, signal.SIGINT)
    proc.wait()
    hit = hit or first_crossing(run_dir, target)
    return {
        "seed": seed, "target": target, "reached": hit is not None,
        "agent_steps": hit["agent_steps"] if hit else None,
        "wall_s": round(hit["time"] - start, 1) if hit else None,
        "eval_mean_return": hit["eval/mean_return"] if hit else None,
        "command": " ".join(cmd[2:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--budget-s", type=float, default=600.0, help="wall-time limit per seed")
    parser.add_argument("--out", type=Path, default=None, help="run directories (default: a temp dir)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for distrl train (after --)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="distrl-cartpole-"))
    results = []
    for seed in args.seeds:
        result = run(seed, args.target, args.overrides, out, args.budget_s)
        print(json.dumps(result), flush=True)
        results.append(result)
    reached = [r for r in results if r["reached"]]
    summary = {
        "reached": f"{len(reached)}/{len(results)}",
        "median_agent_steps": sorted(r["agent_steps"] for r in reached)[len(reached) // 2] if reached else None,
        "median_wall_s": sorted(r["wall_s"] for r in reached)[len(reached) // 2] if reached else None,
        "machine": f"{os.cpu_count()} cores",
    }
    print(json.dumps({"summary": summary}))


if __name__ == "__main__":
    main()

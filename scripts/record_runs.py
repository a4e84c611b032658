"""Keep runs as run records: one gzip'd CSV of each run directory's metrics, after the command, the
machine, the commit and the resolved config (:func:`distrl.runs.write_record`). A run directory is never
committed; its record is (docs/results.md, "How runs are kept").

    python scripts/record_runs.py outputs/mujoco/Hopper-s1 ... --dest docs/lab/runs/mujoco \\
        --machine "2-core AMD EPYC (family 25 model 1), torch 2.13.0+cpu" --commit cb439bb \\
        --command "distrl train experiment=mujoco env.id=Hopper-v5 seed=1 hydra.run.dir=outputs/mujoco/Hopper-s1"

``--command`` may hold ``{run}`` (the run directory, as given) and ``{name}`` (its name). Without
``--commit``, the commit that first added the run's ``metrics.jsonl`` to git is taken (runs tracked
before run records existed).
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

from distrl import runs


def first_commit(run_dir: Path) -> str:
    """The commit that first added ``run_dir/metrics.jsonl`` to git, or ``unknown``."""
    done = subprocess.run(["git", "log", "--diff-filter=A", "--format=%h", "--", str(run_dir / "metrics.jsonl")],
                          capture_output=True, text=True)
    found = done.stdout.split()
    return found[-1] if done.returncode == 0 and found else "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="run directories (config.yaml and metrics.jsonl)")
    parser.add_argument("--dest", type=Path, required=True, help="the folder of the records")
    parser.add_argument("--machine", required=True, help="the machine the runs ran on (CPU model, torch)")
    parser.add_argument("--commit", help="the commit the runs ran at (default: the one that first tracked each)")
    parser.add_argument("--command", default="distrl train ... hydra.run.dir={run} (its overrides were not kept: "
                        "the resolved config below is the run's)", help="the command that made each run")
    args = parser.parse_args()
    for run_dir in args.runs:
        name = runs.name(run_dir)
        dest = runs.write_record(run_dir, args.dest / f"{name}{runs.RECORD_SUFFIX}", run=name,
                                 command=args.command.format(run=run_dir, name=name), machine=args.machine,
                                 commit=args.commit or first_commit(run_dir))
        print(f"{dest}: {dest.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()

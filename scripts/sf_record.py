"""Keep a Sample Factory run (scripts/sample_factory.sh) as a run record beside distrl's: its
TensorBoard scalars, read with TensorBoard's reader, as the rows :mod:`distrl.runs` writes and reads,
so that ``scripts/learning_curve.py`` and ``scripts/mujoco_table.py`` take it as they take a distrl run.

    python scripts/sf_record.py outputs/sf/mujoco_hopper-s1 --dest docs/lab/runs/sf/Hopper-sf211-s1.csv.gz \\
        --machine "2-core AMD EPYC (AVX512-BF16), torch 2.13.0+cpu, sample-factory 2.1.1, mujoco 2.3.7" \\
        --command "scripts/sample_factory.sh run mujoco_hopper 3000000 1"

Columns: ``agent_steps`` (Sample Factory's env steps; frameskip 1), ``time`` (the summary's wall
clock), ``charts/episodic_return`` and ``charts/episodic_length`` (``reward/reward``, ``len/len``: its
mean over the last episodes, as it reports them), ``charts/SPS`` (``perf/_fps``), ``charts/policy_lag``
(``train/version_diff_avg``), the losses and the learning rate; the config is its ``config.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from distrl import runs

COLUMNS = {  # Sample Factory's scalar -> the record's column
    "reward/reward": "charts/episodic_return",
    "len/len": "charts/episodic_length",
    "perf/_fps": "charts/SPS",
    "train/version_diff_avg": "charts/policy_lag",
    "train/loss": "losses/total",
    "train/policy_loss": "losses/policy",
    "train/value_loss": "losses/value",
    "train/kl_loss": "losses/kl",
    "train/entropy": "losses/entropy",
    "train/grad_norm": "losses/grad_norm",
    "train/lr": "charts/learning_rate",
}


def sf_rows(run_dir: Path) -> list[dict]:
    """One row per (env step, scalar group) Sample Factory logged, in order of env steps."""
    events = EventAccumulator(str(run_dir / ".summary" / "0"), size_guidance={"scalars": 0})
    events.Reload()
    rows: dict[int, dict] = {}
    for tag, column in COLUMNS.items():
        if tag not in events.Tags()["scalars"]:
            continue
        for event in events.Scalars(tag):
            row = rows.setdefault(event.step, {"agent_steps": event.step, "time": event.wall_time})
            row[column] = event.value
    return [rows[step] for step in sorted(rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a Sample Factory experiment directory (.summary/0, config.json)")
    parser.add_argument("--dest", type=Path, required=True, help="the record to write (.csv.gz)")
    parser.add_argument("--machine", required=True, help="the machine it ran on (CPU model, versions)")
    parser.add_argument("--command", required=True, help="the command that made it")
    parser.add_argument("--commit", default="Sample Factory 2.1.1 (PyPI), unchanged", help="what code ran")
    args = parser.parse_args()
    rows = sf_rows(args.run)
    config = json.loads((args.run / "config.json").read_text())
    dest = runs.write_rows(rows, config, args.dest, run=runs.name(args.dest), command=args.command,
                           machine=args.machine, commit=args.commit)
    last = [row for row in rows if "charts/episodic_return" in row][-1]
    print(f"{dest}: {len(rows)} rows; at {last['agent_steps']:,} env steps the return "
          f"{last['charts/episodic_return']:.1f}")


if __name__ == "__main__":
    main()

"""Keep an RLeXplore run (scripts/rllte_reference.sh) as a run record beside distrl's: the CSV its
logger writes (``DIR/logs/TAG/DATE/train.log``) as the rows :mod:`distrl.runs` writes and reads, so
that ``scripts/learning_curve.py`` and ``scripts/exploration_table.py`` take it as they take a distrl run.

    python scripts/rllte_record.py outputs/rllte/e3b-s1 --dest docs/lab/runs/doorkey16-rlexplore/e3b-rllte-s1.csv.gz \\
        --machine "2-core AMD EPYC (AVX512-BF16), torch 2.14.1, gymnasium 0.29.1, minigrid 2.3.1" \\
        --command "scripts/rllte_reference.sh run e3b 10000000 1"

Columns: ``agent_steps`` (its ``step``), ``time`` (its ``total_time``, seconds from the start),
``charts/episodic_return`` (its ``episode_reward``, the mean of the last 10 training episodes' returns,
divided by the 100 its env multiplies the goal's reward by: MiniGrid's own return, 0 to 1, as distrl
logs it, and RLeXplore's normalised score, the return over its maximum 1), ``charts/episodic_length``,
``charts/intrinsic_reward`` (its ``intrinsic_episode_reward``: the mean intrinsic reward of a step over
the last 10 rollouts) and ``charts/SPS`` (its ``fps``, agent steps per second from the start).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from distrl import runs

REWARD_SCALE = 100.0  # rllte/env/minigrid/__init__.py at e26d1b2: TransformReward(envs, lambda r: 100.0 * r)
ENV_ID = "MiniGrid-DoorKey-16x16-v0"


def rllte_rows(run_dir: Path) -> list[dict]:
    """One row per logged update of the run's one CSV log, in order of agent steps.

    Raises:
        FileNotFoundError: no ``logs/*/*/train.log`` under ``run_dir``, or more than one.
    """
    logs = sorted(run_dir.glob("logs/*/*/train.log"))
    if len(logs) != 1:
        raise FileNotFoundError(f"{run_dir}: {len(logs)} rllte logs (logs/TAG/DATE/train.log), one expected")
    with logs[0].open() as f:
        return [{"agent_steps": int(float(row["step"])), "time": float(row["total_time"]),
                 "charts/episodic_return": float(row["episode_reward"]) / REWARD_SCALE,
                 "charts/episodic_length": float(row["episode_length"]),
                 "charts/intrinsic_reward": float(row["intrinsic_episode_reward"]),
                 "charts/SPS": float(row["fps"])} for row in csv.DictReader(f)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="the run's directory (scripts/rllte_reference.sh run ... DIR)")
    parser.add_argument("--dest", type=Path, required=True, help="the record to write (.csv.gz)")
    parser.add_argument("--machine", required=True, help="the machine it ran on (CPU model, versions)")
    parser.add_argument("--command", required=True, help="the command that made it")
    parser.add_argument("--commit", default="RLE-Foundation/rllte e26d1b2 (branch reward), unchanged",
                        help="what code ran")
    args = parser.parse_args()
    rows = rllte_rows(args.run)
    config = {"env": {"id": ENV_ID, "success_above": 0.0}, "reward_scale": REWARD_SCALE,
              "source": "RLE-Foundation/rllte e26d1b2, src/utils.py defaults"}
    dest = runs.write_rows(rows, config, args.dest, run=runs.name(args.dest), command=args.command,
                           machine=args.machine, commit=args.commit)
    print(f"{dest}: {len(rows)} rows; at {rows[-1]['agent_steps']:,} agent steps the return "
          f"{rows[-1]['charts/episodic_return']:.3f}")


if __name__ == "__main__":
    main()

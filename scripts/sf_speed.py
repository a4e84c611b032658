"""Sample Factory and distrl end to end on one MuJoCo task, interleaved: each round runs Sample Factory's
own recipe (scripts/sample_factory.sh) and then distrl's ``experiment=mujoco`` for the same number of env
steps, one at a time on an otherwise idle machine, and times each from the command's start to its exit.
Both sides run the same task id, the ``-v4`` one Sample Factory 2.1.1 names (its gymnasium 0.29.1 with
mujoco 2.3.7; distrl's gymnasium registers the v4 ids beside v5, on its own mujoco).

    python scripts/sf_speed.py --steps 2000000 --rounds 2 --task HalfCheetah

For each run it prints the env steps per second over the whole command (start-up, compilation,
evaluations and the last checkpoint included: what a researcher waits for) and over the steady part
(the steps between the first and the last logged point, divided by the time between them), then the
medians per system and their ratio. Runs land in ``outputs/sf_speed/`` (git-ignored); nothing else
is written. distrl's evaluations follow the preset (``train.eval_interval``) unless ``--no-eval``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from distrl import runs

REPO = Path(__file__).resolve().parent.parent
SF_TASKS = {"HalfCheetah": "mujoco_halfcheetah", "Hopper": "mujoco_hopper", "Walker2d": "mujoco_walker",
            "Ant": "mujoco_ant", "Humanoid": "mujoco_humanoid"}


def steady_rate(points: list[tuple[float, int]]) -> float:
    """Env steps per second between the first and the last ``(wall time, env steps)`` point."""
    (t0, s0), (t1, s1) = points[0], points[-1]
    return (s1 - s0) / (t1 - t0) if t1 > t0 else float("nan")


def run_sample_factory(task: str, steps: int, seed: int, out: Path) -> tuple[float, float]:
    from sf_record import sf_rows

    start = time.time()
    subprocess.run([str(REPO / "scripts" / "sample_factory.sh"), "run", SF_TASKS[task], str(steps), str(seed),
                    str(out)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.time() - start
    rows = [row for row in sf_rows(out) if "charts/SPS" in row]
    return steps / wall, steady_rate([(row["time"], row["agent_steps"]) for row in rows])


def run_distrl(task: str, steps: int, seed: int, out: Path, overrides: list[str]) -> tuple[float, float]:
    start = time.time()
    subprocess.run([sys.executable, "-m", "distrl", "train", "experiment=mujoco", f"env.id={task}-v4", f"seed={seed}",
                    f"train.num_train_steps={steps}", *overrides, f"hydra.run.dir={out}"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    wall = time.time() - start
    rows = [row for row in runs.metrics(out) if "charts/SPS" in row]
    return steps / wall, steady_rate([(row["time"], row["agent_steps"]) for row in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="HalfCheetah", choices=sorted(SF_TASKS))
    parser.add_argument("--steps", type=int, default=2_000_000, help="env steps of each run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-eval", action="store_true", help="distrl without evaluations (Sample Factory has none)")
    parser.add_argument("overrides", nargs="*", help="more distrl overrides")
    args = parser.parse_args()
    overrides = [*args.overrides, *(["train.num_eval_episodes=0"] if args.no_eval else [])]
    root = REPO / "outputs" / "sf_speed"
    results: dict[str, list[tuple[float, float]]] = {"sample-factory": [], "distrl": []}
    for r in range(args.rounds):
        for name in results:
            out = root / f"{name}-{args.task}-r{r}"
            shutil.rmtree(out, ignore_errors=True)
            if name == "sample-factory":
                rate = run_sample_factory(args.task, args.steps, args.seed, out)
            else:
                rate = run_distrl(args.task, args.steps, args.seed, out, overrides)
            results[name].append(rate)
            print(f"round {r} {name}: {rate[0]:,.0f} env steps/s end to end, {rate[1]:,.0f} steady", flush=True)
    medians = {name: [statistics.median(rate[i] for rate in rates) for i in (0, 1)] for name, rates in results.items()}
    for name, (whole, steady) in medians.items():
        print(f"{name}: median {whole:,.0f} env steps/s end to end, {steady:,.0f} steady")
    sf, ours = medians["sample-factory"], medians["distrl"]
    print(f"distrl / Sample Factory: {ours[0] / sf[0]:.2f}x end to end, {ours[1] / sf[1]:.2f}x steady")


if __name__ == "__main__":
    main()

"""Learning curves of one or more distrl runs (seeds of one setting), as a PNG and a CSV.

    python scripts/learning_curve.py outputs/pong-s1 outputs/pong-s2 --out docs/pong.png

Reads each run (a run directory, or its record under docs/lab/runs/: :mod:`distrl.runs`) and draws,
against agent steps (left) and against wall-clock hours (right):

- the evaluation mean return (``eval/mean_return``): the mean over the runs
  of their k-th evaluation, +- the standard deviation over the runs;
- the training episodic return (``charts/episodic_return``), smoothed per run
  by the mean over a sliding window of agent steps, then averaged over the runs.

Wall-clock time starts at a run's first record; a pause longer than
``--gap-minutes`` between two records (the run was stopped and resumed later)
is left out. When a resumed run repeats agent steps it had logged before its
last checkpoint, the repeated ones replace the earlier ones. The points go to
a CSV beside the PNG: ``kind,agent_steps,hours,mean,std,runs``.

To compare settings, name each with its runs (seeds) instead:

    python scripts/learning_curve.py --setting none outputs/a-s1 outputs/a-s2 \
        --setting e3b outputs/b-s1 outputs/b-s2 --out docs/doorkey8.png

draws every run's own evaluations (left) and smoothed training return (right, at 200 points)
against agent steps, one colour per setting, one line per run (runs stopped at
a target end there: their curves are not averaged with the runs that go on).
Its CSV: ``setting,run,kind,agent_steps,hours,value``.

``--success`` draws the success rate instead of the return, for envs with ``env.success_above``
(MiniGrid, the sparse chain): each evaluation's ``eval/success_rate``, and the share of training
episodes whose return is above ``env.success_above``, smoothed over the same window:

    python scripts/learning_curve.py --success --setting e3b docs/lab/runs/minigrid/dk16-e3b-*.csv.gz \
        --out docs/lab/figures/doorkey16.png
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
from pathlib import Path

import numpy as np

from distrl import runs as distrl_runs
from distrl.runs import Run, smooth


def smoothed_on(run: Run, window: float, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The run's training return smoothed over ``window`` agent steps, and its hours, at the agent
    steps of ``grid`` (linear interpolation between its episodes)."""
    smoothed = smooth(run.training.steps, run.training.returns, window)
    return np.interp(grid, run.training.steps, smoothed), np.interp(grid, run.training.steps, run.training.hours)


def eval_points(runs: list[Run]) -> list[dict]:
    """The k-th evaluation of every run that has one: mean steps and hours, mean and std of the return."""
    points = []
    for k in range(max(len(r.evaluations.steps) for r in runs)):
        have = [r for r in runs if len(r.evaluations.steps) > k]
        returns = np.array([r.evaluations.returns[k] for r in have])
        points.append({"kind": "eval", "agent_steps": float(np.mean([r.evaluations.steps[k] for r in have])),
                       "hours": float(np.mean([r.evaluations.hours[k] for r in have])),
                       "mean": float(returns.mean()), "std": float(returns.std()), "runs": len(have)})
    return points


def train_points(runs: list[Run], window: float, num_points: int = 200) -> list[dict]:
    """Smoothed training returns of each run on a common grid of agent steps, averaged over the runs
    that reached each grid step; hours are interpolated per run the same way."""
    runs = [r for r in runs if len(r.training.steps)]
    if not runs:
        return []
    end = max(r.training.steps[-1] for r in runs)
    grid = np.linspace(min(r.training.steps[0] for r in runs), end, num_points)
    points = []
    curves = []
    for r in runs:
        inside = (grid >= r.training.steps[0]) & (grid <= r.training.steps[-1])
        curves.append((inside, *smoothed_on(r, window, grid)))
    for i, step in enumerate(grid):
        have = [(ret[i], hrs[i]) for inside, ret, hrs in curves if inside[i]]
        if have:
            returns = np.array([h[0] for h in have])
            points.append({"kind": "train", "agent_steps": float(step), "hours": float(np.mean([h[1] for h in have])),
                           "mean": float(returns.mean()), "std": float(returns.std()), "runs": len(have)})
    return points


def as_success(run: Run, path: Path) -> Run:
    """``run`` with its success rates in place of its returns (:class:`distrl.runs.Run`).

    Raises:
        ValueError: the run's env has no ``env.success_above`` (its success rates are NaN).
    """
    if np.isnan(run.training.success).all() and np.isnan(run.evaluations.success).all():
        raise ValueError(f"{path}: the run's env has no env.success_above, so no success rate")
    return dataclasses.replace(run, evaluations=run.evaluations._replace(returns=run.evaluations.success),
                               training=run.training._replace(returns=run.training.success))


def _figure():
    """pyplot (the file backend) and a figure of two panels sharing the return axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    return plt, fig, axes


def _save(fig, title: str, out: Path) -> None:
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def quantity(success: bool) -> str:
    return "success rate" if success else "return"


def plot(points: list[dict], title: str, out: Path, success: bool = False) -> None:
    _, fig, axes = _figure()
    for ax, x_key, x_label, scale in ((axes[0], "agent_steps", "agent steps (millions)", 1e-6),
                                      (axes[1], "hours", "wall-clock hours", 1.0)):
        for kind, label, style in (("train", f"training {quantity(success)} (smoothed)", "-"),
                                   ("eval", f"eval {quantity(success)}", "o-")):
            pts = [p for p in points if p["kind"] == kind]
            if not pts:
                continue
            x = np.array([p[x_key] for p in pts]) * scale
            mean = np.array([p["mean"] for p in pts])
            std = np.array([p["std"] for p in pts])
            line, = ax.plot(x, mean, style, label=label, markersize=4)
            ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2)
        ax.set_xlabel(x_label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("success rate" if success else "episode return (raw score)")
    axes[0].legend(loc="lower right")
    _save(fig, title, out)


def compare_points(settings: list[tuple[str, list[Run]]], window: float, num_points: int = 200) -> list[dict]:
    """Every run's evaluations and its smoothed training return at ``num_points`` steps, labelled
    with its setting."""
    points = []
    for label, runs in settings:
        for r in runs:
            points += [{"setting": label, "run": r.name, "kind": "eval", "agent_steps": s, "hours": h, "value": v}
                       for s, h, v in zip(r.evaluations.steps, r.evaluations.hours, r.evaluations.returns, strict=True)]
            if len(r.training.steps):  # the smoothed return at num_points steps of the run's span
                grid = np.linspace(r.training.steps[0], r.training.steps[-1], num_points)
                returns, hours = smoothed_on(r, window, grid)
                points += [{"setting": label, "run": r.name, "kind": "train", "agent_steps": float(s),
                            "hours": float(h), "value": float(v)}
                           for s, h, v in zip(grid, hours, returns, strict=True)]
    return points


def plot_compare(points: list[dict], labels: list[str], title: str, out: Path, success: bool = False) -> None:
    plt, fig, axes = _figure()
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, kind, name, style in ((axes[0], "eval", f"eval {'success rate' if success else 'mean return'}", "o-"),
                                  (axes[1], "train", f"training {quantity(success)} (smoothed)", "-")):
        for i, label in enumerate(labels):
            runs = sorted({p["run"] for p in points if p["setting"] == label})
            for j, run in enumerate(runs):
                pts = [p for p in points if p["setting"] == label and p["run"] == run and p["kind"] == kind]
                ax.plot([p["agent_steps"] * 1e-6 for p in pts], [p["value"] for p in pts], style,
                        color=colours[i % len(colours)], markersize=3, alpha=0.8,
                        label=label if j == 0 else None)
        ax.set_title(name)
        ax.set_xlabel("agent steps (millions)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("success rate" if success else "episode return")
    axes[0].legend(loc="center left", fontsize=8)
    _save(fig, title, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="*", help="run directories or run records (.csv.gz)")
    parser.add_argument("--setting", nargs="+", action="append", metavar=("LABEL", "RUN"), default=[],
                        help="a setting to compare and its run directories (repeat for each setting)")
    parser.add_argument("--out", type=Path, default=Path("learning_curve.png"), help="the PNG (the CSV goes beside it)")
    parser.add_argument("--window", type=float, default=100_000, help="smoothing window of the training return, "
                        "in agent steps")
    parser.add_argument("--gap-minutes", type=float, default=10.0, help="pauses longer than this are left out of "
                        "the wall-clock axis")
    parser.add_argument("--title", default=None, help="default: the env id and the number of runs")
    parser.add_argument("--success", action="store_true", help="the success rate instead of the return (runs "
                        "whose env has env.success_above)")
    args = parser.parse_args()

    if bool(args.runs) == bool(args.setting):
        parser.error("give either run directories or --setting LABEL RUN [RUN ...] (one or more)")
    if any(len(s) < 2 for s in args.setting):
        parser.error("--setting needs a label and at least one run directory")
    every_run = args.runs + [Path(r) for s in args.setting for r in s[1:]]
    missing = [str(r) for r in every_run if not (distrl_runs.is_record(r) or (Path(r) / "metrics.jsonl").is_file())]
    if missing:
        parser.error(f"neither a run record nor a run directory with metrics.jsonl: {', '.join(missing)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def read(path) -> Run:
        run = distrl_runs.curves(path, args.gap_minutes)
        if not args.success:
            return run
        try:
            return as_success(run, path)
        except ValueError as error:
            parser.error(str(error))

    if args.setting:
        settings = [(s[0], [read(r) for r in s[1:]]) for s in args.setting]
        points = compare_points(settings, args.window)
        if not points:
            parser.error("the runs have logged no episode returns or evaluations yet")
        first = Path(args.setting[0][1])
        plot_compare(points, [label for label, _ in settings], args.title or _env_id(first), args.out, args.success)
        _write_csv(args.out.with_suffix(".csv"), points, ["setting", "run", "kind", "agent_steps", "hours", "value"])
        print(f"wrote {args.out} and {args.out.with_suffix('.csv')}")
        return
    runs = [read(r) for r in args.runs]
    if not any(len(r.evaluations.steps) or len(r.training.steps) for r in runs):
        parser.error("the runs have logged no episode returns or evaluations yet")
    points = eval_points(runs) + train_points(runs, args.window)
    title = args.title or f"{_env_id(args.runs[0])}, {len(runs)} run{'s' if len(runs) > 1 else ''}"
    plot(points, title, args.out, args.success)
    csv_path = args.out.with_suffix(".csv")
    _write_csv(csv_path, points, ["kind", "agent_steps", "hours", "mean", "std", "runs"])
    print(f"wrote {args.out} and {csv_path}")


def _write_csv(path: Path, points: list[dict], fields: list[str]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(points)


def _env_id(run: Path) -> str:
    try:
        return distrl_runs.env_id(run)
    except (FileNotFoundError, KeyError):
        return distrl_runs.name(run)


if __name__ == "__main__":
    main()

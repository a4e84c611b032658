"""Atari-5 scores of distrl runs at an agent-step budget, and the Atari-57 median they predict.

    python scripts/atari5.py outputs/atari5/* --budget 10000000 --csv docs/atari5.csv --plot docs/atari5.png

Each RUN_DIR is one ``distrl train`` run on one of the five games (its ``config.yaml`` names the env
id, its ``metrics.jsonl`` holds the episodes and evaluations); several runs of a game (seeds) are
averaged. Per game, two readings of the score at the budget:

- **train**: the mean return of the last ``--episodes`` (100) training episodes that ended at or
  before the budget (the measure of the anchors below, openrlbenchmark's CleanRL runs);
- **eval**: the last evaluation (``eval/mean_return``) at or before the budget.

Each score becomes a human-normalised score in percent, ``HNS = 100 (score - random) / (human -
random)``, with the random and human scores of the standard table (Mnih et al. 2015, as DQN Zoo's
``atari_data.py`` lists them). The Atari-5 estimate of the Atari-57 median HNS (Aitchison,
Sweetser, Hutter, "Atari-5: Distilling the Arcade Learning Environment down to Five Games", ICML
2023, the Atari-5 regression without intercept) is

    log10(1 + median) = sum_i w_i log10(1 + max(HNS_i, 0))

with the weights ``WEIGHTS`` below; it needs all five games. A run that has not reached the budget
is scored at its last step, and the table says so (``short``).

The table goes to stdout; ``--csv`` writes it as CSV, ``--plot`` draws the five training curves.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from distrl import runs as distrl_runs
from distrl.runs import Run, smooth

# Random and human scores (Mnih et al. 2015, "Human-level control through deep reinforcement
# learning", the table DQN Zoo's atari_data.py carries).
RANDOM_HUMAN = {
    "BattleZone": (2360.0, 37187.5),
    "DoubleDunk": (-18.6, -16.4),
    "NameThisGame": (2292.3, 8049.0),
    "Phoenix": (761.4, 7242.6),
    "Qbert": (163.9, 13455.0),
}
# The Atari-5 regression's weights, in the order of RANDOM_HUMAN (Aitchison et al. 2023). With
# CleanRL PPO's scores below they give the 70 % the anchor is quoted at.
WEIGHTS = {"BattleZone": 0.382, "DoubleDunk": 0.068, "NameThisGame": 0.311, "Phoenix": 0.124, "Qbert": 0.080}
# CleanRL PPO at 10M agent steps, v5 with sticky actions, mean of the last 100 training episodes
# (openrlbenchmark, machado_10M).
ANCHOR_PPO = {"BattleZone": 23119.0, "DoubleDunk": -1.3, "NameThisGame": 6063.0, "Phoenix": 6741.0,
              "Qbert": 15130.0}
GAMES = tuple(RANDOM_HUMAN)


def hns(game: str, score: float) -> float:
    """Human-normalised score of ``score`` on ``game``, in percent (0: random play, 100: human)."""
    random, human = RANDOM_HUMAN[game]
    return 100.0 * (score - random) / (human - random)


def atari5_estimate(hns_by_game: dict[str, float]) -> float:
    """The Atari-57 median HNS (percent) that the five games' HNS predict (Aitchison et al. 2023).

    Raises:
        ValueError: a game of the five is missing (the estimate needs all five).
    """
    missing = [g for g in GAMES if g not in hns_by_game]
    if missing:
        raise ValueError(f"the Atari-5 estimate needs all five games; missing: {', '.join(missing)}")
    log_median = sum(WEIGHTS[g] * math.log10(1.0 + max(hns_by_game[g], 0.0)) for g in GAMES)
    return 10.0 ** log_median - 1.0


def game_of(run_dir: Path) -> str:
    """The Atari-5 game a run played, from its ``config.yaml`` (``env.id`` such as ``ALE/Qbert-v5``).

    Raises:
        ValueError: no ``config.yaml``, or the run's env is not one of the five.
    """
    try:
        env_id = distrl_runs.env_id(run_dir)
    except FileNotFoundError:
        raise ValueError(f"{run_dir}: neither a run record nor a run directory with config.yaml") from None
    name = re.sub(r"^ALE/|-v\d+$|NoFrameskip", "", env_id)
    if name not in RANDOM_HUMAN:
        raise ValueError(f"{run_dir}: env {env_id} is not an Atari-5 game ({', '.join(GAMES)})")
    return name


@dataclass
class Score:
    """One run's scores at the budget: ``steps`` the last agent step it had logged up to it."""

    train: float
    eval: float
    steps: float
    episodes: int


def score_at(run: Run, budget: float, episodes: int) -> Score:
    """The run's training score (mean of its last ``episodes`` episodes ending at or before
    ``budget`` agent steps) and eval score (last evaluation at or before it); NaN where none."""
    done = run.training.steps <= budget
    last = run.training.returns[done][-episodes:]
    evaluated = run.evaluations.steps <= budget
    evals = run.evaluations.returns[evaluated]
    steps = max([*run.training.steps[done][-1:], *run.evaluations.steps[evaluated][-1:]], default=0.0)
    return Score(float(last.mean()) if len(last) else math.nan, float(evals[-1]) if len(evals) else math.nan,
                 float(steps), len(last))


def table(runs_by_game: dict[str, list[Run]], budget: float, episodes: int) -> list[dict]:
    """Per game: the runs' mean scores and their HNS, and the two Atari-5 estimates (where all five
    games have a score), as rows of the printed table and the CSV."""
    rows = []
    for game in GAMES:
        if game not in runs_by_game:
            continue
        scores = [score_at(r, budget, episodes) for r in runs_by_game[game]]
        train = float(np.mean([s.train for s in scores]))
        evals = float(np.mean([s.eval for s in scores]))
        steps = min(s.steps for s in scores)
        rows.append({"game": game, "runs": len(scores), "agent_steps": int(steps),
                     "short": "short" if steps < budget * 0.99 else "",
                     "train": train, "train_hns": hns(game, train), "eval": evals, "eval_hns": hns(game, evals),
                     "anchor_ppo": ANCHOR_PPO[game], "anchor_ppo_hns": hns(game, ANCHOR_PPO[game])})
    per_game = list(rows)
    for reading in ("train", "eval"):
        values = {r["game"]: r[f"{reading}_hns"] for r in per_game if not math.isnan(r[f"{reading}_hns"])}
        rows.append({"game": f"Atari-5 estimate ({reading})",
                     f"{reading}_hns": atari5_estimate(values) if len(values) == len(GAMES) else math.nan})
    rows.append({"game": "Atari-5 estimate (anchor)", "anchor_ppo_hns": atari5_estimate(
        {g: hns(g, ANCHOR_PPO[g]) for g in GAMES})})
    return rows


COLUMNS = ("game", "runs", "agent_steps", "short", "train", "train_hns", "eval", "eval_hns", "anchor_ppo",
           "anchor_ppo_hns")


def _fmt(value) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:,.1f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def print_table(rows: list[dict], budget: float) -> None:
    print(f"Atari-5 at {budget:,.0f} agent steps (HNS in percent; train: mean of the last training episodes)")
    widths = {c: max(len(c), *(len(_fmt(r.get(c, ""))) for r in rows)) for c in COLUMNS}
    print("  ".join(c.ljust(widths[c]) for c in COLUMNS))
    for r in rows:
        print("  ".join(_fmt(r.get(c, "")).ljust(widths[c]) for c in COLUMNS))
    games = {r["game"] for r in rows}
    missing = [g for g in GAMES if g not in games]
    if missing:
        print(f"the Atari-5 estimate needs all five games; missing: {', '.join(missing)}")


def plot(runs_by_game: dict[str, list[Run]], out: Path, window: float) -> None:
    """One panel per game: each run's training return (mean over ``window`` agent steps) and its
    evaluations, with CleanRL PPO's 10M score as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    games = [g for g in GAMES if g in runs_by_game]
    fig, axes = plt.subplots(1, len(games), figsize=(4 * len(games), 3.6), squeeze=False)
    for ax, game in zip(axes[0], games, strict=True):
        for run in runs_by_game[game]:
            if len(run.training.steps):
                line, = ax.plot(run.training.steps / 1e6, smooth(run.training.steps, run.training.returns, window),
                                label=f"{run.name} (train)")
                ax.plot(run.evaluations.steps / 1e6, run.evaluations.returns, "o", color=line.get_color(), markersize=3)
        ax.axhline(ANCHOR_PPO[game], color="gray", linestyle="--", label="CleanRL PPO, 10M")
        ax.axhline(RANDOM_HUMAN[game][0], color="gray", linestyle=":", label="random")
        ax.set_title(game)
        ax.set_xlabel("agent steps (millions)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("episode return (raw score)")
    axes[0][0].legend(loc="best", fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+", help="run directories or run records (.csv.gz)")
    parser.add_argument("--budget", type=float, default=10_000_000, help="agent steps (default 10M = 40M frames)")
    parser.add_argument("--episodes", type=int, default=100, help="training episodes averaged (default 100)")
    parser.add_argument("--csv", type=Path, default=None, help="write the table here as CSV")
    parser.add_argument("--plot", type=Path, default=None, help="draw the training curves to this PNG")
    parser.add_argument("--window", type=float, default=250_000, help="--plot's smoothing window, in agent steps")
    args = parser.parse_args(argv)

    runs_by_game: dict[str, list[Run]] = {}
    for run_dir in args.runs:
        try:
            game = game_of(run_dir)
            run = distrl_runs.curves(run_dir, gap_minutes=10.0)
        except (ValueError, FileNotFoundError) as e:
            parser.error(str(e))
        runs_by_game.setdefault(game, []).append(run)
    rows = table(runs_by_game, args.budget, args.episodes)
    print_table(rows, args.budget)
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
    if args.plot:
        plot(runs_by_game, args.plot, args.window)
    return 0


if __name__ == "__main__":
    sys.exit(main())

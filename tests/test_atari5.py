"""scripts/atari5.py on made-up runs: the score at the budget both ways, HNS, the Atari-5 estimate."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys

import pytest
from conftest import REPO, write_run

SCRIPT = REPO / "scripts" / "atari5.py"
# CleanRL PPO's 10M scores, which the issue quotes at an Atari-5 estimate of about 70 %.
PPO = {"BattleZone": 23119.0, "DoubleDunk": -1.3, "NameThisGame": 6063.0, "Phoenix": 6741.0, "Qbert": 15130.0}


def make_run(path, game: str, train_score: float, eval_score: float, late_score: float = -1e6):
    """A run dir: 150 training episodes scoring ``train_score`` up to 10M agent steps (the first 50
    score 0), evaluations of 0 at 5M and ``eval_score`` at 10M, then episodes and an evaluation
    past 10M that score ``late_score``."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(f"seed: 1\nenv:\n  kind: atari\n  id: ALE/{game}-v5\n  frameskip: 4\n")
    records = []
    for i in range(150):
        step = int(10_000_000 * (i + 1) / 150)
        records.append({"agent_steps": step, "frames": 4 * step, "time": 1000.0 + i,
                        "charts/episodic_return": 0.0 if i < 50 else train_score})
        if i in (74, 149):  # at 5M and 10M
            records.append({"agent_steps": step, "time": 1000.0 + i,
                            "eval/mean_return": 0.0 if i == 74 else eval_score})
    for i in range(20):
        step = 10_000_000 + 1000 * (i + 1)
        records.append({"agent_steps": step, "frames": 4 * step, "time": 2000.0 + i,
                        "charts/episodic_return": late_score})
    records.append({"agent_steps": 10_020_000, "time": 2100.0, "eval/mean_return": late_score})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def run_script(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)


def read_csv(path):
    with open(path) as f:
        return {row["game"]: row for row in csv.DictReader(f)}


def test_five_games_give_both_estimates_at_the_budget(tmp_path):
    runs = [make_run(tmp_path / g, g, PPO[g], 2 * PPO[g] if g == "Qbert" else PPO[g]) for g in PPO]
    out = tmp_path / "atari5.csv"
    done = run_script(*runs, "--csv", out)
    assert done.returncode == 0, done.stderr
    rows = read_csv(out)
    qbert = rows["Qbert"]
    # the last 100 episodes up to 10M all scored the game's score; those after 10M are left out
    assert float(qbert["train"]) == pytest.approx(15130.0)
    assert float(qbert["train_hns"]) == pytest.approx(100 * (15130.0 - 163.9) / (13455.0 - 163.9))
    assert float(qbert["eval"]) == pytest.approx(30260.0)  # the 10M evaluation, not the later one
    assert int(qbert["agent_steps"]) == 10_000_000 and qbert["short"] == ""
    train_estimate = float(rows["Atari-5 estimate (train)"]["train_hns"])
    assert train_estimate == pytest.approx(70.4, abs=0.5)  # the anchor's quoted figure
    assert train_estimate == pytest.approx(float(rows["Atari-5 estimate (anchor)"]["anchor_ppo_hns"]))
    # eval: Qbert's HNS doubles, so the estimate is higher, by Qbert's weight only
    eval_estimate = float(rows["Atari-5 estimate (eval)"]["eval_hns"])
    hns_1 = 100 * (15130.0 - 163.9) / (13455.0 - 163.9)
    hns_2 = 100 * (30260.0 - 163.9) / (13455.0 - 163.9)
    expected = (1 + train_estimate) * 10 ** (0.080 * (math.log10(1 + hns_2) - math.log10(1 + hns_1))) - 1
    assert eval_estimate == pytest.approx(expected, rel=1e-6)
    assert "Atari-5 estimate (train)" in done.stdout


def test_a_smaller_budget_and_episode_count_read_earlier_episodes(tmp_path):
    runs = [make_run(tmp_path / g, g, PPO[g], PPO[g]) for g in PPO]
    out = tmp_path / "atari5.csv"
    done = run_script(*runs, "--csv", out, "--budget", 5_000_000, "--episodes", 50)
    assert done.returncode == 0, done.stderr
    phoenix = read_csv(out)["Phoenix"]
    # episodes 1-75 ended by 5M: the last 50 are 26-75, of which 26-50 scored 0
    assert float(phoenix["train"]) == pytest.approx(6741.0 * 25 / 50)
    assert float(phoenix["eval"]) == 0.0


def test_a_missing_game_is_named_and_gives_no_estimate(tmp_path):
    runs = [make_run(tmp_path / g, g, PPO[g], PPO[g]) for g in PPO if g != "Phoenix"]
    runs.append(make_run(tmp_path / "Qbert-s2", "Qbert", 0.0, 0.0))
    out = tmp_path / "atari5.csv"
    done = run_script(*runs, "--csv", out)
    assert done.returncode == 0, done.stderr
    assert "needs all five games; missing: Phoenix" in done.stdout
    rows = read_csv(out)
    assert "Phoenix" not in rows
    assert rows["Atari-5 estimate (train)"]["train_hns"] == "nan"
    assert int(rows["Qbert"]["runs"]) == 2 and float(rows["Qbert"]["train"]) == pytest.approx(15130.0 / 2)


def test_a_run_short_of_the_budget_is_marked_and_a_foreign_game_refused(tmp_path):
    short = make_run(tmp_path / "bz", "BattleZone", 5000.0, 5000.0)
    done = run_script(short, "--budget", 20_000_000)
    assert done.returncode == 0, done.stderr
    assert "short" in done.stdout.splitlines()[2]
    pong = make_run(tmp_path / "pong", "Pong", 0.0, 0.0)
    done = run_script(short, pong)
    assert done.returncode != 0 and "ALE/Pong-v5 is not an Atari-5 game" in done.stderr


def test_the_screening_table_gives_a_runs_return_per_window_and_its_last_dormant_shares(tmp_path):
    """scripts/screening.py on a run directory as distrl writes one: episodes averaged per window
    (a window without an episode says n/a), the last eval, entropy, dormant shares and feature rank,
    median SPS;
    the candidate names ``model.layer_norm`` and ``agent.pfo_coef`` when they are set."""
    candidates = {"impala": ["agent=impala"], "layer_norm": ["agent=impala", "model.layer_norm=true"],
                  "pfo": ["agent.pfo_coef=1"]}
    records = [{"agent_steps": 100, "charts/episodic_return": 1000.0},
               {"agent_steps": 400, "charts/episodic_return": 3000.0},
               {"agent_steps": 500, "charts/SPS": 900.0, "losses/entropy": -2.5, "dormant/convs.1": 0.1},
               {"agent_steps": 1300, "charts/episodic_return": 7000.0, "charts/SPS": 1100.0, "losses/entropy": -2.0,
                "dormant/convs.1": 0.3, "dormant/fc.1": 0.5, "rank/features": 87},
               {"agent_steps": 1400, "eval/mean_return": 4000.0}]
    for name, overrides in candidates.items():
        write_run(tmp_path / name, ["env.id=ALE/BattleZone-v5", "seed=2", *overrides], records)
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "screening.py"),
                          *(str(tmp_path / name) for name in candidates), "--window", "500"],
                         capture_output=True, text=True, check=True).stdout
    impala, layer_norm, pfo = out.splitlines()[-3:]
    assert impala == ("| BattleZone | impala T=20 B=4 rmsprop lr=0.0007 | 2 | 0.00M | 2,000 / n/a / 7,000 | 4,000 "
                      "| 2.00 | convs.1 0.30, fc.1 0.50 | 87 | 1,000 |")
    assert layer_norm.startswith("| BattleZone | impala T=20 B=4 rmsprop lr=0.0007 layer_norm | 2 |")
    assert pfo.startswith("| BattleZone | appo T=32 B=32 adam lr=0.00025 pfo=1 | 2 |")

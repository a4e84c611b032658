"""The repository holds code, configs, docs and compact run records, never a run: no tracked file over
1 MiB, the tracked tree within 20 MiB, no run directory or checkpoint (but the tests' own), and every
run record reads back with its provenance (distrl/runs.py)."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import pytest
from conftest import REPO

from distrl import runs

MIB = 1024 * 1024


def tracked() -> list[Path]:
    done = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"git ls-files failed: {done.stderr}")
    return [Path(p) for p in done.stdout.split("\0") if p and (REPO / p).is_file()]


def test_no_tracked_file_is_over_1_mib_and_the_tree_is_within_20_mib():
    files = tracked()
    sizes = {str(p): (REPO / p).stat().st_size for p in files}
    assert not {p: s for p, s in sizes.items() if s > MIB}
    assert sum(sizes.values()) <= 20 * MIB


def test_no_run_directory_or_checkpoint_is_tracked_but_the_tests_own():
    found = [str(p) for p in tracked() if p.parts[0] == "outputs" and p.name != ".gitkeep"
             or p.suffix in (".pt", ".pth") and p.parts[:2] != ("tests", "data")]
    assert not found


def test_every_run_record_reads_back_with_its_provenance():
    records = sorted((REPO / "docs" / "lab" / "runs").rglob(f"*{runs.RECORD_SUFFIX}"))
    assert len(records) >= 59
    for record in records:
        where = runs.provenance(record)
        assert where["run"] == runs.name(record) and where["command"] and where["machine"], record
        assert len(where["commit"]) >= 7 and where["commit"] != "unknown", record
        assert "env" in runs.config(record) and runs.metrics(record), record


def test_a_record_keeps_a_runs_metrics_and_a_torn_last_line_is_skipped(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("env:\n  id: CartPole-v1\n")
    lines = [{"agent_steps": 1024, "frames": 1024, "time": 1795788318.754494, "charts/episodic_return": 9.0},
             {"agent_steps": 2048, "frames": 2048, "time": 1795788320.0, "losses/total": 0.123456789, "finite": True},
             {"agent_steps": 2048, "frames": 2048, "time": 1795788321.5, "eval/mean_return": 500.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"agent_steps": 30')
    assert runs.metrics(run) == lines
    record = runs.write_record(run, tmp_path / "r" / "run.csv.gz", run="run", command="distrl train", machine="m",
                               commit="abcdef0")
    again = runs.write_record(run, tmp_path / "r2.csv.gz", run="run", command="distrl train", machine="m",
                              commit="abcdef0")
    assert record.read_bytes() == again.read_bytes()  # the same run, the same bytes
    back = runs.metrics(record)
    assert [r["agent_steps"] for r in back] == [1024, 2048, 2048]
    assert back[0]["time"] == pytest.approx(1795788318.75, abs=0.006) and back[1]["losses/total"] == 0.1234568
    assert back[1]["finite"] == 1 and back[2]["eval/mean_return"] == 500.0 and "eval/mean_return" not in back[0]
    assert runs.config(record) == {"env": {"id": "CartPole-v1"}}
    assert gzip.open(record, "rt").readline() == "# run: run\n"

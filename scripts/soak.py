"""Soak test: a long `distrl train` under faults, checked for lost slots, throughput and memory growth.

Runs the real command (Pong with the defaults unless other overrides are given) for ``--minutes``,
SIGKILLs one actor process every ``--kill-every`` seconds (round robin) and sends SIGUSR1 (save a
checkpoint, keep training) every ``--usr1-every`` seconds, samples the process tree's memory every
``--sample-every`` seconds, then stops the run with Ctrl-C (SIGINT) and reports:

- actor restarts (from train.log) against the kills sent, and checkpoints written on SIGUSR1;
- slots lost (the shutdown's "slot accounting" line; must be 0);
- agent steps/s in each 5-minute window (from metrics.jsonl);
- RSS and PSS of the whole process tree, and its growth from minute 5 to the end (goal: < 5 %):
  the median PSS of the last 5 minutes against that of minutes 5-10. Medians, not two samples:
  each restarted actor starts smaller and grows back, and the first evaluation (at 500k agent
  steps, about minute 6 on 2 cores) allocates its env and model copy once.

Usage::

    .venv/bin/python scripts/soak.py --minutes 30 --out docs/soak.json [-- key=value ...]

Exit code 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

from distrl import runs


def tree_memory(root: psutil.Process) -> tuple[float, float]:
    """RSS and PSS (MiB) summed over ``root`` and its descendants."""
    rss = pss = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            info = proc.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss += info.rss
        pss += getattr(info, "pss", info.rss)
    return rss / 2**20, pss / 2**20


def actor_processes(root: psutil.Process) -> list[psutil.Process]:
    found = []
    for proc in root.children(recursive=True):
        try:
            cmd = " ".join(proc.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "multiprocessing.spawn" in cmd or "spawn_main" in cmd:
            found.append(proc)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--kill-every", type=float, default=120.0, help="seconds between actor SIGKILLs")
    parser.add_argument("--usr1-every", type=float, default=300.0, help="seconds between SIGUSR1s")
    parser.add_argument("--sample-every", type=float, default=30.0, help="seconds between memory samples")
    parser.add_argument("--run-dir", default="/tmp/distrl-soak", help="the run directory (emptied first)")
    parser.add_argument("--out", help="write the report as JSON here too")
    parser.add_argument("overrides", nargs="*", help="distrl train overrides (after --)")
    args = parser.parse_args()

    run_dir = Path(args.run_dir)
    if run_dir.exists():
        subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    cmd = [sys.executable, "-m", "distrl", "train", "train.num_train_steps=1000000000", f"hydra.run.dir={run_dir}",
           *args.overrides]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    root = psutil.Process(proc.pid)
    start = time.monotonic()
    end = start + args.minutes * 60
    next_kill, next_usr1, next_sample = start + args.kill_every, start + args.usr1_every, start
    kills = usr1s = 0
    victim = 0
    samples: list[dict] = []
    while time.monotonic() < end and proc.poll() is None:
        now = time.monotonic()
        if now >= next_sample:
            rss, pss = tree_memory(root)
            samples.append({"minute": round((now - start) / 60, 2), "rss_mib": round(rss, 1), "pss_mib": round(pss, 1)})
            next_sample += args.sample_every
        if now >= next_kill:
            actors = actor_processes(root)
            if actors:
                actors[victim % len(actors)].send_signal(signal.SIGKILL)
                victim += 1
                kills += 1
            next_kill += args.kill_every
        if now >= next_usr1:
            proc.send_signal(signal.SIGUSR1)
            usr1s += 1
            next_usr1 += args.usr1_every
        time.sleep(1.0)
    crashed = proc.poll() is not None
    if not crashed:
        os.killpg(proc.pid, signal.SIGINT)
    try:
        _, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        stderr += "\n(soak: distrl did not exit within 120 s of Ctrl-C)"

    log = (run_dir / "train.log").read_text() if (run_dir / "train.log").exists() else ""
    restarts = log.count("restarted (restart")
    lost = [int(m.group(1)) for m in re.finditer(r"slot accounting: (\d+) of \d+ slots not returned", log)]
    usr1_saves = len(re.findall(r"checkpoint .*step_\d+\.pt", log))
    metrics = run_dir / "metrics.jsonl"
    records = runs.metrics(run_dir) if metrics.exists() else []
    steps = [(r["time"], r["agent_steps"]) for r in records if "charts/SPS" in r]
    windows = []
    if steps:
        t0 = steps[0][0]
        for k in range(int(args.minutes // 5) + 1):
            inside = [(t, s) for t, s in steps if t0 + 300 * k <= t < t0 + 300 * (k + 1)]
            if len(inside) >= 2:
                (ta, sa), (tb, sb) = inside[0], inside[-1]
                windows.append({"minutes": f"{5 * k}-{5 * (k + 1)}", "agent_steps_per_s": round((sb - sa) / (tb - ta))})
    growth = pss_growth(samples, args.minutes)
    report = {
        "command": " ".join(cmd), "minutes": args.minutes, "exit_code": proc.returncode, "crashed_early": crashed,
        "actor_kills": kills, "actor_restarts": restarts, "sigusr1_sent": usr1s, "checkpoints_written": usr1_saves,
        "slots_lost": sum(lost), "agent_steps_per_s_by_5_min": windows,
        "pss_growth_percent_from_minute_5": None if growth is None else round(growth, 2),
        "memory": samples, "cpu": _cpu_model(),
    }
    ok = (not crashed and proc.returncode == 130 and restarts == kills and not lost
          and growth is not None and growth < 5.0)
    report["pass"] = ok
    if not ok:
        report["stderr_tail"] = stderr[-2000:]
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if ok else 1


def pss_growth(samples: list[dict], minutes: float) -> float | None:
    """Percent growth of the median PSS over the last 5 minutes against minutes 5-10, or None if the
    run was too short to have both windows."""
    early = [s["pss_mib"] for s in samples if 5 <= s["minute"] < 10]
    late = [s["pss_mib"] for s in samples if s["minute"] >= minutes - 5]
    if minutes < 15 or not early or not late:
        return None
    return (statistics.median(late) / statistics.median(early) - 1) * 100


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} x {len(os.sched_getaffinity(0))} cores"
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())

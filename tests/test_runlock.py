"""One live run per run directory: a second holder is refused, naming the live one; a holder that
died (SIGKILL) does not block the next run. (The real command refused: tests/test_cli.py.)"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from distrl.utils.runlock import RunDirectoryBusy, RunLock

HOLD = """
import sys, time
from distrl.utils.runlock import RunLock
lock = RunLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
time.sleep(600)
"""


def hold_in_another_process(run_dir) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_holder_is_refused_until_the_first_releases(tmp_path):
    first = RunLock(tmp_path / "run")
    assert first.acquire() and first.held
    with pytest.raises(RunDirectoryBusy, match=f"live run \\(host {socket.gethostname()}, pid {os.getpid()}\\)"):
        RunLock(tmp_path / "run").acquire()
    first.release()
    second = RunLock(tmp_path / "run")
    assert second.acquire()
    second.release()


def test_a_killed_holder_does_not_block_the_next_run(tmp_path):
    holder = hold_in_another_process(tmp_path)
    try:
        with pytest.raises(RunDirectoryBusy, match=f"pid {holder.pid}\\)"):
            RunLock(tmp_path).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
    lock = RunLock(tmp_path)
    assert lock.acquire()  # the kernel released the dead holder's lock
    lock.release()

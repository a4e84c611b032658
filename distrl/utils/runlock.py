"""One live run per run directory: an OS-held lock on ``<run dir>/.distrl.lock``.

A second ``distrl train`` into the directory of a live run (the same command pasted twice, a SLURM
requeue that starts while the old job still runs) would resume from the live run's checkpoint and
both would write checkpoints and metrics into one directory. The trainer (rank 0 of a group of
ranks) takes an exclusive ``fcntl.flock`` on the lock file before it reads any checkpoint and keeps
it until training ends. The kernel releases the lock when its holder dies in any way (SIGKILL, an
out-of-memory kill), so a dead run never blocks the next one; the host and pid written into the file
only name the holder in the refusal. On a filesystem that does not offer ``flock`` (some network
filesystems, or NFS without its lock service) the run goes on unlocked, with a warning.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
from pathlib import Path

log = logging.getLogger(__name__)

LOCK_FILE = ".distrl.lock"


class RunDirectoryBusy(RuntimeError):
    """Another live process holds the run directory's lock."""


def try_flock(path: Path, holder: str):
    """Take an exclusive ``fcntl.flock`` on the file ``path`` (created if needed) without waiting,
    and write ``holder`` (who holds it, one line) into it.

    Returns:
        ``(the open file, "")`` when taken (the lock lasts until :func:`unflock` or the process's
        death), or ``(None, what the holder wrote)`` when another open file holds it.

    Raises:
        OSError: the filesystem does not offer flock (``errno`` ENOLCK, EOPNOTSUPP, ENOSYS, EINVAL).
    """
    f = open(path, "a+")  # held open as long as the lock
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        other = f.read().strip()
        f.close()
        return None, other
    except OSError:
        f.close()
        raise
    f.seek(0)
    f.truncate()
    f.write(holder + "\n")
    f.flush()
    return f, ""


def unflock(f) -> None:
    """Give up a lock taken by :func:`try_flock` (the file stays; it names the last holder)."""
    fcntl.flock(f, fcntl.LOCK_UN)
    f.close()


class RunLock:
    """The lock of one run directory, held from :meth:`acquire` to :meth:`release` (or the
    holder's death)."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._file = None

    @property
    def held(self) -> bool:
        return self._file is not None

    def acquire(self) -> bool:
        """Take the lock (creating the run directory if needed).

        Returns:
            True when held; False on a filesystem without ``flock`` (warned; the run goes on unlocked).

        Raises:
            RunDirectoryBusy: another live process holds it; the message names its host and pid.
        """
        if self._file is not None:
            return True
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._file, holder = try_flock(self.path, f"host {socket.gethostname()}, pid {os.getpid()}")
        except OSError as exc:
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                log.warning("%s: this filesystem does not offer file locks (%s); a second run started into "
                            "this directory would not be refused", self.run_dir, exc.strerror)
                return False
            raise
        if self._file is None:
            raise RunDirectoryBusy(f"{self.run_dir} is the run directory of a live run "
                                   f"({holder or 'its host and pid not yet written'}); stop it first, or give this "
                                   f"run another hydra.run.dir")
        return True

    def release(self) -> None:
        """Give the lock up (the file stays; its content names the last holder)."""
        if self._file is not None:
            unflock(self._file)
            self._file = None

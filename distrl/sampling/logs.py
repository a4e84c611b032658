"""Where log records go: every logging setup of distrl is here.

- ``distrl train`` / ``distrl eval``: Hydra sets up the console and ``train.log``; ranks other
  than 0 keep warnings on the console only (:func:`console_only`).
- The Python API (no Hydra): :func:`run_logging` logs like the command does.
- Actor processes (spawned: Hydra's setup does not reach them) send their records through a
  ``logging.handlers.QueueHandler`` on a pipe queue (:func:`log_to_queue`); one writer in the
  trainer (:class:`ActorLogWriter`) puts them in ``actors.log`` and on the console.
"""

from __future__ import annotations

import logging
import logging.handlers
import queue
import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path

from tqdm.contrib.logging import logging_redirect_tqdm

from distrl.sampling.queues import PIPE_BUF, MessageQueue

RUN_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
ACTOR_FORMAT = "[%(asctime)s][actor %(actor)s][%(levelname)s] - %(message)s"
# A record must fit one atomic pipe write with its pickle's overhead (about 600 bytes).
MAX_MESSAGE_BYTES = PIPE_BUF - 1024


class _PipeQueueHandler(logging.handlers.QueueHandler):
    """A ``QueueHandler`` that tags records with the actor's id and shortens a message too long for
    one atomic pipe write (keeping its start and its end, which says what failed)."""

    def __init__(self, log_queue: MessageQueue, actor: int):
        super().__init__(log_queue)
        self.actor = actor

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        record = super().prepare(record)
        record.actor = self.actor
        record.stack_info = None
        data = record.msg.encode()
        if len(data) > MAX_MESSAGE_BYTES:
            keep = MAX_MESSAGE_BYTES // 2 - 32
            record.msg = (data[:keep].decode(errors="ignore") + f"\n[... {len(data) - 2 * keep} bytes cut ...]\n"
                          + data[-keep:].decode(errors="ignore"))
        record.message = record.msg
        return record


def log_to_queue(log_queue: MessageQueue, level: str, actor: int) -> None:
    """In an actor process: every record at ``level`` or above goes to ``log_queue``."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(_PipeQueueHandler(log_queue, actor))
    root.setLevel(level)


class ActorLogWriter(logging.handlers.QueueListener):
    """In the trainer: one thread that writes the actors' records to ``path`` and to stderr.

    Call :meth:`start` before the actors start and :meth:`stop` after they have stopped (their last
    records are written first)."""

    def __init__(self, log_queue: MessageQueue, path: str | Path):
        formatter = logging.Formatter(ACTOR_FORMAT)
        self.handlers_owned = [logging.FileHandler(path), logging.StreamHandler(sys.stderr)]
        for handler in self.handlers_owned:
            handler.setFormatter(formatter)
        super().__init__(log_queue, *self.handlers_owned)

    def dequeue(self, block: bool):
        while True:  # the pipe queue raises Empty after each poll; the listener must keep waiting
            try:
                return self.queue.get(timeout=0.5 if block else 0.0)
            except queue.Empty:
                if not block:
                    raise

    def stop(self) -> None:
        super().stop()
        for handler in self.handlers_owned:
            handler.close()


@contextmanager
def run_logging(run_dir: Path, level: str):
    """Outside a Hydra command (the Python API), log like one: ``distrl`` messages at ``level`` to the
    console (when nothing else prints them) and to ``run_dir/train.log``."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        yield
        return
    logger = logging.getLogger("distrl")
    fmt = logging.Formatter(RUN_FORMAT)
    handlers: list[logging.Handler] = [logging.FileHandler(run_dir / "train.log")]
    if not logging.getLogger().handlers:
        handlers.append(logging.StreamHandler())
    level_before = logger.level
    logger.setLevel(level)
    for handler in handlers:
        handler.setFormatter(fmt)
        logger.addHandler(handler)
    try:
        yield
    finally:
        for handler in handlers:
            logger.removeHandler(handler)
            handler.close()
        logger.setLevel(level_before)


def above_the_bar(progress: bool):
    """While the progress bar shows, console log lines are printed above it (tqdm.write), not glued to it."""
    if not progress:
        return nullcontext()
    console = [lg for lg in (logging.getLogger(), logging.getLogger("distrl"))
               if any(type(h) is logging.StreamHandler and h.stream in (sys.stdout, sys.stderr) for h in lg.handlers)]
    return logging_redirect_tqdm(loggers=console) if console else nullcontext()


def console_only(rank: int) -> None:
    """Ranks other than 0 write nothing into the run directory: warnings and errors on the console."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler):
            root.removeHandler(handler)
    fmt = logging.Formatter(f"[%(asctime)s][rank {rank}][%(levelname)s] - %(message)s")
    for handler in root.handlers:
        handler.setFormatter(fmt)
    logging.getLogger("distrl").setLevel(logging.WARNING)

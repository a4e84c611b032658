"""Logging in one place: actors' records reach one writer through a queue; metrics never end a run."""

import logging
import multiprocessing
import shutil

import pytest

from distrl.sampling.logs import MAX_MESSAGE_BYTES, ActorLogWriter, log_to_queue
from distrl.sampling.queues import MessageQueue
from distrl.utils.telemetry import Telemetry

CTX = multiprocessing.get_context("fork")  # the child runs no torch code


def _actor_logs(log_queue: MessageQueue, actor: int) -> None:
    log_to_queue(log_queue, "INFO", actor)
    logger = logging.getLogger("distrl.sampling.actor")
    logger.debug("below the level")
    logger.info("actor %d started", actor)
    logger.warning("x" * 3 * MAX_MESSAGE_BYTES + " the end")  # longer than one atomic pipe write
    try:
        raise RuntimeError("the emulator broke")
    except RuntimeError:
        logger.exception("actor %d failed", actor)


def test_actor_records_reach_one_writer_whole_and_in_order(tmp_path, capfd):
    log_queue = MessageQueue(CTX)
    path = tmp_path / "actors.log"
    writer = ActorLogWriter(log_queue, path)
    writer.start()
    actors = [CTX.Process(target=_actor_logs, args=(log_queue, i)) for i in (3, 4)]
    for p in actors:
        p.start()
    for p in actors:
        p.join(timeout=30)
        assert p.exitcode == 0
    writer.stop()  # the records still in the queue are written first
    text = path.read_text()
    for actor in (3, 4):
        assert f"[actor {actor}][INFO] - actor {actor} started" in text
        assert f"[actor {actor}][ERROR] - actor {actor} failed" in text
    assert "below the level" not in text
    assert "RuntimeError: the emulator broke" in text  # the traceback comes along
    long_lines = [line for line in text.splitlines() if line.startswith("xxxx") or "[WARNING]" in line]
    assert any("bytes cut ..." in line for line in text.splitlines()) and text.count(" the end") == 2
    assert all(len(line) < MAX_MESSAGE_BYTES for line in long_lines)
    assert "actor 3 started" in capfd.readouterr().err  # and on the console


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # the writer thread's too
def test_metrics_that_cannot_be_written_do_not_end_the_run(tmp_path, caplog, capfd):
    """The TensorBoard directory goes away under its writer: one warning, the run goes on and
    metrics.jsonl keeps every record."""
    telemetry = Telemetry(tmp_path, total_steps=100, progress=False)
    telemetry.log({"losses/total": 1.0}, 10)
    telemetry.writer.flush()
    shutil.rmtree(tmp_path / "tb")
    with caplog.at_level(logging.WARNING):
        for step in range(20, 70, 10):
            telemetry.log({"losses/total": 1.0}, step)
        telemetry.close()  # flushes: the writer finds its directory gone here, if not before
    warnings = [r.getMessage() for r in caplog.records if "metrics: cannot write" in r.getMessage()]
    assert len(warnings) == 1 and str(tmp_path / "tb") in warnings[0]
    assert (tmp_path / "metrics.jsonl").read_text().count("losses/total") == 6
    assert "Traceback" not in capfd.readouterr().err

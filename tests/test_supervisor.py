"""The supervisor's restart budget, with real short-lived processes instead of actors: a dead actor's
slots come back and it is restarted with fresh seeds, until the budget is spent."""

import multiprocessing
import os
import signal
import threading
import time

import pytest
import torch

from distrl.learning.distributed import CollectiveFailed
from distrl.learning.thread import LearnerStats
from distrl.nn.distributions import ActionSpace
from distrl.rollout import RolloutLayout
from distrl.runtime.supervisor import ActorFailure, LearnerFailure, RankLost, RestartBudget, Workers
from distrl.sampling.context import ActorContext, ActorEnvs, ActorProcess, Collection
from distrl.sampling.slots import Channels, Slots

CTX = multiprocessing.get_context("fork")  # the stand-in actors run no torch code


def _raises(actor_id: int, ctx: ActorContext) -> None:
    """An actor whose env raises at once: it reports the traceback, as run_actor does, and exits 1."""
    trace = f"Traceback...\nRuntimeError: the emulator broke (seed {ctx.envs.seed})"
    ctx.channels.reports.errors.put((actor_id, trace))
    os._exit(1)


def _sleeps(actor_id: int, ctx: ActorContext) -> None:
    time.sleep(60)


def workers(target, max_restarts: int, window: float = 600.0):
    layout = RolloutLayout(num_steps=4, obs_shape=(3,), obs_dtype=torch.float32,
                           action_space=ActionSpace("discrete", (2,)))
    slots = Slots(layout, 8, CTX)
    channels = Channels.create(slots, CTX, 1)
    ctx = ActorContext(ActorEnvs({}, 1, 100), Collection(4), None, slots.tensors, channels, ActorProcess(os.getpid()))
    w = Workers(CTX, slots, channels, learner=None, stats=LearnerStats(), restarts=RestartBudget(max_restarts, window),
                reseed=lambda actor_id, restart: 100 + 1000 * restart, target=target)
    w.contexts = [ctx]
    w.actors = [w._spawn(0, ctx)]
    return w, slots


def finish(w: Workers) -> None:
    """Stop as the trainer does (the stand-ins ignore the stop flag: kill them first, not after 5 s)."""
    for process in w.actors:
        process.kill()
    w.stop()
    w.close()


def check_until(w: Workers, restarts: int) -> None:
    deadline = time.monotonic() + 20
    while w.restarts < restarts:
        assert time.monotonic() < deadline, f"{w.restarts} restarts"
        w.check()
        time.sleep(0.02)


def test_a_dead_actor_is_restarted_with_fresh_seeds_and_its_slots_return(caplog):
    w, slots = workers(_sleeps, max_restarts=3)
    held = [slots.free_queue.get() for _ in range(3)]
    slots.owner[held] = 0  # the actor holds three slots when it is killed
    os.kill(w.actors[0].pid, signal.SIGKILL)
    check_until(w, 1)
    assert "actor 0 died (killed by SIGKILL): restarted (restart 1 of the run), env seed 1100; 3 slot(s)" \
           in caplog.text
    assert w.actors[0].is_alive() and w.contexts[0].envs.seed == 1100
    assert slots.free_queue.qsize() == 8 and (slots.owner == -1).all()
    assert "actor 0 (pid" in w.report()[0] and "slots: 8 free, 0 full" in w.report()[1]
    finish(w)


def test_the_restart_budget_stops_an_env_that_always_fails():
    w, slots = workers(_raises, max_restarts=2)
    with pytest.raises(ActorFailure) as failure:
        check_until(w, 99)
    message = str(failure.value)
    assert "actor 0 died (RuntimeError: the emulator broke (seed 2100))" in message
    assert "after 2 actor restarts within 600 s (train.max_actor_restarts=2" in message
    assert w.restarts == 2
    finish(w)


def test_restarts_outside_the_window_do_not_count():
    w, _ = workers(_raises, max_restarts=1, window=0.3)
    for restart in range(1, 4):  # each comes after the window of the one before
        check_until(w, restart)
        time.sleep(0.4)
    finish(w)


def test_a_learner_error_is_raised_by_check():
    w, _ = workers(_sleeps, max_restarts=1)
    w.learner_errors.append(ValueError("the batch was empty"))
    with pytest.raises(LearnerFailure, match="learner raised ValueError: the batch was empty"):
        w.check()
    finish(w)


def test_a_failed_collective_is_a_lost_rank_whose_weights_are_saved():
    w, _ = workers(_sleeps, max_restarts=1)
    w.learner_errors.append(CollectiveFailed("rank 0: the other ranks did not answer for 60 s"))
    with pytest.raises(RankLost, match="rank 0: the other ranks did not answer") as lost:
        w.check()
    assert not isinstance(lost.value, LearnerFailure)  # the trainer saves after a lost rank, not after this
    finish(w)


def _last_collective(stop, seconds: float, outcome: list) -> None:
    """A learner thread in its last collective after the budget: the other rank answers after
    ``seconds``; like Ranks._wait it gives up as soon as ``stop`` is set."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if stop.is_set():
            outcome.append("abandoned")
            return
        time.sleep(0.01)
    outcome.append("finished")


@pytest.mark.parametrize("learners_finish, expected", [(30.0, "finished"), (0.0, "abandoned")])
def test_a_finished_run_lets_the_learners_end_their_last_collective(learners_finish, expected):
    # A rank that stopped its learner in the middle of the last collective left the other rank's
    # half done, and gloo aborted that process (SIGABRT) when this one closed its connections.
    w, _ = workers(_sleeps, max_restarts=1)
    outcome: list[str] = []
    thread = threading.Thread(target=_last_collective, args=(w.learner_stop, 0.5, outcome))
    thread.start()
    w.learner_threads.append(thread)
    started = time.monotonic()
    for process in w.actors:
        process.kill()
    w.stop(learners_finish=learners_finish)
    w.close()
    assert outcome == [expected]
    assert time.monotonic() - started < 10  # the wait ends when the thread does, not at learners_finish

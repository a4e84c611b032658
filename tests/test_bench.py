"""scripts/bench.py's limit model: each part's core-seconds per agent step as it spent them (its CPU time)."""

import importlib.util
from pathlib import Path

import pytest
from conftest import compose_train

from distrl.config.placement import plan

SPEC = importlib.util.spec_from_file_location("bench", Path(__file__).resolve().parent.parent / "scripts" / "bench.py")
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)


def test_each_part_is_charged_the_cpu_time_it_spent_not_its_threads():
    # the Atari default on 2 cores: 1 actor, a learner split over both cores' threads that kept them
    # 1.4 cores busy while measured (charged 1.4 / L, not 2 / L)
    placement = plan(compose_train(["num_actors=1", "learner_threads=2", "learner_split=2"]), cores=2)
    parts = (1 / 3000, 1 / 6000, 1.4 / 1500)
    model = bench.limit_model(3000.0, 6000.0, 1500.0, parts, placement, allowed=2)
    assert model["parts"] == parts and model["cost"] == pytest.approx(sum(parts))
    assert model["cores"] == 2 and model["bound"] == "cores"
    assert model["limit"] == pytest.approx(2 / sum(parts))  # 1,379
    # a run whose learner is far slower than the rest is held to L, and one of slow actors to their sampling
    assert bench.limit_model(3000.0, 6000.0, 100.0, parts, placement, allowed=16)["bound"] == "learner"
    one_thread = plan(compose_train(["num_actors=1", "learner_threads=1", "learner_split=1"]), cores=2)
    slow = bench.limit_model(300.0, 600.0, 10**6, (1 / 300, 1 / 600, 1e-6), one_thread, allowed=2)
    assert slow["bound"] == "sampling" and slow["limit"] == pytest.approx(200.0)


def test_a_part_that_waits_costs_no_cpu_and_one_that_computes_costs_its_wall_time():
    """What each figure is charged: the process's CPU seconds over the measured window (_rate)."""
    import time

    def waits() -> int:
        time.sleep(0.01)
        return 10

    def computes() -> int:  # 10 ms of this process's CPU time, however busy the machine is
        end = time.process_time() + 0.01
        while time.process_time() < end:
            pass
        return 10

    steps, wall, cpu = bench._rate(waits, 0.0, 0.3)
    assert steps >= 10 and cpu < 0.2 * wall
    steps, wall, cpu = bench._rate(computes, 0.0, 0.3)
    assert steps >= 10 and cpu >= 0.9 * (steps / 10) * 0.01  # a core-second per 1,000 agent steps

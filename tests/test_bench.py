"""scripts/bench.py's limit model: each part's core-seconds per agent step as it spent them."""

import importlib.util
from pathlib import Path

import pytest
from conftest import compose_train

from distrl.config.placement import plan

SPEC = importlib.util.spec_from_file_location("bench", Path(__file__).resolve().parent.parent / "scripts" / "bench.py")
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)


def test_a_learner_on_two_threads_spends_two_cores_per_step():
    # the Atari default on 2 cores: 1 actor, a learner split over both cores' threads
    placement = plan(compose_train(["num_actors=1", "learner_threads=2", "learner_split=2"]), cores=2)
    model = bench.limit_model(3000.0, 6000.0, 1500.0, placement, allowed=2)
    assert model["parts"] == pytest.approx((1 / 3000, 1 / 6000, 2 / 1500))
    assert model["cores"] == 2 and model["bound"] == "cores"
    assert model["limit"] == pytest.approx(2 / (1 / 3000 + 1 / 6000 + 2 / 1500))  # 1,091, not 2 x P = 1,500
    # a run whose learner is far slower than the rest is held to L, and one of slow actors to their sampling
    assert bench.limit_model(3000.0, 6000.0, 100.0, placement, allowed=16)["bound"] == "learner"
    one_thread = plan(compose_train(["num_actors=1", "learner_threads=1", "learner_split=1"]), cores=2)
    slow = bench.limit_model(300.0, 600.0, 10**6, one_thread, allowed=2)
    assert slow["bound"] == "sampling" and slow["limit"] == pytest.approx(200.0)

"""The schedule: everything a run's position means follows from its update count; periodic work."""

import pytest
from conftest import compose_train

from distrl.config.placement import plan
from distrl.learning.schedule import Every, Schedule, Throughput, piecewise_factor


def test_every_is_due_once_its_interval_has_passed_since_it_last_ran():
    every = Every(100)
    assert not every.due(99) and every.due(100)
    every.ran(130)  # late, as on the trainer's 0.25 s tick: the next is due 100 after it ran
    assert not every.due(229) and every.due(230)
    resumed = Every(100, last=500)
    assert not resumed.due(550) and resumed.due(600)


def test_the_position_follows_from_the_update_count_alone():
    cfg = compose_train(["agent=impala", "train.num_train_steps=8000", "agent.lr_warmup_steps=800"])
    schedule = Schedule.for_run(cfg, world_size=2, frameskip=4)
    assert schedule.steps_per_update == 20 * 4 * 2  # T x B x ranks
    p = schedule.at(3)
    assert (p.updates, p.agent_steps, p.frames, p.policy_version) == (3, 480, 1920, 3)
    # the lr of the next update: warm-up over 800 agent steps (counting the update's own), decay to 0 at 8000
    assert p.learning_rate == pytest.approx(cfg.agent.lr * (640 / 800) * (1 - 480 / 8000))
    assert schedule.at(50).learning_rate == 0.0
    assert schedule.updates_at(480) == 3 and schedule.updates_at(500) == 3  # a whole update, rounded down


@pytest.mark.parametrize("entropy_schedule, factor_at_2000", [
    ("constant", 1.0), ("linear", 0.75), ("[[1000,1.0],[3000,0.2]]", 0.6)])
def test_the_entropy_cost_follows_its_schedule(entropy_schedule, factor_at_2000):
    cfg = compose_train(["train.num_train_steps=8000", "num_steps=20", "batch_size=4",
                         f"agent.entropy_schedule={entropy_schedule}"])
    position = Schedule.for_run(cfg).at(25)  # 2000 agent steps
    assert position.entropy_cost == pytest.approx(cfg.agent.entropy_cost * factor_at_2000)


def test_piecewise_factor_holds_ramps_and_jumps():
    points = [[100, 1.0], [300, 0.2]]
    assert [piecewise_factor(points, s) for s in (0, 100, 200, 300, 10**6)] == pytest.approx([1, 1, 0.6, 0.2, 0.2])
    step = [[300, 1.0], [300, 0.2]]
    assert piecewise_factor(step, 299) == 1.0 and piecewise_factor(step, 300) == 0.2


def test_throughput_is_agent_steps_per_second_over_its_window():
    meter = Throughput(0, window=10.0)
    meter.points[0] = (meter.points[0][0] - 2.0, 0)  # started 2 s ago
    assert meter.add(1000) == pytest.approx(500, rel=0.05)


@pytest.mark.parametrize("cores, device, actors, threads, split", [
    (1, "cpu", 1, 1, 1), (2, "cpu", 1, 2, 2), (16, "cpu", 8, 8, 1), (48, "cpu", 24, 24, 1), (16, "cuda", 15, 1, 1),
    (48, "cuda", 47, 1, 1)])
def test_placement_sizes_a_machine_of_1_2_16_48_cores(cores, device, actors, threads, split, monkeypatch):
    """``auto`` sizes: a CPU learner takes half the cores, a CUDA learner leaves all but one to the
    actors; on 2 cores APPO's CPU learner splits its minibatches in 2 parts on both cores (IMPALA's
    does not and keeps the core the actor leaves); slots are 2 x the stepping envs + B x learners
    for IMPALA, the stepping envs + B x learners (at least one actor's unroll more) for APPO;
    actors are pinned one to a core (with synchronous stepping, the default with a CPU learner) or
    not at all (async, with CUDA)."""
    import torch

    from distrl.config import placement

    monkeypatch.setattr(placement.os, "sched_getaffinity", lambda pid: set(range(100, 100 + cores)))
    monkeypatch.setattr(placement, "resolve_device", lambda name: torch.device(device))
    p = plan(compose_train(["precision=fp32"]))
    assert (p.actors.count, p.learner_threads, p.learner_split, p.device.type) == (actors, threads, split, device)
    bf16 = plan(compose_train(["precision=bf16"]))  # the same rule (measured in both, docs/lab/benchmarks.md)
    assert (bf16.learner_split, bf16.learner_threads) == (split, threads)
    impala = plan(compose_train(["agent=impala"]))
    assert (impala.learner_split, impala.learner_threads) == (1, max(1, cores - actors))
    assert p.num_slots == actors * 16 + 32  # APPO, B=32
    assert plan(compose_train(["agent=appo", "batch_size=8"])).num_slots == actors * 16 + 8 + 8
    assert plan(compose_train(["agent=impala"])).num_slots == 2 * actors * 16 + 4
    if device == "cpu":
        assert not p.actors.async_step and p.actors.cores == tuple((100 + i,) for i in range(actors))
    else:
        assert p.actors.async_step and p.actors.cores == (None,) * actors
    assert p.actors.env_cfg["async_step"] is p.actors.async_step

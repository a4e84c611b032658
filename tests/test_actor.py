"""What an actor writes into the storages is one environment's trajectory, row by row.

Runs the real actor loop on real Pong games (in a thread of the test process),
then checks every filled slot against facts that only hold if the rows line up:
the frame stack shifts by one frame per step within an episode, ``first`` follows
the previous step's episode end, the previous action and reward recorded with a
row are the previous row's, the behaviour logits are the model's output on that
row's observation, and each slot's row 0 repeats its env's previous row T.
"""

import os
import queue
import threading
import time

import pytest
import torch
import torch.multiprocessing as mp
from conftest import compose_train

from distrl.config.placement import plan
from distrl.envs import env_spec
from distrl.nn.actor_learner import ActorLearner
from distrl.rollout import RolloutLayout
from distrl.sampling.actor import act, actor_contexts
from distrl.sampling.slots import Channels, Slots

T, N_ENVS, SLOTS_WANTED = 12, 4, 24


def one_actor(overrides: list[str], num_slots: int):
    """The policy, the slots, the channels and the context of one actor of ``N_ENVS`` envs and T steps
    (fp32: a recomputation of the stored behaviour outputs must match them exactly), to run in a thread."""
    cfg = compose_train([*overrides, f"num_steps={T}", f"envs_per_actor={N_ENVS}", "num_actors=1", "precision=fp32"])
    spec = env_spec(cfg.env)
    torch.manual_seed(0)
    policy = ActorLearner(spec.obs_shape, spec.action_space, cfg.model)
    policy.share_actor()
    ctx = mp.get_context("spawn")
    pool = Slots(RolloutLayout.for_run(cfg, spec), num_slots, ctx)
    channels = Channels.create(pool, ctx, 1, sync=bool(cfg.train.get("sync", False)))
    actor_ctx = actor_contexts(cfg, plan(cfg), policy.actor, pool, channels)[0]
    actor_ctx.process.parent_pid = os.getppid()  # the actor runs in a thread here: its "parent" is ours
    return policy, pool, channels, actor_ctx


def collect(overrides: list[str]) -> tuple[list[dict], ActorLearner]:
    policy, pool, channels, actor_ctx = one_actor(overrides, 3 * N_ENVS)
    stop = channels.stop_event
    held: list[int] = []
    errors: list[BaseException] = []

    def run():
        try:
            act(0, actor_ctx, held)
        except BaseException as exc:  # Stopped ends the loop
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    slots = []
    deadline = time.monotonic() + 120
    while len(slots) < SLOTS_WANTED:
        assert not errors, errors
        assert time.monotonic() < deadline, f"only {len(slots)} slots in 120 s"
        try:
            index = pool.full_queue.get(timeout=1)
        except queue.Empty:
            continue
        slots.append({k: v[index].clone() for k, v in pool.tensors.items()})
        pool.free_queue.put(index)
    stop.set()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert [type(e).__name__ for e in errors] == ["Stopped"]
    return slots, policy


@pytest.mark.parametrize("overrides", [
    ["env.max_episode_steps=30", "env.async_step=true"],
    ["env.max_episode_steps=30", "env.async_step=false"],
    ["env.max_episode_steps=30", "model.use_lstm=true", "model.feature_dim=32"],
    ["env.max_episode_steps=30", "env.async_step=true", "model.last_action_reward=true", "agent.pfo_anchor=behaviour"],
], ids=["async", "synchronous", "lstm", "last_action_reward_and_pfo_anchor"])
def test_slots_hold_contiguous_trajectories(overrides):
    slots, policy = collect(["env=atari", *overrides])
    ends = 0
    for slot in slots:
        obs, first = slot["obs"], slot["first"]
        ended = slot["terminated"] | slot["truncated"]
        assert torch.equal(first[1:], ended[:-1])
        for t in range(T):
            if not first[t + 1]:
                assert torch.equal(obs[t + 1][:-1], obs[t][1:]), f"frame stack breaks at row {t + 1}"
        ends += int(ended[:-1].sum())
        # The action and reward before each row: the previous row's within an episode, 0 at its start.
        after = ~first[1:]
        assert torch.equal(slot["last_action"][1:][after], slot["action"][:-1][after])
        assert torch.equal(slot["last_reward"][1:][after], slot["reward"][:-1][after])
        assert (slot["last_action"][first] == 0).all() and (slot["last_reward"][first] == 0).all()
        # The learner's view: the stored initial LSTM state, `first` flags and previous actions and
        # rewards reproduce the behaviour policy.
        core = (slot["core_h"].unsqueeze(1), slot["core_c"].unsqueeze(1)) if "core_h" in slot else ()
        with torch.no_grad():
            logits, baseline, _, preactivations = policy.actor(
                obs.unsqueeze(1), first.unsqueeze(1), core, slot["last_action"].unsqueeze(1),
                slot["last_reward"].unsqueeze(1), with_preactivations=True)
        torch.testing.assert_close(slot["policy_params"], logits[:, 0], rtol=1e-4, atol=1e-4)
        if "pfo_anchor" in str(overrides):  # PFO's anchor from the actors: the features they acted on
            torch.testing.assert_close(slot["behaviour_preactivations"], preactivations[:, 0], rtol=1e-4, atol=1e-4)
        else:
            assert "behaviour_preactivations" not in slot
        torch.testing.assert_close(slot["baseline"], baseline[:, 0], rtol=1e-4, atol=1e-4)
        truncated_rows = slot["truncated"][:-1] & ~slot["terminated"][:-1]
        assert (slot["truncation_value"][:-1][truncated_rows] != 0).all()
        assert (slot["truncation_value"][:-1][~truncated_rows] == 0).all()
    assert ends > 0  # the 30-step time limit put episode ends into the slots

    # Each slot's row 0 is the row T of the previous slot of the same env (``env_id``, which RE3's
    # memories follow); the first slot of each env excepted.
    previous: dict[int, dict] = {}
    for slot in slots:
        env = int(slot["env_id"])
        if env in previous:
            earlier = previous[env]
            assert torch.equal(earlier["obs"][T], slot["obs"][0]) and earlier["action"][T] == slot["action"][0]
            assert torch.equal(earlier["policy_params"][T], slot["policy_params"][0])
        previous[env] = slot
    assert sorted(previous) == list(range(N_ENVS))


def test_a_synchronous_actor_acts_each_batch_with_the_weights_of_the_update_before_it():
    """train.sync=true, each env's share of a batch two rollouts (1 actor x 4 envs, B=8): the actor
    hands in exactly one batch, waits, and acts the next one, row 0 included, with the weights
    published with the new policy version (here the test plays the learner)."""
    policy, pool, channels, actor_ctx = one_actor(["experiment=mujoco", "env.id=Pendulum-v1",
                                                   f"batch_size={2 * N_ENVS}", "train.sync=true"], 4 * N_ENVS)
    assert actor_ctx.collection.rollouts_per_update == 2
    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: _act_catching(actor_ctx, errors), daemon=True)
    thread.start()
    try:
        for version in range(3):
            batch = [pool.full_queue.get(timeout=60) for _ in range(2 * N_ENVS)]
            with pytest.raises(queue.Empty):  # nothing more until the update: the actor waits
                pool.full_queue.get(timeout=0.5)
            for index in batch:
                slot = {k: v[index] for k, v in pool.tensors.items()}
                assert int(slot["policy_version"]) == version
                with torch.no_grad():
                    params, _, _ = policy.actor(slot["obs"][:T].unsqueeze(1), slot["first"][:T].unsqueeze(1))
                torch.testing.assert_close(slot["policy_params"][:T], params[:, 0], rtol=1e-5, atol=1e-5)
                pool.free_queue.put(index)
            with torch.no_grad():  # the learner's update: new weights, then the new version
                for p in policy.actor.parameters():
                    p.add_(0.1 * torch.randn_like(p))
            channels.policy_version.publish(version + 1)
    finally:
        channels.stop_event.set()
        thread.join(timeout=30)
    assert [type(e).__name__ for e in errors] == ["Stopped"]


def test_a_stopped_actor_ends_within_a_step_not_at_its_slots_end():
    """Stopped in the middle of its slots (a slow env, 200 ms a step; 3 slots of T = 12 rows free for
    each of its 4 envs: 7 s of stepping or more), the actor ends after the step it is in."""
    _, pool, channels, actor_ctx = one_actor(["experiment=cartpole", "env.id=failing_env:SlowSteps-v0"], 3 * N_ENVS)
    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: _act_catching(actor_ctx, errors), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not channels.reports.heartbeat[0] and time.monotonic() < deadline:  # its first step is under way
        time.sleep(0.01)
    time.sleep(0.5)
    stopped_at = time.monotonic()
    channels.stop_event.set()
    thread.join(timeout=30)
    assert time.monotonic() - stopped_at < 2.0
    assert [type(e).__name__ for e in errors] == ["Stopped"]
    assert pool.full_queue.qsize() == 0  # no slot was finished: each env was a few rows into its first


def _act_catching(actor_ctx, errors: list) -> None:
    try:
        act(0, actor_ctx, [])
    except BaseException as exc:  # Stopped ends the loop
        errors.append(exc)


def test_a_new_per_step_quantity_is_its_declaration_and_its_writer(monkeypatch):
    """A made-up per-step quantity (each observation's norm) needs two edits: its declaration
    (distrl.rollout) and the part that writes it (here the policy step's output, as
    distrl.sampling.policy.step_policy would give it). The real actor stores it, the slots gather it,
    both kinds of minibatches carry it row for row with the observations, and a loss reads it."""
    from distrl.learning.plan import Steps, Unrolls
    from distrl.rollout import KEYS, BatchKey, Rows, Writer, declare
    from distrl.sampling import actor as actor_module

    step_policy = actor_module.step_policy

    def with_norm(model, obs, *args, **kwargs):  # the writer: one more entry of the policy's output
        out, seen = step_policy(model, obs, *args, **kwargs)
        return {**out, "obs_norm": obs.float().norm(dim=-1)}, seen

    monkeypatch.setattr(actor_module, "step_policy", with_norm)
    overrides = ["experiment=mujoco", "env.id=Pendulum-v1"]
    _, _, refused, undeclared = one_actor(overrides, 4 * N_ENVS)  # written, not declared: the actor stops, naming it
    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: _act_catching(undeclared, errors), daemon=True)
    thread.start()
    thread.join(timeout=30)
    refused.stop_event.set()  # (an actor that dropped the key would still be running)
    thread.join(timeout=30)
    assert [type(e).__name__ for e in errors] == ["UndeclaredKeyError"] and "'obs_norm'" in str(errors[0])

    monkeypatch.setattr("distrl.rollout.KEYS", dict(KEYS))  # the declaration, undone after the test
    declare(BatchKey("obs_norm", Rows.T_PLUS_1, Writer.ACTING, (), torch.float32, doc="|x_t|"))
    _, pool, channels, actor_ctx = one_actor(overrides, 4 * N_ENVS)
    assert "obs_norm" in pool.tensors
    errors = []
    thread = threading.Thread(target=lambda: _act_catching(actor_ctx, errors), daemon=True)
    thread.start()
    try:
        full = [pool.full_queue.get(timeout=60) for _ in range(2 * N_ENVS)]
    finally:
        channels.stop_event.set()
        thread.join(timeout=30)
    batch = pool.gather(full, torch.device("cpu"))
    assert batch["obs_norm"].shape == (T + 1, 2 * N_ENVS)

    def loss(minibatch):  # a loss that reads the new key: 0 when it lines up with the observations
        return (minibatch["obs_norm"] - minibatch["obs"].norm(dim=-1)).abs().max()

    generator = torch.Generator().manual_seed(0)
    for minibatches in (Steps(4), Unrolls(2)):
        for minibatch in minibatches.split(batch, generator):
            assert loss(minibatch) < 1e-5

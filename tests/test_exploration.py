"""Exploration: the sparse-reward diagnostic, which IMPALA solves with an intrinsic reward and not
without, through the real ``distrl train``."""

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import DistrlProcess, finish_all, metrics

import distrl.envs  # noqa: F401  (registers the diagnostic ids)
from distrl.envs.sparse import forward_actions

BUDGET = 200000  # agent steps: on 3 seeds each, rnd solved it by 31k-152k, re3 by 21k (docs/lab/exploration.md)


def test_the_chain_pays_only_at_its_end_and_random_play_almost_never_gets_there():
    env = gym.make("distrl/SparseChain-v1")
    forward = forward_actions(40)
    assert 10 < forward.sum() < 30 and any(forward[:-1] == forward[1:])  # neither constant nor alternating
    obs, _ = env.reset(seed=0)
    assert obs.shape == (40,) and obs[0] == 1.0 and obs.sum() == 1.0
    total, steps, done = 0.0, 0, False
    while not done:  # the combination: 39 steps
        obs, reward, terminated, truncated, _ = env.step(forward[int(obs.argmax())])
        total, steps, done = total + reward, steps + 1, terminated or truncated
    assert (total, steps, terminated) == (1.0, 39, True)
    for action in (0, 1):  # one action throughout: never past the first cell whose combination differs
        obs, _ = env.reset(seed=0)
        for _ in range(80):
            obs, reward, terminated, truncated, _ = env.step(action)
            assert reward == 0.0 and not terminated
        assert truncated and obs.argmax() <= np.flatnonzero(forward != action)[0]

    # random play: the chance of reaching cell 39 within 80 steps, by dynamic programming over the
    # cells (a random walk that stays put at cell 0 when it steps left there)
    p = np.zeros(40)
    p[0], reached = 1.0, 0.0
    for _ in range(80):
        q = np.zeros(40)
        q[1:] += 0.5 * p[:-1]
        q[:-1] += 0.5 * p[1:]
        q[0] += 0.5 * p[0]
        reached += q[39]
        q[39] = 0.0
        p = q
    assert reached == pytest.approx(1.42e-5, rel=0.01)  # 1 episode in 70,000; the budget below plays about 600


def successes(run_dir: Path) -> int:
    """Training episodes that reached the end of the chain."""
    records = metrics(run_dir)
    return sum(r.get("charts/episodic_return", 0.0) > 0 for r in records)


def evals(run_dir: Path) -> list[float]:
    records = metrics(run_dir)
    return [r["eval/mean_return"] for r in records if "eval/mean_return" in r]


@pytest.mark.long
@pytest.mark.timeout(900)
def test_an_intrinsic_reward_solves_the_sparse_chain_and_none_does_not(tmp_path):
    """``experiment=sparse_chain`` for 200k agent steps (about 40 s each alone on 2 cores): with ``rnd`` and
    with ``re3`` the agent finds the reward again and again and its evaluations rise above 0; without
    an intrinsic reward it never finds it (``rnd``: see below). The three runs go at once, in fp32 on any CPU:
    253 s on an idle AVX2-only EPYC, 345 s beside two Atari runs, so the guard against a hang is 840 s."""
    procs = {name: DistrlProcess(["train", "experiment=sparse_chain", f"intrinsic={name}", "precision=fp32",
                                  f"train.num_train_steps={BUDGET}", f"hydra.run.dir={tmp_path / name}"])
             for name in ("none", "rnd", "re3")}
    results = dict(zip(procs, finish_all(list(procs.values()), timeout=840), strict=True))
    for name, done in results.items():
        assert done.returncode == 0, f"{name}: {done.stderr[-3000:]}"
        assert done.alive_children() == []
    # Random play reaches the end in 1 episode of 70,000 (above): the runs play about 2,500 each, so
    # 20 successful training episodes cannot be luck. An untrained policy drifts from uniform with
    # nothing to steer it, so a lucky episode can be likelier than that: CI once saw 1 for none, its
    # evaluations at 0. "Does not solve it" is therefore no evaluation above 0 and fewer than 5
    # successes. rnd is run and its metrics checked, but whether it finds the end within 200k is not
    # asserted: run this way it did in 1 of 3 tries (alone, in bf16, on 3 of 3 seeds;
    # docs/lab/exploration.md), and a test must not pass or fail by chance.
    assert successes(tmp_path / "none") < 5 and max(evals(tmp_path / "none")) == 0.0
    assert successes(tmp_path / "re3") >= 20 and max(evals(tmp_path / "re3")) > 0.0
    # the chain's env.success_above (0) makes the success rates of training and evaluations
    for name in ("none", "re3"):
        records = metrics(tmp_path / name)
        train_rates = [r["charts/success_rate"] for r in records if "charts/success_rate" in r]
        eval_rates = [r["eval/success_rate"] for r in records if "eval/success_rate" in r]
        assert train_rates and len(eval_rates) == len(evals(tmp_path / name))
        assert (max(eval_rates) > 0) == (name == "re3")
    assert max(train_rates) > 0  # re3's
    records = metrics(tmp_path / "rnd")
    logged = [r for r in records if "charts/intrinsic_reward" in r]
    assert logged and all({"charts/intrinsic_reward_raw", "charts/intrinsic_coef", "losses/intrinsic"} <= set(r)
                          for r in logged)
    assert all(r["charts/intrinsic_coef"] == pytest.approx(0.1) for r in logged)


def test_minigrid_gives_its_view_as_uint8_cells_to_a_network_that_fits_it():
    from conftest import compose_train

    from distrl.config.schema import ConfigError
    from distrl.envs import env_spec, make_vector_env
    from distrl.nn.actor_critic import ActorCritic
    from distrl.runtime.preflight import validate

    cfg = compose_train(["experiment=minigrid", "env.id=MiniGrid-DoorKey-16x16-v0"])
    validate(cfg)
    spec = env_spec(cfg.env)
    assert spec.obs_shape == (3, 7, 7) and spec.is_image and spec.action_space.nvec == (7,)
    env = make_vector_env(cfg.env, 2)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (2, 3, 7, 7) and obs.dtype == np.uint8 and 0 < obs.max() <= 10
    env.close()
    model = ActorCritic(spec.obs_shape, spec.action_space, cfg.model)
    logits, values, _ = model(torch.from_numpy(obs).unsqueeze(0), torch.ones(1, 2, dtype=torch.bool))
    assert logits.shape == (1, 2, 7) and values.shape == (1, 2)
    with pytest.raises(ConfigError, match="^model.encoder='nature_cnn' is not allowed: one that takes images of 7 "
                                          "pixels a side: impala_resnet, minigrid_cnn$"):
        validate(compose_train(["env=minigrid"]))


def test_the_exploration_table_gives_steps_to_the_target_against_none_on_the_same_seed(tmp_path):
    """scripts/exploration_table.py on run directories as distrl writes them: the first evaluation at
    or above the target, the last success rate and intrinsic share, and a module's steps over
    ``none``'s on its seed (inf where only ``none`` got there); then a row per setting."""
    import subprocess
    import sys

    from conftest import REPO, write_run

    def run(name, overrides, evals):
        records = [{"agent_steps": step, "eval/mean_return": value} for step, value in evals]
        records.append({"agent_steps": evals[-1][0], "charts/SPS": 2000.0, "charts/success_rate": 0.5,
                        "charts/intrinsic_share": 0.25})
        return write_run(tmp_path / name, ["experiment=minigrid", *overrides], records)

    paths = [run("none-s1", ["seed=1"], [(100_000, 0.2), (200_000, 0.91), (300_000, 0.95)]),
             run("e3b-s1", ["seed=1", "intrinsic=e3b"], [(100_000, 0.5), (300_000, 0.92)]),
             run("e3b-s2", ["seed=2", "intrinsic=e3b"], [(100_000, 0.1)]),
             run("re3-s1", ["seed=1", "intrinsic=re3"], [(100_000, 0.3)])]
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "exploration_table.py"), *paths],
                         capture_output=True, text=True, check=True).stdout
    rows = {tuple(cell.strip() for cell in line.split("|")[2:5]): line for line in out.splitlines()[2:]}
    e3b = "e3b coef=0.01 episodic norm=rewards"
    agent = "appo lr=0.00025 ent=0.001 raw-adv"
    assert rows[(e3b, agent, "1")].endswith("| 0.30M | 0.30M | 0.92 | 0.92 | 0.50 | 0.25 | 2,000 | 1.50 |")
    assert rows[(e3b, agent, "2")].endswith("| 0.10M | not | 0.10 | 0.10 | 0.50 | 0.25 | 2,000 |  |")
    re3 = rows[("re3 coef=0.05 norm=returns", agent, "1")]
    assert re3.endswith("| not | 0.30 | 0.30 | 0.50 | 0.25 | 2,000 | inf |")
    assert rows[("none", agent, "1")].endswith("| 0.30M | 0.20M | 0.95 | 0.95 | 0.50 | 0.25 | 2,000 |  |")
    assert f"| **DoorKey-8x8** | **{e3b}** | {agent} | 1 of 2 solved | | median 0.30M |" in out


def test_the_learning_curve_draws_success_rates_where_the_env_defines_success(tmp_path):
    """scripts/learning_curve.py --success on run directories as distrl writes them: each
    evaluation's eval/success_rate, and the share of training episodes above env.success_above
    smoothed over the window; a run whose env has no success_above is refused with its path."""
    import subprocess
    import sys

    from conftest import REPO, write_run

    def episode(step, ret):
        return {"agent_steps": step, "time": step / 1000, "charts/episodic_return": ret, "charts/episodic_length": 9}

    doorkey = write_run(tmp_path / "dk", ["experiment=minigrid"], [
        episode(100, 0.0), episode(200, 0.8), episode(300, 0.0), episode(400, 0.9),
        {"agent_steps": 400, "time": 0.4, "eval/mean_return": 0.45, "eval/success_rate": 0.5}])
    out = tmp_path / "dk.png"
    script = [sys.executable, str(REPO / "scripts" / "learning_curve.py")]
    subprocess.run([*script, "--success", "--window", "200", "--setting", "e3b", doorkey, "--out", str(out)],
                   check=True, capture_output=True)
    rows = [row.split(",") for row in out.with_suffix(".csv").read_text().splitlines()[1:]]
    assert [float(r[5]) for r in rows if r[2] == "eval"] == [0.5]
    train = [(float(r[3]), float(r[5])) for r in rows if r[2] == "train"]
    assert train[0] == (100.0, 0.0) and train[-1] == (400.0, 0.5)  # episodes at 300 and 400: 1 of 2

    cue = write_run(tmp_path / "cue", ["experiment=image_cue"], [episode(100, 20.0)])
    refused = subprocess.run([*script, "--success", cue, "--out", str(tmp_path / "cue.png")],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and f"{cue}: the run's env has no env.success_above" in refused.stderr


def test_an_rllte_log_becomes_a_record_as_distrl_writes_them(tmp_path):
    """scripts/rllte_record.py on a CSV as rllte's Logger writes it (its keys sorted, a row per logged
    update): the return over the x100 of its env, the env's id and success threshold, the provenance."""
    import csv
    import subprocess
    import sys

    from conftest import REPO

    from distrl import runs

    log = tmp_path / "run" / "logs" / "PPO_MiniGrid-DoorKey-16x16-v0_e3b_s1" / "2026-12-08-01-00-00" / "train.log"
    log.parent.mkdir(parents=True)
    rows = [{"step": 8192 * update, "episode": 256 * update, "episode_length": length, "episode_reward": reward,
             "intrinsic_episode_reward": 0.01, "fps": 1300.0, "total_time": 6.3 * update}
            for update, length, reward in ((80, 640.0, 0.0), (81, 612.5, 45.5))]
    with log.open("w") as f:
        writer = csv.DictWriter(f, fieldnames=sorted(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    dest = tmp_path / "e3b-rllte-s1.csv.gz"
    subprocess.run([sys.executable, str(REPO / "scripts" / "rllte_record.py"), str(tmp_path / "run"), "--dest",
                    str(dest), "--machine", "a machine", "--command", "scripts/rllte_reference.sh run e3b 663552 1"],
                   check=True, capture_output=True)
    got = runs.metrics(dest)
    assert [r["agent_steps"] for r in got] == [655_360, 663_552]
    assert [r["charts/episodic_return"] for r in got] == pytest.approx([0.0, 0.455])
    assert [r["charts/episodic_length"] for r in got] == [640.0, 612.5] and got[1]["time"] == pytest.approx(510.3)
    assert runs.env_id(dest) == "MiniGrid-DoorKey-16x16-v0" and runs.config(dest)["env"]["success_above"] == 0.0
    assert runs.provenance(dest)["command"] == "scripts/rllte_reference.sh run e3b 663552 1"

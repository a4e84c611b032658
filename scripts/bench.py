"""Throughput benchmark of distrl on this machine, with the same Hydra overrides as ``distrl train``.

    python scripts/bench.py env=atari num_actors=2 envs_per_actor=8
    python scripts/bench.py --seconds 30 --compile env=atari

Each figure runs for ``--seconds`` of wall time after ``--warmup`` seconds and
is printed as one JSON line; a summary table follows. Figures, in agent steps/s:

  E  env only: the configured envs with their preprocessing and random actions,
     spread over the same processes as training (num_actors x envs_per_actor);
  I  inference only: the actor model's forward pass on the actors' batch shape,
     one thread per process, in num_actors processes;
  S  sampling: the real actor processes (env, inference, slots writes) with a
     learner that only returns slots to the free queue;
  L  learning: learner updates on full storages with no actors running (T x B per update;
     with train.prefetch=true the next batch is copied beside each update);
  T  end to end: the real ``distrl train`` command (agent steps/s and frames/s), with
     its peak memory (sum of PSS over the process tree), mean policy lag and the cores busy
     over the measured part: the actor processes' together, the trainer process's (learners). With
     ``--ranks 1 2 4``: T with each number of ranks (``distributed.nproc_per_node``, the
     machine's cores split among them), T_N, and the scaling efficiency T_N / (N x T_1).

With ``--precisions fp32 bf16`` every figure is measured with each ``precision``, the two
interleaved in every round (``--repeats``), and the ratios follow; ``--variant 'A=1' --variant
'A=2 B=3'`` does the same for any sets of overrides.

Limit model (docs/lab/benchmarks.md, "The limit model"): each part's core-seconds per agent step as
it spent them when measured: the CPU time of its processes (every thread) over the measured window,
over the agent steps it did (a learner on two threads that keeps them busy 70 % of the time is
charged 1.4 cores, not 2). An agent step costs c = c_E + c_I + c_L core-seconds, and a run of C cores
(its processes' threads, at most the cores the command may use) does at most C / c agent steps/s; no
faster than its actors sample, P_S = 1 / (1/E + 1/I), nor than its learner learns, L. The limit is
the least of the three, and S/P_S and T/limit say how close distrl runs to what its parts allow.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import torch
import torch.multiprocessing as mp
from omegaconf import OmegaConf

from distrl import runs
from distrl.config.placement import plan
from distrl.runtime.preflight import compose_config


# ---------------------------------------------------------------- E and I workers (spawned)
def _rate(step, warmup: float, seconds: float) -> tuple[int, float, float]:
    """Call ``step()`` (it returns the agent steps it did) for ``warmup`` + ``seconds``; of the
    measured part: the agent steps, its wall seconds and the process's CPU seconds (all its threads)."""
    start = time.perf_counter()
    while time.perf_counter() - start < warmup:
        step()
    steps, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        steps += step()
    return steps, time.perf_counter() - start, time.process_time() - cpu


def _env_worker(env_cfg: dict, num_envs: int, seed: int, cores, warmup: float, seconds: float, out) -> None:
    from distrl.envs import make_vector_env
    from distrl.sampling.actor import pin_process

    pin_process(cores)  # as distrl train pins the actor this worker stands in for
    torch.set_num_threads(1)
    env = make_vector_env(OmegaConf.create(env_cfg), num_envs, num_threads=1)
    env.reset(seed=seed)
    env.action_space.seed(seed)

    def step() -> int:  # random actions of the env's own space (Discrete, MultiDiscrete or Box)
        env.step(env.action_space.sample())
        return num_envs

    out.put(_rate(step, warmup, seconds))
    env.close()


def _inference_worker(obs_shape, obs_dtype: str, action_space, model_cfg: dict, batch: int, cores,
                      precision: str, warmup: float, seconds: float, out) -> None:
    from distrl.nn.actor_critic import ActorCritic
    from distrl.nn.precision import autocast
    from distrl.runtime.evaluator import inference_copy
    from distrl.sampling.actor import pin_process

    pin_process(cores)
    torch.set_num_threads(1)
    # as the actors hold it: bf16 weights for bf16 (ActorLearner.share_actor)
    model = inference_copy(ActorCritic(tuple(obs_shape), action_space, OmegaConf.create(model_cfg)), "cpu", precision)
    if obs_dtype == "uint8":
        obs = torch.randint(0, 255, (batch, *obs_shape), dtype=torch.uint8)
    else:
        obs = torch.randn(batch, *obs_shape)
    first = torch.zeros(batch, dtype=torch.bool)
    core = model.initial_state(batch)
    space = model.action_space  # the previous action, of the space's shape and dtype
    last_action = torch.zeros((batch, *space.action_shape), dtype=space.action_dtype)
    last_reward = torch.zeros(batch)

    def step() -> int:
        with autocast(precision):
            model.act(obs, first, core, False, last_action, last_reward)
        return batch

    out.put(_rate(step, warmup, seconds))


def _run_workers(target, argsets, timeout: float) -> tuple[float, float]:
    """The workers' agent steps/s together, and the core-seconds they spent per agent step."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, out), daemon=True) for args in argsets]
    for p in procs:
        p.start()
    measured = [out.get(timeout=timeout) for _ in procs]  # (steps, wall seconds, CPU seconds) each
    for p in procs:
        p.join()
    return (float(sum(steps / wall for steps, wall, _ in measured)),
            sum(cpu for _, _, cpu in measured) / sum(steps for steps, _, _ in measured))


def bench_env(cfg, spec, args) -> tuple[float, float]:
    env_cfg = OmegaConf.to_container(cfg.env, resolve=True)
    cores = plan(cfg).actors.cores
    return _run_workers(_env_worker, [(env_cfg, cfg.envs_per_actor, 1000 * i, cores[i], args.warmup, args.seconds)
                                      for i in range(len(cores))], args.warmup + args.seconds + 120)


def bench_inference(cfg, spec, args) -> tuple[float, float]:
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    placement = plan(cfg)
    dtype = "uint8" if spec.obs_dtype == np.uint8 else "float32"
    return _run_workers(_inference_worker, [(list(spec.obs_shape), dtype, spec.action_space, model_cfg,
                                             cfg.envs_per_actor, c, placement.actors.precision, args.warmup,
                                             args.seconds) for c in placement.actors.cores],
                        args.warmup + args.seconds + 120)


# ---------------------------------------------------------------- S: real actors, null learner
def bench_sampling(cfg, spec, args) -> float:
    from distrl.intrinsic import intrinsic_for_run
    from distrl.nn.actor_learner import ActorLearner
    from distrl.rollout import RolloutLayout
    from distrl.sampling.actor import actor_contexts, run_actor
    from distrl.sampling.slots import Channels, Slots

    ctx = mp.get_context("spawn")
    placement = plan(cfg)
    policy = ActorLearner(spec.obs_shape, spec.action_space, cfg.model,
                          return_norm=bool(cfg.agent.normalize_rewards),
                          value_norm=bool(cfg.agent.normalize_values))
    policy.share_actor(actor_precision=placement.actors.precision)
    slots = Slots(RolloutLayout.for_run(cfg, spec), placement.num_slots, ctx)
    channels = Channels.create(slots, ctx, placement.actors.count, sync=bool(cfg.train.get("sync", False)))
    stop, episodes = channels.stop_event, channels.reports.episodes
    intrinsic = intrinsic_for_run(cfg, spec, placement.stepping)  # e3b's bonus is computed in the actors
    bonus = intrinsic.actor_bonus if intrinsic is not None else None
    procs = []
    for i, actx in enumerate(actor_contexts(cfg, placement, policy.actor, slots, channels, log_level="WARNING",
                                            bonus=bonus)):
        p = ctx.Process(target=run_actor, args=(i, actx), daemon=True)
        p.start()
        procs.append(p)
    filled, start, measuring = 0, time.perf_counter(), False
    try:
        while True:
            now = time.perf_counter()
            if not measuring and now - start >= args.warmup + 10:  # + process start-up
                measuring, filled, start = True, 0, now
            if measuring and now - start >= args.seconds:
                break
            try:
                index = slots.full_queue.get(timeout=0.5)
            except queue.Empty:
                continue
            slots.free_queue.put(index)
            filled += 1
            while True:
                try:
                    episodes.get_nowait()
                except queue.Empty:
                    break
        rate = filled * cfg.num_steps / (time.perf_counter() - start)
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return rate


# ---------------------------------------------------------------- L: learner only
def bench_learner(cfg, spec, args, compile_model: bool = False) -> tuple[float, float]:
    """In a process of its own, like the other figures; with ``--profile`` (not for the compiled
    figure) ``torch.profiler``'s table of the updates after the measured ones is written there."""
    compile_model = compile_model or bool(cfg.train.th_compile)  # --compile, or train.th_compile=true given
    profile = None if compile_model else args.profile
    return _run_workers(_learner_worker, [(OmegaConf.to_container(cfg, resolve=True), spec, compile_model,
                                           args.warmup, args.seconds, profile, args.profile_updates)],
                        args.warmup + args.seconds + 600)


def _learner_worker(cfg_dict: dict, spec, compile_model: bool, warmup: float, seconds: float,
                    profile: str | None, profile_updates: int, out) -> None:
    """The learner's updates on B slots of random data, gathered again for each update; with
    ``train.prefetch=true`` through the learner thread's own :class:`BatchSource`, which copies the
    next batch beside the update from twice B slots that a thread here puts back on the full
    queue as soon as they are freed (so that figure also holds the queues' traffic)."""
    from distrl.learning.batches import BatchSource
    from distrl.learning.learner import make_learner, make_optimizer
    from distrl.learning.schedule import Schedule
    from distrl.learning.split import split_step, torch_threads
    from distrl.learning.step import StepOptions
    from distrl.nn.actor_learner import ActorLearner
    from distrl.rollout import RolloutLayout
    from distrl.sampling.slots import Slots

    cfg = OmegaConf.create(cfg_dict)
    placement = plan(cfg)
    device = placement.device
    policy = ActorLearner(spec.obs_shape, spec.action_space, cfg.model,
                          return_norm=bool(cfg.agent.normalize_rewards),
                          value_norm=bool(cfg.agent.normalize_values)).to(device)
    policy.share_actor(actor_precision=placement.actors.precision)
    cfg.train.num_train_steps = 10**12
    schedule = Schedule.for_run(cfg)
    steps_per_update = schedule.steps_per_update
    optimizer = make_optimizer(policy, cfg.agent)
    options = StepOptions(device, placement.precision, cfg.train.compile_mode if compile_model else None,
                          split_step(placement))
    learner = make_learner(policy, optimizer, schedule, cfg.agent, options)
    torch.set_num_threads(torch_threads(learner.optimizer_step.split, placement.learner_threads))
    prefetch = bool(cfg.train.prefetch)
    num_slots = max(cfg.batch_size, 2) * (2 if prefetch else 1)
    slots = Slots(RolloutLayout.for_run(cfg, spec), num_slots, mp.get_context("spawn"))
    buf = slots.tensors
    if spec.obs_dtype == np.uint8:
        buf["obs"].random_(0, 255)
    else:
        buf["obs"].normal_()
    space = spec.action_space
    if space.kind == "box":  # a Gaussian policy of mean 0 and std 1 and its samples: finite ratios
        buf["action"].normal_()
        buf["policy_params"].zero_()
    else:
        buf["action"].random_(0, min(space.nvec))
        buf["policy_params"].normal_()
    buf["reward"].normal_()
    indices = list(range(cfg.batch_size))
    stop = threading.Event()

    def recycle() -> None:  # the actors' part: every freed slot is full again at once
        while not stop.is_set():
            try:
                slots.full_queue.put(slots.free_queue.get(timeout=0.5))
            except queue.Empty:
                continue

    if prefetch:
        for index in range(num_slots):
            slots.full_queue.put(index)
        threading.Thread(target=recycle, daemon=True).start()
        source = BatchSource(slots, cfg.batch_size, device, stop, {}, "bench", prefetch=True)

    def step() -> int:
        batch = source.next().tensors if prefetch else slots.gather(indices, device)
        learner.update(batch)  # .item() of the losses synchronises CUDA
        return steps_per_update

    measured = _rate(step, warmup + (30 if compile_model else 0), seconds)
    if profile:
        write_profile(step, profile_updates, device, Path(profile))
    stop.set()
    if prefetch:
        source.close()
    slots.close()
    out.put(measured)


def write_profile(step, updates: int, device: torch.device, path: Path) -> None:
    """``torch.profiler`` over ``updates`` calls of ``step`` (CPU, and CUDA's kernels on a CUDA
    device): its operators by total self time, in a text table at ``path``."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(updates):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    sort_by = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    path.write_text(f"{updates} learner updates on {device}, sorted by {sort_by}\n"
                    + prof.key_averages().table(sort_by=sort_by, row_limit=30) + "\n")


# ---------------------------------------------------------------- T: the real command
def bench_end_to_end(overrides: list[str], spec, args) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="distrl-bench-"))
    cmd = [sys.executable, "-m", "distrl", "train", *overrides, "train.num_train_steps=1000000000",
           "train.eval_interval=1000000000", "train.save_interval=1000000000", "train.log_interval=2000",
           f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, text=True)
    peak_pss, start = 0, time.time()
    metrics = run_dir / "metrics.jsonl"
    warm_at = cpu_start = cpu_end = None
    while proc.poll() is None:
        try:
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            total = 0
            for p in tree:
                try:
                    total += p.memory_full_info().pss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            peak_pss = max(peak_pss, total)
        except psutil.NoSuchProcess:
            break
        if warm_at is None and metrics.exists() and "losses/total" in metrics.read_text():
            warm_at = time.time() + args.warmup
        if warm_at is not None and cpu_start is None and time.time() >= warm_at:
            cpu_start = (time.time(), *_cpu_seconds(proc.pid))
        if warm_at is not None and time.time() >= warm_at + args.seconds:
            cpu_end = (time.time(), *_cpu_seconds(proc.pid))
            os.killpg(proc.pid, signal.SIGINT)
            break
        if time.time() - start > args.warmup + args.seconds + 300:
            os.killpg(proc.pid, signal.SIGKILL)
            raise RuntimeError("end-to-end run did not start training in time")
        time.sleep(0.5)
    _, err = proc.communicate(timeout=120)
    records = runs.metrics(run_dir)
    logs = [r for r in records if "charts/SPS" in r and r["time"] >= warm_at]
    if len(logs) < 2:
        raise RuntimeError(f"too few log records (one per 2,000 agent steps) after warm-up: give a slow setup "
                           f"a longer --seconds; stderr:\n{err[-2000:]}")
    sps = (logs[-1]["agent_steps"] - logs[0]["agent_steps"]) / (logs[-1]["time"] - logs[0]["time"])
    lag = float(np.mean([r["charts/policy_lag"] for r in logs]))
    shares = {}
    if cpu_start is not None and cpu_end is not None:  # cores busy over the measured part
        wall = cpu_end[0] - cpu_start[0]
        shares = {"trainer_cores": (cpu_end[1] - cpu_start[1]) / wall,
                  "actor_cores": (cpu_end[2] - cpu_start[2]) / wall}
    return {"T": sps, "T_frames": sps * spec.frameskip, "peak_pss_gib": peak_pss / 2**30, "policy_lag": lag,
            "run_dir": str(run_dir), **shares}


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) so far of the trainer process ``pid`` (its learner threads, batch
    copies, logging) and of its child processes together (the actors; their env threads included)."""
    def seconds(p: psutil.Process) -> float:
        try:
            times = p.cpu_times()
            return times.user + times.system
        except psutil.NoSuchProcess:
            return 0.0
    trainer = psutil.Process(pid)
    return seconds(trainer), sum(seconds(child) for child in trainer.children(recursive=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="measured wall time per figure")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--compile", action="store_true", help="also measure L with train.th_compile=true")
    parser.add_argument("--only", default="EISLT", help="which figures, e.g. EIL")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1],
                        help="measure T with each of these numbers of ranks on this machine")
    parser.add_argument("--repeats", type=int, default=1,
                        help="rounds of E, I, S, L (interleaved, so that a machine whose speed drifts "
                             "affects every figure alike); each figure is the median of its rounds")
    parser.add_argument("--profile", metavar="PATH",
                        help="after L, profile --profile-updates more learner updates with torch.profiler "
                             "and write its table of operators to PATH")
    parser.add_argument("--profile-updates", type=int, default=5)
    parser.add_argument("--precisions", nargs="+", choices=["auto", "fp32", "bf16"],
                        help="measure every figure with each precision, back to back (e.g. fp32 bf16); "
                             "default: the precision= override, else auto")
    parser.add_argument("--variant", dest="variants", action="append", metavar="OVERRIDES",
                        help="a set of overrides (one quoted string) added to the others; with several, every "
                             "figure is measured with each, interleaved in every round as --precisions are "
                             "(e.g. --variant learner_threads=1 --variant learner_threads=2); not with --precisions")
    args, overrides = parser.parse_known_args()
    if args.variants and args.precisions:
        parser.error("--variant and --precisions: give one of them")
    asked = [o.split("=", 1)[1] for o in overrides if o.startswith("precision=")]
    if asked and args.precisions:
        parser.error(f"precision={asked[-1]} and --precisions {' '.join(args.precisions)}: give one of them")
    overrides = [o for o in overrides if not o.startswith("precision=")]
    precisions = args.precisions or asked[-1:] or ["auto"]
    cfg = compose_config(overrides)
    from distrl.envs import env_spec

    spec = env_spec(cfg.env)
    machine = {"cpu": _cpu_model(), "cores": os.cpu_count(), "torch": torch.__version__,
               "python": platform.python_version(), "device": cfg.device, "bf16_flags": _bf16_flags()}
    placement = plan(cfg)
    setup = {"env": cfg.env.id, "num_actors": placement.actors.count, "envs_per_actor": cfg.envs_per_actor,
             "T": cfg.num_steps, "B": cfg.batch_size, "model": cfg.model.encoder,
             "actor_cores": placement.actors.cores, "overrides": overrides}
    print(json.dumps({"machine": machine, "setup": setup}), flush=True)
    if args.variants:
        setups = {variant: [*overrides, *variant.split(), *(f"precision={p}" for p in asked[-1:])]
                  for variant in args.variants}
    else:
        setups = {precision: [*overrides, f"precision={precision}"] for precision in precisions}
    tables = _measure(args, setups, spec)
    for precision, rows in tables:
        width = max(len(k) for k, _ in rows)
        print(precision if args.variants else f"precision={precision}")
        print("\n".join(f"  {k:<{width}}  {v:>10}" for k, v in rows))
    if len(tables) > 1:
        first = dict(tables[0][1])
        for precision, rows in tables[1:]:
            ratios = {k: float(v.replace(",", "")) / float(first[k].replace(",", "")) for k, v in rows
                      if k in ("E", "I", "S", "L", "T", "P") and k in first}
            print(f"{precision} / {tables[0][0]}: " + ", ".join(f"{k} {r:.2f}x" for k, r in ratios.items()))


def _measure(args, overrides_by_precision: dict[str, list[str]], spec) -> list[tuple[str, list[tuple[str, str]]]]:
    """Every figure of ``args.only`` for each setup's overrides (keyed by its precision, or by its
    ``--variant`` string); per setup, the summary rows.

    Each round measures every figure with every setup before the next round, T included, so that
    a machine whose speed drifts affects every setup alike; a figure is the median of its rounds."""
    setups = {}
    for precision, overrides in overrides_by_precision.items():
        cfg = compose_config(overrides)
        placement = plan(cfg)
        setups[precision] = (cfg, placement, overrides)
        print(json.dumps({"precision": {"asked": precision, "learner": placement.precision,
                                        "why": placement.precision_reason, "actors": placement.actors.precision}}),
              flush=True)
    rounds: dict[str, dict[str, list[float]]] = {precision: {} for precision in setups}
    costs: dict[str, dict[str, list[float]]] = {precision: {} for precision in setups}  # core-s per agent step
    extras: dict[str, dict[str, list[dict]]] = {precision: {} for precision in setups}
    for repeat in range(args.repeats):
        for precision, (cfg, _, overrides) in setups.items():
            for name, measure in _parts(cfg, overrides, spec, args):
                if name[0] not in args.only:
                    continue
                value = measure()
                if isinstance(value, dict):  # T: agent steps/s with its frames/s, memory and lag
                    extras[precision].setdefault(name, []).append(value)
                    value = value["T"]
                elif isinstance(value, tuple):  # E, I, L: agent steps/s and the core-seconds per agent step
                    value, cost = value
                    costs[precision].setdefault(name, []).append(cost)
                rounds[precision].setdefault(name, []).append(value)
                print(json.dumps({"round": repeat + 1, "precision": precision, "figure": name,
                                  "agent_steps_per_s": round(value, 1)}), flush=True)
    if "L" in args.only and args.compile:
        for precision, (cfg, _, _) in setups.items():
            rounds[precision]["L_compiled"] = [bench_learner(cfg, spec, args, compile_model=True)[0]]
    return [(precision, _summary(args, rounds[precision], extras[precision], costs[precision], setups[precision][1],
                                 precision)) for precision in setups]


def _parts(cfg, overrides: list[str], spec, args) -> list[tuple[str, object]]:
    """The figures of one setup as ``(name, measure)``; ``measure()`` gives agent steps/s (E, I, L: with
    the core-seconds per agent step; T: a dict)."""
    parts = [("E", lambda: bench_env(cfg, spec, args)), ("I", lambda: bench_inference(cfg, spec, args)),
             ("S", lambda: bench_sampling(cfg, spec, args)), ("L", lambda: bench_learner(cfg, spec, args))]
    if "T" in args.only:
        parts += [("T" if ranks == 1 else f"T_{ranks}",
                   lambda ranks=ranks: bench_end_to_end([*overrides, f"distributed.nproc_per_node={ranks}"],
                                                        spec, args)) for ranks in args.ranks]
    return parts


def _summary(args, rounds: dict[str, list[float]], extras: dict[str, list[dict]], costs: dict[str, list[float]],
             placement, precision: str):
    """Print one precision's figures (medians of the rounds; E, I and L with their core-seconds per agent
    step) as JSON lines; its summary rows."""
    figures = {name: float(np.median(values)) for name, values in rounds.items()}
    for name, value in figures.items():
        extra = {}
        if name in extras:  # the T round nearest the median
            end = min(extras[name], key=lambda e: abs(e["T"] - value))
            extra = {"frames_per_s": round(value * end["T_frames"] / end["T"], 1),
                     "peak_pss_gib": round(end["peak_pss_gib"], 2), "policy_lag": round(end["policy_lag"], 2),
                     **{k: round(end[k], 2) for k in ("trainer_cores", "actor_cores") if k in end}}
        if name in costs:
            extra = {"core_ms_per_agent_step": round(float(np.median(costs[name])) * 1e3, 4)}
        print(json.dumps({"figure": name, "agent_steps_per_s": round(value, 1), "precision": precision,
                          "rounds": [round(v, 1) for v in rounds[name]], **extra}), flush=True)
    rows = [(k, f"{v:,.0f}") for k, v in figures.items()]
    for ranks in args.ranks:
        if ranks > 1 and {"T", f"T_{ranks}"} <= set(figures):
            rows.append((f"T_{ranks}/({ranks} x T)", f"{figures[f'T_{ranks}'] / (ranks * figures['T']):.2f}"))
    if {"E", "I"} <= set(figures):
        p_s = 1 / (1 / figures["E"] + 1 / figures["I"])
        rows.append(("P_S", f"{p_s:,.0f}"))
        if "S" in figures:
            rows.append(("S/P_S", f"{figures['S'] / p_s:.2f}"))
            if args.repeats > 1 and all(k in rounds for k in "EIS"):  # each round's own ratio
                ratios = [s * (1 / e + 1 / i) for e, i, s in zip(rounds["E"], rounds["I"], rounds["S"], strict=True)]
                rows.append(("S/P_S rounds", " ".join(f"{r:.2f}" for r in ratios)))
        if "L" in figures:
            parts = tuple(float(np.median(costs[k])) for k in "EIL")
            model = limit_model(figures["E"], figures["I"], figures["L"], parts, placement,
                                len(os.sched_getaffinity(0)))
            rows.append(("core-s per agent step (E, I, L)", " + ".join(f"{c * 1e3:.3f}" for c in model["parts"])
                         + f" = {model['cost'] * 1e3:.3f} ms"))
            rows.append((f"limit (least of {model['cores']} cores / cost, P_S, L)",
                         f"{model['limit']:,.0f} ({model['bound']})"))
            if "T" in figures:
                rows.append(("T/limit", f"{figures['T'] / model['limit']:.2f}"))
    if "T" in extras:  # where the cores went during T (the round nearest the median)
        end = min(extras["T"], key=lambda e: abs(e["T"] - figures["T"]))
        if "actor_cores" in end:
            rows.append(("cores busy: actors, trainer", f"{end['actor_cores']:.2f}, {end['trainer_cores']:.2f}"))
    print(json.dumps({"summary": {k: v for k, v in rows}, "precision": precision}), flush=True)
    return rows


def limit_model(e: float, i: float, learn: float, parts: tuple[float, float, float], placement,
                allowed: int) -> dict:
    """The limit of a run from its parts' figures (agent steps/s): ``e`` (E) and ``i`` (I) measured in
    the actors' processes, ``learn`` (L) on the learner's threads, and ``parts``, the core-seconds
    each spent per agent step (its processes' CPU time over its measured window, over its agent
    steps); ``allowed``: the cores the command may use. Returns ``parts``, their sum ``cost``, the
    run's ``cores`` (its actors and learner threads, at most ``allowed``), the ``limit`` (agent
    steps/s: the least of cores / cost, sampling's 1 / (1/E + 1/I) and L) and which of the three it
    is (``bound``)."""
    cores = min(placement.actors.count + placement.learner_threads, allowed)
    bounds = {"cores": cores / sum(parts), "sampling": 1 / (1 / e + 1 / i), "learner": learn}
    bound = min(bounds, key=bounds.get)
    return {"parts": parts, "cost": sum(parts), "cores": cores, "limit": bounds[bound], "bound": bound}


def _bf16_flags() -> list[str]:
    from distrl.config.host import cpu_bf16_flags

    return list(cpu_bf16_flags())


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()

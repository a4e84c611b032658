"""Where a run's work goes on this machine: actor processes, env stepping, slots, threads and cores.

:func:`plan` turns the ``auto`` values of a train config into one :class:`Placement`, read by the
trainer (to start processes), by validation (to check the slot count before anything starts) and
by ``scripts/bench.py`` (to measure the same layout). Measurements behind the rules are in
``docs/lab/benchmarks.md``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from omegaconf import DictConfig, OmegaConf

from distrl.config.host import actor_precision, cpu_count, resolve_device, resolve_precision

# learner_split=auto on 2 cores: one part a thread. Pong, APPO, 3 interleaved rounds (scripts/bench.py
# --only T): 2-core Intel Xeon, fp32: T 349 (2 parts), 331 (4 parts), 330 (2 torch threads, unsplit),
# 277 (1 thread; the old auto); 2-core AMD EPYC with AVX512-BF16, bf16 (issue 79, commit ff4e5da): T 860
# (2 parts on 2 threads) against 643 (1 thread, the old auto there), 1.34x (docs/lab/benchmarks.md)
SPLIT_PARTS = 2
# the encoders whose step is heavy enough to split: on HalfCheetah's 64x64 MLP (experiment=mujoco)
# a split (or a second torch thread) cost T 0.53-0.68x one thread; on MiniGrid's small CNN 1.0x
SPLIT_ENCODERS = ("nature_cnn",)  # impala_resnet: unmeasured (its one-thread T is under 70 agent steps/s here)


@dataclass(frozen=True)
class ActorPlacement:
    """Where and how the actor processes run.

    Attributes:
        count: actor processes (``num_actors``).
        envs_per_actor: environments each actor steps with one batched forward pass.
        async_step: whether actors step half their envs while inferring on the other half.
        cores: per actor, the core ids it is pinned to, or None (not pinned).
        env_cfg: the ``env`` node as a plain dict for actor processes, ``async_step`` resolved.
        precision: the actors' (and evaluations') arithmetic on the CPU.
    """

    count: int
    envs_per_actor: int
    async_step: bool
    cores: tuple[tuple[int, ...] | None, ...]
    env_cfg: dict
    precision: str = "fp32"


@dataclass(frozen=True)
class Placement:
    """The resolved sizing of one run.

    Attributes:
        device: the learner's device.
        actors: the actor processes (:class:`ActorPlacement`).
        num_slots: rollout slots.
        learner_threads: threads of the trainer process's learner: torch threads, or with
            ``learner_split > 1`` the threads that run the parts (each on one torch thread).
        learner_split: parts of a minibatch the learner's threads share (1: no split).
        precision: the learner's arithmetic, ``fp32`` or ``bf16`` (:func:`distrl.config.host.resolve_precision`).
        precision_reason: why (``set``, or what ``auto`` read).
    """

    device: torch.device
    actors: ActorPlacement
    num_slots: int
    learner_threads: int
    learner_split: int
    precision: str = "fp32"
    precision_reason: str = "set"

    @property
    def stepping(self) -> int:
        """Environments stepping at once (``num_actors x envs_per_actor``)."""
        return self.actors.count * self.actors.envs_per_actor


def plan(cfg: DictConfig, cores: int | None = None) -> Placement:
    """Resolve ``device``, ``num_actors``, ``num_slots``, ``learner_threads``, ``env.async_step``
    and ``pin_actors`` of a composed train config, for this process's cores (or the first ``cores``
    of them: how a sweep job on its share of the machine will be sized).

    - ``device``: ``cuda`` under ``torchrun`` is ``cuda:LOCAL_RANK``; the cores are this rank's share
      (:func:`distrl.learning.distributed.take_core_share` restricts the process before this runs).
    - ``num_actors=auto``: with a CUDA learner, one actor per core but one; with a CPU learner half
      the cores (at least 1), since there the learner needs as many cores as the actors.
    - ``learner_split=auto``: on 2 cores, a CPU learner in fp32 whose agent makes several
      optimizer steps a batch (APPO's, the bottleneck there) with the Nature CNN
      (:data:`SPLIT_ENCODERS`) splits each minibatch's network work in :data:`SPLIT_PARTS` parts on
      threads (:mod:`distrl.learning.split`), so that it takes the time the actor leaves on its
      core: Pong, APPO, 2-core Intel Xeon, fp32, T 1.26x one learner thread, 1.06x two torch threads
      unsplit (docs/lab/benchmarks.md, "APPO at the 2-core limit"); 2-core AMD EPYC with
      AVX512-BF16, bf16, T 1.34x one learner thread (issue 79). Elsewhere 1 (no split): on 1 core
      there is nothing to share; a small network's step is too short to share (MuJoCo's MLP);
      IMPALA's one step a batch leaves the actors the bottleneck; ``train.th_compile`` compiles the
      unsplit step; the IMPALA ResNet, more cores, a GPU and bf16 on an AMX Xeon are unmeasured.
    - ``learner_threads=auto``: with a split, every core (the parts' threads share the actors'
      cores); otherwise the cores the actors leave (at least 1).
    - ``num_slots=auto``: the environments stepping at once + ``batch_size x num_learners``
      (the least validation allows: each stepping env holds a slot, each learner collects B), plus
      room for the actors to run ahead of the learner: for an agent of one optimizer step a batch
      (IMPALA's) one more unroll of every stepping env, so that the actors never wait on a learner
      that keeps up with them; for an agent of several (APPO's ``num_epochs x num_minibatches``),
      whose learner is the bottleneck, one actor's unroll at most (``envs_per_actor`` less the B
      already counted): more slots would only let the actors run further ahead and raise the policy
      lag (Pong, APPO, seed 2: lag 2.0 with the IMPALA rule against 1.5, eval +0.3 against +14.1 at
      3M agent steps; docs/lab/atari5.md, "The third session of screening").
    - ``env.async_step=auto``: on with a CUDA learner, off with a CPU learner (it takes the cores a
      CPU learner needs); it can only happen on the ``vector`` Atari backend with an even
      ``envs_per_actor``, and is off otherwise whatever the key says.
    - ``precision=auto``: bf16 where the learner's device computes it natively
      (:func:`distrl.config.host.resolve_precision`); the actors by the CPU's flags.
    - ``pin_actors=auto``: pin each actor to one core when stepping is synchronous (ale-py's env
      thread then shares the actor's core); not with async stepping, whose env thread wants a core
      of its own; ``true`` with async stepping gives each actor two cores. Cores come from this
      process's affinity mask (taskset, SLURM cpusets), in order, round-robin past the last one.

    Raises:
        ConfigError: ``device`` names a device this machine does not have.
    """
    device = resolve_device(cfg.device)
    if device.type == "cuda" and device.index is None and "LOCAL_RANK" in os.environ:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))  # one rank per GPU
    cores = cpu_count() if cores is None else cores
    if cfg.num_actors != "auto":
        num_actors = int(cfg.num_actors)
    else:
        num_actors = max(1, cores - 1) if device.type == "cuda" else max(1, cores // 2)
    steps_a_batch = int(cfg.agent.num_epochs) * int(cfg.agent.get("num_minibatches", 1))
    precision, reason = resolve_precision(cfg.get("precision", "fp32"), device)
    learner_split = cfg.get("learner_split", 1)
    if learner_split == "auto":
        measured = (device.type == "cpu" and cores == 2 and steps_a_batch > 1
                    and cfg.model.encoder in SPLIT_ENCODERS and not cfg.train.get("th_compile", False))
        learner_split = SPLIT_PARTS if measured else 1
    if cfg.learner_threads != "auto":
        learner_threads = int(cfg.learner_threads)
    else:
        learner_threads = cores if learner_split > 1 else max(1, cores - num_actors)
    if cfg.num_slots != "auto":
        num_slots = int(cfg.num_slots)
    else:
        least = num_actors * cfg.envs_per_actor + cfg.batch_size * cfg.num_learners
        if steps_a_batch == 1:
            num_slots = least + num_actors * cfg.envs_per_actor
        else:
            num_slots = least + max(0, cfg.envs_per_actor - cfg.batch_size * cfg.num_learners)

    wanted = cfg.env.get("async_step", False)
    if wanted == "auto":
        wanted = device.type == "cuda"
    async_step = bool(wanted) and cfg.env.get("backend") == "vector" and cfg.envs_per_actor % 2 == 0

    pin = cfg.pin_actors
    if pin is False or (pin == "auto" and async_step) or not hasattr(os, "sched_setaffinity"):
        actor_cores: tuple = (None,) * num_actors
    else:
        allowed = sorted(os.sched_getaffinity(0))[:cores]
        width = 2 if async_step else 1
        actor_cores = tuple(
            tuple(sorted({allowed[(width * i + k) % len(allowed)] for k in range(width)})) for i in range(num_actors)
        )

    env_cfg = OmegaConf.to_container(cfg.env, resolve=True)
    if "async_step" in env_cfg:
        env_cfg["async_step"] = async_step
    actors = ActorPlacement(num_actors, cfg.envs_per_actor, async_step, actor_cores, env_cfg,
                            actor_precision(cfg.get("precision", "fp32")))
    return Placement(device, actors, num_slots, learner_threads, learner_split, precision, reason)

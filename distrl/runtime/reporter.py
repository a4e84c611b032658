"""What a run logs: finished episodes, the learner's losses and timings, the dormant units, feature rank and
evaluations (:class:`Reporter`, one part of :class:`distrl.runtime.trainer.Trainer`), and
the run's first lines (:func:`announce`).

Every scalar goes through :class:`distrl.utils.telemetry.Telemetry` (TensorBoard, metrics.jsonl,
W&B) against agent steps.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from distrl.config.placement import Placement
from distrl.envs import EnvSpec
from distrl.learning.distributed import Ranks
from distrl.learning.learner import Learner
from distrl.learning.thread import LearnerStats
from distrl.nn.actor_learner import ActorLearner
from distrl.nn.dormant import feature_health
from distrl.runtime.evaluator import EvalResult
from distrl.runtime.supervisor import Workers
from distrl.sampling.queues import drain
from distrl.sampling.slots import Channels
from distrl.utils.telemetry import NullTelemetry, Telemetry

log = logging.getLogger(__name__)

DORMANT_LOG_INTERVALS = 5  # the dormant units are measured with every 5th log record
DORMANT_OBSERVATIONS = 256  # on this many observations of the last batch: 0.14 s on one busy core (Nature CNN)


class Reporter:
    """Logs one run's progress.

    Args:
        telemetry: where every scalar goes (:class:`distrl.utils.telemetry.Telemetry`).
        channels: the run's queues (finished episodes come on ``channels.reports.episodes``).
        learner, stats: the learner (its lock, update count and last batch; its ranks: rank 0 logs every
            rank's episodes, the others hand theirs over; its network, whose learner copy's encoder's
            dormant units are measured) and its statistics.
        workers: the actor restarts to log.
        frameskip: frames per agent step (FPS beside SPS).
        success_above: an episode whose return is above this succeeded (``env.success_above``):
            ``charts/success_rate`` over each log interval's episodes and ``eval/success_rate``;
            None: neither is logged.
    """

    def __init__(self, telemetry: Telemetry | NullTelemetry, channels: Channels, learner: Learner,
                 stats: LearnerStats, workers: Workers, frameskip: int, success_above: float | None = None):
        self.telemetry, self.channels, self.learner, self.stats = telemetry, channels, learner, stats
        self.ranks: Ranks = learner.ranks
        self.networks: ActorLearner = learner.networks
        self.workers, self.frameskip = workers, frameskip
        self.success_above = success_above
        self.interval_episodes = self.interval_successes = 0  # since the last log record

    def finished_episodes(self) -> list[tuple[float, int]]:
        """Episodes finished since the last tick, ``(raw return, length)``: this rank's actors' and, on
        rank 0, the other ranks' (which the learners' collectives bring, :mod:`distrl.learning.distributed`)."""
        episodes = [(r, n) for _, r, n in drain(self.channels.reports.episodes)]
        if not self.ranks.is_main:
            self.ranks.outgoing.extend(episodes)
            episodes = []
        while self.ranks.incoming:
            episodes.append(self.ranks.incoming.popleft())
        return episodes


    def log_episodes(self, episodes: list[tuple[float, int]], steps: int, recent_returns: deque) -> None:
        """Log finished episodes ``(raw return, length in agent steps)`` at ``steps`` agent steps and
        append their returns to ``recent_returns`` (the progress line's window)."""
        for episode_return, episode_length in episodes:
            recent_returns.append(episode_return)
            self.interval_episodes += 1
            self.interval_successes += self.success_above is not None and episode_return > self.success_above
            self.telemetry.log({"charts/episodic_return": episode_return,
                                "charts/episodic_length": episode_length}, steps)


    def learner_time(self) -> tuple[int, dict[str, float]]:
        """``(updates, LearnerStats.seconds)`` of one moment."""
        with self.learner.lock, self.stats.lock:
            return self.learner.updates, dict(self.stats.seconds)


    def log_training(self, steps: int, last_log: tuple, recent_returns: deque, dormant: bool = False) -> tuple:
        """Log SPS (over the whole log interval since ``last_log``), the learner's losses, where its
        time went (ms per update) and the interval's episodes' success rate, with ``dormant`` the
        share of dormant units of each encoder layer (``dormant/<layer>``) and the approximate rank
        of its output features (``rank/features``), :func:`distrl.nn.dormant.feature_health` on up
        to ``DORMANT_OBSERVATIONS`` observations of the learner's last batch, under its lock: the
        weights of one moment; returns this moment as the next ``last_log``."""
        measured = self.feature_scalars() if dormant else {}  # before the clock: it takes a moment
        timed = self.learner_time()  # may wait for an update to end: the clock is read after it, so that
        now = time.perf_counter()     # SPS's interval is the one between the log records' times
        (then, steps_then, (updates_then, seconds_then)), (updates, seconds) = last_log, timed
        sps = (steps - steps_then) / (now - then)
        scalars = {"charts/SPS": sps, "charts/FPS": sps * self.frameskip,
                   "charts/policy_lag": self.stats.policy_lag, "charts/actor_restarts": self.workers.restarts,
                   "losses/nonfinite_updates": self.stats.nonfinite_updates}
        last = dict(self.stats.last)
        charts = ("learning_rate", "entropy_cost", "intrinsic_reward", "intrinsic_reward_raw", "intrinsic_coef",
                  "intrinsic_share")
        for name, value in last.items():  # an update override (distrl.compat) may add metrics of its own
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                key = "losses/intrinsic" if name == "intrinsic_loss" else f"losses/{name}"
                scalars["charts/" + name if name in charts else key] = value
        scalars.update(measured)
        if self.success_above is not None and self.interval_episodes:
            scalars["charts/success_rate"] = self.interval_successes / self.interval_episodes
        self.interval_episodes = self.interval_successes = 0
        if updates > updates_then:
            scalars.update({f"perf/learner_{name}_ms": 1000 * (seconds[name] - seconds_then[name])
                            / (updates - updates_then) for name in seconds})
        else:  # no update since: the next log line measures from the same moment
            timed = (updates_then, seconds_then)
        self.telemetry.log(scalars, steps)
        mean_return = f"{np.mean(recent_returns):.2f}" if recent_returns else "n/a"
        log.info("steps=%d frames=%d SPS=%.0f return(mean of last %d)=%s loss=%s lag=%.1f", steps,
                 steps * self.frameskip, sps, len(recent_returns), mean_return,
                 f"{last['total']:.3f}" if "total" in last else "n/a", self.stats.policy_lag)
        return now, steps, timed


    def feature_scalars(self) -> dict[str, float]:
        with self.learner.lock:
            obs = self.learner.last_obs
            if obs is None:
                return {}
            obs = obs[:-1].flatten(0, 1)  # the T x B observations of the loss
            obs = obs[::max(1, len(obs) // DORMANT_OBSERVATIONS)][:DORMANT_OBSERVATIONS]
            fractions, rank = feature_health(self.networks.learner.encoder, obs)
        return {**{f"dormant/{name}": value for name, value in fractions.items()}, "rank/features": rank}


    def log_eval(self, result: EvalResult, step: int) -> None:
        """Log an evaluation of the weights taken at ``step`` agent steps (none with no episode)."""
        if not result.returns:
            return
        scalars = {"eval/mean_return": result.mean_return, "eval/std_return": result.std_return}
        if self.success_above is not None:
            scalars["eval/success_rate"] = float(np.mean(np.asarray(result.returns) > self.success_above))
        self.telemetry.log(scalars, step)
        log.info("eval at %d steps: return %.2f +- %.2f over %d episodes", step, result.mean_return,
                 result.std_return, len(result.returns))


def announce(cfg: DictConfig, placement: Placement, spec: EnvSpec, networks: ActorLearner, ranks: Ranks,
             run_dir: Path) -> None:
    """The run's first log lines: where it writes, what it trains on what, in which precision."""
    p = placement
    log.info("run directory %s", run_dir.resolve())
    log.info("%s: observations %s, %s | %d actor(s) x %d envs, T=%d, B=%d | learner on %s, "
             "%d thread(s)%s | %s", cfg.env.id, spec.obs_shape, spec.action_space.describe(), p.actors.count,
             p.actors.envs_per_actor, cfg.num_steps, cfg.batch_size, p.device, p.learner_threads,
             f", minibatches in {p.learner_split} parts" if p.learner_split > 1 else "", networks.describe())
    log.info("precision: learner %s (%s), actors %s", p.precision, p.precision_reason, p.actors.precision)
    log.debug("%s", networks.learner)
    if ranks.enabled:
        log.info("rank %d of %d (local %d of %d, cores %s): gradients averaged over the ranks, effective "
                 "batch B x ranks = %d", ranks.rank, ranks.world_size, ranks.local_rank,
                 ranks.local_world_size, sorted(os.sched_getaffinity(0)), cfg.batch_size * ranks.world_size)
    log.info("training to %d agent steps (%d frames); Ctrl-C stops and saves a checkpoint",
             cfg.train.num_train_steps, cfg.train.num_train_steps * spec.frameskip)


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat

"""What the trainer logs: finished episodes, the learner's losses and timings, the dormant units,
evaluations and the best checkpoint they find (:class:`Reporting`, a part of
:class:`distrl.engine.trainer.DistributedTrainer`).

Every scalar goes through :class:`distrl.utils.telemetry.Telemetry` (TensorBoard, metrics.jsonl,
W&B) against agent steps.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from typing import Any

import numpy as np

from distrl.engine.evaluator import EvalResult
from distrl.engine.queues import drain
from distrl.engine.supervisor import Stalled
from distrl.nn.dormant import dormant_fractions
from distrl.utils import checkpoint

log = logging.getLogger(__name__)

DORMANT_LOG_INTERVALS = 5  # the dormant units are measured with every 5th log record
DORMANT_OBSERVATIONS = 256  # on this many observations of the last batch: 0.14 s on one busy core (Nature CNN)


class Reporting:
    """The logging methods of :class:`distrl.engine.trainer.DistributedTrainer` (whose attributes
    they read: ``telemetry``, ``channels``, ``ranks``, ``learner``, ``stats``, ``workers``,
    ``policy``, ``spec``, ``evals``, ``evaluations``, ``best_eval_return``, ``run_dir``)."""

    def _finished_episodes(self) -> list[tuple[float, int]]:
        """Episodes finished since the last tick, ``(raw return, length)``: this rank's actors' and, on
        rank 0, the other ranks' (which the learners' collectives bring, :mod:`distrl.engine.distributed`)."""
        episodes = [(r, n) for _, r, n in drain(self.channels.episode_queue)]
        if not self.ranks.is_main:
            self.ranks.outgoing.extend(episodes)
            episodes = []
        while self.ranks.incoming:
            episodes.append(self.ranks.incoming.popleft())
        return episodes


    def _log_episodes(self, episodes: list[tuple[float, int]], steps: int, recent_returns: deque) -> None:
        """Log finished episodes ``(raw return, length in agent steps)`` at ``steps`` agent steps and
        append their returns to ``recent_returns`` (the progress line's window)."""
        for episode_return, episode_length in episodes:
            recent_returns.append(episode_return)
            self.telemetry.log({"charts/episodic_return": episode_return,
                                "charts/episodic_length": episode_length}, steps)


    def _learner_time(self) -> tuple[int, dict[str, float]]:
        """``(updates, LearnerStats.seconds)`` of one moment."""
        with self.learner.lock, self.stats.lock:
            return self.learner.updates, dict(self.stats.seconds)


    def _log_training(self, steps: int, last_log: tuple, recent_returns: deque, dormant: bool = False) -> tuple:
        """Log SPS (over the whole log interval since ``last_log``), the learner's losses and where its
        time went (ms per update), with ``dormant`` the share of dormant units of each encoder layer
        (``dormant/<layer>``, :func:`distrl.nn.dormant.dormant_fractions` on up to
        ``DORMANT_OBSERVATIONS`` observations of the learner's last batch, under its lock: the weights
        of one moment); returns this moment as the next ``last_log``."""
        measured = self._dormant_scalars() if dormant else {}  # before the clock: it takes a moment
        timed = self._learner_time()  # may wait for an update to end: the clock is read after it, so that
        now = time.perf_counter()     # SPS's interval is the one between the log records' times
        (then, steps_then, (updates_then, seconds_then)), (updates, seconds) = last_log, timed
        sps = (steps - steps_then) / (now - then)
        scalars = {"charts/SPS": sps, "charts/FPS": sps * self.spec.frameskip,
                   "charts/policy_lag": self.stats.policy_lag, "charts/actor_restarts": self.workers.restarts,
                   "losses/nonfinite_updates": self.stats.nonfinite_updates}
        last = dict(self.stats.last)
        charts = ("learning_rate", "entropy_cost", "intrinsic_reward", "intrinsic_reward_raw", "intrinsic_coef")
        for name, value in last.items():  # an update override (distrl.compat) may add metrics of its own
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                key = "losses/intrinsic" if name == "intrinsic_loss" else f"losses/{name}"
                scalars["charts/" + name if name in charts else key] = value
        scalars.update(measured)
        if updates > updates_then:
            scalars.update({f"perf/learner_{name}_ms": 1000 * (seconds[name] - seconds_then[name])
                            / (updates - updates_then) for name in seconds})
        else:  # no update since: the next log line measures from the same moment
            timed = (updates_then, seconds_then)
        self.telemetry.log(scalars, steps)
        mean_return = f"{np.mean(recent_returns):.2f}" if recent_returns else "n/a"
        log.info("steps=%d frames=%d SPS=%.0f return(mean of last %d)=%s loss=%s lag=%.1f", steps,
                 steps * self.spec.frameskip, sps, len(recent_returns), mean_return,
                 f"{last['total']:.3f}" if "total" in last else "n/a", self.stats.policy_lag)
        return now, steps, timed


    def _dormant_scalars(self) -> dict[str, float]:
        with self.learner.lock:
            obs = self.learner.last_obs
            if obs is None:
                return {}
            obs = obs[:-1].flatten(0, 1)  # the T x B observations of the loss
            obs = obs[::max(1, len(obs) // DORMANT_OBSERVATIONS)][:DORMANT_OBSERVATIONS]
            fractions = dormant_fractions(self.policy.learner.encoder, obs)
        return {f"dormant/{name}": value for name, value in fractions.items()}


    def _evaluate_when_due(self, steps: int, done: bool) -> None:
        """Log an evaluation that finished; start the next one when it is due (rank 0, one at a time).
        An evaluation counts as run (``evals.last``, the checkpoint's ``last_eval_step``) once it
        finishes: one that a stop cuts short is run again, at once, by the resumed run."""
        finished = self.evaluations.finished()
        if finished:
            self._log_eval(*finished)
        if (not self.evaluations.busy and self.cfg.train.num_eval_episodes > 0 and self.evals.due(steps)
                and not done and self.ranks.is_main):
            self.evaluations.start(self.checkpoint_state(), steps)


    def _log_eval(self, result: EvalResult, snapshot: dict, step: int) -> None:
        """Count an evaluation of ``snapshot``'s weights (taken at ``step`` agent steps) as run and log
        it; a new best is saved as best.pt."""
        self.evals.ran(step)
        if not result.returns:
            return
        self.telemetry.log({"eval/mean_return": result.mean_return, "eval/std_return": result.std_return}, step)
        log.info("eval at %d steps: return %.2f +- %.2f over %d episodes", step, result.mean_return,
                 result.std_return, len(result.returns))
        if result.mean_return > self.best_eval_return:
            self.best_eval_return = result.mean_return
            # best.pt is the snapshot the evaluation started from: weights, optimizer, counters and
            # RNG of one moment, with the return it scored.
            try:
                checkpoint.save_best({**snapshot, "best_eval_return": result.mean_return},
                                     self.run_dir / "checkpoints")
            except checkpoint.CheckpointSaveError as exc:
                log.error("best.pt not saved, training goes on: %s", exc)


    def _final_eval(self) -> None:
        """Evaluate the final weights (the checkpoint is already safe); the caller saves the result."""
        step = self.position.agent_steps
        snapshot = self.checkpoint_state()
        self._log_eval(*self.evaluations.run(snapshot, step), step)

    def _announce(self) -> None:
        cfg, p = self.cfg, self.placement
        log.info("run directory %s", self.run_dir.resolve())
        log.info("%s: observations %s, %s | %d actor(s) x %d envs, T=%d, B=%d | learner on %s, "
                 "%d thread(s) | %s", cfg.env.id, self.spec.obs_shape, self.spec.action_space.describe(), p.num_actors,
                 p.envs_per_actor, cfg.num_steps, cfg.batch_size, self.device, p.learner_threads,
                 self.policy.describe())
        log.info("precision: learner %s (%s), actors %s", p.precision, p.precision_reason, p.actor_precision)
        log.debug("%s", self.policy.learner)
        if self.ranks.enabled:
            log.info("rank %d of %d (local %d of %d, cores %s): gradients averaged over the ranks, effective "
                     "batch B x ranks = %d", self.ranks.rank, self.ranks.world_size, self.ranks.local_rank,
                     self.ranks.local_world_size, sorted(os.sched_getaffinity(0)),
                     cfg.batch_size * self.ranks.world_size)
        log.info("training to %d agent steps (%d frames); Ctrl-C stops and saves a checkpoint",
                 cfg.train.num_train_steps, cfg.train.num_train_steps * self.spec.frameskip)

    def _check_progress(self, progress_at: tuple[float, int], steps: int) -> tuple[float, int]:
        """The moment agent steps last moved; raise :class:`Stalled` after ``train.stall_timeout``
        seconds without."""
        if steps != progress_at[1]:
            return time.monotonic(), steps
        seconds = time.monotonic() - progress_at[0]
        if seconds <= self.cfg.train.stall_timeout:
            return progress_at
        log.error("no agent step consumed for %.0f s (train.stall_timeout=%g); where everything is:",
                  seconds, self.cfg.train.stall_timeout)
        for line in self.workers.report():
            log.error("  %s", line)
        raise Stalled(f"stalled: no agent step consumed for {seconds:.0f} s at {steps} agent "
                      f"steps (train.stall_timeout={self.cfg.train.stall_timeout:g}); train.log says where "
                      f"each actor and learner was")

    # ----------------------------------------------------------------- shutdown


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat

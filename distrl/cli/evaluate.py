"""The Hydra main of ``distrl eval``: score a checkpoint from its path alone."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from pathlib import Path

import hydra
import numpy as np
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from distrl.cli.exits import checked, fail
from distrl.config.host import actor_precision, resolve_device
from distrl.config.schema import ConfigError, config_dir, register_configs

log = logging.getLogger("distrl")

register_configs()


def evaluation_precision(state: dict) -> str:
    """The arithmetic ``distrl eval`` scores a checkpoint in by default: that of the run's own
    evaluations, i.e. of its actors (``actor_precision``; a checkpoint without it: the actors'
    precision for its ``precision`` key on this CPU, fp32 for one older than bf16)."""
    if "actor_precision" in state:
        return state["actor_precision"]
    return actor_precision(state["config"].get("precision", "fp32"))


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="eval")
def main(cfg: DictConfig) -> None:
    """Load ``ckpt``, play ``num_episodes`` episodes, print them and write ``results.json``."""
    # torch is imported here, not with the module: Hydra's --cfg, --info and completion never call main
    from distrl.config.checks import validate_bf16_device, validate_env, validate_eval
    from distrl.runs import load_policy
    from distrl.runtime.evaluator import evaluate, record_episodes
    from distrl.utils.checkpoint import CheckpointError

    checked("eval", cfg, validate_eval)

    try:
        model, train_cfg, state = load_policy(cfg.ckpt)
    except CheckpointError as exc:
        fail("eval", str(exc), remove_run_dir=True)
    env_cfg = train_cfg.env
    if env_cfg.get("factory"):  # unpickling it from a file could run any code: only the script that made it
        fail("eval", f"{cfg.ckpt}: its env ({env_cfg.id}) was a Python env factory, which `distrl eval` does not "
                     f"unpickle from a file; evaluate from Python (distrl.Trainer.test, IMPALA.eval) with the "
                     f"factory, or train with a Gymnasium id", remove_run_dir=True)
    for key, value in cfg.env.items():
        if value is not None:
            if key not in env_cfg:
                fail("eval", f"env.{key}={value!r} is not allowed: the checkpoint's env ({env_cfg.id}) has no {key}",
                     remove_run_dir=True)
            env_cfg[key] = value
    if cfg.video and not os.environ.get("DISPLAY"):
        # MuJoCo renders offscreen through EGL where no display is (set before mujoco is imported;
        # MUJOCO_GL=osmesa where EGL is missing)
        os.environ.setdefault("MUJOCO_GL", "egl")
    try:
        validate_env(env_cfg)
    except ConfigError as exc:
        fail("eval", str(exc), remove_run_dir=True)

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    device = resolve_device(cfg.device)
    precision = cfg.precision or evaluation_precision(state)
    # null: as the run's own evaluations (train.eval_deterministic: the distribution's mode, or a sample)
    deterministic = (bool(train_cfg.train.get("eval_deterministic", False)) if cfg.deterministic is None
                     else bool(cfg.deterministic))
    try:
        validate_bf16_device(precision, device)  # the checkpoint's precision too, not only a precision= given
    except ConfigError as exc:
        fail("eval", str(exc), remove_run_dir=True)
    if cfg.video:
        video = out_dir / "video.mp4"
        result = record_episodes(model, env_cfg, cfg.num_episodes, cfg.seed, str(video), cfg.video_fps,
                                 deterministic, device=device, precision=precision)
    else:
        video = None
        result = evaluate(model, env_cfg, cfg.num_episodes, cfg.seed, deterministic, device=device,
                          precision=precision)

    for i, (ret, length) in enumerate(zip(result.returns, result.lengths, strict=True)):
        print(f"episode {i + 1}: return {ret:g}, length {length} agent steps")
    returns = np.asarray(result.returns)
    print(f"{env_cfg.id}: return {returns.mean():.2f} ± {returns.std():.2f} (min {returns.min():g}, "
          f"max {returns.max():g}) over {len(returns)} episodes, "
          f"{'greedy' if deterministic else 'sampled'} actions, {precision}, "
          f"checkpoint at {state['agent_steps']} agent steps")
    results = {
        "mean_return": float(returns.mean()), "std_return": float(returns.std()),
        "min": float(returns.min()), "max": float(returns.max()), "n_episodes": len(returns),
        "returns": result.returns, "lengths": result.lengths,
        "deterministic": deterministic, "precision": precision, "device": str(device),
        "checkpoint": str(Path(cfg.ckpt).resolve()),
        "env_id": env_cfg.id, "agent_steps": int(state["agent_steps"]), "seed": int(cfg.seed),
        "video": str(video) if video else None,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    (out_dir / "results.json").write_text(json.dumps(results, indent=2))
    log.info("results in %s", out_dir / "results.json")

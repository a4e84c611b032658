#!/usr/bin/env bash
# Sample Factory 2.1.1's own MuJoCo recipe, unchanged, beside distrl on the same machine (docs/lab/mujoco.md,
# "Sample Factory beside distrl").
#
#   scripts/sample_factory.sh setup                      # its own virtualenv, .venv-sf/ (gymnasium < 1.0, numpy < 2,
#                                                        # mujoco 2.3.7, torch 2.13.0 as distrl's); about 2 minutes
#   scripts/sample_factory.sh run TASK STEPS SEED [DIR]  # sf_examples.mujoco.train_mujoco for TASK (mujoco_halfcheetah,
#                                                        # mujoco_hopper, mujoco_walker, mujoco_ant, mujoco_humanoid)
#
# `run` keeps Sample Factory's recipe (sf_examples/mujoco/mujoco_params.py) and sets only what the issue that
# measured it set: 2 workers x 32 envs (the machine has 2 cores), the number of env steps, the seed, the CPU. Its
# TensorBoard summaries land in DIR (default outputs/sf/TASK-sSEED); `python scripts/sf_record.py DIR ...` keeps
# them as a run record beside distrl's.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-sf

case "${1:-}" in
  setup)
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --upgrade pip
    "$VENV/bin/pip" install torch==2.13.0
    "$VENV/bin/pip" install "sample-factory==2.1.1" "gymnasium[mujoco]==0.29.1" "mujoco==2.3.7" "numpy<2"
    "$VENV/bin/python" -c "import sample_factory, gymnasium, mujoco; print('sample-factory', sample_factory.__version__ \
      if hasattr(sample_factory, '__version__') else '2.1.1', 'gymnasium', gymnasium.__version__, 'mujoco', mujoco.__version__)"
    ;;
  run)
    task=${2:?task, e.g. mujoco_halfcheetah}
    steps=${3:?env steps, e.g. 10000000}
    seed=${4:?seed}
    dir=${5:-outputs/sf/${task}-s${seed}}
    mkdir -p "$(dirname "$dir")"
    exec "$VENV/bin/python" -m sf_examples.mujoco.train_mujoco --env="$task" --experiment="$(basename "$dir")" \
      --train_dir="$(dirname "$dir")" --num_workers=2 --num_envs_per_worker=32 --train_for_env_steps="$steps" \
      --seed="$seed" --device=cpu
    ;;
  *)
    sed -n '2,13p' "$0"
    exit 2
    ;;
esac

#!/usr/bin/env bash
# RLeXplore's own MiniGrid runs, reproduced with its own code beside distrl (issue 95, docs/lab/exploration.md,
# "DoorKey-16x16 as RLeXplore ran it"): the `reward` branch of RLE-Foundation/rllte at e26d1b2 (2024-08-11), whose
# MiniGrid env is the agent's 7x7 view with the goal's reward times 100, and whose src/utils.py holds the PPO
# settings of the paper's runs. rllte-core from PyPI (1.0.1) is not that code: its E3B takes another encoder.
#
#   scripts/rllte_reference.sh setup [REPO]          # the branch's code in .rllte-src/ (cloned from REPO, default
#                                                    # GitHub; a local clone works) and its own virtualenv,
#                                                    # .venv-rllte/ (gymnasium 0.29.1, minigrid 2.3.1, torch 2.14.1)
#   scripts/rllte_reference.sh run REWARD STEPS SEED [DIR]   # src/train_ppo.py on MiniGrid-DoorKey-16x16-v0 with
#                                                    # --intrinsic_reward=REWARD (e3b, re3, extrinsic), on the CPU
#
# `run` keeps the branch's defaults (256 envs x 32 steps, 4 epochs of minibatches of 1,024, lr 2.5e-4 annealed, clip
# 0.1, value clip 0.1, entropy 0.01, gamma 0.99, GAE 0.95, beta 0.25) and sets only the env, the reward, the number
# of agent steps, the seed and the device. Its console lands in DIR/console.log (default outputs/rllte/REWARD-sSEED)
# and rllte's own CSV log in DIR/logs/TAG/DATE/train.log; `python scripts/rllte_record.py DIR ...` keeps it as a
# run record.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-rllte
SRC=.rllte-src
COMMIT=e26d1b236f19056038aa01452c36b1b5d7e873d8

case "${1:-}" in
  setup)
    repo=${2:-https://github.com/RLE-Foundation/rllte}
    rm -rf "$SRC"
    git clone --quiet --no-checkout "$repo" "$SRC"
    git -C "$SRC" checkout --quiet "$COMMIT"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --upgrade pip
    # torchvision (one of its augmentations imports it) from PyPI works only beside PyPI's own torch: 2.14.1, a
    # CUDA build that runs on the CPU here. The branch's pyproject pins plotting and hub packages its training
    # never imports; these are the ones it imports
    "$VENV/bin/pip" install "torch==2.14.1" "torchvision==0.29.1" "gymnasium==0.29.1" "minigrid==2.3.1" "numpy<2" \
      "gym==0.26.2" envpool imageio termcolor scipy pandas tqdm "pynvml==11.5.0"
    "$VENV/bin/pip" install --no-deps -e "$SRC"
    "$VENV/bin/python" -c "import rllte, gymnasium, minigrid, torch; print('rllte', '$COMMIT'[:7], 'gymnasium', \
      gymnasium.__version__, 'minigrid', minigrid.__version__, 'torch', torch.__version__)"
    ;;
  run)
    reward=${2:?intrinsic reward: e3b, re3 or extrinsic}
    steps=${3:?agent steps, e.g. 10000000}
    seed=${4:?seed}
    dir=${5:-outputs/rllte/${reward}-s${seed}}
    mkdir -p "$dir"
    src=$PWD/$SRC python=$PWD/$VENV/bin/python
    cd "$dir"  # rllte writes its CSV logs under logs/TAG/DATE/ of the working directory
    exec env PYTHONPATH="$src" "$python" -u "$src/src/train_ppo.py" --env_id=MiniGrid-DoorKey-16x16-v0 \
      --intrinsic_reward="$reward" --num_train_steps="$steps" --seed="$seed" --device=cpu > console.log 2>&1
    ;;
  *)
    sed -n '2,17p' "$0"
    exit 2
    ;;
esac

#!/usr/bin/env bash
# The packages distrl needs that the device machine's image lacks, as wheels in .whl/ for its Python 3.12
# (the image has its own torch, numpy, tensorboard, psutil, tqdm, opencv, imageio, pytest): run here, where
# PyPI is reached, then name .whl in the device call's carry (scripts/gpu_check.sh says how). About 4 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir .whl
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    PLATFORMS+=(--platform "$p")
done
# the versions make install gives here (pyproject.toml's ranges)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
    -d .whl hydra-core==1.3.8 omegaconf==2.3.1 gymnasium==1.4.0 farama-notifications==0.0.6 ale-py==0.12.1
# hydra's parser runtime is published as a source archive only: a pure-Python wheel of it is built here
python3 -m pip wheel -q --no-deps antlr4-python3-runtime==4.9.3 -w .whl
ls -l .whl

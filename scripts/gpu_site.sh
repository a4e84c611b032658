# Sourced by the scripts/gpu_*.sh that run on the device machine, from the repository's root, after
# `set -u`: makes $OUT (default /tmp/<script name>), installs the wheels of .whl/ (scripts/gpu_wheels.sh)
# into /tmp/site and sets SITE to "/tmp/site:" (empty without wheels, as on a machine with distrl
# installed), PY to an absolute python (default python3), PYTHONUNBUFFERED; defines `machine`, which
# prints the date, the GPU and its driver, the cores and the CPU model.
OUT=${OUT:-/tmp/$(basename "$0" .sh)}
mkdir -p "$OUT"
PY=${PY:-python3}
case $PY in */*) PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY") ;; esac  # usable from any folder
SITE=
if ls .whl/*.whl > /dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    SITE=/tmp/site:
fi
export PYTHONUNBUFFERED=1

machine() {
    date -u
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2> /dev/null || echo "no nvidia-smi"
    echo "cores $(nproc)"
    grep -m1 'model name' /proc/cpuinfo
}

# Sourced by the scripts/gpu_*.sh that run on the device machine: installs the wheels of .whl/
# (scripts/gpu_wheels.sh) into /tmp/site and sets SITE to "/tmp/site:" (empty without wheels, as on a
# machine with distrl installed), PY to an absolute python (default python3) and PYTHONUNBUFFERED.
PY=${PY:-python3}
case $PY in */*) PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY") ;; esac  # usable from any folder
SITE=
if ls .whl/*.whl > /dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    SITE=/tmp/site:
fi
export PYTHONUNBUFFERED=1

#!/usr/bin/env bash
# Issue 43's checks on the device machine (one NVIDIA GPU, 16 cores), in one call of at most 7.5 minutes,
# each step under its own time limit, every figure written under $OUT:
#   env.txt      the GPU, driver, torch and CUDA versions, the CPU, the commit given as $1
#   pytest.txt   the CUDA tests (tests/test_cuda.py): a CUDA learner in fp32 and bf16, distrl eval
#                device=cuda, a CUDA checkpoint resumed and evaluated on the CPU
#   bench.txt    scripts/bench.py E, I, L, T at the auto sizing with the default agent (Pong)
#   profile.txt  torch.profiler's operators over 5 learner updates at that sizing (after L)
#   gpu_util.txt nvidia-smi dmon's utilisation, one line a second, from bench to the end
#   train.txt, perf.txt  a 75 s distrl train with the defaults, and its perf/learner_{wait,gather,
#                step,publish}_ms, SPS and policy lag averaged from its metrics.jsonl
# Here first: bash scripts/gpu_wheels.sh. The tree that travels must be under 64 MiB: untrack the carried
# runs for the call (git rm -r -q --cached outputs; after it, git reset -q -- outputs). Then, from the device tool:
#   run(command="bash scripts/gpu_check.sh $(git rev-parse --short HEAD here)", carry=[".whl"], timeout_s=480)
# To try it on a CPU machine: move .whl aside, then PY=.venv/bin/python bash scripts/gpu_check.sh (OUT: /tmp/gpu_check)
# (the CUDA tests, named on its command line, then fail at once: distrl refuses device=cuda without CUDA).
set -u
cd "$(dirname "$0")/.."
. scripts/gpu_site.sh
export PYTHONPATH=$SITE$PWD

{
    echo "commit ${1:-not given}"; machine
    nvidia-smi 2> /dev/null
    "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device')"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

step() {  # step NAME SECONDS COMMAND...: COMMAND's output in $OUT/NAME.txt, stopped by Ctrl-C at SECONDS
    local name=$1 limit=$2
    shift 2
    echo "== $name: start $(date +%T), limit ${limit} s"
    timeout -s INT -k 30 "$limit" "$@" > "$OUT/$name.txt" 2>&1
    echo "== $name: exit $? at $(date +%T)"
    tail -n 8 "$OUT/$name.txt"
}

step pytest 150 "$PY" -m pytest -p no:cacheprovider -v tests/test_cuda.py
if command -v nvidia-smi > /dev/null; then
    nvidia-smi dmon -s u -d 1 > "$OUT/gpu_util.txt" 2>&1 &
    DMON=$!
fi
step bench 210 "$PY" scripts/bench.py env=atari --only EILT --seconds 12 --warmup 4 --profile "$OUT/profile.txt"
rm -rf /tmp/gpu_run
step train 75 "$PY" -m distrl train env=atari train.log_interval=20000 hydra.run.dir=/tmp/gpu_run
[ -n "${DMON:-}" ] && kill "$DMON"
"$PY" - > "$OUT/perf.txt" 2>&1 <<'PYEOF'
import json, statistics
records = [json.loads(line) for line in open("/tmp/gpu_run/metrics.jsonl")]
logged = [r for r in records if "perf/learner_step_ms" in r][1:]  # the first interval holds the start-up
print(f"{len(logged)} log intervals after the first, to {max([0] + [r['agent_steps'] for r in records])} "
      f"agent steps")
for key in ("perf/learner_wait_ms", "perf/learner_gather_ms", "perf/learner_step_ms", "perf/learner_publish_ms",
            "charts/SPS", "charts/policy_lag"):
    values = [r[key] for r in logged if key in r]
    if values:
        print(f"{key}: mean {statistics.mean(values):.2f}, min {min(values):.2f}, max {max(values):.2f}")
PYEOF
cat "$OUT/perf.txt"
echo "== done at $(date +%T)"

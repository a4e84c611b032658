#!/usr/bin/env bash
# Issue 43's learning check on the device machine: does a sizing that makes the GPU learner faster keep
# Pong's learning per agent step? distrl train env=atari (ALE/Pong-v5, sticky actions) seed 2 to 5M agent
# steps at the auto sizing plus the overrides given (e.g. batch_size=128 agent.lr=0.0005), evaluated
# every 0.5M (10 episodes), stopped by Ctrl-C at LIMIT seconds (default 540). Under $OUT: train.txt (its
# log), metrics.jsonl and config.yaml, and summary.txt (the evaluations, and the median SPS).
# The 2-core anchor it is read against: APPO's defaults (T=32, B=32), seed 2, eval +14.7 at 5M
# (docs/lab/atari5.md); the issue asks +14 to +17.8. Wheels in .whl/ as scripts/gpu_check.sh says:
#   run(command="bash scripts/gpu_pong.sh batch_size=128", carry=[".whl"], timeout_s=600)
set -u
cd "$(dirname "$0")/.."
. scripts/gpu_site.sh
export PYTHONPATH=$SITE$PWD
RUN=/tmp/gpu_pong_run
rm -rf "$RUN"
{ machine; echo "overrides: $*"; } | tee "$OUT/env.txt"
timeout -s INT -k 30 "${LIMIT:-540}" "$PY" -m distrl train env=atari seed=2 train.num_train_steps=5000000 \
    train.eval_interval=500000 train.log_interval=50000 "$@" hydra.run.dir="$RUN" > "$OUT/train.txt" 2>&1
echo "train exit $?"
cp "$RUN/metrics.jsonl" "$RUN/config.yaml" "$OUT/" 2> /dev/null
"$PY" - "$RUN/metrics.jsonl" 2>&1 <<'PYEOF' | tee "$OUT/summary.txt"
import json, statistics, sys
records = [json.loads(line) for line in open(sys.argv[1])]
for r in records:
    if "eval/mean_return" in r:
        print(f"eval at {r['agent_steps']:,} agent steps: {r['eval/mean_return']:+.1f} (std {r['eval/std_return']:.1f})")
sps = [r["charts/SPS"] for r in records if "charts/SPS" in r][1:]
last = max([0] + [r["agent_steps"] for r in records])
print(f"to {last:,} agent steps; median SPS {statistics.median(sps):,.0f} agent steps/s" if sps else f"to {last:,}")
PYEOF

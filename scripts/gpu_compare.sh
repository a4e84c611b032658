#!/usr/bin/env bash
# Throughput of several versions of distrl, or of several overrides, side by side on the device machine
# (issue 43: "each change measured separately"), in one call. Each argument is one figure:
#   FIGURE:NAME:TREE[:OVERRIDE,OVERRIDE...]
# FIGURE is L (learner updates alone) or T (the real distrl train), as scripts/bench.py measures them
# (--seconds 12 --warmup 4, env=atari, the auto sizing); TREE a folder holding distrl/, conf/ and scripts/
# (. for this checkout; an older commit: git archive COMMIT distrl conf scripts | tar -x -C .ab/NAME, with
# /.ab/ in .git/info/exclude and .ab named in the call's carry). The figures run in the order given,
# so interleave the versions. Each figure's output goes to $OUT/compare.txt, a summary line per figure
# to the standard output; PROFILE=NAME adds torch.profiler's table of that figure's updates
# ($OUT/profile.txt, an L figure only); WARMUP and MEASURE (default 4 and 12) set bench.py's --warmup and
# --seconds (a T figure with train.th_compile=true needs a warm-up past its compiling, about a minute;
# an L figure adds 30 s itself); TESTS=EXPR first runs the tests of tests/test_cuda.py that pytest's -k EXPR
# selects ($OUT/pytest.txt, at most 240 s). Wheels in .whl/ as scripts/gpu_check.sh says.
#   run(command="bash scripts/gpu_compare.sh L:old:.ab/old L:new:. T:old:.ab/old T:new:.",
#       carry=[".whl", ".ab"], timeout_s=...)
set -u
cd "$(dirname "$0")/.."
. scripts/gpu_site.sh
machine | tee "$OUT/env.txt"
if [ -n "${TESTS:-}" ]; then
    PYTHONPATH=$SITE$PWD timeout -s INT -k 30 240 "$PY" -m pytest -p no:cacheprovider -v tests/test_cuda.py \
        -k "$TESTS" > "$OUT/pytest.txt" 2>&1
    echo "tests ($TESTS): exit $?, $(tail -n 1 "$OUT/pytest.txt")"
fi
for spec in "$@"; do
    IFS=: read -r figure name tree overrides <<< "$spec"
    root=$(cd "$tree" && pwd)
    extra=()
    [ -n "$overrides" ] && IFS=, read -r -a extra <<< "$overrides"
    profile=()
    [ "${PROFILE:-}" = "$name" ] && [ "$figure" = L ] && profile=(--profile "$OUT/profile.txt")
    echo "== $figure $name ($tree ${extra[*]:-}) $(date +%T)" >> "$OUT/compare.txt"
    result=$(cd "$root" && PYTHONPATH=$SITE$root timeout -s INT -k 30 240 "$PY" scripts/bench.py env=atari \
        --only "$figure" --seconds "${MEASURE:-12}" --warmup "${WARMUP:-4}" "${profile[@]}" "${extra[@]}" 2>&1 | tee -a "$OUT/compare.txt" \
        | grep -E "^\s+$figure\s" | tail -1)
    echo "$figure $name ${extra[*]:-}: ${result:-failed, see compare.txt} agent steps/s"
done
echo "== done at $(date +%T)"

#!/usr/bin/env bash
# One GPU session's prepared run, for a lent machine with a few minutes of device time: build the
# extension and check every GPU path against float64 references (bench/gpu_check.py), then time the
# speed targets (bench/gpu_limits.py). Results go under $OUT (default build/gpu_session):
# check/{gpu_check.log,summary.json,stdout.txt} and limits/{REPORT.md,gpu_limits.json,stdout.txt};
# copy them to bench/results/gpu_<machine>_<date>/ afterwards.
#
#     bash scripts/gpu_session.sh [extra gpu_check arguments, e.g. --deadline-s 420 --no-bare-route; the build alone took 110-175 s on one H200, and the Triton sections compile a kernel per estimator, block and dtype, 1-5 s each, which gpu_check compiles ahead on 6 cores beside the build]
#
# The exit status is gpu_check's (0 only when every check passed); the timings run either way.
set -u
OUT="${OUT:-build/gpu_session}"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/check" "$OUT/limits"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv || true
"$PY" bench/gpu_check.py --out "$OUT/check" "$@" > "$OUT/check/stdout.txt" 2>&1
check_rc=$?
echo "gpu_check exit status $check_rc"
# the section table and every failure (the full log is in $OUT/check)
grep -E '^\[build\]|^\[[a-z-]+\] [0-9]+ passed|^FAIL|^FAILED|^\[done\]' "$OUT/check/stdout.txt" | tail -n 40
timeout 170 "$PY" -m bench.gpu_limits --out "$OUT/limits" > "$OUT/limits/stdout.txt" 2>&1
echo "gpu_limits exit status $?"
(cd "$OUT/limits" && sed -n '/^| backend/,$p' REPORT.md 2>/dev/null) | cut -c1-120 | tail -n 75
exit $check_rc

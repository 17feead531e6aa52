#!/usr/bin/env bash
# The GPU check from a plain checkout (see benchmarks/device_python.sh):
# benchmarks/gpu_check.py writes summary.json, check.log and the bench JSONs under $OUT
# (default ./gpu-check-out). Extra arguments go to gpu_check.py (--budget-s, --short for a
# dry run).
set -u
cd "$(dirname "$0")/.." || exit 1
source benchmarks/device_python.sh
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
# The whole check stays under 9 minutes even if a step hangs past its own limit.
exec timeout -k 5 500 "$PY" benchmarks/gpu_check.py --out "$OUT" "$@"

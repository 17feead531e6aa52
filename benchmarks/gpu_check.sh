#!/usr/bin/env bash
# The run a lent GPU host owes, from a plain checkout (see benchmarks/device_python.sh):
# benchmarks/gpu_check.py writes summary.json after every step, check.log, the load
# generator's JSONs, the R2D2 legs' relay.tar.NN parts and the regenerated docs/ copies
# under $OUT (default ./gpu-check-out). Extra arguments go to gpu_check.py.
#
# Before the lease, here (the sizes of what travels, refused beyond the carry limit):
#   python benchmarks/gpu_check.py --carry-check
# The lease: the device tool's `run` with
#   command: bash benchmarks/gpu_check.sh     carry: [".whl", "runs/relay/minatar-r2d2"]
#   timeout_s: 600
# It runs, within its 550 s budget: `info`; `loadgen` (about 3 minutes: CartPole 1024 x 1,
# Atari Pong 64 x 1 with the Nature CNN and the ResNet, inference only and training, on
# CUDA, GPU utilisation per window); `legs` (the rest less a minute to stop and pack and
# 40 s for the tables: the five MinAtar games of R2D2 seed 0 side by side, on from the
# carried relay, then seed 1 once seed 0 finished); `tables` (docs/performance.md's GPU
# load-generator block and docs/learning.md's minatar-r2d2 table, regenerated into
# $OUT/docs/, as the host's checkout does not come back). `--steps legs,tables` spends a
# later lease on the legs alone; `--steps info,tests,train,timings,bench` is the
# accelerator check of docs/performance.md's GPU table. `--dry-run` is every step at toy
# size, without CUDA too (tests/test_gpu_check.py runs it).
#
# Afterwards, here, from the files that came back (FILES below):
#   mkdir -p runs/relay/minatar-r2d2 && cat FILES/relay.tar.* | tar -xzf - -C runs/relay/minatar-r2d2
#   cp FILES/summary.json benchmarks/results/gpu-loadgen-TAG-summary.json
#   python -m benchmarks.gpu_table benchmarks/results/gpu-loadgen-TAG-summary.json \
#       --update docs/performance.md
#   python -m benchmarks.learning archive --out runs/relay/minatar-r2d2   # finished runs
#   make bench-learning-table SUITE=minatar AGENT=r2d2
# (FILES/docs/ holds the same pages as the host rendered them, the unfinished runs'
# rows included, to compare.)
set -u
cd "$(dirname "$0")/.." || exit 1
source benchmarks/device_python.sh
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
# The whole run stays inside the device tool's 600 s a command even if a step hangs past
# its own limit.
exec timeout -k 5 "${HARD_LIMIT_S:-585}" "$PY" benchmarks/gpu_check.py --out "$OUT" "$@"

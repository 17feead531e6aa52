#!/usr/bin/env bash
# One leg of a learning-benchmark run too long for one lease of a GPU host. The suite's
# results directory travels in with the checkout (name it in the call's carry), `run
# --stop-after` trains on from its checkpoint until the lease is nearly spent, and the
# directory goes back out under $OUT as relay.tar.NN parts of at most 15 MiB, each small
# enough to come back from the host (the checkpoint history stays behind).
#
#   bash benchmarks/gpu_leg.sh RESULTS_DIR SECONDS [benchmarks.learning run flags]
#
# Unpack the parts over RESULTS_DIR here (cat relay.tar.* | tar -xf - -C RESULTS_DIR) and
# carry it into the next lease. Exit status: 0 once every run finished, 130 to go on.
set -u
cd "$(dirname "$0")/.." || exit 1
if [ $# -lt 2 ]; then
    echo "usage: $0 RESULTS_DIR SECONDS [benchmarks.learning run flags]" >&2
    exit 2
fi
results=$1 seconds=$2
shift 2
source benchmarks/device_python.sh
OUT=${OUT:-$PWD/gpu-leg-out}
mkdir -p "$OUT" "$results"
# The hard limit leaves the run its grace to checkpoint after --stop-after.
timeout -k 5 "$(( ${seconds%.*} + 150 ))" \
    "$PY" -m benchmarks.learning run --out "$results" --stop-after "$seconds" "$@"
status=$?
rm -f "$OUT"/relay.tar.*
tar -cf - --exclude=checkpoints -C "$results" . | split -b 15M -d - "$OUT/relay.tar."
ls -l "$OUT"
exit "$status"

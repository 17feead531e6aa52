#!/usr/bin/env bash
# One leg of a learning-benchmark run too long for one lease of a GPU host. The suite's
# results directory travels in with the checkout (name it in the call's carry), `run
# --stop-after` trains on from its checkpoint until the lease is nearly spent, and the
# directory goes back out under $OUT as relay.tar.NN parts (gzipped) of at most 15 MiB,
# each small enough to come back from the host. The checkpoint history and an R2D2
# replay (hundreds of MiB) stay behind: the next leg refills the replay before learning.
#
#   bash benchmarks/gpu_leg.sh RESULTS_DIR SECONDS [benchmarks.learning run flags]
#   PARALLEL_ENVS=Breakout,Asterix bash benchmarks/gpu_leg.sh RESULTS_DIR SECONDS [flags]
#
# PARALLEL_ENVS trains those envs of the suite side by side, one `run --envs E` each into
# the same RESULTS_DIR (its output lines prefixed with [E]), so that one host's cores and
# GPU serve several small runs at once. Unpack the parts over RESULTS_DIR here
# (cat relay.tar.* | tar -xzf - -C RESULTS_DIR) and carry it into the next lease.
# Exit status: 0 once every run finished, 130 to go on (also for a run the hard limit
# killed: it resumes from its last checkpoint), another for a run that failed.
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
# The hard limit leaves each run its grace to checkpoint after --stop-after (LEG_GRACE_S,
# default 150; a caller with a tighter lease passes less, so the relay is still packed).
grace=${LEG_GRACE_S:-150}
leg() {
    timeout -k 5 "$(( ${seconds%.*} + ${grace%.*} ))" \
        "$PY" -m benchmarks.learning run --out "$results" --stop-after "$seconds" "$@"
    local code=$?
    # A run the hard limit ended (timeout's 124, or 137 once it needed KILL) lost only what
    # it trained since its last checkpoint; the next leg resumes from that one.
    if [ "$code" -eq 124 ] || [ "$code" -eq 137 ]; then
        echo "$0: a run outlived its grace and was killed; the next leg goes on from its last checkpoint"
        return 130
    fi
    return "$code"
}
if [ -n "${PARALLEL_ENVS:-}" ]; then
    pids=()
    for env in ${PARALLEL_ENVS//,/ }; do
        leg "$@" --envs "$env" > >(sed -u "s/^/[$env] /") 2>&1 &
        pids+=("$!")
    done
    status=0
    for pid in "${pids[@]}"; do
        wait "$pid"
        code=$?
        # A failure outranks "go on", which outranks "finished".
        if [ "$code" -ne 0 ] && [ "$code" -ne 130 ]; then status=$code
        elif [ "$code" -eq 130 ] && [ "$status" -eq 0 ]; then status=130; fi
    done
else
    leg "$@"
    status=$?
fi
rm -f "$OUT"/relay.tar.*
tar -czf - --exclude=checkpoints --exclude=replay.npz -C "$results" . | split -b 15M -d - "$OUT/relay.tar."
ls -l "$OUT"
exit "$status"

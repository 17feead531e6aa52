#!/usr/bin/env bash
# The GPU check from a plain checkout, no `make install`: carried wheels (.whl/, see the
# device notes) go into /tmp/site, the checkout onto PYTHONPATH, then benchmarks/gpu_check.py
# writes summary.json, check.log and the bench JSONs under $OUT (default ./gpu-check-out).
# Extra arguments go to gpu_check.py (--budget-s, --short for a dry run).
set -u
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || echo "gpu_check: installing .whl/*.whl failed; going on"
    export PYTHONPATH=/tmp/site:$PWD
else
    echo "gpu_check: no .whl/ wheels; using the installed packages"
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 SEEDRL_LOG_LEVEL=${SEEDRL_LOG_LEVEL:-WARNING}
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
# The whole check stays under 9 minutes even if a step hangs past its own limit.
exec timeout -k 5 500 "$PY" benchmarks/gpu_check.py --out "$OUT" "$@"

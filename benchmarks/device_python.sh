# Sourced by the scripts that run on a lent GPU host from a plain checkout (no `make
# install`): wheels carried in .whl/ (or $WHEELS) go into /tmp/site, the checkout onto
# PYTHONPATH, and PY names the interpreter. Without wheels the installed packages are used.
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$WHEELS"/*.whl || echo "$0: installing $WHEELS/*.whl failed; going on"
    export PYTHONPATH=/tmp/site:$PWD
else
    echo "$0: no wheels in $WHEELS/; using the installed packages"
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 SEEDRL_LOG_LEVEL=${SEEDRL_LOG_LEVEL:-WARNING}

#!/usr/bin/env bash
# What the JupyterHub end-to-end test needs (idempotent):
# - JupyterHub from PyPI in the venv the test users can run (scripts/install-multiuser.sh makes
#   it: /opt/gpujobs-test, or GPUJOBS_TEST_VENV), so the hub's LocalProcessSpawner can start
#   their `jupyterhub-singleuser` as them;
# - configurable-http-proxy from npm, under that venv's prefix (`npm install --prefix`), so the
#   hub finds it at $VENV/chp/node_modules/.bin/configurable-http-proxy.
# Without root or without the venv (install-multiuser.sh skipped) there is nothing to install into.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GPUJOBS_TEST_VENV:-/opt/gpujobs-test}
if [ "$(id -u)" != 0 ] || [ ! -x "$VENV/bin/python" ]; then
    echo "install-jupyterhub.sh: needs root and $VENV (scripts/install-multiuser.sh); skipped" >&2
    exit 0
fi
if [ ! -x "$VENV/bin/jupyterhub" ]; then
    "$VENV/bin/python" -m pip install -q "jupyterhub>=5,<7"
fi
CHP="$VENV/chp/node_modules/.bin/configurable-http-proxy"
if [ ! -x "$CHP" ]; then
    if ! command -v npm >/dev/null; then
        apt-get install -y -q nodejs npm >/dev/null
    fi
    npm install --silent --no-fund --no-audit --prefix "$VENV/chp" configurable-http-proxy@5 >/dev/null 2>&1 \
        || npm install --no-fund --no-audit --prefix "$VENV/chp" configurable-http-proxy@5
fi
chmod -R a+rX "$VENV"

#!/usr/bin/env bash
# Install what the tests need (Python packages into .venv, the labextension build, Debian's
# chromium, PostgreSQL, Slurm and munge) and run all the tests. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test]"
scripts/install-browser.sh   # Debian's chromium for the browser tests
scripts/install-postgres.sh  # Debian's PostgreSQL server for the store's PostgreSQL tests
scripts/install-multiuser.sh # test Unix users and a venv they can run (jobs as their owners)
scripts/install-slurm.sh     # Debian's Slurm and munge for the Slurm runner's tests
.venv/bin/ruff check .
set +e
.venv/bin/python -m pytest "$@"
code=$?
set -e
# pytest exits 5 when it collected no test: that is a failure of the suite, not a pass
exit $code

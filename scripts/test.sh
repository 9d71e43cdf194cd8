#!/usr/bin/env bash
# Install what the tests need (Python packages into .venv-test, the labextension build, Debian's
# chromium, PostgreSQL, Slurm and munge, JupyterHub) and run all the tests. Extra arguments go to pytest.
#
# Test files run in parallel, one file per worker at a time (pytest-xdist --dist loadfile:
# a module's shared server, kernel or database stays in one worker; each worker has its own
# temporary and Jupyter dirs and servers on free ports). GPUJOBS_TEST_WORKERS sets how many
# (default: one more than the CPUs, at most 4: most tests wait on real time, a time limit, a
# grace, a kernel starting, so one worker per CPU leaves them idle; on 2 cores 3 workers ran the
# suite in 732 s against 932 s with 2; 0 runs them in this process). The slowest tests are
# listed at the end.
#
# The tests have a venv of their own (GPUJOBS_TESTS_VENV, default .venv-test), not the .venv that
# scripts/run-lab.sh serves Lab from: a kernelspec, extension or package a user installs into
# their Lab's venv (`kernelspec install --sys-prefix`) must not change what the tests see.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${GPUJOBS_TESTS_VENV:-.venv-test}
step() { printf '\n==> %s\n' "$*"; }
step "Python packages into $VENV (the first time also builds the lab extension, a few minutes)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e ".[test]"
step "Debian's chromium for the browser tests"
scripts/install-browser.sh
step "Debian's PostgreSQL server for the store's PostgreSQL tests"
scripts/install-postgres.sh
step "test Unix users and a venv they can run (jobs as their owners)"
scripts/install-multiuser.sh
step "rootless podman for those users and the container test image (built here, no registry)"
scripts/install-podman.sh
step "JupyterHub and configurable-http-proxy in that venv (the JupyterHub test)"
scripts/install-jupyterhub.sh
step "Debian's Slurm and munge for the Slurm runner's tests"
scripts/install-slurm.sh
step "ruff (the project's own code; not what a user saved in the clone)"
scripts/lint.sh "$VENV/bin/ruff"
cpus=$(nproc 2>/dev/null || echo 1)
workers=${GPUJOBS_TEST_WORKERS:-$(( cpus + 1 < 4 ? cpus + 1 : 4 ))}
step "pytest ($workers workers)"
set +e
"$VENV/bin/python" -m pytest -n "$workers" --maxprocesses=4 --dist loadfile --durations=25 "$@"
code=$?
set -e
# pytest exits 5 when it collected no test: that is a failure of the suite, not a pass
exit $code

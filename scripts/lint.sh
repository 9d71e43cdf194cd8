#!/usr/bin/env bash
# ruff over what the project owns (the package, tests, benchmarks, binder), not over whatever a
# user saved in the clone (a tour notebook with names defined in other cells, job outputs).
# $1: the ruff to run (default: the one on PATH); further arguments go to `ruff check`.
set -euo pipefail
cd "$(dirname "$0")/.."
RUFF=${1:-ruff}
shift || true
exec "$RUFF" check jupyter_gpujobs tests benchmarks binder "$@"

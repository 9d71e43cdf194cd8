#!/usr/bin/env bash
# Install jupyter-gpujobs into .venv and start JupyterLab with the extension on the embedded
# default: SQLite in the Jupyter data dir, the local runner, the machine's NVIDIA GPUs (NVML),
# or fake GPUs (2xA100-80GB,2xT4) on a machine without them. Extra arguments go to `jupyter lab`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e .
if ! .venv/bin/python -c "import pynvml; pynvml.nvmlInit()" >/dev/null 2>&1; then
  export GPUJOBS_FAKE_GPUS="${GPUJOBS_FAKE_GPUS:-2xA100-80GB,2xT4}"
  echo "No NVIDIA GPU found: using fake GPUs $GPUJOBS_FAKE_GPUS (set GPUJOBS_FAKE_GPUS to change them)."
fi
exec .venv/bin/jupyter lab "$@"

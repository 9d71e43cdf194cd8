#!/usr/bin/env bash
# Install jupyter-gpujobs into .venv and start JupyterLab with the extension on the embedded
# default: SQLite in the Jupyter data dir, the local runner, the machine's NVIDIA GPUs (NVML),
# or fake GPUs (2xA100-80GB,2xT4) on a machine without them. Extra arguments go to `jupyter lab`.
#
# It says what it does, step by step. The install runs on the first start and again when
# pyproject.toml changed (or with GPUJOBS_REINSTALL=1). Lab's terminals and kernels get the
# venv's bin first on PATH, so `jupyter gpujobs ...` works in them as the README shows. As root
# it adds --allow-root, and with no display --no-browser. GPUJOBS_VENV: the venv (default .venv).
# Lab serves a working folder of the user's, not this clone, so the notebooks and job outputs of
# the tour never land in the source tree: GPUJOBS_WORKDIR (default ~/gpujobs-work), created if
# missing, unless the arguments name a root dir (--ServerApp.root_dir, --notebook-dir).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${GPUJOBS_VENV:-.venv}
VENV=$(mkdir -p "$VENV" && cd "$VENV" && pwd)
MARK="$VENV/.jupyter-gpujobs-installed"
step() { printf '\n==> %s\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
  step "1/4 creating the virtual environment $VENV (with $PY)"
  "$PY" -m venv "$VENV"
else
  step "1/4 using the virtual environment $VENV"
fi

if [ ! -f "$MARK" ] || [ pyproject.toml -nt "$MARK" ] || [ -n "${GPUJOBS_REINSTALL:-}" ]; then
  step "2/4 installing jupyter-gpujobs and JupyterLab into it (the first time takes a few minutes: it"
  echo "    downloads JupyterLab and builds the lab extension with Node.js)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  set +e
  "$VENV/bin/python" -m pip install -e . 2>&1 | grep --line-buffered -v -e '^Requirement already satisfied' \
    -e '^  Using cached' -e '^  Downloading'
  code=${PIPESTATUS[0]}
  set -e
  [ "$code" = 0 ] || { echo "the install failed (pip exit $code; see above)" >&2; exit "$code"; }
  touch "$MARK"
else
  step "2/4 jupyter-gpujobs is installed (GPUJOBS_REINSTALL=1 installs it again)"
fi

step "3/4 looking for NVIDIA GPUs"
if "$VENV/bin/python" -c "import pynvml; pynvml.nvmlInit()" >/dev/null 2>&1; then
  echo "    found NVML: the queue schedules this machine's GPUs"
else
  export GPUJOBS_FAKE_GPUS="${GPUJOBS_FAKE_GPUS:-2xA100-80GB,2xT4}"
  echo "    no NVIDIA GPU found: using fake GPUs $GPUJOBS_FAKE_GPUS (set GPUJOBS_FAKE_GPUS to change them)"
fi

# Lab's kernels inherit the server's environment: the venv comes first on PATH. Its terminals
# would too, but Jupyter starts them as login shells when it has no tty, and /etc/profile resets
# PATH: they run bash with an rc file that sets up the user's shell as usual, then the venv.
export VIRTUAL_ENV="$VENV"
export PATH="$VENV/bin:$PATH"
args=()
if command -v bash >/dev/null && [[ " $* " != *"terminado_settings"* ]]; then
  rc="$VENV/.jupyter-gpujobs-terminal-rc"
  cat > "$rc" <<RC
# Lab terminals of scripts/run-lab.sh: the user's usual bash setup, then this venv first on PATH
[ -f /etc/profile ] && . /etc/profile
if [ -f ~/.bash_profile ]; then . ~/.bash_profile; elif [ -f ~/.profile ]; then . ~/.profile; elif [ -f ~/.bashrc ]; then . ~/.bashrc; fi
export VIRTUAL_ENV="$VENV" PATH="$VENV/bin:\$PATH"
RC
  args+=("--ServerApp.terminado_settings=shell_command=['$(command -v bash)','--rcfile','$rc','-i']")
fi
if [ "$(id -u)" = 0 ] && [[ " $* " != *" --allow-root "* ]]; then
  args+=(--allow-root)
  echo "    running as root: adding --allow-root"
fi
if [ -z "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ] && [ "$(uname)" != Darwin ] && [[ " $* " != *" --no-browser "* ]] \
   && [[ " $* " != *"--ServerApp.open_browser"* ]]; then
  args+=(--no-browser)
  echo "    no display: adding --no-browser; open the URL printed below (on a remote box through ssh -L)"
fi

if [[ " $* " != *"root_dir"* ]] && [[ " $* " != *"notebook-dir"* ]] && [[ " $* " != *"notebook_dir"* ]]; then
  WORKDIR=${GPUJOBS_WORKDIR:-$HOME/gpujobs-work}
  mkdir -p "$WORKDIR"
  WORKDIR=$(cd "$WORKDIR" && pwd)
  args+=("--ServerApp.root_dir=$WORKDIR")
  echo "    serving $WORKDIR: your notebooks and job outputs go there, not into this clone"
  echo "    (GPUJOBS_WORKDIR or --ServerApp.root_dir=DIR serves another folder)"
fi

step "4/4 starting JupyterLab; in its terminals try: jupyter gpujobs gpus"
echo "    (in a shell of your own, first: source $VENV/bin/activate)"
exec "$VENV/bin/jupyter" lab ${args[@]+"${args[@]}"} "$@"

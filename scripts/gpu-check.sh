#!/usr/bin/env bash
# gpu-check.sh: one prepared check of jupyter-gpujobs on a machine with a real NVIDIA GPU
# (and possibly no network). Never run in CI: it needs a GPU and takes a few minutes.
#
#   scripts/gpu-check.sh [--wheels DIR] [--python PYTHON] [--keep] [--dry-run]
#
# It finds the Python that has PyTorch (--python, else python3 on PATH, $VIRTUAL_ENV, common
# venv places; the first whose `import torch` works), makes a virtual environment from it,
# installs the project into that (offline from DIR when --wheels is given), then makes that
# PyTorch importable there (a .pth file naming its site-packages, after the venv's own: a venv
# made with --system-site-packages from inside a venv sees the base interpreter's packages, not
# the venv's). It starts a Jupyter server with the extension on the NVML backend with the
# defaults (no foreign-use threshold raised), prints one line per check, "PASS|FAIL|SKIP <name>
# <detail with its figure>", then a summary line; the MPS check runs on a second server with
# c.GPUJobs.mps=True. It exits 1 when a check failed. The whole run is bounded to 4 minutes.
#
# Checks:
#   inventory        the NVML inventory (GET gpus) matches
#                    nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader
#   idle-memory      an idle GPU is not in use outside the queue, and GET gpus' memory used and
#                    reserved are nvidia-smi's memory.used and memory.reserved (the driver's
#                    reservation is not "used")
#   torch-visible    a PyTorch job sees exactly its GPU: device_count()==1, its UUID matches
#   samples-rise     utilization and memory samples rise while a matmul loop runs
#   oom              a job allocating more GPU memory than exists ends FAILED, "out of memory"
#   time-limit-frees a job killed at its time limit gives its GPU memory back (nvidia-smi)
#   rogue            a process started outside the queue on a GPU is reported as rogue
#   fence            a job given one GPU opens its /dev/nvidiaN and gets EPERM on every other GPU's
#                    node (device cgroup); SKIP on a 1-GPU machine or where GET gpus says
#                    "GPU fence: none" (not root, no writable devices cgroup)
#   process-memory   NVML reports the used memory of a process that holds 1 GiB through cuMemAlloc
#                    (python -m jupyter_gpujobs.gpualloc: ctypes and libcuda, no framework)
#   mig              where a GPU is in MIG mode: GET gpus lists exactly the MIG-... UUIDs of
#                    nvidia-smi -L, and a job asking for the first one's profile gets
#                    CUDA_VISIBLE_DEVICES=<its MIG UUID> and can allocate there; SKIP without MIG
#   over-share       a job with a 1G GPU memory share that allocates 3 GiB ends FAILED with
#                    "used N GB of its 1 GB share on GPU i" (and a WARNING event before)
#   gpujob-cell      a %%gpujob cell with a PyTorch matmul, run from a real IPython kernel
#                    (seconds for the whole cell, TFLOP/s inside the job)
#   gpu-kernel       a kernel of a GPU kernelspec (`jupyter gpujobs kernelspec install -g 1`)
#                    started through the server: seconds to start, the GPU it sees, GPU freed
#                    after its shutdown
#   four-shares      four 0.25 shares of one GPU run at once (their measuring windows overlap):
#                    TFLOP/s of each and their sum against one whole-GPU job alone
#   mps-share        with c.GPUJobs.mps=True: a 2G share allocating 1 GiB runs, one allocating
#                    4 GiB is refused by the driver (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)
# The checks that need PyTorch are SKIPped when it cannot be imported (with why).
#
# Preparing DIR on a machine with network (same OS, CPU architecture and Python minor
# version as the GPU machine), from the repository root:
#   python -m pip wheel --wheel-dir DIR .          # the project's wheel and every dependency
#   python -m pip download --dest DIR torch         # optional, large: only if the GPU machine
#                                                   # has no PyTorch of its own
# then copy DIR (and this repository) to the GPU machine and run
#   scripts/gpu-check.sh --wheels DIR
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEELS=""
PYTHON="${PYTHON:-}"
KEEP=0
DRY=0
BUDGET=235 # seconds for the whole run: finding PyTorch, set-up, servers and checks (under 4 minutes)
MPS_PHASE=45 # seconds kept at the end for the second server (c.GPUJobs.mps=True) and its check

usage() { sed -n '2,/^set -uo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) WHEELS="${2:-}"; shift 2 ;;
    --wheels=*) WHEELS="${1#--wheels=}"; shift ;;
    --python) PYTHON="${2:-}"; shift 2 ;;
    --python=*) PYTHON="${1#--python=}"; shift ;;
    --keep) KEEP=1; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-check: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done

CHECKS=(
  "inventory|NVML inventory (GET gpus) == nvidia-smi --query-gpu=index,uuid,name,memory.total"
  "idle-memory|idle GPUs: not foreign; GET gpus memory used/reserved == nvidia-smi memory.used/memory.reserved"
  "torch-visible|a 1-GPU PyTorch job: torch.cuda.device_count()==1 and its UUID is the allocated GPU's"
  "samples-rise|a 1-GPU matmul loop: job stats and GPU samples show utilization and memory rising"
  "oom|a job allocating 1.5x the GPU's memory ends FAILED with reason 'out of memory' (and an oom finding)"
  "time-limit-frees|a job holding GPU memory with a 10s time limit ends TIMEOUT; nvidia-smi shows the memory freed"
  "rogue|a process started outside the queue on a GPU appears in GET findings?kind=rogue_process"
  "fence|a job given GPU i opens /dev/nvidia<minor of i>; the other GPUs' nodes fail with EPERM"
  "process-memory|NVML usedGpuMemory of a process holding 1 GiB via cuMemAlloc (gpualloc, no framework)"
  "mig|with MIG: GET gpus MIG UUIDs == nvidia-smi -L; a --type <profile> job gets CUDA_VISIBLE_DEVICES=MIG-..."
  "over-share|a gpu_memory=1G job allocating 3 GiB ends FAILED: 'used N GB of its 1 GB share on GPU i'"
  "gpujob-cell|a %%gpujob cell (PyTorch bf16 matmul) from a real IPython kernel: seconds, TFLOP/s"
  "gpu-kernel|a GPU kernelspec's kernel through POST api/kernels: start seconds, GPU seen, freed on shutdown"
  "four-shares|four 0.25 shares at once on one GPU: TFLOP/s each, sum vs one job alone"
  "mps-share|c.GPUJobs.mps=True: a 2G share allocating 1 GiB runs; allocating 4 GiB is refused by the driver"
)

# The Pythons to ask for PyTorch, in order: --python, python3 on PATH, the active venv, common places.
candidates() {
  [ -n "$PYTHON" ] && echo "$PYTHON"
  command -v python3 2>/dev/null
  [ -n "${VIRTUAL_ENV:-}" ] && echo "$VIRTUAL_ENV/bin/python"
  local d
  for d in /opt/venv /venv /.venv /opt/conda /opt/conda/envs/* "$HOME/.venv" "$HOME/venv" /root/.venv /root/venv \
           /workspace/.venv /opt/*/venv /opt/*/.venv /usr/local /usr; do
    [ -x "$d/bin/python3" ] && echo "$d/bin/python3"
  done
  return 0
}

# The first candidate whose `import torch` works ("" when none): where its packages are.
find_torch_python() {
  local c seen=" "
  while IFS= read -r c; do
    case "$seen" in *" $c "*) continue ;; esac
    seen="$seen$c "
    if timeout 60 "$c" -c 'import torch' >/dev/null 2>&1; then echo "$c"; return 0; fi
  done < <(candidates)
  return 0
}

if [ "$DRY" = 1 ]; then
  echo "gpu-check dry run: repository $REPO"
  echo "  pythons asked for PyTorch, in order:"
  candidates | awk '!seen[$0]++' | sed 's/^/    /'
  TORCH_PY="$(find_torch_python)"
  if [ -n "$TORCH_PY" ]; then
    echo "  PyTorch: $TORCH_PY ($("$TORCH_PY" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>&1))"
    echo "  venv:    $TORCH_PY -m venv WORK/venv, then a .pth naming its site-packages (after the venv's own)"
  else
    echo "  PyTorch: not found in any of them: the PyTorch checks will SKIP"
    echo "  venv:    ${PYTHON:-python3} -m venv WORK/venv"
  fi
  if [ -n "$WHEELS" ]; then
    echo "  install: pip install --no-index --find-links $WHEELS jupyter-gpujobs (or the source tree)"
  else
    echo "  install: pip install $REPO (needs network)"
  fi
  echo "  server:  jupyter server without GPUJOBS_FAKE_GPUS (NVML backend), the defaults but"
  echo "           --GPUJobs.sample_interval=1 --GPUJobs.share_grace=2; then one with --GPUJobs.mps=True"
  echo "  budget:  ${BUDGET}s in all"
  for c in "${CHECKS[@]}"; do
    printf '  check %-17s %s\n' "${c%%|*}" "${c#*|}"
  done
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "  nvidia-smi: $(nvidia-smi -L 2>&1 | head -3 | tr '\n' ' ')"
  else
    echo "  nvidia-smi: not found: a real run here would stop at 'FAIL setup' (no NVIDIA GPU or driver)"
  fi
  exit 0
fi

START=$(date +%s)
END=$(( START + BUDGET ))
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "FAIL setup nvidia-smi not found: this script needs a machine with an NVIDIA GPU and driver"
  echo "SUMMARY 0 passed, 1 failed, 0 skipped"
  exit 1
fi
if [ -n "$WHEELS" ] && [ ! -d "$WHEELS" ]; then
  echo "FAIL setup --wheels $WHEELS is not a directory"
  echo "SUMMARY 0 passed, 1 failed, 0 skipped"
  exit 1
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpujobs-check.XXXXXX")"
SERVER_PID=""
stop_server() {
  # SIGTERM: a clean stop (SIGINT would make the server ask for a confirmation first)
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null
    for _ in $(seq 20); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$SERVER_PID" 2>/dev/null
  fi
  [ -n "$SERVER_PID" ] && wait "$SERVER_PID" 2>/dev/null
  SERVER_PID=""
}
cleanup() {
  stop_server
  # the MPS control daemons of the mps phase stay up after their engine (by design): quit them
  local pipe
  for pipe in "$WORK"/mps/pipe/*/; do
    [ -e "$pipe/control" ] && echo quit | CUDA_MPS_PIPE_DIRECTORY="$pipe" timeout 10 nvidia-cuda-mps-control >/dev/null 2>&1
  done
  # job supervisors run in their own sessions; stop any this run left (their command lines name the state dirs)
  pkill -KILL -f "$WORK/state" 2>/dev/null || true
  if [ "$KEEP" = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

echo "gpu-check: work dir $WORK"
TORCH_PY="$(find_torch_python)"
if [ -n "$TORCH_PY" ]; then
  BASE_PY="$TORCH_PY"
  echo "gpu-check: PyTorch found with $TORCH_PY ($(( $(date +%s) - START ))s)"
else
  BASE_PY="${PYTHON:-python3}"
  echo "gpu-check: no Python here imports torch (asked: $(candidates | awk '!seen[$0]++' | tr '\n' ' ')); the PyTorch checks will SKIP"
fi
"$BASE_PY" -m venv "$WORK/venv" >"$WORK/venv.log" 2>&1 \
  || { echo "FAIL setup venv: $BASE_PY -m venv failed: $(tail -1 "$WORK/venv.log")"; echo "SUMMARY 0 passed, 1 failed, 0 skipped"; exit 1; }
VPY="$WORK/venv/bin/python"
PIP=("$VPY" -m pip install --quiet --disable-pip-version-check)
if [ -n "$WHEELS" ]; then
  WHEEL_DIR="$(cd "$WHEELS" && pwd)"
  if ls "$WHEEL_DIR"/jupyter_gpujobs-*.whl >/dev/null 2>&1; then
    TARGET="jupyter-gpujobs"
  else
    TARGET="$REPO"
  fi
  "${PIP[@]}" --no-index --find-links "$WHEEL_DIR" "$TARGET" >"$WORK/pip.log" 2>&1 \
    || { echo "FAIL setup offline install from $WHEEL_DIR failed (see below)"; tail -20 "$WORK/pip.log"; exit 1; }
else
  "${PIP[@]}" "$REPO" >"$WORK/pip.log" 2>&1 \
    || { echo "FAIL setup install of $REPO failed (see below)"; tail -20 "$WORK/pip.log"; exit 1; }
fi
if [ -n "$TORCH_PY" ]; then
  # PyTorch's site-packages after the venv's own: importable, without shadowing what was installed
  SITE="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  "$TORCH_PY" -c 'import os, sys
print("\n".join(p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages") and os.path.isdir(p)))' \
    >"$SITE/zz-gpu-check-torch.pth"
  if ! "$VPY" -c 'import torch' >/dev/null 2>&1; then
    echo "gpu-check: torch of $TORCH_PY is still not importable in the venv ($("$VPY" -c 'import torch' 2>&1 | tail -1))"
  fi
fi
echo "gpu-check: installed in $(( $(date +%s) - START ))s"

TOKEN="gpu-check-$RANDOM$RANDOM"
mkdir -p "$WORK/root" "$WORK/state" "$WORK/state-mps" "$WORK/home"
export JUPYTER_CONFIG_DIR="$WORK/home/config" JUPYTER_DATA_DIR="$WORK/home/data" JUPYTER_RUNTIME_DIR="$WORK/home/runtime"
# start_server STATE_DIR [more --GPUJobs options]: a server on the NVML backend; sets PORT and SERVER_PID
start_server() {
  local state="$1"
  shift
  PORT="$("$VPY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  env -u GPUJOBS_FAKE_GPUS -u GPUJOBS_URL -u GPUJOBS_TOKEN \
    "$VPY" -m jupyter_server --no-browser --ip=127.0.0.1 --port="$PORT" --port-retries=0 \
    --IdentityProvider.token="$TOKEN" --ServerApp.root_dir="$WORK/root" \
    --ServerApp.jpserver_extensions=jupyter_gpujobs=True --GPUJobs.state_dir="$state" \
    --GPUJobs.sample_interval=1 --GPUJobs.kill_grace=2 --GPUJobs.tick_interval=0.5 --GPUJobs.share_grace=2 \
    "$@" --allow-root >>"$WORK/server.log" 2>&1 &
  SERVER_PID=$!
}
start_server "$WORK/state"

cat >"$WORK/check.py" <<'PYEOF'
"""The checks of gpu-check.sh, against a running server: one line per check."""
import json
import os
import subprocess
import sys
import time

import httpx

PHASE, URL, TOKEN, PY, DEADLINE, WORK = sys.argv[1:7]
DEADLINE = float(DEADLINE)
API = URL + "gpujobs/api/"
H = {"Authorization": f"token {TOKEN}"}
results = []


def report(status, name, detail):
    results.append(status)
    print(f"{status} {name} {detail}", flush=True)


def call(method, path, **kw):
    r = httpx.request(method, API + path, headers=H, timeout=30, **kw)
    r.raise_for_status()
    return r.json()


def smi(*args):
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30).stdout


def used_mb(index):
    out = smi(f"--id={index}", "--query-gpu=memory.used", "--format=csv,noheader,nounits").strip()
    return float(out.splitlines()[0]) if out else float("nan")


def submit(code, **extra):
    body = {"command": [PY, "-c", code], "gpus": 1, "time_limit": "2m", "name": "gpu-check", **extra}
    return call("POST", "jobs", json=body)


def wait(job_id, states, timeout):
    end = min(time.time() + timeout, DEADLINE)
    while True:
        job = call("GET", f"jobs/{job_id}")
        if job["state"] in states or time.time() > end:
            return job
        time.sleep(0.5)


def log(job_id):
    return call("GET", f"jobs/{job_id}/log", params={"offset": 0})["data"]


def left():
    return DEADLINE - time.time()


def server_gpus():
    """GET gpus once the server answers on the NVML backend; None (reported) when it does not."""
    end = time.time() + 60
    while True:
        try:
            gpus = call("GET", "gpus")
            break
        except Exception as err:
            if time.time() > end:
                report("FAIL", "server", f"no answer from {URL} within 60s: {err}")
                return None
            time.sleep(0.5)
    if gpus["backend"] != "nvml":
        report("FAIL", "server", f"backend is {gpus['backend']!r}, not nvml (see the server log)")
        return None
    return gpus


def main():
    gpus = server_gpus()
    if gpus is None:
        return
    if PHASE == "mps":
        mps_share_check(gpus)
        return
    api_gpus = sorted(gpus["gpus"], key=lambda g: g["index"])
    isolation = gpus.get("isolation") or "GPU fence: none (not reported)"
    print(f"gpu-check: isolation: {isolation}", flush=True)

    # ---- inventory
    # (a GPU in MIG mode is not schedulable itself: its MIG instances are, see the mig check)
    rows = [r.split(", ") for r in smi("--query-gpu=index,uuid,name,memory.total,mig.mode.current",
                                          "--format=csv,noheader,nounits").strip().splitlines()]
    want = [(int(i), u.strip(), n.strip(), float(m)) for i, u, n, m, mig in rows if mig.strip() != "Enabled"]
    got = [(g["index"], g["uuid"], g["name"], float(g["memory_total_mb"])) for g in api_gpus if not g.get("mig")]
    same = len(want) == len(got) and all(
        w[:3] == g[:3] and abs(w[3] - g[3]) <= max(2.0, 0.01 * w[3]) for w, g in zip(want, got))
    report("PASS" if same else "FAIL", "inventory",
           f"{len(got)} GPU(s): {', '.join(f'{g[0]}:{g[2]}' for g in got)}" if same
           else f"nvidia-smi {want} != API {got}")

    idle_memory_check(api_gpus)
    fence_check(api_gpus, isolation)
    process_memory_check(api_gpus)
    mig_check(api_gpus)
    over_share_check()

    has_torch = subprocess.run([PY, "-c", "import torch; assert torch.cuda.is_available()"],
                               capture_output=True, timeout=120).returncode == 0
    if has_torch:
        torch_checks(api_gpus)
    else:
        for name in ("torch-visible", "samples-rise", "oom", "time-limit-frees", "rogue"):
            report("SKIP", name, NO_TORCH)
    gpujob_cell_check(has_torch)
    gpu_kernel_check(has_torch)
    four_shares_check(has_torch, api_gpus)


NO_TORCH = "PyTorch with CUDA is not importable in the venv (no Python on this machine has it; or pass its wheel)"


def torch_checks(api_gpus):
    """torch-visible, samples-rise, oom, time-limit-frees, rogue: each one job (or process) with PyTorch."""
    uuid_of = {g["index"]: g["uuid"] for g in api_gpus}

    # ---- torch-visible
    job = submit("import json, os, torch\n"
                 "p = torch.cuda.get_device_properties(0)\n"
                 "print('RESULT ' + json.dumps({'n': torch.cuda.device_count(), 'uuid': str(getattr(p, 'uuid', '')),"
                 " 'env': os.environ.get('CUDA_VISIBLE_DEVICES')}))")
    end_job = wait(job["id"], ("COMPLETED", "FAILED", "TIMEOUT", "LOST", "CANCELLED"), 90)
    line = next((x for x in log(job["id"]).splitlines() if x.startswith("RESULT ")), None)
    if end_job["state"] != "COMPLETED" or line is None:
        report("FAIL", "torch-visible", f"job ended {end_job['state']}: {end_job['reason']}")
    else:
        seen = json.loads(line[7:])
        index = end_job["assigned_gpus"][0]
        want_uuid = uuid_of[index].lower().removeprefix("gpu-")
        got_uuid = seen["uuid"].lower().removeprefix("gpu-")
        ok = seen["n"] == 1 and (not got_uuid or got_uuid == want_uuid)
        report("PASS" if ok else "FAIL", "torch-visible",
               f"device_count={seen['n']}, uuid {got_uuid or '(torch too old to say)'} vs GPU {index} {want_uuid}")

    # ---- samples-rise
    job = submit("import time, torch\n"
                 "a = torch.randn(8192, 8192, device='cuda')\n"
                 "hold = torch.empty(int(1.5 * 2**30), dtype=torch.uint8, device='cuda')\n"
                 "end = time.time() + 15\n"
                 "while time.time() < end:\n"
                 "    b = a @ a\n"
                 "    torch.cuda.synchronize()\n")
    running = wait(job["id"], ("RUNNING", "COMPLETED", "FAILED"), 60)
    index = (running.get("assigned_gpus") or [0])[0]
    t0 = running.get("started_at") or time.time()
    end_job = wait(job["id"], ("COMPLETED", "FAILED", "TIMEOUT", "LOST"), 60)
    time.sleep(1.5)
    stats = call("GET", f"jobs/{job['id']}/stats")
    samples = call("GET", "gpus/samples", params={"gpu": index, "since": t0 - 10, "resolution": 0})["samples"]
    before = [s for s in samples if s["time"] < t0]
    during = [s for s in samples if t0 <= s["time"] <= (end_job.get("ended_at") or time.time())]
    base_mem = min((s["memory_used_mb"] or 0) for s in before) if before else 0
    peak_util = max((s["utilization"] or 0) for s in during) if during else 0
    peak_mem = max((s["memory_used_mb"] or 0) for s in during) if during else 0
    ok = (end_job["state"] == "COMPLETED" and peak_util >= 30 and peak_mem - base_mem >= 1000
          and (stats["utilization_max"] or 0) >= 30 and (stats["memory_max_mb"] or 0) >= 1000)
    report("PASS" if ok else "FAIL", "samples-rise",
           f"GPU {index}: utilization up to {peak_util:.0f}%, memory {base_mem:.0f} -> {peak_mem:.0f} MB "
           f"({len(during)} samples); job stats util max {stats['utilization_max']}%, "
           f"memory max {stats['memory_max_mb']} MB; job {end_job['state']}")

    # ---- oom
    job = submit("import torch\n"
                 "total = torch.cuda.get_device_properties(0).total_memory\n"
                 "x = torch.empty(int(total * 1.5), dtype=torch.uint8, device='cuda')\n")
    end_job = wait(job["id"], ("COMPLETED", "FAILED", "TIMEOUT", "LOST"), 90)
    time.sleep(1.0)
    oom = call("GET", "findings", params={"kind": "oom", "job": job["id"]})["findings"]
    ok = end_job["state"] == "FAILED" and "out of memory" in (end_job["reason"] or "")
    report("PASS" if ok else "FAIL", "oom",
           f"job {end_job['state']}: {end_job['reason']!r}; oom finding: {'yes' if oom else 'no'}")

    # ---- time-limit-frees
    job = submit("import time, torch\n"
                 "hold = torch.empty(2 * 2**30, dtype=torch.uint8, device='cuda')\n"
                 "torch.cuda.synchronize()\n"
                 "print('holding', flush=True)\n"
                 "time.sleep(600)\n", time_limit="10s")
    running = wait(job["id"], ("RUNNING",), 30)
    index = (running.get("assigned_gpus") or [0])[0]
    held = 0.0
    for _ in range(40):
        if "holding" in log(job["id"]):
            held = used_mb(index)
            break
        time.sleep(0.5)
    end_job = wait(job["id"], ("TIMEOUT", "COMPLETED", "FAILED", "LOST", "CANCELLED"), 40)
    freed = used_mb(index)
    for _ in range(20):
        if freed < held - 1500:
            break
        time.sleep(0.5)
        freed = used_mb(index)
    apps = smi(f"--id={index}", "--query-compute-apps=pid", "--format=csv,noheader").split()
    ok = end_job["state"] == "TIMEOUT" and held > 0 and freed < held - 1500
    report("PASS" if ok else "FAIL", "time-limit-frees",
           f"job {end_job['state']} ({end_job['reason']}); GPU {index} memory {held:.0f} MB while held, "
           f"{freed:.0f} MB after; compute processes left: {len(apps)}")

    # ---- rogue
    gpus = call("GET", "gpus")["gpus"]
    free = [g["index"] for g in gpus if not g.get("job_id")] or [gpus[0]["index"]]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUJOBS_")}
    env["CUDA_VISIBLE_DEVICES"] = str(free[0])
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    rogue = subprocess.Popen([PY, "-c", "import time, torch\nx = torch.ones(1, device='cuda')\n"
                                        "torch.cuda.synchronize()\ntime.sleep(120)"], env=env)
    found = None
    started = time.time()
    try:
        end = min(time.time() + 45, DEADLINE)
        while time.time() < end and found is None:
            rows = call("GET", "findings", params={"kind": "rogue_process", "open": "1"})["findings"]
            found = next((f for f in rows if f["pid"] == rogue.pid), None)
            if found is None:  # in a container NVML may report the host's pid of the process
                found = next((f for f in rows if f["gpu"] == free[0] and f["time"] >= started - 1), None)
            time.sleep(1)
    finally:
        rogue.kill()
        rogue.wait()
    report("PASS" if found else "FAIL", "rogue",
           found["message"] if found else f"process {rogue.pid} on GPU {free[0]} was not reported within 45s")


def fence_check(api_gpus, isolation):
    """A 1-GPU job opens every GPU's device node: its own opens, the others give EPERM."""
    api_gpus = [g for g in api_gpus if not g.get("mig")]  # whole GPUs: one device node each
    if len(api_gpus) < 2:
        report("SKIP", "fence", "needs 2 or more GPUs")
        return
    if not isolation.startswith("GPU fence: device cgroup"):
        report("SKIP", "fence", f"no device fence on this host: {isolation}")
        return
    import pynvml

    pynvml.nvmlInit()
    try:
        minor = {g["index"]: int(pynvml.nvmlDeviceGetMinorNumber(pynvml.nvmlDeviceGetHandleByIndex(g["index"])))
                 for g in api_gpus}
    finally:
        pynvml.nvmlShutdown()
    code = ("import errno, json, os\n"
            f"minors = {sorted(minor.values())!r}\n"
            "out = {}\n"
            "for m in minors:\n"
            "    try:\n"
            "        os.close(os.open(f'/dev/nvidia{m}', os.O_RDWR))\n"
            "        out[m] = 'ok'\n"
            "    except OSError as err:\n"
            "        out[m] = errno.errorcode.get(err.errno, str(err.errno))\n"
            "print('RESULT ' + json.dumps(out))\n")
    job = submit(code, time_limit="1m")
    end_job = wait(job["id"], ("COMPLETED", "FAILED", "TIMEOUT", "LOST", "CANCELLED"), 60)
    line = next((x for x in log(job["id"]).splitlines() if x.startswith("RESULT ")), None)
    if end_job["state"] != "COMPLETED" or line is None:
        report("FAIL", "fence", f"job ended {end_job['state']}: {end_job['reason']}")
        return
    opened = {int(k): v for k, v in json.loads(line[7:]).items()}
    mine = minor[end_job["assigned_gpus"][0]]
    others = {m: r for m, r in opened.items() if m != mine}
    ok = opened.get(mine) == "ok" and all(r == "EPERM" for r in others.values())
    report("PASS" if ok else "FAIL", "fence",
           f"given GPU {end_job['assigned_gpus'][0]} (/dev/nvidia{mine}: {opened.get(mine)}); "
           f"other nodes: {', '.join(f'nvidia{m}: {r}' for m, r in sorted(others.items()))}")


def process_memory_check(api_gpus):
    """A process holding 1 GiB through cuMemAlloc: NVML's per-process used memory says so."""
    import pynvml

    whole = [g for g in api_gpus if not g.get("mig")]
    if not whole:
        report("SKIP", "process-memory", "no whole GPU (every GPU is in MIG mode)")
        return
    gpu = whole[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUJOBS_")}
    env.update({"CUDA_VISIBLE_DEVICES": str(gpu["index"]), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    proc = subprocess.Popen([PY, "-m", "jupyter_gpujobs.gpualloc", "1G", "--seconds", "40"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline().strip()
        if not line.startswith("gpualloc: holding"):
            report("FAIL", "process-memory", f"gpualloc did not hold the memory: {line or proc.poll()}")
            return
        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(gpu["index"])
            found, seen = None, []
            for _ in range(20):
                seen = [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
                found = next((m for pid, m in seen if pid == proc.pid), None)
                if found is not None:
                    break
                time.sleep(0.5)
        finally:
            pynvml.nvmlShutdown()
        if found is None:  # in a container NVML may give the host's pid
            near = [m / 2**20 for _, m in seen if isinstance(m, int) and 1024 <= m / 2**20 <= 4096]
            report("PASS" if near else "FAIL", "process-memory",
                   f"pid {proc.pid} not among NVML's {[p for p, _ in seen]} (another pid namespace?); "
                   + (f"a process holds {near[0]:.0f} MiB" if near else "no process holds ~1 GiB"))
            return
        mib = found / 2**20 if isinstance(found, int) else 0
        ok = 1024 <= mib <= 4096
        report("PASS" if ok else "FAIL", "process-memory",
               f"GPU {gpu['index']}: NVML says pid {proc.pid} uses {mib:.0f} MiB (1024 MiB allocated + its context)")
    finally:
        proc.kill()
        proc.wait()


def mig_check(api_gpus):
    """Where MIG is on: the API's MIG devices are nvidia-smi's, and a job gets its MIG UUID."""
    listed = [x.split("UUID:")[1].strip(" )") for x in smi("-L").splitlines() if "MIG" in x and "UUID:" in x]
    api_migs = [g for g in api_gpus if g.get("mig")]
    if not listed and not api_migs:
        report("SKIP", "mig", "no GPU in MIG mode here (the engine never changes MIG settings)")
        return
    if sorted(listed) != sorted(g["uuid"] for g in api_migs):
        report("FAIL", "mig", f"nvidia-smi -L MIG UUIDs {sorted(listed)} != API {sorted(g['uuid'] for g in api_migs)}")
        return
    profile = api_migs[0]["name"].split()[-1]
    code = ("import os, subprocess, sys\n"
            "print('VISIBLE', os.environ['CUDA_VISIBLE_DEVICES'], flush=True)\n"
            "sys.exit(subprocess.call([sys.executable, '-m', 'jupyter_gpujobs.gpualloc', '256M', '--seconds', '1']))")
    job = submit(code, gpu_type=profile, time_limit="1m", name="gpu-check-mig")
    end_job = wait(job["id"], ("COMPLETED", "FAILED", "TIMEOUT", "LOST", "CANCELLED"), 60)
    given = {g["index"]: g["uuid"] for g in api_migs}.get((end_job.get("assigned_gpus") or [None])[0])
    visible = next((x.split()[1] for x in log(job["id"]).splitlines() if x.startswith("VISIBLE ")), None)
    ok = end_job["state"] == "COMPLETED" and given is not None and visible == given
    report("PASS" if ok else "FAIL", "mig",
           f"{len(api_migs)} MIG instance(s) ({', '.join(sorted({g['name'] for g in api_migs}))}); a --type {profile} "
           f"job got CUDA_VISIBLE_DEVICES={visible} (its instance {given}), ended {end_job['state']}: "
           f"{end_job['reason']}")


def over_share_check():
    """A job asking for 1G of one GPU's memory that allocates 3 GiB is stopped with the reason."""
    import re

    try:
        job = call("POST", "jobs", json={"command": [PY, "-m", "jupyter_gpujobs.gpualloc", "3G"], "gpus": 1,
                                         "gpu_memory": "1G", "time_limit": "2m", "name": "gpu-check-share"})
    except httpx.HTTPStatusError as err:
        report("FAIL", "over-share", f"the server refused a share job: {err.response.text[:200]}")
        return
    end_job = wait(job["id"], ("COMPLETED", "FAILED", "TIMEOUT", "LOST", "CANCELLED"), 60)
    events = call("GET", f"jobs/{job['id']}/events")["events"]
    warned = any(e["state"] == "WARNING" and "over its GPU share" in (e["reason"] or "") for e in events)
    reason = end_job["reason"] or ""
    ok = (end_job["state"] == "FAILED" and re.fullmatch(r"used [0-9.]+ GB of its 1 GB share on GPU \d+", reason)
          and warned)
    report("PASS" if ok else "FAIL", "over-share",
           f"job {end_job['state']}: {reason!r}; warned first: {'yes' if warned else 'no'}; "
           f"log: {log(job['id']).strip()[-200:]!r}")


FINAL = ("COMPLETED", "FAILED", "TIMEOUT", "LOST", "CANCELLED")
#: a bf16 8192x8192 matmul loop: prints "MATMUL <TFLOP/s> TFLOP/s on <device>"
MATMUL = ("import time, torch\n"
          "a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\n"
          "b = a @ a\n"
          "torch.cuda.synchronize()\n"
          "t = time.time()\n"
          "for _ in range(50):\n"
          "    b = a @ a\n"
          "torch.cuda.synchronize()\n"
          "print(f'MATMUL {50 * 2 * 8192**3 / (time.time() - t) / 1e12:.0f} TFLOP/s on {torch.cuda.get_device_name(0)}')\n")
#: argv: a barrier folder and how many jobs meet there; measures 4 s of matmuls once all are ready
MEASURE = ("import json, os, sys, time, torch\n"
           "barrier, n = sys.argv[1], int(sys.argv[2])\n"
           "a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\n"
           "b = a @ a\n"
           "torch.cuda.synchronize()\n"
           "open(os.path.join(barrier, str(os.getpid())), 'w').close()\n"
           "end = time.time() + 60\n"
           "while len(os.listdir(barrier)) < n and time.time() < end:\n"
           "    time.sleep(0.02)\n"
           "t0, k = time.time(), 0\n"
           "while time.time() - t0 < 4:\n"
           "    for _ in range(10):\n"
           "        b = a @ a\n"
           "    torch.cuda.synchronize()\n"
           "    k += 10\n"
           "t1 = time.time()\n"
           "print('RESULT ' + json.dumps({'tflops': k * 2 * 8192**3 / (t1 - t0) / 1e12, 't0': t0, 't1': t1}))\n")


def guarded(name):
    """A check that raises is reported FAIL under its own name, and the next one runs."""
    def wrap(fn):
        def run(*args):
            try:
                fn(*args)
            except Exception as err:
                report("FAIL", name, f"{type(err).__name__}: {err}")
        return run
    return wrap


def no_time(name, need):
    if left() < need:
        report("SKIP", name, f"not run: {left():.0f}s of the budget left, it needs about {need}s")
        return True
    return False


@guarded("idle-memory")
def idle_memory_check(api_gpus):
    """Idle GPUs: none is in use outside the queue (with the defaults), and the memory GET gpus
    gives as used and reserved is what nvidia-smi gives."""
    idle = [g["index"] for g in api_gpus if not g.get("mig") and not g.get("job_id")]
    if not idle:
        report("SKIP", "idle-memory", "no idle whole GPU")
        return
    reserved_known = True
    try:
        rows = [[float(x) for x in r.split(", ")] for r in smi(
            "--query-gpu=index,memory.used,memory.reserved", "--format=csv,noheader,nounits").strip().splitlines()]
    except ValueError:  # a driver without memory.reserved
        reserved_known = False
        rows = [[float(x) for x in r.split(", ")] for r in smi(
            "--query-gpu=index,memory.used", "--format=csv,noheader,nounits").strip().splitlines()]
    by_index = {int(r[0]): r[1:] for r in rows}
    time.sleep(2.5)  # a fresh inventory (it is read again every 2 s)
    views = {g["index"]: g for g in call("GET", "gpus")["gpus"]}
    parts, ok = [], True
    for i in idle:
        v, smi_row = views[i], by_index.get(i, [float("nan")])
        used, reserved = v["memory_used_mb"], v.get("memory_reserved_mb")
        same = abs(used - smi_row[0]) <= 64
        if reserved_known:
            same = same and reserved is not None and abs(reserved - smi_row[1]) <= 64
        ok = ok and same and not v.get("foreign")
        parts.append(f"GPU {i}: used {used} MiB, reserved {reserved} MiB (nvidia-smi {smi_row[0]:.0f}"
                     + (f"/{smi_row[1]:.0f}" if reserved_known else "/-") + ")"
                     + (f"; FOREIGN: {v['foreign']}" if v.get("foreign") else "; not foreign"))
    report("PASS" if ok else "FAIL", "idle-memory", "; ".join(parts))


@guarded("gpujob-cell")
def gpujob_cell_check(has_torch):
    """A %%gpujob cell with PyTorch, from a real IPython kernel that finds the server by its env."""
    if not has_torch:
        report("SKIP", "gpujob-cell", NO_TORCH)
        return
    if no_time("gpujob-cell", 40):
        return
    from jupyter_client.manager import KernelManager

    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUJOBS_")}
    env.update({"GPUJOBS_URL": URL, "GPUJOBS_TOKEN": TOKEN})
    out = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append(f"{msg['content']['ename']}: {msg['content']['evalue']}\n")

    t0 = time.time()
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env=env, cwd=os.path.join(WORK, "root"))
    try:
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        kc.execute_interactive("%load_ext jupyter_gpujobs", timeout=60, output_hook=hook)
        t1 = time.time()
        reply = kc.execute_interactive("%%gpujob -g 1 -t 2m --name gpu-check-cell\n" + MATMUL,
                                       timeout=max(10.0, min(120.0, left())), output_hook=hook)
        t2 = time.time()
        kc.stop_channels()
    finally:
        km.shutdown_kernel(now=True)
    text = "".join(out)
    line = next((x for x in text.splitlines() if "MATMUL " in x), None)
    ok = reply["content"]["status"] == "ok" and line is not None
    report("PASS" if ok else "FAIL", "gpujob-cell",
           f"the cell took {t2 - t1:.1f}s ({t2 - t0:.1f}s with the kernel's start): "
           + (line.split("MATMUL ", 1)[1] if line else f"no result; output {text[-300:]!r}"))


@guarded("gpu-kernel")
def gpu_kernel_check(has_torch):
    """A kernel of a 1-GPU kernelspec through the server: it starts on a GPU, sees it, and the
    GPU is free again after its shutdown."""
    if no_time("gpu-kernel", 30):
        return
    from jupyter_client import BlockingKernelClient

    name = "gpu-check-1gpu"
    done = subprocess.run([PY, "-m", "jupyter_gpujobs.cli", "kernelspec", "install", "--user", "--name", name,
                           "-g", "1", "-t", "2m"], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        report("FAIL", "gpu-kernel", f"kernelspec install failed: {done.stderr.strip()[-300:]}")
        return
    http = httpx.Client(base_url=URL, headers=H, timeout=max(10.0, min(90.0, left())))
    t0 = time.time()
    r = http.post("api/kernels", json={"name": name})
    started = time.time() - t0
    if r.status_code != 201:
        report("FAIL", "gpu-kernel", f"POST api/kernels answered {r.status_code}: {r.text[:300]}")
        return
    kid = r.json()["id"]
    out = []
    try:
        kc = BlockingKernelClient(connection_file=os.path.join(os.environ["JUPYTER_RUNTIME_DIR"], f"kernel-{kid}.json"))
        kc.load_connection_file()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        code = "import os\nprint('VISIBLE', os.environ.get('CUDA_VISIBLE_DEVICES'))\n"
        if has_torch:
            code += "import torch\nprint('TORCH', torch.cuda.device_count(), 'x', torch.cuda.get_device_name(0))\n"
        kc.execute_interactive(code, timeout=60, output_hook=lambda m: out.append(m["content"].get("text", ""))
                               if m["msg_type"] == "stream" else None)
        kc.stop_channels()
    finally:
        t1 = time.time()
        http.delete(f"api/kernels/{kid}")
    freed = None
    while time.time() < min(t1 + 30, DEADLINE):
        if not any(g.get("job_id") for g in call("GET", "gpus")["gpus"]):
            freed = time.time() - t1
            break
        time.sleep(0.2)
    text = "".join(out)
    visible = next((x.split(" ", 1)[1] for x in text.splitlines() if x.startswith("VISIBLE ")), None)
    seen = next((x.split(" ", 1)[1] for x in text.splitlines() if x.startswith("TORCH ")), None)
    ok = visible not in (None, "None", "") and (seen is None or seen.startswith("1 x")) and freed is not None
    if has_torch and seen is None:
        ok = False
    report("PASS" if ok else "FAIL", "gpu-kernel",
           f"started in {started:.1f}s; CUDA_VISIBLE_DEVICES={visible}"
           + (f", torch sees {seen}" if seen else "") + "; "
           + (f"its GPU free {freed:.1f}s after the shutdown" if freed is not None else "its GPU still held 30s after"))


def measure(n, gpus):
    """n jobs of MEASURE at once (a share each when gpus < 1): (jobs as they ended, results)."""
    barrier = os.path.join(WORK, "root", f"barrier-{n}-{time.time():.0f}")
    os.makedirs(barrier)
    os.chmod(barrier, 0o777)
    jobs = [call("POST", "jobs", json={"command": [PY, "-c", MEASURE, barrier, str(n)], "gpus": gpus,
                                       "time_limit": "2m", "name": f"gpu-check-x{n}"}) for _ in range(n)]
    ended = [wait(j["id"], FINAL, 90) for j in jobs]
    found = []
    for j in ended:
        line = next((x for x in log(j["id"]).splitlines() if x.startswith("RESULT ")), None)
        found.append(json.loads(line[7:]) if line else None)
    return ended, found


@guarded("four-shares")
def four_shares_check(has_torch, api_gpus):
    """Four 0.25 shares of one GPU at once against one whole-GPU job alone (TFLOP/s)."""
    if not has_torch:
        report("SKIP", "four-shares", NO_TORCH)
        return
    if not [g for g in api_gpus if not g.get("mig")]:
        report("SKIP", "four-shares", "no whole GPU (every GPU is in MIG mode)")
        return
    if no_time("four-shares", 45):
        return
    alone_jobs, alone = measure(1, 1)
    if alone[0] is None:
        report("FAIL", "four-shares", f"the job alone ended {alone_jobs[0]['state']}: {alone_jobs[0]['reason']}")
        return
    jobs, got = measure(4, 0.25)
    if any(r is None for r in got):
        bad = next(j for j, r in zip(jobs, got) if r is None)
        report("FAIL", "four-shares", f"a share job ended {bad['state']}: {bad['reason']}; "
                                      f"log {log(bad['id']).strip()[-200:]!r}")
        return
    one = alone[0]["tflops"]
    total = sum(r["tflops"] for r in got)
    overlap = min(r["t1"] for r in got) - max(r["t0"] for r in got)
    where = sorted({tuple(j["assigned_gpus"]) for j in jobs})
    ok = overlap > 0 and len(where) == 1 and total >= 0.5 * one
    report("PASS" if ok else "FAIL", "four-shares",
           f"one job alone {one:.0f} TFLOP/s; four 0.25 shares at once on GPU {where}: "
           f"{', '.join(str(round(r['tflops'])) for r in got)} "
           f"TFLOP/s, sum {total:.0f} = {total / one:.2f}x; all four measured together for {max(overlap, 0):.1f}s")


@guarded("mps-share")
def mps_share_check(gpus):
    """With c.GPUJobs.mps=True: a 2G share allocating 1 GiB runs; one allocating 4 GiB is refused
    by the driver (its MPS pinned memory limit), not stopped later by the engine's watcher."""
    enforcement = gpus.get("share_enforcement") or ""
    if "MPS asked for but" in enforcement:
        report("FAIL", "mps-share", enforcement)
        return
    if not [g for g in gpus["gpus"] if not g.get("mig")]:
        report("SKIP", "mps-share", "no whole GPU (every GPU is in MIG mode)")
        return
    code = ("import os, subprocess, sys\n"
            "print('LIMIT', os.environ.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT'), flush=True)\n"
            "sys.exit(subprocess.call([sys.executable, '-m', 'jupyter_gpujobs.gpualloc', sys.argv[1], '--seconds', '3']))")
    jobs = {size: call("POST", "jobs", json={"command": [PY, "-c", code, size], "gpus": 1, "gpu_memory": "2G",
                                             "time_limit": "1m", "name": f"gpu-check-mps-{size}"})
            for size in ("1G", "4G")}
    ended = {size: wait(j["id"], FINAL, 60) for size, j in jobs.items()}
    logs = {size: log(j["id"]) for size, j in jobs.items()}
    limit = next((x.split(" ", 1)[1] for x in logs["4G"].splitlines() if x.startswith("LIMIT ")), None)
    refused = next((x for x in logs["4G"].splitlines() if "could not allocate" in x), None)
    within_ok = ended["1G"]["state"] == "COMPLETED" and "gpualloc: holding" in logs["1G"]
    past_ok = ended["4G"]["state"] == "FAILED" and refused is not None and "gpualloc: holding" not in logs["4G"]
    took = (ended["4G"].get("ended_at") or 0) - (ended["4G"].get("started_at") or 0)
    report("PASS" if within_ok and past_ok else "FAIL", "mps-share",
           f"{enforcement}; 1 GiB in a 2G share: {ended['1G']['state']}; 4 GiB: {ended['4G']['state']} "
           f"after {took:.1f}s ({(refused or logs['4G'].strip()[-200:])!r}); CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={limit}")


try:
    main()
except Exception as err:  # a check that crashed is a failure, with what went wrong
    report("FAIL", "checker", f"{type(err).__name__}: {err}")
sys.exit(1 if "FAIL" in results else 0)
PYEOF

# run_checks PHASE DEADLINE: the checks of one phase against the running server, into results
run_checks() {
  local remain=$(( $2 - $(date +%s) ))
  if [ "$remain" -lt 20 ]; then
    echo "FAIL budget no time left for the $1 checks (${BUDGET}s in all)" | tee -a "$WORK/results"
    return
  fi
  # each check waits at most until its deadline; timeout is the backstop for a hung one
  timeout "$remain" "$VPY" "$WORK/check.py" "$1" "http://127.0.0.1:$PORT/" "$TOKEN" "$VPY" "$(( $2 - 5 ))" "$WORK" \
    | tee -a "$WORK/results"
  if [ "${PIPESTATUS[0]}" = 124 ]; then
    echo "FAIL timeout the $1 checks reached the ${BUDGET}s budget" | tee -a "$WORK/results"
  fi
}

REMAIN=$(( END - MPS_PHASE - $(date +%s) ))
if [ "$REMAIN" -lt 60 ]; then
  echo "FAIL setup took $(( $(date +%s) - START ))s, leaving under 60s of the ${BUDGET}s budget for the checks"
  echo "SUMMARY 0 passed, 1 failed, 0 skipped"
  exit 1
fi
: >"$WORK/results"
run_checks main "$(( END - MPS_PHASE ))"
stop_server
if command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
  start_server "$WORK/state-mps" --GPUJobs.mps=True --GPUJobs.mps_pipe_dir="$WORK/mps/pipe" \
    --GPUJobs.mps_log_dir="$WORK/mps/log"
  run_checks mps "$(( END - 3 ))"
  stop_server
else
  echo "SKIP mps-share nvidia-cuda-mps-control is not on PATH (it comes with the driver or the CUDA toolkit)" \
    | tee -a "$WORK/results"
fi
PASSED=$(grep -c '^PASS ' "$WORK/results")
FAILED=$(grep -c '^FAIL ' "$WORK/results")
SKIPPED=$(grep -c '^SKIP ' "$WORK/results")
echo "SUMMARY $PASSED passed, $FAILED failed, $SKIPPED skipped"
if [ "$FAILED" != 0 ]; then
  echo "--- last lines of the server log ($WORK/server.log) ---"
  tail -30 "$WORK/server.log"
fi
echo "gpu-check: done in $(( $(date +%s) - START ))s"
exit "$([ "$FAILED" = 0 ] && echo 0 || echo 1)"

#!/usr/bin/env bash
# gpu-check.sh: one prepared check of jupyter-gpujobs on a machine with a real NVIDIA GPU
# (and possibly no network). Never run in CI: it needs a GPU and takes a few minutes.
#
#   scripts/gpu-check.sh [--wheels DIR] [--python PYTHON] [--keep] [--dry-run]
#
# It creates a virtual environment (with --system-site-packages, so a PyTorch that the
# machine already has is used), installs the project into it (offline from DIR when
# --wheels is given), starts a Jupyter server with the extension on the NVML backend, and
# prints one line per check, "PASS|FAIL|SKIP <name> <detail>", then a summary line. It exits
# 1 when a check failed. The whole run is bounded to under 6 minutes.
#
# Checks:
#   inventory        the NVML inventory (GET gpus) matches
#                    nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader
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
# The checks that need PyTorch are SKIPped when it cannot be imported; the last three need none.
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
PYTHON="${PYTHON:-python3}"
KEEP=0
DRY=0
BUDGET=350 # seconds for the whole run: set-up, server and checks

usage() { sed -n '2,/^set -uo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) WHEELS="${2:-}"; shift 2 ;;
    --wheels=*) WHEELS="${1#--wheels=}"; shift ;;
    --python) PYTHON="${2:-}"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-check: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done

CHECKS=(
  "inventory|NVML inventory (GET gpus) == nvidia-smi --query-gpu=index,uuid,name,memory.total"
  "torch-visible|a 1-GPU PyTorch job: torch.cuda.device_count()==1 and its UUID is the allocated GPU's"
  "samples-rise|a 1-GPU matmul loop: job stats and GPU samples show utilization and memory rising"
  "oom|a job allocating 1.5x the GPU's memory ends FAILED with reason 'out of memory' (and an oom finding)"
  "time-limit-frees|a job holding GPU memory with a 10s time limit ends TIMEOUT; nvidia-smi shows the memory freed"
  "rogue|a process started outside the queue on a GPU appears in GET findings?kind=rogue_process"
  "fence|a job given GPU i opens /dev/nvidia<minor of i>; the other GPUs' nodes fail with EPERM"
  "process-memory|NVML usedGpuMemory of a process holding 1 GiB via cuMemAlloc (gpualloc, no framework)"
  "mig|with MIG: GET gpus MIG UUIDs == nvidia-smi -L; a --type <profile> job gets CUDA_VISIBLE_DEVICES=MIG-..."
  "over-share|a gpu_memory=1G job allocating 3 GiB ends FAILED: 'used N GB of its 1 GB share on GPU i'"
)

if [ "$DRY" = 1 ]; then
  echo "gpu-check dry run: repository $REPO"
  echo "  venv:    $PYTHON -m venv --system-site-packages WORK/venv"
  if [ -n "$WHEELS" ]; then
    echo "  install: pip install --no-index --find-links $WHEELS jupyter-gpujobs (or the source tree)"
  else
    echo "  install: pip install $REPO (needs network)"
  fi
  echo "  server:  jupyter server without GPUJOBS_FAKE_GPUS (NVML backend), --GPUJobs.sample_interval=1 --GPUJobs.share_grace=2"
  for c in "${CHECKS[@]}"; do
    printf '  check %-17s %s\n' "${c%%|*}" "${c#*|}"
  done
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
cleanup() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -INT "$SERVER_PID" 2>/dev/null
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$SERVER_PID" 2>/dev/null
  fi
  # job supervisors run in their own sessions; stop any this run left
  pkill -KILL -f "$WORK/state/run" 2>/dev/null || true
  if [ "$KEEP" = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

echo "gpu-check: work dir $WORK"
"$PYTHON" -m venv --system-site-packages "$WORK/venv" || { echo "FAIL setup venv: $PYTHON -m venv failed"; exit 1; }
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
echo "gpu-check: installed in $(( $(date +%s) - START ))s"

PORT="$("$VPY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
TOKEN="gpu-check-$RANDOM$RANDOM"
mkdir -p "$WORK/root" "$WORK/state" "$WORK/home"
env -u GPUJOBS_FAKE_GPUS -u GPUJOBS_URL -u GPUJOBS_TOKEN \
  JUPYTER_CONFIG_DIR="$WORK/home/config" JUPYTER_DATA_DIR="$WORK/home/data" JUPYTER_RUNTIME_DIR="$WORK/home/runtime" \
  "$VPY" -m jupyter_server --no-browser --ip=127.0.0.1 --port="$PORT" --port-retries=0 \
  --IdentityProvider.token="$TOKEN" --ServerApp.root_dir="$WORK/root" \
  --ServerApp.jpserver_extensions=jupyter_gpujobs=True --GPUJobs.state_dir="$WORK/state" \
  --GPUJobs.sample_interval=1 --GPUJobs.kill_grace=2 --GPUJobs.tick_interval=0.5 --GPUJobs.share_grace=2 \
  --allow-root >"$WORK/server.log" 2>&1 &
SERVER_PID=$!

cat >"$WORK/check.py" <<'PYEOF'
"""The checks of gpu-check.sh, against a running server: one line per check."""
import json
import os
import subprocess
import sys
import time

import httpx

URL, TOKEN, PY, DEADLINE = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
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


def main():
    # ---- the server answers on the NVML backend
    end = time.time() + 60
    while True:
        try:
            gpus = call("GET", "gpus")
            break
        except Exception as err:
            if time.time() > end:
                report("FAIL", "server", f"no answer from {URL} within 60s: {err}")
                return
            time.sleep(0.5)
    if gpus["backend"] != "nvml":
        report("FAIL", "server", f"backend is {gpus['backend']!r}, not nvml (see the server log)")
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

    fence_check(api_gpus, isolation)
    process_memory_check(api_gpus)
    mig_check(api_gpus)
    over_share_check()

    has_torch = subprocess.run([PY, "-c", "import torch; assert torch.cuda.is_available()"],
                               capture_output=True, timeout=120).returncode == 0
    torch_checks = ("torch-visible", "samples-rise", "oom", "time-limit-frees", "rogue")
    if not has_torch:
        for name in torch_checks:
            report("SKIP", name, "PyTorch with CUDA is not importable in the venv (install it, or pass its wheel)")
        return
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


try:
    main()
except Exception as err:  # a check that crashed is a failure, with what went wrong
    report("FAIL", "checker", f"{type(err).__name__}: {err}")
passed, failed, skipped = (results.count(s) for s in ("PASS", "FAIL", "SKIP"))
print(f"SUMMARY {passed} passed, {failed} failed, {skipped} skipped", flush=True)
sys.exit(1 if failed else 0)
PYEOF

REMAIN=$(( END - $(date +%s) ))
if [ "$REMAIN" -lt 90 ]; then
  echo "FAIL setup took $(( $(date +%s) - START ))s, leaving under 90s of the ${BUDGET}s budget for the checks"
  echo "SUMMARY 0 passed, 1 failed, 0 skipped"
  exit 1
fi
# each check waits at most until DEADLINE; timeout is the backstop for a hung one
timeout "$REMAIN" "$VPY" "$WORK/check.py" "http://127.0.0.1:$PORT/" "$TOKEN" "$VPY" "$(( END - 10 ))"
RC=$?
if [ "$RC" = 124 ]; then
  echo "FAIL timeout the run reached its ${BUDGET}s budget"
  echo "SUMMARY (incomplete)"
fi
if [ "$RC" != 0 ]; then
  echo "--- last lines of the server log ($WORK/server.log) ---"
  tail -30 "$WORK/server.log"
fi
echo "gpu-check: done in $(( $(date +%s) - START ))s"
exit "$([ "$RC" = 0 ] && echo 0 || echo 1)"

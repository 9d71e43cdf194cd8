"""The local runner: each run of a job is supervised by its own shim process
(`python -m jupyter_gpujobs.engine.runners.shim JOB_DIR`, see shim.py) in its own session, so runs
keep going when the Jupyter server restarts or is SIGKILLed.

A run lives in `STATE_DIR/job-<id>-<stamp>/` (private to the user): `spec.json` (what to
run, written here), `ready` and `state.json` (the shim is up / the job's pid), `control.json`
(a stop request, written here), `result.json` (how it ended, written by the shim atomically)
and `shim.log` (the shim's own output, for debugging).

The handle the service stores is `{"runner": "local", "job_dir", "pid", "create_time",
"started_at"}`; pid and create time together identify the shim, so a recycled pid is never
taken for it. `start()` does not wait for anything; `poll()` stats result files and checks
supervisors' liveness at most every `liveness_interval` seconds, so it can run every 50 ms.

Each supervisor holds the write end of a pipe whose read end the runner watches on the event
loop: the supervisor exits right after writing its result, the pipe reads EOF, and the runner
calls `on_exit` (the service polls at once) instead of the engine finding the result at its
next poll, on average half a `poll_interval` later. Polling stays, for runs reattached after a
restart and as the safety net.

Supervisors are started ahead of the jobs they will run: the runner keeps `standbys` of them
waiting (`shim --standby`, as many as GPUs free at once when jobs end together), and a start
hands one its job dir on stdin instead of waiting for an interpreter to start. `poll()` refills
them when it finds no job ended, so the refill is not in front of a start.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from . import cgroups, users
from .base import LOST_REASON, NOT_STARTED_REASON, Exit, LaunchRequest, Runner, StopOutcome
from .shim import read_json, write_json_atomic

_PACKAGE_PARENT = str(Path(__file__).resolve().parents[3])
#: the smallest log cap (c.GPUJobs.log_max_bytes) that keeps a useful head and tail
MIN_LOG_BYTES = 65536
_PSUTIL_PARENT = str(Path(psutil.__file__).resolve().parents[1])


class LocalRunner(Runner):
    """Runs jobs on this machine under one supervisor (shim) process each."""

    name = "local"
    runs_containers = True  # a job in an image: its supervisor runs it there (engine/containers)
    #: most supervisors kept waiting, whatever `standbys` is asked for
    MAX_STANDBYS = 8

    def __init__(self, state_dir: Path, python: str = sys.executable, liveness_interval: float = 0.5,
                 cgroups_mode: str = "auto", standbys: int = 4, private_tmp: str = "auto",
                 log_max_bytes: int = 1 << 30):
        if log_max_bytes and log_max_bytes < MIN_LOG_BYTES or log_max_bytes < 0:
            raise ValueError(f"c.GPUJobs.log_max_bytes: {log_max_bytes} is too small; 0 (no cap) or at least "
                             f"{MIN_LOG_BYTES} bytes")
        self.state_dir = Path(state_dir)
        self.python = python
        self.liveness_interval = liveness_interval
        #: a job's log keeps at most this many bytes (shim.CappedLog); 0: no cap
        self.log_max_bytes = int(log_max_bytes)
        #: what confines a job here (cgroups.py); `cgroups_mode="off"` keeps to subreaper supervision
        self.isolation = cgroups.detect(cgroups_mode)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            os.chmod(self.state_dir, 0o700)
        except OSError:
            pass
        #: why a job cannot get a private /tmp and /dev/shm here ("" when every job gets them)
        self.private_tmp_problem = self._probe_private_tmp(private_tmp)
        self.isolation.tmp = (f"no private /tmp: {self.private_tmp_problem}" if self.private_tmp_problem
                              else "private /tmp and /dev/shm per job")
        self._children: dict[str, subprocess.Popen[bytes]] = {}  # job_dir -> shims we started
        self._checked: dict[str, float] = {}  # job_dir -> monotonic time of the last liveness check
        self._exiting: list[subprocess.Popen[bytes]] = []  # shims that reported, to be reaped
        self._seq = 0
        #: how many supervisors wait for a job (at most MAX_STANDBYS; 0: each start spawns one)
        self.standbys = standbys
        self._standbys: list[subprocess.Popen[bytes]] = []  # oldest first
        self._standby_pythonpath: str | None = None
        self._exit_pipes: dict[int, int] = {}  # supervisor pid -> read end of its exit pipe

    def _probe_private_tmp(self, mode: str) -> str:
        """"" when jobs get a private /tmp and /dev/shm here, else why not (a throwaway process
        tries the mounts a job's supervisor makes)."""
        if mode == "off":
            return "turned off in the settings (c.GPUJobs.private_tmp)"
        if mode != "auto":
            raise ValueError(f"c.GPUJobs.private_tmp must be 'auto' or 'off', not {mode!r}")
        if not sys.platform.startswith("linux"):
            return "mount namespaces are Linux's"
        if os.geteuid() != 0:
            return "the engine is not root (only root may give a job a mount namespace)"
        code = ("import sys; from jupyter_gpujobs.engine.runners.shim import probe_private_mounts as p; "
                "sys.stdout.write(p())")
        try:
            done = subprocess.run([self.python, "-S", "-c", code], capture_output=True, text=True, timeout=30,
                                  env=self._shim_env(os.environ.get("PYTHONPATH")))
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"the probe did not run ({err})"
        if done.returncode != 0:
            return f"the probe failed ({(done.stderr.strip().splitlines() or ['no output'])[-1]})"
        return done.stdout.strip()

    # ------------------------------------------------------------------ start

    def prepare(self, req: LaunchRequest) -> dict[str, Any]:
        """Make the run's directory with its `spec.json`; nothing runs yet. The service stores
        the handle with the RUNNING transition, so a restart finds the run by its directory
        (and cgroups) even if the engine stopped before the supervisor's pid was recorded."""
        self._seq += 1
        job_dir = self.state_dir / f"job-{req.job_id}-{time.time_ns() // 1000:x}{self._seq}"
        job_dir.mkdir(mode=0o700)
        pythonpath = os.environ.get("PYTHONPATH")
        iso = self.isolation
        cg = iso.paths(job_dir.name) if iso.enabled else {}
        try:
            account = users.account(req.run_as)
        except KeyError:
            account = None  # the supervisor fails the job, naming the user
        write_json_atomic(str(job_dir / "spec.json"), {
            "job_id": req.job_id, "command": list(req.command), "cwd": req.cwd, "env": dict(req.env),
            "gpu_indices": list(req.gpu_indices), "gpu_uuids": list(req.gpu_uuids),
            "time_limit_s": req.time_limit_s, "grace_s": req.grace_s, "preempt_grace_s": req.preempt_grace_s,
            "log_path": req.log_path or str(job_dir / "output.log"), "fake": bool(req.fake),
            "pythonpath": pythonpath, "run_as": req.run_as, "account": account, "cgroups": cg,
            "deny_devices": list(req.deny_devices) if iso.fence else [],
            "mem_bytes": req.mem_bytes, "cpus": req.cpus, "v2_controllers": list(iso.v2_controllers),
            "bpf_fence": iso.bpf, "warn_signal": req.warn_signal,
            "container": req.container,
            # the engine's environment only for a personal engine's job run as its own user
            "inherit_env": bool(self.inherit_environment and account is None and req.run_as is None),
            "env_allow": list(self.env_allow), "log_max_bytes": self.log_max_bytes,
            "private_tmp": not self.private_tmp_problem,
            "tmp_keep": [p for p in self.tmp_keep if os.path.normpath(p).startswith("/tmp/")],
        })
        handle: dict[str, Any] = {"runner": "local", "job_dir": str(job_dir)}
        if cg:
            handle["cgroups"] = cg  # a restarted engine finds the job's processes by these
        return handle

    def start(self, req: LaunchRequest, handle: dict[str, Any] | None = None) -> dict[str, Any]:
        prepared = handle or self.prepare(req)
        job_dir = Path(prepared["job_dir"])
        pythonpath = os.environ.get("PYTHONPATH")
        proc = self._take_standby(pythonpath)
        if proc is not None:
            assert proc.stdin is not None
            try:
                proc.stdin.write(f"{job_dir}\n".encode())
                proc.stdin.close()
            except OSError:  # it died after it was taken (BrokenPipe): start one for this job
                proc.kill()
                proc.wait()
                self._close_exit_pipe(proc.pid)
                proc = None
        if proc is None:
            with open(job_dir / "shim.log", "wb") as shim_log:
                proc = self._spawn_shim([str(job_dir)], str(job_dir), pythonpath, subprocess.DEVNULL, shim_log)
        try:
            create_time = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            create_time = None
        self._children[str(job_dir)] = proc
        self._watch_exit(proc.pid)
        return {**prepared, "pid": proc.pid, "create_time": create_time, "started_at": time.time()}

    def discard(self, handle: dict[str, Any]) -> None:
        """Remove the directory of a prepared run that will not start."""
        job_dir = handle.get("job_dir")
        if job_dir and not handle.get("pid"):
            shutil.rmtree(job_dir, ignore_errors=True)

    # ------------------------------------------------------------------ reattach

    def reattach(self, job_id: int, handle: dict[str, Any]) -> dict[str, Any] | Exit | None:
        """Find a run whose supervisor's pid was never recorded, by its directory. A run whose
        supervisor is not up gets a stop request first: a supervisor that comes up later
        reads it before it starts the job and only writes a result; one that came up
        meanwhile is found on the second look and stops the job it may have started."""
        job_dir = handle.get("job_dir")
        if not job_dir or not os.path.isdir(job_dir):
            return None
        result_path = os.path.join(job_dir, "result.json")
        for attempt in (1, 2):
            exit_ = self._read_result(job_id, result_path)
            if exit_ is not None:
                return exit_
            shim = self._find_supervisor(job_dir)
            if shim is not None:
                return {**handle, "pid": shim.pid, "create_time": shim.create_time(), "started_at": time.time()}
            if attempt == 1:
                write_json_atomic(os.path.join(job_dir, "control.json"), {
                    "outcome": "preempted", "reason": NOT_STARTED_REASON, "grace_s": 0, "at": time.time()})
        cg = handle.get("cgroups") or {}
        if not os.path.exists(os.path.join(job_dir, "state.json")) and not (cg and cgroups.populated(cg)):
            return None  # no supervisor started the job, and none will now
        return handle  # the job started and its supervisor is gone: poll() stops what is left, then LOST

    @staticmethod
    def _find_supervisor(job_dir: str) -> psutil.Process | None:
        """The live supervisor of a run: the pid it wrote to `ready`, if that process still
        works in the run's directory (so a recycled pid is not taken for it)."""
        try:
            with open(os.path.join(job_dir, "ready")) as f:
                p = psutil.Process(int(f.read().strip()))
            if p.status() != psutil.STATUS_ZOMBIE and os.path.samefile(p.cwd(), job_dir):
                return p
        except (OSError, ValueError, psutil.Error):
            pass
        return None

    # ------------------------------------------------------------------ standby supervisor

    def _shim_env(self, pythonpath: str | None) -> dict[str, str]:
        env = dict(os.environ)
        # the shim must import this package whatever the cwd; the job gets PYTHONPATH back as it was
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_PARENT, _PSUTIL_PARENT, pythonpath) if p)
        return env

    def fill_standbys(self) -> None:
        """Start supervisors until `standbys` wait for a job, so that many jobs starting at once
        (GPUs freed together) do not wait for an interpreter to start (-S: no site-packages
        scan; what the shim needs is on PYTHONPATH)."""
        pythonpath = os.environ.get("PYTHONPATH")
        if self._standbys and self._standby_pythonpath != pythonpath:
            self._close_standbys()  # they would run jobs with another PYTHONPATH
        self._standbys = [p for p in self._standbys if p.poll() is None]
        want = max(0, min(self.standbys, self.MAX_STANDBYS))
        while len(self._standbys) < want:
            try:
                proc = self._spawn_shim(["--standby"], str(self.state_dir), pythonpath, subprocess.PIPE,
                                        subprocess.DEVNULL)
            except OSError:
                return
            self._standbys.append(proc)
            self._standby_pythonpath = pythonpath

    def _spawn_shim(self, args: list[str], cwd: str, pythonpath: str | None, stdin: Any, out: Any
                    ) -> subprocess.Popen[bytes]:
        """A supervisor process (in its own session), given the write end of its exit pipe."""
        read_end, write_end = os.pipe()
        try:
            env = {**self._shim_env(pythonpath), "GPUJOBS_SHIM_EXIT_FD": str(write_end)}
            proc = subprocess.Popen(
                [self.python, "-S", "-m", "jupyter_gpujobs.engine.runners.shim", *args], cwd=cwd, env=env,
                stdin=stdin, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                pass_fds=(write_end,),
            )
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        self._exit_pipes[proc.pid] = read_end
        return proc

    def _watch_exit(self, pid: int) -> None:
        """Call `on_exit` when supervisor `pid` exits (its exit pipe reads EOF); without an
        event loop (a plain script) or a callback, polling alone finds its result."""
        read_end = self._exit_pipes.get(pid)
        if read_end is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or self.on_exit is None:
            self._close_exit_pipe(pid)
            return

        def exited() -> None:
            loop.remove_reader(read_end)
            self._close_exit_pipe(pid)
            if self.on_exit is not None:
                self.on_exit()

        loop.add_reader(read_end, exited)

    def _close_exit_pipe(self, pid: int) -> None:
        read_end = self._exit_pipes.pop(pid, None)
        if read_end is not None:
            os.close(read_end)

    def _take_standby(self, pythonpath: str | None) -> subprocess.Popen[bytes] | None:
        """A waiting supervisor started with this PYTHONPATH, or None."""
        if self._standby_pythonpath != pythonpath:
            self._close_standbys()
        while self._standbys:
            proc = self._standbys.pop(0)
            if proc.poll() is None:
                return proc
            self._close_exit_pipe(proc.pid)
        return None

    def _close_standbys(self) -> None:
        procs, self._standbys = self._standbys, []
        for proc in procs:
            try:
                if proc.stdin:
                    proc.stdin.close()  # EOF: it exits
            except OSError:
                pass
        deadline = time.monotonic() + 2
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            self._close_exit_pipe(proc.pid)

    def close(self) -> None:
        """Stop the supervisors waiting for a job (running jobs are not touched)."""
        self._close_standbys()

    # ------------------------------------------------------------------ adopted processes

    def adopt(self, req: LaunchRequest, pids: list[int],
              handle: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """A GPU kernel's processes into the job's own cgroups, `kernel-<id>-<stamp>` (made with
        the fence and limits on the first call; a kernel restart joins those of `handle`). The
        stamp keeps them apart from another engine's kernel job of the same id on this host:
        the cgroups are the machine's, job ids are one engine's."""
        iso = self.isolation
        if not iso.enabled:
            return None
        cg = dict((handle or {}).get("cgroups") or {})
        if not cg:
            self._seq += 1
            cg = iso.paths(f"kernel-{req.job_id}-{time.time_ns() // 1000:x}{self._seq}")
        if not cgroups.exists(cg):
            try:
                cgroups.create(cg, req.deny_devices if iso.fence else [], req.mem_bytes, req.cpus,
                               iso.v2_controllers, iso.bpf, readable=req.container is not None)
            except OSError:
                cgroups.remove(cg)
                raise
        for pid in pids:
            for path in cgroups.procs_files(cg):
                try:
                    with open(path, "w") as f:
                        f.write(str(pid))
                except ProcessLookupError:
                    break  # it exited meanwhile: nothing to confine
        return {"runner": self.name, "adopted": True, "cgroups": cg}

    def adopted_run(self, handle: dict[str, Any] | None) -> str:
        cg = (handle or {}).get("cgroups") or {}
        return os.path.basename(next(iter(cg.values()))) if cg else ""

    def adopted_alive(self, handle: dict[str, Any]) -> bool:
        return cgroups.populated(handle.get("cgroups") or {})

    def stop_adopted(self, handle: dict[str, Any]) -> bool:
        cg = handle.get("cgroups") or {}
        if cg and cgroups.populated(cg):
            cgroups.kill(cg)
            return not cgroups.populated(cg)
        return True

    def release_adopted(self, handle: dict[str, Any]) -> None:
        cgroups.remove(handle.get("cgroups") or {})

    # ------------------------------------------------------------------ stop

    def terminate(self, job_id: int, handle: dict[str, Any], reason: str,
                  outcome: StopOutcome = "cancelled", grace_s: float = 10) -> None:
        job_dir = handle["job_dir"]
        control = os.path.join(job_dir, "control.json")
        if os.path.exists(os.path.join(job_dir, "result.json")):
            return
        write_json_atomic(control, {"outcome": outcome, "reason": reason, "grace_s": grace_s,
                                    "at": time.time()})
        if not os.path.exists(os.path.join(job_dir, "ready")):
            return  # the shim reads control.json before it starts the job
        if self._shim_alive(handle):
            try:
                os.kill(int(handle["pid"]), signal.SIGTERM)
            except OSError:
                pass
        else:
            self._kill_orphans(job_dir, handle)

    def withdraw_stop(self, job_id: int, handle: dict[str, Any]) -> bool:
        job_dir = handle.get("job_dir")
        if not job_dir or os.path.exists(os.path.join(job_dir, "result.json")):
            return False
        control = os.path.join(job_dir, "control.json")
        asked = read_json(control)
        if asked is None or asked.get("outcome") != "preempted" or asked.get("withdrawn"):
            return False
        write_json_atomic(control, {**asked, "withdrawn": True, "withdrawn_at": time.time()})
        return True

    def set_time_limit(self, job_id: int, handle: dict[str, Any], time_limit_s: int) -> bool:
        job_dir = handle.get("job_dir")
        if not job_dir or not os.path.isdir(job_dir) or os.path.exists(os.path.join(job_dir, "result.json")):
            return False
        write_json_atomic(os.path.join(job_dir, "limit.json"), {"time_limit_s": int(time_limit_s)})
        return True

    # ------------------------------------------------------------------ watch

    def poll(self, handles: dict[int, dict[str, Any]]) -> list[Exit]:
        out: list[Exit] = []
        mono = time.monotonic()
        for job_id, handle in handles.items():
            job_dir = handle.get("job_dir")
            if not job_dir:
                out.append(Exit(job_id, "lost", None, None, "no supervisor was recorded for this run", time.time()))
                continue
            result_path = os.path.join(job_dir, "result.json")
            if os.path.exists(result_path):
                exit_ = self._read_result(job_id, result_path)
                if exit_ is not None:
                    cg = handle.get("cgroups")
                    if cg and cgroups.populated(cg):  # only after a supervisor error: its GPUs wait
                        cgroups.kill(cg)
                        continue
                    if cg:
                        cgroups.remove(cg)
                    self._forget(job_dir)
                    out.append(exit_)
                    continue
            proc = self._children.get(job_dir)
            if proc is not None:
                if proc.poll() is None:
                    continue  # our own child and still running: no /proc read needed
            elif mono - self._checked.get(job_dir, -1e9) < self.liveness_interval:
                continue
            self._checked[job_dir] = mono
            if self._shim_alive(handle):
                continue
            exit_ = self._read_result(job_id, result_path)  # it may have finished just now
            if exit_ is None:
                if self._kill_orphans(job_dir, handle):
                    continue  # its GPUs stay held until the last process of the job is gone
                exit_ = Exit(job_id, "lost", None, None, LOST_REASON, time.time())
            cgroups.remove(handle.get("cgroups") or {})
            self._forget(job_dir)
            out.append(exit_)
        if not out and len(self._standbys) < min(self.standbys, self.MAX_STANDBYS):
            self.fill_standbys()  # not in front of the starts that follow an exit
        return out

    def alive(self, handle: dict[str, Any]) -> bool:
        job_dir = handle.get("job_dir")
        if not job_dir or os.path.exists(os.path.join(job_dir, "result.json")):
            return False
        return self._shim_alive(handle)

    def _shim_alive(self, handle: dict[str, Any]) -> bool:
        job_dir = handle.get("job_dir")
        proc = self._children.get(job_dir) if job_dir else None
        if proc is not None and proc.poll() is not None:
            return False
        try:
            p = psutil.Process(int(handle["pid"]))
            if handle.get("create_time") is not None and abs(p.create_time() - float(handle["create_time"])) > 0.5:
                return False  # the pid was recycled
            return p.status() != psutil.STATUS_ZOMBIE
        except (psutil.Error, KeyError, TypeError, ValueError):
            return False

    # ------------------------------------------------------------------ helpers

    def _read_result(self, job_id: int, path: str) -> Exit | None:
        data = read_json(path)
        if data is None:
            return None
        return Exit(job_id=job_id, outcome=str(data.get("outcome") or "failed"),
                    exit_code=data.get("exit_code"), signal=data.get("signal"),
                    reason=str(data.get("reason") or ""), ended_at=float(data.get("ended_at") or time.time()),
                    started=data.get("started_at") is not None or data.get("outcome") not in ("preempted", "cancelled"))

    def _forget(self, job_dir: str) -> None:
        proc = self._children.pop(job_dir, None)
        if proc is not None and proc.poll() is None:
            self._exiting.append(proc)  # it exits right after writing its result; reap it later
        self._exiting = [p for p in self._exiting if p.poll() is None]
        self._checked.pop(job_dir, None)

    def _kill_orphans(self, job_dir: str, handle: dict[str, Any]) -> bool:
        """The shim is gone but its job may not be: kill the job's cgroup, or else its process
        group and tree, so the GPU given back is really free. True while a process of the job's
        cgroup is still alive (it is being killed: ask again)."""
        cg = handle.get("cgroups") or {}
        if cg and cgroups.populated(cg):
            cgroups.kill(cg)
            return cgroups.populated(cg)
        state = read_json(os.path.join(job_dir, "state.json"))
        if not state or not state.get("pid"):
            return False
        pid = int(state["pid"])
        try:
            p = psutil.Process(pid)
            started = float(state.get("started_at") or 0)
            if started and p.create_time() > started + 1.0:
                return False  # a different process now has that pid
            procs = [p, *p.children(recursive=True)]
        except psutil.Error:
            procs = []
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        for proc in procs:
            try:
                proc.kill()
            except psutil.Error:
                pass
        return False

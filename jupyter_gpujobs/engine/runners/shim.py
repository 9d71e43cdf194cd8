"""The per-job supervisor ("shim"): `python -m jupyter_gpujobs.engine.runners.shim JOB_DIR`.

The local runner starts one shim per run, in its own session, so the run outlives the
Jupyter server that started it. The shim owns one run from start to result:

- reads `JOB_DIR/spec.json` (written by the runner), builds the job's environment (from an
  allow-list of the supervisor's own, `ENV_ALLOWED` plus the admin's `env_allow`, unless the
  runner says the job may inherit it: a personal engine's job run as its own user; then
  the request's variables; then CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES = exactly the allocated indices, MIG-… UUIDs
  for MIG instances, empty for none; CUDA_DEVICE_ORDER=PCI_BUS_ID; GPUJOBS_JOB_ID, GPUJOBS_GPU_UUIDS, GPUJOBS_TIME_LIMIT,
  GPUJOBS_KILL_GRACE, GPUJOBS_PREEMPT_GRACE; GPUJOBS_FAKE=1 on fake GPUs; PYTHONUNBUFFERED=1) and starts the
  command in its own process group with stdout and stderr merged into the log file, or, with a
  log cap (`log_max_bytes`), into a pipe the supervisor copies to the log (`CappedLog`: the head
  and the latest tail are kept, with a line saying how much was cut between them), telling the
  job where its output starts in the log (GPUJOBS_LOG_OFFSET);
- gives the job a private /tmp (a folder of its run directory, bind-mounted) and /dev/shm (a
  fresh tmpfs) in a mount namespace of its own when the runner asks (`private_tmp`), and
  removes that /tmp when the job has ended;
- becomes a child subreaper (Linux), so descendants that leave the process group or
  daemonize are re-parented to it and can still be found and killed;
- sends the signal a job asked for before its end (`warn_signal`, "B:USR1@300": to the whole
  job, or with `B:` to its first process only) that many seconds before its time limit, and
  at once when it is preempted, its SIGTERM then waiting until the grace has only the kill
  grace left (the engine gives it a grace of at least its asked time, `model.preempt_grace`);
- stops the whole tree (SIGTERM, grace, SIGKILL) at the time limit, when asked (SIGTERM to the
  shim after the runner wrote `JOB_DIR/control.json` with outcome and reason; a control with
  `withdrawn` in the grace takes the SIGKILL back), and when the
  main process ends but left processes behind;
- writes `JOB_DIR/result.json` atomically: outcome, exit code, signal and a reason a person
  can act on ("failed (exit code 3)", "killed by signal SIGSEGV", "out of memory (...)").

It must start fast (it is on the dispatch path), so it imports only the standard library;
psutil is imported only when a process tree has to be stopped. This module owns the run's
supervision (the `Shim`: signals, limits, the tree, the result) and its entry point; beside
it, each imported at start: `joblog` (the log, its cap, OOM patterns), `jobtmp` (private
/tmp and /dev/shm), `jobenv` (environment and user), `spawn` (starting the process),
`runfiles` (the run directory's JSON files, how a run ended in words). It may call those and
`cgroups`, and, for a job in a container image, `containers.wrap` (issue 29). Other modules import those names from here (`read_json`, `how_it_ended`,
`OOM_PATTERNS`, `probe_private_mounts`...), which it re-exports.
"""

from __future__ import annotations

import errno as errno_
import os
import select
import signal
import sys
import time
from typing import Any

from . import cgroups
from .jobenv import (
    ENV_ALLOWED,
    allowed_environment,
    job_environment,
    parse_warning,
    resolve_user,
    visible_devices,
)
from .joblog import OOM_PATTERNS, CappedLog, OutputPipe, find_oom, open_log
from .jobtmp import _libc, make_job_tmp, private_mounts, probe_private_mounts, remove_job_tmp
from .runfiles import _format_duration, how_it_ended, read_json, write_json_atomic
from .spawn import SpawnError, spawn

__all__ = ["ENV_ALLOWED", "OOM_PATTERNS", "CappedLog", "OutputPipe", "Shim", "SpawnError", "allowed_environment",
           "find_oom", "how_it_ended", "job_environment", "make_job_tmp", "main", "open_log", "parse_warning",
           "private_mounts", "probe_private_mounts", "read_json", "remove_job_tmp", "resolve_user", "spawn",
           "visible_devices", "write_json_atomic"]


#: The write end of the pipe the runner watches (see local.py); closed once the result is
#: written, so the engine reads it then, not after this interpreter's shutdown.
_EXIT_FD: int | None = None


def _tell_runner() -> None:
    global _EXIT_FD
    if _EXIT_FD is not None:
        try:
            os.close(_EXIT_FD)
        except OSError:
            pass
        _EXIT_FD = None


def _become_subreaper() -> bool:
    libc = _libc()
    try:
        return libc is not None and libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except Exception:
        return False


class Shim:
    def __init__(self, job_dir: str):
        self.job_dir = job_dir
        self.spec_path = os.path.join(job_dir, "spec.json")
        self.control_path = os.path.join(job_dir, "control.json")
        self.result_path = os.path.join(job_dir, "result.json")
        self.state_path = os.path.join(job_dir, "state.json")
        self.limit_path = os.path.join(job_dir, "limit.json")  # a time limit changed while it runs
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.term_requested = False
        self.subreaper = False
        self.child_pid: int | None = None
        self.child_status: int | None = None
        self.known: dict[int, float] = {}  # descendants seen: pid -> create time (no subreaper)
        self.cg: dict[str, str] = {}  # the run's cgroups (cgroups.py), empty without
        self.output: OutputPipe | None = None  # where a capped run's output goes

    def time_limit(self, limit: float) -> float:
        """The run's time limit now: the spec's, or the one the runner wrote to `limit.json`
        since (`LocalRunner.set_time_limit`: `PATCH jobs/{id}` with a time_limit)."""
        changed = read_json(self.limit_path) if os.path.exists(self.limit_path) else None
        value = (changed or {}).get("time_limit_s")
        return float(value) if isinstance(value, (int, float)) and value > 0 else limit

    # ------------------------------------------------------------------ signals

    def install_handlers(self) -> None:
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)

        def on_term(signum: int, frame: Any) -> None:
            self.term_requested = True

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, on_term)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        with open(os.path.join(self.job_dir, "ready"), "w") as f:
            f.write(str(os.getpid()))

    def wait(self, timeout: float) -> None:
        readers = [self.wake_r]
        if self.output is not None and self.output.open:
            readers.append(self.output.read_fd)
        try:
            select.select(readers, [], [], max(0.0, timeout))
        except InterruptedError:
            pass
        if self.output is not None:
            self.output.drain()
        try:
            while os.read(self.wake_r, 512):
                pass
        except (BlockingIOError, OSError):
            pass

    # ------------------------------------------------------------------ processes

    def reap(self) -> bool:
        """Reap every exited child; False when no child is left at all."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            except InterruptedError:
                continue
            if pid == 0:
                return True
            if pid == self.child_pid and self.child_status is None:
                self.child_status = status

    def tree(self) -> list[Any]:
        """The live descendants of the shim (psutil processes)."""
        import psutil

        procs: dict[int, Any] = {}
        try:
            for p in psutil.Process().children(recursive=True):
                procs[p.pid] = p
        except psutil.Error:
            pass
        for pid, ctime in list(self.known.items()):
            if pid in procs:
                continue
            try:
                p = psutil.Process(pid)
                if abs(p.create_time() - ctime) < 0.5:
                    procs[pid] = p
                else:
                    del self.known[pid]
            except psutil.Error:
                del self.known[pid]
        return list(procs.values())

    def remember_tree(self) -> None:
        """Without a subreaper, remember descendants so those that get re-parented to init
        can still be stopped."""
        import psutil

        try:
            for p in psutil.Process().children(recursive=True):
                try:
                    self.known.setdefault(p.pid, p.create_time())
                except psutil.Error:
                    pass
        except psutil.Error:
            pass

    def signal_tree(self, sig: int) -> int:
        """Send `sig` to the job's process group and every descendant (and every process in
        its cgroup, which none can leave); how many got it."""
        if sig == signal.SIGKILL and self.cg:
            alive = cgroups.populated(self.cg)
            cgroups.kill(self.cg)
            return int(alive)
        import psutil

        sent = 0
        group: int | None = None
        if self.child_pid is not None and self.child_status is None:
            try:
                os.killpg(self.child_pid, sig)  # not reaped yet, so the group id is still ours
                group = self.child_pid
                sent += 1
            except OSError:
                pass
        for p in self.tree():
            try:
                if p.status() == psutil.STATUS_ZOMBIE:
                    continue
                if group is not None and os.getpgid(p.pid) == group:
                    continue  # got it through the group: a second SIGTERM could cut its cleanup short
                p.send_signal(sig)
                sent += 1
            except (psutil.Error, OSError):
                pass
        for pid in cgroups.pids(self.cg) if self.cg else ():
            try:
                if group is not None and os.getpgid(pid) == group:
                    continue
                os.kill(pid, sig)
                sent += 1
            except OSError:
                pass
        return sent

    def send_warning(self, warning: tuple[int, float, bool]) -> None:
        """The signal a job asked for before its end: to its first process only (`B:`), else
        to the whole job (`signal_tree`)."""
        sig, _before, first_only = warning
        if not first_only:
            self.signal_tree(sig)
        elif self.child_pid is not None and self.child_status is None:
            try:
                os.kill(self.child_pid, sig)
            except OSError:
                pass

    def leftovers(self) -> bool:
        """Is a process of the job still alive after its main process ended?"""
        if self.cg:
            return cgroups.populated(self.cg)
        return bool(self.known and self.tree())

    # ------------------------------------------------------------------ the run

    def fail_to_start(self, spec: dict[str, Any], reason: str, log_fd: int | None) -> int:
        if log_fd is not None:
            try:
                os.write(log_fd, f"gpujobs: {reason}\n".encode())
            except OSError:
                pass
        self.write_result(spec, "failed", None, None, reason)
        return 0

    @staticmethod
    def spawn_failure(err: SpawnError, command: list[str], cwd: str | None,
                      user: tuple[str, int, int, str, str] | None) -> str:
        """The reason a person reads when the job could not start."""
        who = user[0] if user else None
        if err.stage == "cwd":
            if err.errno == errno_.ENOENT:
                return f"working directory not found: {cwd}"
            if err.errno in (errno_.EACCES, errno_.EPERM) and who:
                return f"cwd {cwd} is not accessible to {who}"
            return f"cannot enter the working directory {cwd}: {err.strerror}"
        if err.stage == "cgroup":
            return f"could not put the job in its cgroup: {err.strerror}"
        if err.stage == "tmp":
            return f"could not give the job a private /tmp and /dev/shm: {err.strerror}"
        if err.stage == "user":
            return f"could not switch to the user {who}: {err.strerror}"
        if err.errno == errno_.ENOENT:
            return f"command not found: {command[0]}"
        if err.errno == errno_.EACCES:
            return f"permission denied: {command[0]}" + (f" (for {who})" if who else "")
        return f"could not start {command[0]}: {err.strerror or err}"

    def write_result(self, spec: dict[str, Any], outcome: str, exit_code: int | None,
                     sig: int | None, reason: str, started_at: float | None = None) -> None:
        """Write the result. On a full or read-only disk keep it, and stay (so the engine does
        not take the run for lost), until it can be written: the true outcome is recorded once
        space returns."""
        result = {"job_id": spec.get("job_id"), "outcome": outcome, "exit_code": exit_code, "signal": sig,
                  "reason": reason, "started_at": started_at, "ended_at": time.time(), "pid": self.child_pid}
        pause = 0.2
        while True:
            try:
                write_json_atomic(self.result_path, result)
                _tell_runner()
                return
            except OSError as err:
                if err.errno not in (errno_.ENOSPC, errno_.EDQUOT, errno_.EROFS):
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 5.0)

    def run(self) -> int:
        self.install_handlers()
        spec = read_json(self.spec_path)
        if spec is None:
            self.write_result({}, "failed", None, None, f"supervisor could not read {self.spec_path}")
            return 1
        control = read_json(self.control_path)
        if control is not None:  # stopped before it started
            self.write_result(spec, control.get("outcome", "cancelled"), None, None,
                              control.get("reason", "cancelled"))
            return 0

        log_path = spec.get("log_path") or os.path.join(self.job_dir, "output.log")
        log_fd: int | None = None
        try:
            user = resolve_user(spec)
        except KeyError:
            from .users import NotAUnixUser  # the engine's words for it

            return self.fail_to_start(spec, str(NotAUnixUser(str(spec["run_as"]))), None)
        try:
            os.makedirs(os.path.dirname(os.path.abspath(log_path)), mode=0o700, exist_ok=True)
            log_fd = open_log(log_path, (user[1], user[2]) if user else None)
        except OSError as err:
            return self.fail_to_start(spec, f"cannot open the log file {log_path}: {err.strerror}", None)
        log_start = os.lseek(log_fd, 0, os.SEEK_END)

        command = [str(c) for c in spec.get("command") or []]
        cwd = spec.get("cwd") or None
        if not command:
            return self.fail_to_start(spec, "no command to run", log_fd)

        env = job_environment(spec, dict(os.environ))
        if user is not None:
            env.update({"HOME": user[3], "USER": user[0], "LOGNAME": user[0], "SHELL": user[4] or "/bin/sh"})
        elif not spec.get("inherit_env"):
            import pwd

            me = pwd.getpwuid(os.getuid())
            env.update({"HOME": me.pw_dir, "USER": me.pw_name, "LOGNAME": me.pw_name, "SHELL": me.pw_shell or "/bin/sh"})
        tmp_dir: str | None = None
        tmp_keep = [os.path.normpath(str(p)) for p in spec.get("tmp_keep") or ()
                    if os.path.normpath(str(p)).startswith("/tmp/")]
        # a job in an image has the container's own /tmp and /dev/shm; its runtime (rootless
        # podman, as the owner) keeps its run state and locks there, the same for all its jobs
        if spec.get("private_tmp") and not spec.get("container"):
            where = os.path.normpath(cwd or self.job_dir)
            if where != "/tmp" and not where.startswith("/tmp/"):  # else the folder would vanish for it
                try:
                    tmp_dir = make_job_tmp(self.job_dir, tmp_keep)
                except OSError as err:
                    return self.fail_to_start(spec, f"could not make the job's private /tmp: {err.strerror}", log_fd)
        self.cg = {str(k): str(v) for k, v in (spec.get("cgroups") or {}).items()}
        if self.cg:
            try:
                cgroups.create(self.cg, spec.get("deny_devices") or [], spec.get("mem_bytes"), spec.get("cpus"),
                               tuple(spec.get("v2_controllers") or ()), bool(spec.get("bpf_fence")),
                               readable=bool(spec.get("container")))
            except OSError as err:
                cgroups.remove(self.cg)
                return self.fail_to_start(spec, f"could not confine the job in its cgroup: {err.strerror or err}",
                                          log_fd)
        if spec.get("container"):  # a job in its image (issue 29): the runtime runs it, as its owner
            from ..containers import wrap

            command, env = wrap(spec["container"], command, env)
        self.subreaper = _become_subreaper()
        cap = int(spec.get("log_max_bytes") or 0)
        if cap:
            self.output = OutputPipe(log_fd, cap)
            env["GPUJOBS_LOG_OFFSET"] = str(log_start)  # where its output starts in the log (cell jobs' spans)
        try:
            pid = spawn(command, cwd, env, self.output.write_fd if self.output else log_fd, self.cg,
                        (user[0], user[1], user[2], user[5]) if user else None, tmp_dir, tmp_keep)
        except SpawnError as err:
            cgroups.remove(self.cg)
            if tmp_dir:
                remove_job_tmp(tmp_dir)
            if self.output is not None:
                self.output.close()
                self.output = None
            return self.fail_to_start(spec, self.spawn_failure(err, command, cwd, user), log_fd)
        if self.output is not None:
            os.close(self.output.write_fd)  # the job holds it: EOF once the job's last process is gone
            self.output.write_fd = -1
        else:
            os.close(log_fd)
            log_fd = None
        self.child_pid = pid
        started_mono = time.monotonic()
        started_at = time.time()
        write_json_atomic(self.state_path, {"pid": pid, "pgid": pid, "started_at": started_at,
                                            "shim_pid": os.getpid()})

        limit = spec.get("time_limit_s")
        grace = float(spec.get("grace_s") if spec.get("grace_s") is not None else 10)
        deadline = started_mono + float(limit) if limit else None
        warning = parse_warning(spec.get("warn_signal"))
        warned = False  # the signal before the end was sent
        kill_grace = grace
        term_at: float | None = None  # a preempted job with a signal: its SIGTERM, after its asked time
        stop: tuple[str, str] | None = None  # (outcome, reason) once stopping
        kill_at: float | None = None
        # a stop withdrawn in its grace (a preemption whose preemptor was cancelled): the job
        # runs on; an end before the grace would have ended is still its answer to the stop
        withdrawn: tuple[tuple[str, str], float] | None = None
        ended_mono: float | None = None
        killed = False
        leftovers_stopping = False
        next_scan = started_mono
        while True:
            have_children = self.reap()
            now = time.monotonic()
            if self.child_status is None:
                if stop is None:
                    control = read_json(self.control_path) if (
                        self.term_requested or os.path.exists(self.control_path)) else None
                    if control is not None and control.get("withdrawn"):
                        control = None
                    if control is not None or self.term_requested:
                        control = control or {}
                        stop = (str(control.get("outcome") or "cancelled"),
                                str(control.get("reason") or "stopped by a signal to the supervisor"))
                        if control.get("grace_s") is not None:
                            grace = float(control["grace_s"])
                    elif (warning is not None and not warned and deadline is not None
                          and now >= deadline - warning[1] and now < deadline):
                        limit = self.time_limit(limit)  # (a limit extended since: limit.json)
                        deadline = started_mono + float(limit)
                        if now >= deadline - warning[1]:
                            warned = True
                            self.send_warning(warning)
                    elif deadline is not None and now >= deadline:
                        limit = self.time_limit(limit)  # (a limit extended since: limit.json)
                        deadline = started_mono + float(limit)
                        if now >= deadline:
                            stop = ("timeout", f"time limit of {_format_duration(float(limit))} reached")
                    if stop is not None and warning is not None and stop[0] == "preempted":
                        if not warned:  # its signal now, its SIGTERM when the kill grace is all that is left
                            warned = True
                            self.send_warning(warning)
                        term_at = time.monotonic() + max(0.0, grace - kill_grace)  # (from the signal's sending)
                    elif stop is not None:
                        self.signal_tree(signal.SIGTERM)
                    if stop is not None:
                        kill_at = now + grace
                elif kill_at is not None and not killed and (read_json(self.control_path) or {}).get("withdrawn"):
                    withdrawn, stop, kill_at, self.term_requested = (stop, kill_at), None, None, False
                if term_at is not None and (stop is None or killed or now >= term_at):
                    if stop is not None and not killed:
                        self.signal_tree(signal.SIGTERM)
                    term_at = None
                if kill_at is not None and now >= kill_at and not killed:
                    self.signal_tree(signal.SIGKILL)
                    killed = True
                if not self.subreaper and now >= next_scan:
                    self.remember_tree()
                    next_scan = now + 1.0
            else:
                # the main process ended: nothing of the run may outlive it
                ended_mono = now if ended_mono is None else ended_mono
                if not have_children and not self.leftovers():
                    break
                if not leftovers_stopping:
                    leftovers_stopping = True
                    if not killed:
                        self.signal_tree(signal.SIGTERM)
                        soon = now + min(grace, 5.0)
                        kill_at = min(kill_at, soon) if kill_at is not None else soon
                elif kill_at is not None and now >= kill_at:
                    if self.signal_tree(signal.SIGKILL) == 0 and not have_children:
                        break
                    kill_at = now + 0.5
            waits = [0.5]
            if deadline is not None and stop is None:
                waits.append(deadline - now)
                if warning is not None and not warned:
                    waits.append(deadline - warning[1] - now)
            if term_at is not None:
                waits.append(term_at - now)
            if kill_at is not None:
                waits.append(kill_at - now)
            if self.child_status is not None or killed:
                waits.append(0.05)
            self.wait(min(waits))

        if spec.get("container") and (stop is not None or killed or leftovers_stopping):
            # (a container that ended by itself was removed by its runtime: `podman run --rm`)
            from ..containers.leftovers import remove_container

            remove_container(spec["container"], env, user, tmp_dir, tmp_keep, self.cg, self.reap)
        status = self.child_status if self.child_status is not None else 0
        exit_code: int | None = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        sig: int | None = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        host_oom = bool(self.cg) and cgroups.oom_killed(self.cg)
        cgroups.remove(self.cg)
        if self.output is not None:
            self.output.close()  # nothing of the job is left: what it wrote last is in the log
        if log_fd is not None:
            os.close(log_fd)
        if tmp_dir:
            remove_job_tmp(tmp_dir)
        if stop is None and withdrawn is not None and ended_mono is not None and ended_mono < withdrawn[1]:
            stop = withdrawn[0]
        if stop is not None:
            outcome, reason = stop
        elif host_oom:
            limit_text = cgroups.format_bytes(int(spec.get("mem_bytes") or 0))
            outcome, reason = "oom", f"host memory limit of {limit_text} reached ({how_it_ended(exit_code, sig)})"
        elif exit_code == 0:
            outcome, reason = "completed", "completed"
        else:
            pattern = find_oom(log_path, log_start)
            how = how_it_ended(exit_code, sig)
            if pattern:
                outcome, reason = "oom", f"out of memory ({pattern} in the log; {how})"
            else:
                outcome, reason = "failed", f"failed ({how})" if exit_code is not None else how
        self.write_result(spec, outcome, exit_code, sig, reason, started_at)
        return 0


def standby() -> str | None:
    """Wait, already started, for the runner to name a job dir on stdin (one line); then
    become that job's supervisor. This takes the interpreter's start-up (and the C library's
    loading) off the dispatch path."""
    _libc()
    cgroups.load_clone3()
    line = sys.stdin.readline().strip()
    if not line:
        return None  # the runner went away (EOF)
    os.chdir(line)
    log_fd = os.open(os.path.join(line, "shim.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((null_fd, 0), (log_fd, 1), (log_fd, 2)):
        os.dup2(fd, target)
    return line


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    # the write end of the pipe the runner watches: held until this process exits, never by the job
    global _EXIT_FD
    exit_fd = os.environ.pop("GPUJOBS_SHIM_EXIT_FD", "")
    if exit_fd.isdigit():
        try:
            os.set_inheritable(int(exit_fd), False)
            _EXIT_FD = int(exit_fd)
        except OSError:
            pass
    if args == ["--standby"]:
        job_dir = standby()
        if job_dir is None:
            return 0
        args = [job_dir]
    if len(args) != 1:
        print("usage: python -m jupyter_gpujobs.engine.runners.shim JOB_DIR", file=sys.stderr)
        return 2
    shim = Shim(args[0])
    try:
        return shim.run()
    except Exception as err:  # never leave a run without a result or a process behind
        import traceback

        try:
            traceback.print_exc()
        except OSError:
            pass  # shim.log is on a full disk: the result below still says what happened
        try:
            shim.signal_tree(signal.SIGKILL)
        except Exception:
            pass
        shim.write_result(read_json(shim.spec_path) or {}, "failed", None, None, f"supervisor error: {err}")
        return 1


if __name__ == "__main__":
    sys.exit(main())

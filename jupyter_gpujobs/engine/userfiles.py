"""Looking at what a user names (a notebook to run, a folder to write to, a job's working
folder) as that user, never with the engine's (root's) rights, off the engine's event loop,
bounded in time and size.

A root engine must not open a path a user gave it: the user could name a FIFO or a device
that never ends (every request of every user would wait), a huge sparse file (seconds of the
loop, a GB of memory), or a file only root may read (the answer would tell them something of
it). So the looking is done by a small helper process that runs with the user's uid, gid and
groups (`runners.users.account`), in its own session, with a CPU-time and address-space
limit of its own, fed a request on stdin and read back from at most `MAX_ANSWER` bytes of its
stdout; it is killed at the deadline, and one user has at most `MAX_PER_USER` running at once. It opens the file with O_NONBLOCK (a FIFO does not
block the open), refuses anything but a regular file, checks the size from fstat before
reading, and parses the notebook itself: the engine receives a verdict, never the file.
Whatever the helper sees, the user could see for themselves, so its answers tell nothing
of what only root may read; a path it may not open gets the same answer as a missing one.

A personal engine (not root) runs the helper as itself: the same bounds, no user switch.

May call: `runners.users` (who the user is) and the standard library; nothing else of ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
import sys
import time
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .runners.users import account

#: The most the engine reads of a helper's answer (a user may tamper with their own helper).
MAX_ANSWER = 16 << 10

#: What the helper runs (`python -I -S -c HELPER`, standard library only, any Python >= 3.6):
#: it reads one JSON request from stdin and prints one JSON answer.
HELPER = r"""
import json, os, resource, stat, sys

req = json.loads(sys.stdin.read(1 << 16))
limit = int(req["max_bytes"])
cpu = int(req["cpu_s"])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
mem = int(req["memory_bytes"])
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))


def answer(**kw):
    sys.stdout.write(json.dumps(kw))
    sys.stdout.flush()
    os._exit(0)


def notebook(path):
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            answer(notebook="not_a_file")  # (a FIFO or device is never opened)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        answer(notebook="missing")
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        answer(notebook="not_a_file")
    if st.st_size > limit:
        answer(notebook="too_big", size=st.st_size)
    chunks, total = [], 0
    while total <= limit:
        chunk = os.read(fd, min(1 << 20, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > limit:
        answer(notebook="too_big", size=total)
    try:
        content = json.loads(b"".join(chunks).decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        answer(notebook="not_json", detail=str(err)[:200])
    except MemoryError:
        answer(notebook="too_big", size=total)
    if not isinstance(content, dict) or not isinstance(content.get("cells"), list):
        answer(notebook="no_cells")


def folder(path, create):
    if os.path.isdir(path):
        return "ok" if os.access(path, os.W_OK | os.X_OK) else "not_writable"
    parent = os.path.dirname(path)
    if create and os.path.isdir(parent):
        return "ok" if os.access(parent, os.W_OK | os.X_OK) else "not_writable"
    return "missing"


def directory(path):
    ok = os.path.isdir(path) and os.access(path, os.X_OK)
    answer(directory="ok" if ok else "missing", real=os.path.realpath(path) if ok else "")


if req.get("directory"):
    directory(req["directory"])
if req.get("notebook"):
    notebook(req["notebook"])
out = {"notebook": "ok"}
if req.get("folder"):
    out["folder"] = folder(req["folder"], bool(req.get("create")))
answer(**out)
"""


class HelperFailed(RuntimeError):
    """The helper gave no answer: it ran past its time, was killed, or could not start."""


@dataclass(frozen=True)
class Bounds:
    """How far the helper may go: the largest file it reads, and its time."""

    max_bytes: int = 64 << 20
    timeout_s: float = 5.0


@dataclass(frozen=True)
class NotebookVerdict:
    """What the helper found, as the user.

    notebook: "ok", "missing" (absent, or the user may not open it: the same answer),
    "not_a_file" (a folder, FIFO, device, socket), "too_big", "not_json", "no_cells";
    folder: None (not asked), "ok", "missing", "not_writable"."""

    notebook: str
    folder: str | None = None
    size: int | None = None
    detail: str = ""


def _open_to_all(path: str) -> bool:
    """Whether any user may run the file at `path` (every folder above it searchable by others,
    the file executable by others), read as root from the mode bits."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or not st.st_mode & stat.S_IXOTH:
        return False
    folder = os.path.dirname(path)
    while True:
        try:
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
        parent = os.path.dirname(folder)
        if parent == folder:
            return True
        folder = parent


@lru_cache(maxsize=8)
def helper_python(preferred: str = "") -> str:
    """A Python every user may run for the helper: `preferred` (c.GPUJobs.job_python), the
    engine's own interpreter, or the system's, each by its real path (`-I -S` needs no venv).
    On a personal engine the engine's own interpreter is always fine."""
    candidates = [preferred, sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"]
    if os.geteuid() != 0:
        return os.path.realpath(sys.executable)
    for path in (os.path.realpath(c) for c in candidates if c):
        if _open_to_all(path):
            return path
    return os.path.realpath(sys.executable)


#: Checks one user may have running at once (this helper, and containers/present.py's image
#: checks: `user_slot`): more wait for a slot, within their own time, so a flood of submissions
#: costs its sender, not the machine.
MAX_PER_USER = 2
_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary())


def as_user(unix_user: str | None, path: str = "/usr/bin:/bin") -> dict[str, Any]:
    """What runs a process as `unix_user` (None: the engine's own user), for
    `asyncio.create_subprocess_exec`: their uid, gid and groups, and a plain environment of
    theirs (PATH `path`, LANG, HOME; USER and LOGNAME for another user). The engine's one way
    of running something as a user (this helper, containers/present.py and pull.py).
    HelperFailed when there is no such user."""
    env = {"PATH": path, "LANG": "C.UTF-8", "HOME": os.environ.get("HOME") or "/"}
    try:
        acct = account(unix_user) if unix_user else None
    except KeyError:
        raise HelperFailed(f"{unix_user} is not a user on this machine") from None
    if acct is None:  # (the engine's own user)
        return {"env": env}
    name, uid, gid, home, _shell, groups = acct
    env.update({"HOME": str(home), "USER": str(name), "LOGNAME": str(name)})
    return {"user": uid, "group": gid, "extra_groups": list(groups), "env": env}


@contextlib.asynccontextmanager
async def user_slot(unix_user: str | None, timeout_s: float) -> AsyncIterator[float]:
    """One of the `MAX_PER_USER` slots of `unix_user` (None: the engine's own user), held in
    the block, which gets the seconds left of `timeout_s` once it has it. HelperFailed when
    none is free within `timeout_s`."""
    slots = _slots.setdefault(asyncio.get_running_loop(), {})
    slot = slots.setdefault(unix_user or "", asyncio.Semaphore(MAX_PER_USER))
    started = time.monotonic()
    try:
        await asyncio.wait_for(slot.acquire(), timeout_s)
    except asyncio.TimeoutError:
        raise HelperFailed(f"{MAX_PER_USER} earlier checks were still running after {timeout_s:g} s") from None
    try:
        yield max(0.001, timeout_s - (time.monotonic() - started))
    finally:
        slot.release()


async def _run_helper(unix_user: str | None, request: dict[str, Any], bounds: Bounds,
                      python: str = "") -> dict[str, Any]:
    """Run the helper as `unix_user` (None: as the engine's own user) on `request`; its
    answer. HelperFailed when it gives none within `bounds.timeout_s` (waiting for a slot
    included)."""
    async with user_slot(unix_user, bounds.timeout_s) as left:
        return await _helper(unix_user, request, Bounds(bounds.max_bytes, left), python)


async def _helper(unix_user: str | None, request: dict[str, Any], bounds: Bounds, python: str) -> dict[str, Any]:
    """One run of the helper (`_run_helper`)."""
    who = as_user(unix_user)
    cpu_s = max(1, int(bounds.timeout_s + 0.999))
    # room for the file, the text decoded from it and its parsed objects, and the interpreter
    memory = 512 * (1 << 20) + 16 * bounds.max_bytes
    payload = json.dumps({**request, "max_bytes": bounds.max_bytes, "cpu_s": cpu_s,
                          "memory_bytes": memory}).encode()
    interpreter = helper_python(python)
    try:
        proc = await asyncio.create_subprocess_exec(
            interpreter, "-I", "-S", "-c", HELPER,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            cwd="/", start_new_session=True, close_fds=True, **who)
    except OSError as err:
        raise HelperFailed(f"could not start the checking process ({interpreter}: {err.strerror or err}); an admin "
                           "may set c.GPUJobs.job_python to a Python every user may run") from None
    assert proc.stdin is not None and proc.stdout is not None

    async def exchange() -> bytes:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(payload)
        try:
            await proc.stdin.drain()
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass
        out = b""
        while len(out) <= MAX_ANSWER:
            chunk = await proc.stdout.read(MAX_ANSWER + 1 - len(out))
            if not chunk:
                break
            out += chunk
        await proc.wait()
        return out

    try:
        raw = await asyncio.wait_for(exchange(), bounds.timeout_s)
    except asyncio.TimeoutError:
        raise HelperFailed(f"no answer within {bounds.timeout_s:g} s") from None
    finally:
        if proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:  # reaped in the background: a process stuck in the kernel does not hold us
                await asyncio.wait_for(asyncio.shield(proc.wait()), 1.0)
            except asyncio.TimeoutError:
                pass
    if len(raw) > MAX_ANSWER:
        raise HelperFailed("its answer was too long")
    try:
        answer = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        why = f"it ended with status {proc.returncode}" if raw == b"" else "its answer was not JSON"
        raise HelperFailed(f"no answer ({why})") from None
    if not isinstance(answer, dict):
        raise HelperFailed("its answer was not an object")
    return answer


async def check_notebook(unix_user: str | None, notebook: str, folder: str | None = None,
                         create_folder: bool = False, bounds: Bounds = Bounds(),
                         python: str = "") -> NotebookVerdict:
    """As `unix_user`: is `notebook` a regular file of at most `bounds.max_bytes` holding a
    Jupyter notebook, and may the user write into `folder` (or create it, with
    `create_folder`, in its existing parent)? HelperFailed when the helper gave no answer."""
    answer = await _run_helper(unix_user, {"notebook": notebook, "folder": folder, "create": create_folder},
                               bounds, python)
    verdict = answer.get("notebook")
    if not isinstance(verdict, str):
        raise HelperFailed("its answer named no verdict")
    folder_verdict = answer.get("folder")
    size = answer.get("size")
    return NotebookVerdict(notebook=verdict, folder=folder_verdict if isinstance(folder_verdict, str) else None,
                           size=size if isinstance(size, int) else None, detail=str(answer.get("detail") or "")[:200])


#: How long a user's folder found enterable is taken as such without asking again (seconds):
#: a burst of submissions from one folder costs one helper.
DIRECTORY_OK_S = 10.0
_directories_ok: dict[tuple[str, str], tuple[float, str]] = {}
#: checks under way: a burst of submissions that all name one folder waits for one helper and
#: goes on in one event-loop turn, so the burst is still one commit (Admission's group commit)
_directories_asked: dict[tuple[str, str], asyncio.Task[str | None]] = {}


async def check_directory(unix_user: str | None, path: str, bounds: Bounds = Bounds(),
                          python: str = "") -> str | None:
    """As `unix_user`: the real path (symbolic links followed as the user) of `path` when it
    is a folder the user may enter, else None -- a folder that is missing, not a folder, or
    behind a folder the user may not search, whatever root could see there. HelperFailed
    when the helper gave no answer. A folder found enterable is remembered DIRECTORY_OK_S."""
    key = (unix_user or "", path)
    now = time.monotonic()
    hit = _directories_ok.get(key)
    if hit is not None and now - hit[0] < DIRECTORY_OK_S:
        return hit[1]
    asked = _directories_asked.get(key)
    if asked is None:
        asked = _directories_asked[key] = asyncio.ensure_future(
            _check_directory(unix_user, path, bounds, python, key, now))
        asked.add_done_callback(lambda _: _directories_asked.pop(key, None))
    return await asyncio.shield(asked)  # (every caller the same way: they go on in one turn)


async def _check_directory(unix_user: str | None, path: str, bounds: Bounds, python: str,
                           key: tuple[str, str], now: float) -> str | None:
    answer = await _run_helper(unix_user, {"directory": path}, bounds, python)
    verdict, real = answer.get("directory"), answer.get("real")
    if verdict not in ("ok", "missing") or not isinstance(real, str):
        raise HelperFailed("its answer named no verdict")
    if verdict != "ok" or not os.path.isabs(real):
        return None
    if len(_directories_ok) > 10_000:
        _directories_ok.clear()
    _directories_ok[key] = (now, real)
    return real


__all__ = ["Bounds", "HelperFailed", "NotebookVerdict", "as_user", "check_directory", "check_notebook", "helper_python",
           "user_slot"]

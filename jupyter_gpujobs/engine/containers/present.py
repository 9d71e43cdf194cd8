"""Is a job's image there for its owner? Asked at submit, as the owner, off the event loop.

An image of rootless podman is in its owner's own storage (their home) or in a store the
site shares (`additionalimagestores`): only a process of the owner sees what they may use, so
the check runs the runtime's `exists_command` as them (never as root: `userfiles.as_user`), with
a time limit, in one of the owner's few slots for checks (`userfiles.user_slot`, shared with
the engine's other looks at their files: a user's flood of submissions waits for its own
checks, not others'), and a missing image is a refusal naming it; an image found is taken as there for a minute (a burst
of submissions asks once). The file or folder a pull of podman's local transports reads is
looked at the same way (`check_readable`). Nothing is pulled here: a job whose image a pull can fetch waits
for it before it may take GPUs (pull.py, which runs its commands as the owner with `as_owner`).

May call: `containers` (the interface), `userfiles` (running as the owner, their slots).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

from ..userfiles import HelperFailed, as_user, user_slot
from . import ImageProblem, Runtime

#: the most seconds a check may take before the submission is refused
CHECK_TIMEOUT_S = 30.0
#: how long an image found for a user is taken as there without asking again (a burst of
#: submissions asks once); a missing one is asked again every time
FOUND_FOR_S = 60.0
_found: dict[tuple[str, str], float] = {}  # (Unix user or "", image) -> monotonic time it was found


def as_owner(unix_user: str | None) -> dict[str, object]:
    """What runs a runtime's command as `unix_user` (None: the engine's own user), for
    `asyncio.create_subprocess_exec` (`userfiles.as_user`, with the engine's PATH, where the
    runtime is). ImageProblem when there is no such user."""
    try:
        return as_user(unix_user, os.environ.get("PATH") or "/usr/local/bin:/usr/bin:/bin")
    except HelperFailed as err:
        raise ImageProblem(str(err)) from None


def known_present(image: str, unix_user: str | None) -> bool:
    """Was `image` found there for `unix_user` within `FOUND_FOR_S` (no need to ask again)?"""
    return time.monotonic() - _found.get((unix_user or "", image), -FOUND_FOR_S) < FOUND_FOR_S


async def check_present(runtime: Runtime, image: str, unix_user: str | None,
                        timeout_s: float = CHECK_TIMEOUT_S) -> None:
    """ImageProblem naming `image` when it is not there for `unix_user` (None: the engine's
    own user, a personal engine)."""
    command = runtime.exists_command(image)
    if command is None:
        return
    key = (unix_user or "", image)
    now = time.monotonic()
    if known_present(image, unix_user):
        return
    code, err_text = await _ask(command, image, unix_user, timeout_s)
    if code == 1 or (code != 0 and not err_text.strip()):
        raise ImageProblem(runtime.missing_text(image))
    if code != 0:
        last = err_text.decode(errors="replace").strip().splitlines()[-1][:300]
        raise ImageProblem(f"could not check image {image}: {last}")
    if len(_found) > 10000:  # (a bound, whatever the users ask)
        _found.clear()
    _found[key] = now


async def check_readable(path: str, image: str, unix_user: str | None,
                         timeout_s: float = CHECK_TIMEOUT_S) -> None:
    """ImageProblem naming `image` unless `unix_user` (None: the engine's own user) may read
    the file or folder `path` a pull would fetch it from, looked at as them (`test -r`: never
    opened, so a FIFO or a huge file costs nothing)."""
    code, _err = await _ask(["test", "-r", path], image, unix_user, timeout_s)
    if code != 0:
        who = unix_user or "the engine's user"
        raise ImageProblem(f"image {image}: no file or folder {path} that {who} may read")


async def _ask(command: list[str], image: str, unix_user: str | None, timeout_s: float) -> tuple[int, bytes]:
    """Run `command` as `unix_user` (`as_owner`), in one of their slots (`user_slot`), within
    `timeout_s` (waiting for the slot included; then its session is killed); its exit status
    and what it wrote to stderr. ImageProblem naming `image` when it could not start or gave
    no answer in time."""
    try:
        async with user_slot(unix_user, timeout_s) as left:
            return await _run(command, image, unix_user, left)
    except HelperFailed as err:  # (no slot in time)
        raise ImageProblem(f"could not check image {image}: {err}") from None


async def _run(command: list[str], image: str, unix_user: str | None, timeout_s: float) -> tuple[int, bytes]:
    """One run of a check (`_ask`)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, cwd="/", start_new_session=True, close_fds=True,
            **as_owner(unix_user))  # type: ignore[arg-type]
    except OSError as err:
        raise ImageProblem(f"could not check image {image} ({command[0]}: {err.strerror or err})") from None
    try:
        _out, err_text = await asyncio.wait_for(proc.communicate(), timeout_s)
    except asyncio.TimeoutError:  # (a hung network mount)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        raise ImageProblem(f"could not check image {image}: {command[0]} gave no answer within "
                           f"{timeout_s:.3g} s") from None
    return proc.returncode if proc.returncode is not None else -1, err_text


"""Jobs' checkpoint folders (`jupyter_gpujobs.checkpoint.folder()`) go with their other files
after `c.GPUJobs.job_retention`.

A job's folder lies under its user's own folder and was made by the job, with the user's
rights; so it is removed with the user's rights too, never the engine's (root's): a small
helper process (`python -I -S`, standard library only) runs as the user (uid, gid, groups),
in its own session, with a deadline, and removes the folders it is given, never following a
link. One helper per user and pass. A personal engine (not root) runs it as itself.

It is called by `files.JobFiles.remove_expired_files` with the jobs whose files that pass
removed. May call: the store (read only), `access.Access` (where a user's folder is),
`runners.users` (who the user is), `userfiles.helper_python` and `checkpoint.checkpoint_dir`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence

from ..checkpoint import checkpoint_dir
from .access import Access
from .runners.users import NotAUnixUser, account, run_as
from .state import EngineState
from .userfiles import helper_python

log = logging.getLogger("jupyter_gpujobs")

#: What the helper runs: removes each folder named on its command line; a link in a folder's
#: place is removed itself, never followed (shutil.rmtree follows none inside either).
REMOVE = """
import os, shutil, sys
for path in sys.argv[1:]:
    try:
        if os.path.islink(path):
            os.unlink(path)
        elif os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
    except OSError:
        pass
"""
#: The most folders one helper is given, and its time.
BATCH = 200
TIMEOUT_S = 60.0


async def remove_checkpoints(state: EngineState, access: Access, job_ids: Sequence[int]) -> int:
    """Remove the checkpoint folders of these jobs (ended, their files past the retention),
    each as its user; returns how many helpers ran."""
    by_user: dict[str | None, list[str]] = {}
    for k in range(0, len(job_ids), 500):
        for job_id, job in state.store.get_many(list(job_ids[k:k + 500])).items():
            try:
                unix_user = run_as(job.user, state.run_as_owner)
            except NotAUnixUser:
                continue  # no Unix user: its job never ran, so made no folder
            by_user.setdefault(unix_user, []).append(checkpoint_dir(str(access.root_for(job.user)), job_id))
    python = helper_python(state.job_python)
    helpers = 0
    for unix_user, paths in by_user.items():
        for k in range(0, len(paths), BATCH):
            helpers += 1
            await _remove_as(unix_user, paths[k:k + BATCH], python)
    return helpers


async def _remove_as(unix_user: str | None, paths: list[str], python: str) -> None:
    who: dict[str, object] = {}
    if unix_user is not None:
        try:
            acct = account(unix_user)  # [name, uid, gid, home, shell, [gids]]; None: the engine's own
        except KeyError:
            return
        if acct is not None:
            who = {"user": acct[1], "group": acct[2], "extra_groups": list(acct[5])}  # type: ignore[call-overload]
    try:
        proc = await asyncio.create_subprocess_exec(
            python, "-I", "-S", "-c", REMOVE, *paths, cwd="/", env={"PATH": os.defpath},
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL, start_new_session=True, **who)  # type: ignore[arg-type]
    except OSError as err:
        log.warning("gpujobs: could not remove the checkpoint folders of %s: %s", unix_user or "the engine's user", err)
        return
    try:
        await asyncio.wait_for(proc.wait(), TIMEOUT_S)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        log.warning("gpujobs: removing the checkpoint folders of %s took over %ss; stopped",
                    unix_user or "the engine's user", TIMEOUT_S)

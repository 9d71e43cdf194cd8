"""A job's files: reading its log, and removing the files of jobs ended long ago.

Owns `read_log` (to a viewer who may see it; `LogRemoved` once the retention took it) and the
retention loop (`c.GPUJobs.job_retention`): every `cleanup_interval` the run directories and
logs of jobs ended longer ago are removed, off the event loop (`retention.py` does the file
system work). It may call the store (read only), `access.Access` (who may read a log) and
`retention` (and `checkpoints`, for the jobs' checkpoint folders); it reads the active jobs and supervisor handles in `state.EngineState`.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from ..model import Job, format_bytes, format_duration
from .access import Access
from .checkpoints import remove_checkpoints
from .errors import LogRemoved
from .state import EngineState

log = logging.getLogger("jupyter_gpujobs")


class JobFiles:
    #: The first removal pass runs this long after start (or after cleanup_interval if shorter).
    RETENTION_FIRST_PASS_S = 30.0

    def __init__(self, state: EngineState, access: Access):
        self.state = state
        self.access = access

    def read_log(self, job_id: int, offset: int = 0, max_bytes: int = 256 * 1024,
                 viewer: str | None = None) -> tuple[str, int, bool]:
        """(text, next offset, job ended) from a job's log file, to a `viewer` who may see it."""
        job = self.access.get_private(job_id, viewer)
        path = self.state.store.log_path(job_id)
        if self._log_removed(job, path):
            raise LogRemoved(f"the log of job {job_id} was removed after the "
                             f"{format_duration(self.state.job_retention_s)} retention (c.GPUJobs.job_retention); "
                             "the job's record and events are kept")
        if not path or not Path(path).exists():
            return "", offset, job.state.is_final
        with open(path, "rb") as f:
            f.seek(max(0, offset))
            data = f.read(max_bytes)
        # do not split a UTF-8 character
        cut = len(data)
        while cut > 0 and cut > len(data) - 4 and (data[cut - 1] & 0xC0) == 0x80:
            cut -= 1
        if cut > 0 and data[cut - 1] >= 0xC0:
            cut -= 1
        if cut <= 0 and data:
            cut = len(data)
        done = job.state.is_final and len(data) < max_bytes
        return data[:cut].decode("utf-8", errors="replace"), offset + cut, done

    def _log_removed(self, job: Job, path: str | None) -> bool:
        """Was this job's log removed after the retention (recorded, final long enough, gone)?"""
        retention_s = self.state.job_retention_s
        return bool(
            path and retention_s > 0 and job.state.is_final and job.ended_at is not None
            and job.ended_at + retention_s <= self.state.clock() and not Path(path).exists()
        )

    async def retention_loop(self) -> None:
        """Remove the files of jobs ended longer than job_retention ago, every cleanup_interval
        (off the scheduling cycle; the file system work runs in a thread)."""
        await asyncio.sleep(min(self.state.cleanup_interval, self.RETENTION_FIRST_PASS_S))
        while True:
            try:
                await self.remove_expired_files()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("gpujobs: removing the files of old jobs failed")
            await asyncio.sleep(self.state.cleanup_interval)

    async def remove_expired_files(self) -> Any:
        """One removal pass: the run directories and logs of jobs that reached a final state
        more than job_retention ago. Files of active jobs (pending, running, or with a
        supervisor handle), of jobs the store does not know, and of runs whose processes may
        still be alive stay; so do the jobs' rows and events. Returns a `retention.Removed`."""
        from . import retention

        s = self.state
        if s.job_retention_s <= 0:
            return retention.Removed()
        run_root = getattr(s.runner, "state_dir", None)  # the runner's run directories
        run_root = Path(run_root) if run_root is not None else None
        logs_root = s.state_dir / "logs"
        found = await asyncio.to_thread(retention.scan, run_root, logs_root)
        # decided on the loop (the store and the active jobs live here); a job that is final
        # for longer than the retention never becomes active again
        cutoff = s.clock() - s.job_retention_s
        ids = [i for i in found if s.active_job(i) is None and i not in s.handles]
        expired: dict[int, retention.JobFiles] = {}
        for k in range(0, len(ids), 500):
            for job_id, job in s.store.get_many(ids[k:k + 500]).items():
                if (job.state.is_final and job.ended_at is not None and job.ended_at <= cutoff
                        and s.active_job(job_id) is None and job_id not in s.handles):
                    expired[job_id] = found[job_id]
        if not expired:
            return retention.Removed()
        removed = await asyncio.to_thread(retention.remove, expired, run_root, logs_root)
        if removed.jobs:  # their checkpoint folders too, as their users (checkpoints.py)
            await remove_checkpoints(s, self.access, removed.jobs)
        if removed.jobs:
            log.info("gpujobs: removed the files of %d job(s) ended more than %s ago "
                     "(c.GPUJobs.job_retention): %d run dir(s), %d log(s), %s freed",
                     len(removed.jobs), format_duration(s.job_retention_s), removed.run_dirs,
                     removed.log_files, format_bytes(removed.bytes_freed))
        if removed.kept_alive:
            log.warning("gpujobs: kept %d run dir(s) of ended jobs whose processes may still be alive: %s",
                        len(removed.kept_alive), ", ".join(str(p) for p in removed.kept_alive[:5]))
        return removed

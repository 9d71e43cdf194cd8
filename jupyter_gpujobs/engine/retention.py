"""The files of finished jobs on disk, and their removal after `c.GPUJobs.job_retention`.

Every run of a job leaves a directory `STATE_DIR/run/job-<id>-<stamp>/` (spec.json, ready,
state.json, control.json, result.json, shim.log; see runners/local.py) and every job a log
`STATE_DIR/logs/job-<id>.log`. The engine (JobService) decides *which* jobs' files may go
(final for longer than the retention, not active); this module finds the files and removes
them, refusing anything that is not a plain directory or file directly inside its root
(symlinks are never followed or removed) and any run whose supervisor or job process may
still be alive. It touches only the file system, so it can run off the event loop.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from .runners.jobtmp import remove_tree
from .runners.shim import read_json

log = logging.getLogger("jupyter_gpujobs")

_RUN_DIR = re.compile(r"job-(\d+)-[0-9a-f]+")
_LOG_FILE = re.compile(r"job-(\d+)\.log")


@dataclass
class JobFiles:
    """What one job has on disk: its run directories and its log file."""

    run_dirs: list[Path] = field(default_factory=list)
    log_file: Path | None = None


@dataclass
class Removed:
    """The outcome of one removal pass."""

    jobs: list[int] = field(default_factory=list)
    run_dirs: int = 0
    log_files: int = 0
    bytes_freed: int = 0
    kept_alive: list[Path] = field(default_factory=list)  # runs whose processes may be alive


def scan(run_root: Path | None, logs_root: Path | None) -> dict[int, JobFiles]:
    """Job id -> its run directories and log file, from the names directly inside the roots.
    Symlinks and anything that is not a plain directory (runs) or file (logs) are left out."""
    out: dict[int, JobFiles] = {}
    for root, pattern, want_dir in ((run_root, _RUN_DIR, True), (logs_root, _LOG_FILE, False)):
        if root is None:
            continue
        try:
            entries = list(os.scandir(root))
        except OSError:
            continue
        for entry in entries:
            m = pattern.fullmatch(entry.name)
            if not m:
                continue
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            if not (stat.S_ISDIR(mode) if want_dir else stat.S_ISREG(mode)):
                continue  # symlinks included
            files = out.setdefault(int(m.group(1)), JobFiles())
            if want_dir:
                files.run_dirs.append(Path(entry.path))
            else:
                files.log_file = Path(entry.path)
    return out


def run_may_be_alive(job_dir: Path) -> bool:
    """Could the supervisor (shim) or the job process of this run still be running? True
    when a process with one of the recorded pids exists and is not younger than the record
    (a younger one got a recycled pid)."""
    candidates: list[tuple[int, float | None]] = []
    state = read_json(str(job_dir / "state.json")) or {}
    for key in ("pid", "shim_pid"):
        try:
            pid = int(state[key])
        except (KeyError, TypeError, ValueError):
            continue
        started = state.get("started_at")
        candidates.append((pid, float(started) if isinstance(started, (int, float)) else None))
    ready = job_dir / "ready"
    try:
        candidates.append((int(ready.read_text().strip()), ready.stat().st_mtime))
    except (OSError, ValueError):
        pass
    for pid, recorded_at in candidates:
        if pid <= 1:
            continue
        try:
            proc = psutil.Process(pid)
            if recorded_at is not None and proc.create_time() > recorded_at + 1.0:
                continue  # started after the record: not this run's process
            if proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            continue
    return False


def _inside(path: Path, root: Path) -> bool:
    """Is `path` (not followed if a symlink) an entry directly inside `root`?"""
    try:
        return path.parent.resolve(strict=True) == root.resolve(strict=True) and not path.is_symlink()
    except OSError:
        return False


def remove(files: dict[int, JobFiles], run_root: Path | None, logs_root: Path | None) -> Removed:
    """Remove the given jobs' run directories and logs (the caller decided they may go).
    A run whose processes may still be alive is kept, and so is that job's log."""
    out = Removed()
    for job_id, job in sorted(files.items()):
        removed_any = False
        kept = False
        for job_dir in job.run_dirs:
            if run_root is None or not _inside(job_dir, run_root) or not _RUN_DIR.fullmatch(job_dir.name):
                continue
            if run_may_be_alive(job_dir):
                out.kept_alive.append(job_dir)
                kept = True
                continue
            try:
                size = remove_tree(str(job_dir))  # (however deep a job made its /tmp in it)
            except OSError as err:
                log.warning("gpujobs: could not remove %s: %s", job_dir, err)
                kept = True
                continue
            out.run_dirs += 1
            out.bytes_freed += size
            removed_any = True
        path = job.log_file
        if (path is not None and not kept and logs_root is not None and _inside(path, logs_root)
                and _LOG_FILE.fullmatch(path.name)):
            try:
                st = os.lstat(path)
                if stat.S_ISREG(st.st_mode):
                    os.unlink(path)
                    out.log_files += 1
                    out.bytes_freed += st.st_size
                    removed_any = True
            except OSError as err:
                log.warning("gpujobs: could not remove %s: %s", path, err)
        if removed_any:
            out.jobs.append(job_id)
    return out


__all__ = ["JobFiles", "Removed", "remove", "run_may_be_alive", "scan"]

"""Repository functions of the monitoring tables (gpu_info, gpu_samples, job_stats, findings),
each taking a `Store` (the read-only queries over jobs and allocations that usage reports and
runtime prediction need are in history.py).

Samples are kept downsampled: raw readings (resolution 0), per-minute rows (60) rolled up
from them and per-hour rows (3600) rolled up from the minutes; `rollup()` builds the coarse
rows of complete buckets and prunes each resolution past its retention, so the database
stays small. A bucket's means are weighted by its `count` of raw readings.
No decision is taken here: the monitor (jupyter_gpujobs/monitor/) decides what to record.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, delete, func, insert, or_, select, update
from sqlalchemy.orm import aliased

from . import Store, _writes
from .tables import FindingRow, GPUInfoRow, GPUSampleRow, JobStatsRow

RAW, MINUTE, HOUR = 0, 60, 3600

__all__ = [
    "RAW", "MINUTE", "HOUR", "SampleValues", "JobStats", "record_gpus", "gpu_models", "add_samples",
    "rollup", "utilization_buckets", "samples", "save_job_stats", "job_stats", "add_finding",
    "resolve_finding", "resolve_findings_except", "list_findings", "get_finding", "count_samples",
    "sample_series",
]


@dataclass
class SampleValues:
    """One GPU reading, or one bucket of them (`count` readings) at `time`."""

    host: str
    gpu_index: int
    gpu_uuid: str
    time: float
    utilization: float | None = None
    memory_used_mb: float | None = None
    memory_total_mb: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    ecc_errors: int | None = None
    xid: int | None = None
    count: int = 1
    utilization_max: float | None = None
    memory_used_max_mb: float | None = None
    temperature_max_c: float | None = None
    power_max_w: float | None = None

    @classmethod
    def of(cls, host: str, sample: Any) -> SampleValues:
        """From a `gpus.GPUSample` (or anything with its attributes)."""
        return cls(host=host, gpu_index=sample.index, gpu_uuid=sample.uuid, time=sample.time,
                   utilization=sample.utilization, memory_used_mb=sample.memory_used_mb,
                   memory_total_mb=sample.memory_total_mb, temperature_c=sample.temperature_c,
                   power_w=sample.power_w, ecc_errors=sample.ecc_errors, xid=sample.xid)


@dataclass
class JobStats:
    """Running GPU-use statistics of one job (see JobStatsRow)."""

    job_id: int
    samples: int = 0
    utilization_mean: float | None = None
    utilization_max: float | None = None
    memory_mean_mb: float | None = None
    memory_max_mb: float | None = None
    memory_total_mb: int | None = None
    memory_max_fraction: float | None = None
    first_at: float | None = None
    last_at: float | None = None
    final: bool = False

    def add(self, time: float, utilization: float | None, memory_mb: float | None,
            memory_total_mb: int | None, max_fraction: float | None) -> None:
        """Fold one reading of the job's GPUs into the means and peaks."""
        n = self.samples + 1
        if utilization is not None:
            self.utilization_mean = utilization if self.utilization_mean is None else \
                self.utilization_mean + (utilization - self.utilization_mean) / n
            self.utilization_max = max(self.utilization_max or 0.0, utilization)
        if memory_mb is not None:
            self.memory_mean_mb = memory_mb if self.memory_mean_mb is None else \
                self.memory_mean_mb + (memory_mb - self.memory_mean_mb) / n
            self.memory_max_mb = max(self.memory_max_mb or 0.0, memory_mb)
        if memory_total_mb:
            self.memory_total_mb = memory_total_mb
        if max_fraction is not None:
            self.memory_max_fraction = max(self.memory_max_fraction or 0.0, max_fraction)
        self.samples = n
        self.first_at = time if self.first_at is None else self.first_at
        self.last_at = time

    def as_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id, "samples": self.samples,
            "utilization_mean": _round(self.utilization_mean), "utilization_max": _round(self.utilization_max),
            "memory_mean_mb": _round(self.memory_mean_mb), "memory_max_mb": _round(self.memory_max_mb),
            "memory_total_mb": self.memory_total_mb, "memory_max_fraction": _round(self.memory_max_fraction, 3),
            "first_sample_at": self.first_at, "last_sample_at": self.last_at, "final": self.final,
        }


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


# ----------------------------------------------------------------------------- GPUs seen


@_writes
def record_gpus(store: Store, gpus: Iterable[Any], now: float) -> None:
    """Upsert the GPUs of an inventory (`model.GPU`s) into gpu_info."""
    gpus = list(gpus)
    if not gpus:
        return
    with store._session.begin() as s:
        known = {r.uuid: r for r in s.scalars(select(GPUInfoRow).where(
            GPUInfoRow.uuid.in_([g.uuid for g in gpus]))).all()}
        for g in gpus:
            row = known.get(g.uuid)
            if row is None:
                s.add(GPUInfoRow(uuid=g.uuid, host=g.host, gpu_index=g.index, name=g.name,
                                 memory_total_mb=g.memory_total_mb or 0, first_seen=now, last_seen=now))
            else:
                row.host, row.gpu_index, row.name = g.host, g.index, g.name
                row.memory_total_mb = g.memory_total_mb or row.memory_total_mb
                row.last_seen = now


def gpu_models(store: Store) -> dict[str, str]:
    """GPU UUID -> model name, for every GPU ever seen."""
    with store.session() as s:
        return {u: n for u, n in s.execute(select(GPUInfoRow.uuid, GPUInfoRow.name)).all()}


# ----------------------------------------------------------------------------- samples


def _sample_dict(v: SampleValues, resolution: int) -> dict[str, Any]:
    """The gpu_samples row of a reading or bucket (plain values: rows are bulk-inserted)."""
    return {
        "host": v.host, "gpu_index": v.gpu_index, "gpu_uuid": v.gpu_uuid, "resolution": resolution,
        "time": v.time, "count": v.count, "utilization": v.utilization,
        "utilization_max": v.utilization_max if v.utilization_max is not None else v.utilization,
        "memory_used_mb": v.memory_used_mb,
        "memory_used_max_mb": v.memory_used_max_mb if v.memory_used_max_mb is not None else v.memory_used_mb,
        "memory_total_mb": v.memory_total_mb, "temperature_c": v.temperature_c,
        "temperature_max_c": v.temperature_max_c if v.temperature_max_c is not None else v.temperature_c,
        "power_w": v.power_w, "power_max_w": v.power_max_w if v.power_max_w is not None else v.power_w,
        "ecc_errors": v.ecc_errors, "xid": v.xid,
    }


_STATS_COLUMNS = ("samples", "utilization_mean", "utilization_max", "memory_mean_mb", "memory_max_mb",
                  "memory_total_mb", "memory_max_fraction", "first_at", "last_at", "final")


@_writes
def add_samples(store: Store, values: Iterable[SampleValues], resolution: int = RAW,
                stats: Iterable[JobStats] = ()) -> None:
    """Insert readings (or, with `resolution`, ready-made buckets) and save job stats, in one
    transaction (Core executemany: this runs at every sampling tick)."""
    rows = [_sample_dict(v, resolution) for v in values]
    with store._session.begin() as s:
        if rows:
            s.execute(insert(GPUSampleRow), rows)
        _save_stats(s, stats)


def _bucket(rows: Sequence[GPUSampleRow], start: float) -> SampleValues:
    first = rows[0]

    def wmean(attr: str) -> float | None:
        total = weight = 0.0
        for r in rows:
            value = getattr(r, attr)
            if value is not None:
                total += value * r.count
                weight += r.count
        return total / weight if weight else None

    def peak(attr: str) -> float | None:
        values = [getattr(r, attr) for r in rows if getattr(r, attr) is not None]
        return max(values) if values else None

    last = max(rows, key=lambda r: r.time)
    return SampleValues(
        host=first.host, gpu_index=first.gpu_index, gpu_uuid=last.gpu_uuid, time=start,
        count=sum(r.count for r in rows), utilization=wmean("utilization"), utilization_max=peak("utilization_max"),
        memory_used_mb=wmean("memory_used_mb"), memory_used_max_mb=peak("memory_used_max_mb"),
        memory_total_mb=last.memory_total_mb, temperature_c=wmean("temperature_c"),
        temperature_max_c=peak("temperature_max_c"), power_w=wmean("power_w"), power_max_w=peak("power_max_w"),
        ecc_errors=peak("ecc_errors"),  # type: ignore[arg-type]
        xid=last.xid,
    )


def _roll(s: Any, source: int, target: int, now: float) -> int:
    """Build `target` buckets from `source` rows of complete buckets not rolled up yet, per GPU
    from its last bucket on (a GPU back after a long absence keeps its old rows)."""
    cutoff = math.floor(now / target) * target
    done = {(h, i): t for h, i, t in s.execute(
        select(GPUSampleRow.host, GPUSampleRow.gpu_index, func.max(GPUSampleRow.time))
        .where(GPUSampleRow.resolution == target)
        .group_by(GPUSampleRow.host, GPUSampleRow.gpu_index)).all()}
    firsts = s.execute(
        select(GPUSampleRow.host, GPUSampleRow.gpu_index, func.min(GPUSampleRow.time))
        .where(GPUSampleRow.resolution == source, GPUSampleRow.time < cutoff)
        .group_by(GPUSampleRow.host, GPUSampleRow.gpu_index)).all()
    buckets = []
    for host, index, first in firsts:
        last = done.get((host, index))
        low = first if last is None else max(first, last + target)
        if low >= cutoff:
            continue
        groups: dict[float, list[GPUSampleRow]] = {}
        for row in s.scalars(select(GPUSampleRow).where(
                GPUSampleRow.host == host, GPUSampleRow.gpu_index == index, GPUSampleRow.resolution == source,
                GPUSampleRow.time >= low, GPUSampleRow.time < cutoff)).all():
            start = math.floor(row.time / target) * target
            if last is None or start > last:
                groups.setdefault(start, []).append(row)
        buckets += [_sample_dict(_bucket(rows, start), target) for start, rows in groups.items()]
    if buckets:
        s.execute(insert(GPUSampleRow), buckets)
    return len(buckets)


def _covered_until(coarser: Sequence[int]) -> Any:
    """The end of the last `coarser` bucket of the row's own GPU (NULL when it has none), as a
    subquery correlated with the gpu_samples row being deleted."""
    bucket = aliased(GPUSampleRow)
    return (select(func.max(bucket.time + bucket.resolution))
            .where(bucket.host == GPUSampleRow.host, bucket.gpu_index == GPUSampleRow.gpu_index,
                   bucket.resolution.in_(coarser))
            .scalar_subquery())


@_writes
def rollup(store: Store, now: float, raw_keep_s: float, minute_keep_s: float, hour_keep_s: float) -> dict[str, int]:
    """Roll complete minutes of raw readings into minute rows and complete hours of minute rows
    into hour rows, then delete rows past their retention. Returns what it did.

    Raw and minute rows are deleted only where a coarser bucket of their GPU already covers
    them, decided in the DELETE itself: readings another writer commits while this runs (a
    second host, imported history) are not seen by the roll-ups above and must wait for the
    next rollup rather than be pruned unrolled (SQLite runs the reads above outside the write
    transaction, PostgreSQL's READ COMMITTED sees each statement's own snapshot)."""
    raw_keep_s = max(raw_keep_s, 2 * MINUTE)
    minute_keep_s = max(minute_keep_s, 2 * HOUR)
    with store._session.begin() as s:
        minutes = _roll(s, RAW, MINUTE, now)
        s.flush()
        hours = _roll(s, MINUTE, HOUR, now)
        pruned = 0
        for resolution, keep, coarser in ((RAW, raw_keep_s, (MINUTE, HOUR)), (MINUTE, minute_keep_s, (HOUR,)),
                                          (HOUR, hour_keep_s, ())):
            condition = [GPUSampleRow.resolution == resolution, GPUSampleRow.time < now - keep]
            if coarser:
                condition.append(GPUSampleRow.time < _covered_until(coarser))
            result = s.execute(delete(GPUSampleRow).where(*condition))
            pruned += result.rowcount or 0
    return {"minutes": minutes, "hours": hours, "pruned": pruned}


def count_samples(store: Store) -> dict[int, int]:
    """Rows per resolution (for tests and the docs' size estimate)."""
    with store.session() as s:
        return {r: n for r, n in s.execute(select(GPUSampleRow.resolution, func.count())
                                           .group_by(GPUSampleRow.resolution)).all()}


def samples(store: Store, since: float, until: float, resolution: int | None = None,
            gpu_index: int | None = None, host: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """Stored rows in [since, until), oldest first (the first `limit` of them, when given)."""
    q = select(GPUSampleRow).where(GPUSampleRow.time >= since, GPUSampleRow.time < until).order_by(GPUSampleRow.time)
    if resolution is not None:
        q = q.where(GPUSampleRow.resolution == resolution)
    if gpu_index is not None:
        q = q.where(GPUSampleRow.gpu_index == gpu_index)
    if host is not None:
        q = q.where(GPUSampleRow.host == host)
    if limit is not None:
        q = q.limit(limit)
    with store.session() as s:
        rows = s.scalars(q).all()
    return [{"host": r.host, "gpu": r.gpu_index, "uuid": r.gpu_uuid, "resolution": r.resolution, "time": r.time,
             "count": r.count, "utilization": r.utilization, "utilization_max": r.utilization_max,
             "memory_used_mb": r.memory_used_mb, "memory_used_max_mb": r.memory_used_max_mb,
             "memory_total_mb": r.memory_total_mb, "temperature_c": r.temperature_c, "power_w": r.power_w,
             "ecc_errors": r.ecc_errors, "xid": r.xid} for r in rows]


def _non_overlapping(rows: Sequence[Any]) -> list[Any]:
    """The rows (each starting host, gpu, resolution, time) to use so that no reading counts
    twice: per GPU, hour rows where they exist, minute rows after the last hour, raw readings
    after the last minute. Sorted by time."""
    hour_end: dict[tuple[str, int], float] = {}
    for host, gpu, res, t, *_ in rows:
        if res == HOUR:
            hour_end[(host, gpu)] = max(hour_end.get((host, gpu), -math.inf), t + HOUR)
    minute_end: dict[tuple[str, int], float] = {}
    for host, gpu, res, t, *_ in rows:
        if res == MINUTE and t >= hour_end.get((host, gpu), -math.inf):
            minute_end[(host, gpu)] = max(minute_end.get((host, gpu), -math.inf), t + MINUTE)
    out = []
    for row in rows:
        host, gpu, res, t = row[:4]
        key = (host, gpu)
        if (res == HOUR or (res == MINUTE and t >= hour_end.get(key, -math.inf))
                or (res == RAW and t >= max(hour_end.get(key, -math.inf), minute_end.get(key, -math.inf)))):
            out.append(row)
    out.sort(key=lambda r: r[3])
    return out


def utilization_buckets(store: Store, since: float, until: float) -> list[tuple[str, int, float, int, float, int]]:
    """Non-overlapping utilization readings in [since, until): (host, gpu, time, resolution,
    mean utilization, count) (see `_non_overlapping`)."""
    with store.session() as s:
        rows = s.execute(
            select(GPUSampleRow.host, GPUSampleRow.gpu_index, GPUSampleRow.resolution, GPUSampleRow.time,
                   GPUSampleRow.utilization, GPUSampleRow.count)
            .where(GPUSampleRow.time >= since, GPUSampleRow.time < until, GPUSampleRow.utilization.is_not(None))
        ).all()
    return [(host, gpu, t, res, float(util), int(count)) for host, gpu, res, t, util, count in _non_overlapping(rows)]


def sample_series(store: Store, since: float, until: float, step: float,
                  gpu_index: int | None = None) -> list[dict[str, Any]]:
    """GPU readings in [since, until) in buckets of `step` seconds per GPU (bucket starts at
    `since + k * step`), from the finest rows that cover each moment (`_non_overlapping`):
    utilization and memory means weighted by the raw readings behind them, and their peaks.
    Sorted by time, then host and GPU."""
    q = (select(GPUSampleRow.host, GPUSampleRow.gpu_index, GPUSampleRow.resolution, GPUSampleRow.time,
                GPUSampleRow.count, GPUSampleRow.utilization, GPUSampleRow.utilization_max,
                GPUSampleRow.memory_used_mb, GPUSampleRow.memory_used_max_mb, GPUSampleRow.memory_total_mb)
         .where(GPUSampleRow.time >= since, GPUSampleRow.time < until))
    if gpu_index is not None:
        q = q.where(GPUSampleRow.gpu_index == gpu_index)
    with store.session() as s:
        rows = s.execute(q).all()
    buckets: dict[tuple[int, str, int], dict[str, Any]] = {}
    for host, gpu, _res, t, count, util, util_max, mem, mem_max, mem_total in _non_overlapping(rows):
        k = int((t - since) // step)
        b = buckets.setdefault((k, host, gpu), {"n_util": 0, "s_util": 0.0, "n_mem": 0, "s_mem": 0.0,
                                                "util_max": None, "mem_max": None, "mem_total": None})
        n = max(1, int(count or 1))
        if util is not None:
            b["n_util"] += n
            b["s_util"] += util * n
            peak = util_max if util_max is not None else util
            b["util_max"] = peak if b["util_max"] is None else max(b["util_max"], peak)
        if mem is not None:
            b["n_mem"] += n
            b["s_mem"] += mem * n
            peak = mem_max if mem_max is not None else mem
            b["mem_max"] = peak if b["mem_max"] is None else max(b["mem_max"], peak)
        if mem_total is not None:
            b["mem_total"] = mem_total
    return [{"host": host, "gpu": gpu, "time": since + k * step, "step": step, "count": max(b["n_util"], b["n_mem"]),
             "utilization": _round(b["s_util"] / b["n_util"]) if b["n_util"] else None,
             "utilization_max": _round(b["util_max"]),
             "memory_used_mb": _round(b["s_mem"] / b["n_mem"]) if b["n_mem"] else None,
             "memory_used_max_mb": _round(b["mem_max"]), "memory_total_mb": b["mem_total"]}
            for (k, host, gpu), b in sorted(buckets.items())]


# ----------------------------------------------------------------------------- job stats


def _save_stats(s: Any, stats: Iterable[JobStats]) -> None:
    stats = list(stats)
    if not stats:
        return
    known = set(s.scalars(select(JobStatsRow.job_id).where(
        JobStatsRow.job_id.in_([st.job_id for st in stats]))).all())
    new = [{"job_id": st.job_id, **{c: getattr(st, c) for c in _STATS_COLUMNS}}
           for st in stats if st.job_id not in known]
    old = [{"b_job_id": st.job_id, **{c: getattr(st, c) for c in _STATS_COLUMNS}}
           for st in stats if st.job_id in known]
    if new:
        s.execute(insert(JobStatsRow), new)
    if old:
        s.connection().execute(
            update(JobStatsRow.__table__).where(JobStatsRow.__table__.c.job_id == bindparam("b_job_id"))
            .values({c: bindparam(c) for c in _STATS_COLUMNS}), old)


@_writes
def save_job_stats(store: Store, stats: Iterable[JobStats]) -> None:
    with store._session.begin() as s:
        _save_stats(s, stats)


def job_stats(store: Store, job_id: int) -> JobStats | None:
    with store.session() as s:
        row = s.get(JobStatsRow, job_id)
        if row is None:
            return None
        return JobStats(job_id=row.job_id, samples=row.samples, utilization_mean=row.utilization_mean,
                        utilization_max=row.utilization_max, memory_mean_mb=row.memory_mean_mb,
                        memory_max_mb=row.memory_max_mb, memory_total_mb=row.memory_total_mb,
                        memory_max_fraction=row.memory_max_fraction, first_at=row.first_at,
                        last_at=row.last_at, final=row.final)


def job_stats_many(store: Store, job_ids: Iterable[int]) -> dict[int, JobStats]:
    ids = list(job_ids)
    out: dict[int, JobStats] = {}
    for i in range(0, len(ids), 500):
        with store.session() as s:
            for row in s.scalars(select(JobStatsRow).where(JobStatsRow.job_id.in_(ids[i:i + 500]))).all():
                out[row.job_id] = JobStats(job_id=row.job_id, samples=row.samples,
                                           utilization_mean=row.utilization_mean,
                                           memory_max_mb=row.memory_max_mb, final=row.final)
    return out


# ----------------------------------------------------------------------------- findings


def _finding_dict(r: FindingRow) -> dict[str, Any]:
    return {"id": r.id, "kind": r.kind, "key": r.key, "severity": r.severity, "time": r.time,
            "last_seen": r.last_seen, "resolved_at": r.resolved_at, "open": r.resolved_at is None,
            "job_id": r.job_id, "user": r.user, "host": r.host, "gpu": r.gpu_index, "pid": r.pid,
            "action": r.action, "message": r.message, "data": r.data or {}}


@_writes
def add_finding(store: Store, now: float, *, kind: str, key: str, message: str, severity: str = "warning",
                job_id: int | None = None, user: str | None = None, host: str | None = None,
                gpu_index: int | None = None, pid: int | None = None, action: str = "",
                data: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], bool]:
    """Record a finding, or refresh the open one with the same key (its message, data and
    `last_seen`). Returns (the finding, whether it is new)."""
    with store._session.begin() as s:
        row = s.scalars(select(FindingRow).where(FindingRow.key == key, FindingRow.resolved_at.is_(None))).first()
        new = row is None
        if row is None:
            row = FindingRow(kind=kind, key=key, time=now, job_id=job_id, user=user, host=host,
                             gpu_index=gpu_index, pid=pid)
            s.add(row)
        row.last_seen = now
        row.job_id = job_id if job_id is not None else row.job_id
        row.message = message
        row.severity = severity
        row.action = action or row.action or ""
        row.data = dict(data or {})
        s.flush()
        return _finding_dict(row), new


def get_finding(store: Store, finding_id: int) -> dict[str, Any] | None:
    with store.session() as s:
        row = s.get(FindingRow, finding_id)
        return _finding_dict(row) if row else None


@_writes
def resolve_finding(store: Store, now: float, *, key: str | None = None, finding_id: int | None = None,
                    action: str | None = None) -> dict[str, Any] | None:
    """Close the open finding with this key (or id); returns it, or None when none was open."""
    with store._session.begin() as s:
        q = select(FindingRow).where(FindingRow.resolved_at.is_(None))
        q = q.where(FindingRow.key == key) if key is not None else q.where(FindingRow.id == finding_id)
        row = s.scalars(q).first()
        if row is None:
            return None
        row.resolved_at = now
        if action is not None:
            row.action = action
        s.flush()
        return _finding_dict(row)


@_writes
def resolve_findings_except(store: Store, now: float, kind: str, keep_keys: Iterable[str]) -> list[dict[str, Any]]:
    """Close the open findings of `kind` whose key is not in `keep_keys` (the condition went away)."""
    keep = set(keep_keys)
    with store._session.begin() as s:
        rows = [r for r in s.scalars(select(FindingRow).where(FindingRow.kind == kind,
                                                              FindingRow.resolved_at.is_(None))).all()
                if r.key not in keep]
        for r in rows:
            r.resolved_at = now
        s.flush()
        return [_finding_dict(r) for r in rows]


def list_findings(store: Store, *, kind: str | None = None, job_id: int | None = None, user: str | None = None,
                  open_only: bool = False, since: float | None = None, limit: int = 200,
                  user_or_kind: tuple[str, str] | None = None, before_id: int | None = None) -> list[dict[str, Any]]:
    """Findings, newest first. `user_or_kind` (user, kind): only those about that user or of
    that kind; `before_id`: only those older than that finding (the next page)."""
    q = select(FindingRow).order_by(FindingRow.id.desc()).limit(limit)
    if user_or_kind is not None:
        q = q.where(or_(FindingRow.user == user_or_kind[0], FindingRow.kind == user_or_kind[1]))
    if before_id is not None:
        q = q.where(FindingRow.id < before_id)
    if kind:
        q = q.where(FindingRow.kind == kind)
    if job_id is not None:
        q = q.where(FindingRow.job_id == job_id)
    if user is not None:
        q = q.where(FindingRow.user == user)
    if open_only:
        q = q.where(FindingRow.resolved_at.is_(None))
    if since is not None:
        q = q.where(FindingRow.last_seen >= since)
    with store.session() as s:
        return [_finding_dict(r) for r in s.scalars(q).all()]


@_writes
def set_finding_action(store: Store, finding_id: int, action: str) -> None:
    with store._session.begin() as s:
        s.execute(update(FindingRow).where(FindingRow.id == finding_id).values(action=action))

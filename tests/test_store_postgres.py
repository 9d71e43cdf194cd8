"""The store and the engine on a real PostgreSQL (a throwaway cluster on loopback, started here;
scripts/install-postgres.sh installs Debian's server when it is missing)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from schema_upgrade import check_newer_schema_is_refused, check_upgrade_keeps_jobs
from servers import free_port

from jupyter_gpujobs.engine.store import GPUAlreadyAllocated, Store
from jupyter_gpujobs.model import JobState

PY = sys.executable


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name) or ""]
    if not found[-1]:
        raise RuntimeError(f"PostgreSQL's {name} is not installed: run scripts/install-postgres.sh")
    return found[-1]


def _as_db_user(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run it as the `postgres` user then."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    # not under pytest's tmp dir: that is private to root, and the server runs as `postgres`
    base = Path(tempfile.mkdtemp(prefix="gpujobs-pg-"))
    data, sock = base / "data", base / "sock"
    sock.mkdir()
    if os.geteuid() == 0:
        shutil.chown(base, "postgres")
        shutil.chown(sock, "postgres")
    subprocess.run(_as_db_user([_pg_bin("initdb"), "-D", str(data), "-A", "trust", "-U", "gpujobs"]),
                   check=True, capture_output=True)
    port = free_port()
    options = f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run(_as_db_user([_pg_bin("pg_ctl"), "-D", str(data), "-o", options, "-l", str(base / "log"),
                                "-w", "start"]), check=True, capture_output=True)
    try:
        subprocess.run(_as_db_user([_pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "gpujobs",
                                    "gpujobs"]), check=True, capture_output=True)
        yield f"postgresql+psycopg://gpujobs@127.0.0.1:{port}/gpujobs"
    finally:
        subprocess.run(_as_db_user([_pg_bin("pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
                       capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def fresh_database(postgres_url: str, request: pytest.FixtureRequest) -> str:
    """The URL of a new, empty database in the same cluster."""
    name = "m_" + request.node.name.lower()[-40:].replace("-", "_")
    port = postgres_url.rsplit(":", 1)[1].split("/")[0]
    subprocess.run(_as_db_user([_pg_bin("createdb"), "-h", "127.0.0.1", "-p", port, "-U", "gpujobs", name]),
                   check=True, capture_output=True)
    return postgres_url.rsplit("/", 1)[0] + "/" + name


@pytest.fixture
def store(postgres_url: str) -> Iterator[Store]:
    s = Store(postgres_url)
    s.migrate()
    yield s
    from jupyter_gpujobs.engine.store.tables import Base

    with s.engine.begin() as conn:  # a clean database for the next test
        for table in reversed(Base.metadata.sorted_tables):
            conn.execute(table.delete())
    s.close()


def test_schema_and_job_life_cycle(store: Store) -> None:
    assert store.revision() is not None
    now = time.time()
    a, b = store.add_jobs([{"user": "alice", "command": ["python", "x.py"], "gpus": 1, "group": "vision"},
                           {"user": "bob", "command": ["true"], "gpus": 1}], actor="alice", now=now)
    assert store.get(a.id) == a and a.group == "vision"
    started = store.start(a.id, "localhost", [(0, "GPU-0")], now + 1)
    assert started is not None and started.state is JobState.RUNNING and started.assigned_gpus == (0,)
    # the partial unique index holds on PostgreSQL too: one GPU, one job
    with pytest.raises(GPUAlreadyAllocated):
        store.start(b.id, "localhost", [(0, "GPU-0")], now + 2)
    assert store.get(b.id).state is JobState.PENDING, "the refused start left nothing behind"
    done = store.transition(a.id, JobState.COMPLETED, "runner", "completed", now + 3, expect=(JobState.RUNNING,))
    assert done is not None and done.state is JobState.COMPLETED
    assert store.transition(a.id, JobState.CANCELLED, "alice", "late", now + 4, expect=(JobState.RUNNING,)) is None
    assert store.start(b.id, "localhost", [(0, "GPU-0")], now + 5) is not None
    assert [e["state"] for e in store.events(job_id=a.id)] == ["PENDING", "RUNNING", "COMPLETED"]
    jobs, nxt = store.list_jobs(limit=1)
    assert [j.id for j in jobs] == [b.id] and nxt == b.id
    assert [j.id for j in store.list_jobs(limit=1, cursor=nxt)[0]] == [a.id]


def test_engine_runs_a_job_on_postgres(live_server: Any, postgres_url: str, store: Store) -> None:
    server = live_server(fake_gpus="1xA100", config={"db_url": postgres_url})
    client = server.client()
    job = client.submit([PY, "-c", "import os; print('on', os.environ['CUDA_VISIBLE_DEVICES'])"], gpus=1)
    final = client.wait(job["id"], timeout=30)
    assert final["state"] == "COMPLETED", final
    assert client.log(job["id"])["data"] == "on 0\n"
    assert store.get(job["id"]).state is JobState.COMPLETED, "the job is in PostgreSQL, not in SQLite"
    assert not list(Path(server.state_dir).glob("*.sqlite"))


def test_upgrade_from_the_first_schema_keeps_jobs_on_postgres(fresh_database: str) -> None:
    check_upgrade_keeps_jobs(fresh_database)


def test_a_newer_schema_is_refused_unchanged_on_postgres(fresh_database: str) -> None:
    check_newer_schema_is_refused(fresh_database)


def test_shares_hold_one_card_together_but_never_beside_a_whole_job_on_postgres(store: Store) -> None:
    now = time.time()
    jobs = store.add_jobs([{"user": "alice", "command": ["true"], "gpus": 1, "share": 0.5} for _ in range(3)]
                          + [{"user": "bob", "command": ["true"], "gpus": 1}], actor="alice", now=now)
    a, b, c, whole = (j.id for j in jobs)
    assert store.get(a).share == 0.5
    assert store.start(a, "localhost", [(0, "GPU-0")], now, share=0.5) is not None
    assert store.start(b, "localhost", [(0, "GPU-0")], now, share=0.5) is not None
    with pytest.raises(GPUAlreadyAllocated):  # the card is full
        store.start(c, "localhost", [(0, "GPU-0")], now, share=0.5)
    with pytest.raises(GPUAlreadyAllocated):  # it holds shares
        store.start(whole, "localhost", [(0, "GPU-0")], now)
    assert sorted(x["share"] for x in store.active_allocations()) == [0.5, 0.5]

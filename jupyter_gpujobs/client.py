"""The one Python client of the jupyter-gpujobs REST API, sync (`GPUJobsClient`) and async
(`AsyncGPUJobsClient`). The CLI, the magics, the widgets and the kernel provisioner all use it.

With no arguments it finds the engine by itself: `GPUJOBS_URL` / `GPUJOBS_TOKEN` (set in every
kernel and job the server starts), else `GPUJOBS_SOCKET` or the machine's shared engine at
`/run/jupyter-gpujobs/engine.sock`, else the running Jupyter servers in Jupyter's runtime dir.
A shared engine is reached on its Unix socket (`unix:///path/engine.sock`) with no token: it
knows the caller by the uid of the calling process.

    from jupyter_gpujobs.client import GPUJobsClient
    jobs = GPUJobsClient()
    job = jobs.submit("python train.py", gpus=1, time_limit="30m")
    jobs.wait(job["id"])

Each API call is described once (method, path, parameters); the sync and async clients differ
only in how they send it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

API = "gpujobs/api/"
SHARED_SOCKET = "/run/jupyter-gpujobs/engine.sock"
_UNIX = "unix://"
_UNIX_BASE = "http://gpujobs-engine/"  # the URL a request over the socket names (any host will do)
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "LOST")
_KEEP: Any = object()  # (an argument not given: the engine keeps what it has)


class GPUJobsError(RuntimeError):
    """An error answer from the engine, or no engine to talk to.

    `status` is the HTTP status (None when the engine could not be reached), `field` the
    request field the engine named as wrong.
    """

    def __init__(self, message: str, status: int | None = None, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.field = field


def _running_servers() -> list[dict[str, Any]]:
    """What the running Jupyter servers wrote in Jupyter's runtime dir (`jpserver-*.json`),
    the newest first; files left by servers that are gone are skipped.

    Read here rather than with `jupyter_server.serverapp.list_running_servers`: importing the
    server application costs two seconds (its JSON-schema formats), which every CLI call
    would pay before its first request."""
    import psutil
    from jupyter_core.paths import jupyter_runtime_dir

    infos = []
    for path in Path(jupyter_runtime_dir()).glob("jpserver-*.json"):
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
            mtime = path.stat().st_mtime
        except (OSError, ValueError):  # gone meanwhile, or still being written
            continue
        if isinstance(info, dict) and isinstance(info.get("pid"), int) and psutil.pid_exists(info["pid"]):
            infos.append((mtime, info))
    return [info for _, info in sorted(infos, key=lambda pair: pair[0], reverse=True)]


def find_server(url: str | None = None, token: str | None = None) -> tuple[str, str]:
    """(base URL ending in '/', token) of the engine to talk to (see `locate_engine`)."""
    found, found_token, _how = locate_engine(url, token)
    return found, found_token


def locate_engine(url: str | None = None, token: str | None = None) -> tuple[str, str, str]:
    """(base URL ending in '/', token, how it was found, in words) of the engine to talk to:
    `url` (the CLI's --url), else GPUJOBS_URL, else GPUJOBS_SOCKET or the machine's shared
    engine, else the newest running Jupyter server with the extension."""
    if url:
        base, tok = _with_token(url, token)
        return base, tok, "--url"
    env_url = os.environ.get("GPUJOBS_URL")
    if env_url:
        base, tok = _with_token(env_url, token)
        return base, tok, "GPUJOBS_URL (set in the kernels and terminals of a Jupyter server with the extension)"
    sock = os.environ.get("GPUJOBS_SOCKET")
    if sock:
        return _UNIX + sock, "", "GPUJOBS_SOCKET"
    if os.path.exists(SHARED_SOCKET):
        return _UNIX + SHARED_SOCKET, "", "the machine's shared engine"
    candidates = _running_servers()
    for info in candidates:
        base = info.get("url", "").rstrip("/") + "/"
        tok = token if token is not None else info.get("token", "")
        try:
            r = httpx.get(base + API + "whoami", headers=_auth(tok), timeout=2.0)
        except httpx.HTTPError:
            continue
        if r.status_code in (200, 503):  # 503: its extension could not start, and says why
            return base, tok, "the newest running Jupyter server with jupyter-gpujobs"
    if candidates:
        raise GPUJobsError(
            "found running Jupyter servers, but none hosts jupyter-gpujobs; is the extension enabled? "
            "(jupyter server extension list)"
        )
    raise GPUJobsError(
        "no running Jupyter server with jupyter-gpujobs found; start one with `jupyter lab`, "
        "or pass --url and --token (or set GPUJOBS_URL and GPUJOBS_TOKEN)"
    )


def _with_token(url: str, token: str | None) -> tuple[str, str]:
    if url.startswith(_UNIX):
        return url.rstrip("/"), ""  # the socket knows who calls: a token would mean nothing
    return url.rstrip("/") + "/", token if token is not None else os.environ.get("GPUJOBS_TOKEN", "")


def http_target(url: str) -> tuple[str, str | None]:
    """(base URL for requests, Unix socket path or None) of an engine URL from `find_server`."""
    if url.startswith(_UNIX):
        return _UNIX_BASE, url[len(_UNIX):]
    return url, None


class UnixResolver:
    """A tornado resolver that sends every connection to one Unix socket (for websockets and
    tornado's HTTP client to a shared engine)."""

    def __init__(self, path: str):
        self.path = path

    async def resolve(self, host: str, port: int, family: int = 0) -> list[tuple[int, Any]]:
        import socket

        return [(socket.AF_UNIX, self.path)]

    def close(self) -> None:
        pass


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"token {token}"} if token else {}


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _queue_params(limit: int | None, offset: int, user: str | None) -> dict[str, Any]:
    return _drop_none({"limit": limit, "offset": offset or None, "user": user})


#: How often a call answered 503 with Retry-After (the store's database down or read-only for a
#: moment) is sent again, and the longest wait between two tries; each retry is said on stderr.
RETRIES_503 = 3
MAX_RETRY_WAIT_S = 30.0


def retry_after(response: httpx.Response, attempt: int) -> float | None:
    """Seconds to wait before sending a call again that was answered `response` (the
    `attempt`th try), or None not to: only a 503 with Retry-After, RETRIES_503 times at most.
    Says so on stderr (a terminal, or a notebook cell's output)."""
    if response.status_code != 503 or attempt > RETRIES_503:
        return None
    try:
        delay = min(MAX_RETRY_WAIT_S, max(0.0, float(response.headers["Retry-After"])))
    except (KeyError, ValueError):
        return None  # a 503 with no Retry-After (an engine that did not start) will not pass by waiting
    try:
        message = response.json().get("message") or response.reason_phrase
    except ValueError:
        message = response.reason_phrase
    print(f"gpujobs: the engine cannot take this now ({message}); trying again in {delay:g}s "
          f"({attempt} of {RETRIES_503})", file=sys.stderr, flush=True)
    return delay


def _raise_for(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        try:
            body = response.json()
            message = body.get("message") or response.reason_phrase
            field = body.get("field")
        except ValueError:
            message, field = response.text.strip() or response.reason_phrase, None
        if response.status_code in (401, 403) and not field and "belongs to" not in message:
            message = f"{message} (check the token: --token or GPUJOBS_TOKEN)"
        raise GPUJobsError(message, status=response.status_code, field=field)
    if not response.content:
        return None
    return response.json()


class _Calls:
    """Every API call, described once. `_call` sends it (sync or async)."""

    url: str
    token: str

    def _call(self, method: str, path: str, *, params: dict[str, Any] | None = None,
              body: Any = None, pick: Callable[[Any], Any] | None = None) -> Any:
        raise NotImplementedError

    # --- GPUs and identity
    def gpus(self) -> Any:
        """The GPU inventory: index, uuid, name, memory, utilization, job_id and user holding it."""
        return self._call("GET", "gpus", pick=lambda d: d["gpus"])

    def gpu_report(self) -> Any:
        """`{"gpus": [...], "backend", "isolation"}`: the inventory and what confines jobs here."""
        return self._call("GET", "gpus")

    def drain(self, gpu: int, reason: str = "", host: str | None = None, draining: bool = True) -> Any:
        """Admin: start no new job on a GPU (running ones go on), or with `draining=False`
        hand it out again."""
        return self._call("POST", "gpus/drain", body=_drop_none({"gpu": gpu, "host": host, "draining": draining,
                                                                 "reason": reason}))

    def set_foreign_override(self, gpu: int, override: bool = True, reason: str = "", host: str | None = None) -> Any:
        """Admin: hand out a GPU although a process outside the queue uses it (until it is seen
        unused), or with `override=False` take that back. Returns `{"gpus": [...]}`."""
        return self._call("POST", "gpus/foreign", body=_drop_none({"gpu": gpu, "host": host, "override": override,
                                                                   "reason": reason}))

    def whoami(self) -> Any:
        return self._call("GET", "whoami")

    def info(self) -> Any:
        """What is in force in the engine: version, identity, GPU backend and runner, store,
        isolation (what `jupyter gpujobs doctor` shows)."""
        return self._call("GET", "info")

    # --- jobs
    def submit(self, command: str | list[str] | None = None, *, gpus: int | float = 1, gpu_type: str | None = None,
               time_limit: str | int | None = None, priority: str | None = None, name: str | None = None,
               cwd: str | None = None, env: dict[str, str] | None = None, **extra: Any) -> Any:
        """Submit a job; returns it (state PENDING). `gpus`: whole GPUs, or a share of one GPU
        below 1 (0.25). `extra`: gpu_memory ("20G": memory on one shared GPU), group,
        preemptible, requeue, begin, when, depends, array, kind, payload, mem, cpus."""
        body = _drop_none({"command": command, "gpus": gpus, "gpu_type": gpu_type, "time_limit": time_limit,
                           "priority": priority, "name": name, "cwd": cwd, "env": env, **extra})
        return self._call("POST", "jobs", body=body)

    def what_if(self, command: str | list[str] | None = None, *, gpus: int | float = 1, gpu_type: str | None = None,
                time_limit: str | int | None = None, **extra: Any) -> Any:
        """When this request would start if submitted now, and the nearby choices that would
        start sooner (`POST jobs?dry_run=1`, as sbatch --test-only): nothing is submitted. The
        same fields as `submit`, checked the same way. Returns `{"expected_start", "alternatives":
        [{"gpus", "gpu_type", "time_limit_s", "change", "expected_start"}], "advice", "basis", ...}`."""
        body = _drop_none({"command": command, "gpus": gpus, "gpu_type": gpu_type, "time_limit": time_limit,
                           **extra})
        return self._call("POST", "jobs", params={"dry_run": "1"}, body=body)

    def submit_notebook(self, notebook: str, *, parameters: dict[str, Any] | None = None,
                        kernel: str | None = None, output: str | None = None, gpus: int | float = 1,
                        **options: Any) -> Any:
        """Queue a notebook for execution on allocated GPUs (nbclient, papermill-style parameters).
        The job is named after the notebook (`train` for `exp/train.ipynb`) unless `name` is given."""
        if not options.get("name"):
            options["name"] = os.path.splitext(os.path.basename(notebook))[0]
        payload = _drop_none({"notebook": notebook, "parameters": parameters or {}, "kernel": kernel,
                              "output": output})
        return self.submit(None, kind="notebook", payload=payload, gpus=gpus, **options)

    def jobs(self, state: str | list[str] | None = None, user: str | None = None, limit: int | None = None,
             cursor: int | None = None, kind: str | None = None) -> Any:
        """`{"jobs": [...], "next": cursor}`, newest first."""
        if isinstance(state, (list, tuple)):
            state = ",".join(state)
        return self._call("GET", "jobs", params=_drop_none(
            {"state": state, "user": user, "limit": limit, "cursor": cursor, "kind": kind}))

    def job(self, job_id: int, advice: bool = False) -> Any:
        """One job; with `advice`, and when it is yours, right-sizing advice from your other
        finished jobs of its name (`"advice": {"text", "suggest", ...}` or None)."""
        return self._call("GET", f"jobs/{int(job_id)}", params={"advice": "1"} if advice else None)

    def cancel(self, job_id: int) -> Any:
        """Cancel a pending or running job; returns it as it is after up to a few seconds."""
        return self._call("DELETE", f"jobs/{int(job_id)}")

    def cancel_many(self, ids: list[int] | None = None, user: str | None = None, array: int | None = None,
                    all: bool = False) -> Any:
        """Cancel many jobs in one request (one of: these ids, a user's, an array's, all you may):
        `{"cancelled": [...], "stopping": [...], "errors": {id: why}}`."""
        body: dict[str, Any] = ({"ids": [int(i) for i in ids]} if ids is not None else {"user": user} if user is not None
                                else {"array": int(array)} if array is not None else {"all": True} if all else {})
        return self._call("POST", "jobs/cancel", body=body)

    def hold(self, job_id: int) -> Any:
        """Keep a pending job from starting (state HELD) until `release`; returns it."""
        return self._call("POST", f"jobs/{int(job_id)}/hold")

    def release(self, job_id: int) -> Any:
        """Let a held job be scheduled again; returns it."""
        return self._call("POST", f"jobs/{int(job_id)}/release")

    def update(self, job_id: int, **changes: Any) -> Any:
        """Change a job's `time_limit`, `priority`, `name` or `begin` (None: now); returns it.
        A running job's limit is extended only within your maximum and when it pushes back no
        reservation or guaranteed job (GPUJobsError 409 says why otherwise)."""
        return self._call("PATCH", f"jobs/{int(job_id)}", body=changes)

    def end(self, job_id: int, state: str = "COMPLETED", reason: str | None = None) -> Any:
        """Report the end of a job whose process the engine did not start (a kernel)."""
        return self._call("POST", f"jobs/{int(job_id)}/end", body=_drop_none({"state": state, "reason": reason}))

    def adopt(self, job_id: int, pid: int) -> Any:
        """Have the engine confine process `pid` (a GPU kernel's) in its job's cgroup:
        `{"confined": bool, "isolation": text}`."""
        return self._call("POST", f"jobs/{int(job_id)}/adopt", body={"pid": int(pid)})

    def log(self, job_id: int, offset: int = 0) -> Any:
        """`{"offset": next offset, "data": text, "done": bool}`."""
        return self._call("GET", f"jobs/{int(job_id)}/log", params={"offset": offset})

    def events(self, job_id: int) -> Any:
        return self._call("GET", f"jobs/{int(job_id)}/events", pick=lambda d: d["events"])

    def queue(self, limit: int | None = None, offset: int = 0, user: str | None = None) -> Any:
        """One page of the pending jobs in scheduling order (the server's default page, 100
        jobs, when `limit` is None); `queue_page` also says how many there are."""
        return self._call("GET", "queue", params=_queue_params(limit, offset, user), pick=lambda d: d["jobs"])

    def queue_page(self, limit: int | None = None, offset: int = 0, user: str | None = None) -> Any:
        """`{"jobs": [...], "total": pending jobs, "offset": offset, "next": next offset or None}`."""
        return self._call("GET", "queue", params=_queue_params(limit, offset, user))

    # --- quotas
    def quota(self, user: str | None = None) -> Any:
        return self._call("GET", "quota", params=_drop_none({"user": user}))

    def set_quota(self, scope: str, name: str, quota: dict[str, Any] | None) -> Any:
        """Admin: set (or with None, clear) the quota of a user (`scope="users"`) or group."""
        return self._call("PUT", "quota", body={"scope": scope, "name": name, "quota": quota})

    # --- GPU-hour budgets, the audit trail, accounting records (issue 30)
    def budgets(self, user: str | None = None) -> Any:
        """Budgets with what is used and left (admins: all, or a user's; others: their own)."""
        return self._call("GET", "budgets", params=_drop_none({"user": user}))["budgets"]

    def set_budget(self, scope: str, name: str, budget: dict[str, Any] | None) -> Any:
        """Admin: set (or with None, clear) the GPU-hour budget of a user (`scope="users"`) or
        group: `{"gpu_hours": 500, "period": "week"|"month"|"dates", "start", "end", "mode"}`."""
        return self._call("PUT", "budgets", body={"scope": scope, "name": name, "budget": budget})

    def audit(self, since: str | float | None = None, until: str | float | None = None,
              action: str | None = None, actor: str | None = None, limit: int | None = None) -> Any:
        """Admin: the audit trail of admin actions and policy changes, newest first."""
        return self._call("GET", "audit", params=_drop_none({"since": since, "until": until, "action": action,
                                                             "actor": actor, "limit": limit}))["audit"]

    def accounting(self, since: str | float | None = None, until: str | float | None = None,
                   user: str | None = None) -> Any:
        """Per-job accounting records of a period (`{"records", "total_gpu_hours", ...}`)."""
        return self._call("GET", "accounting", params=_drop_none({"since": since, "until": until, "user": user}))

    # --- advance reservations
    def reservations(self) -> Any:
        """Every reservation, with its active or next occurrence and its GPUs then."""
        return self._call("GET", "reservations")["reservations"]

    def reserve(self, gpus: int, start: str | float, duration: str | int, *, gpu_type: str | None = None,
                host: str | None = None, repeat: str | None = None, users: list[str] | None = None,
                groups: list[str] | None = None, name: str | None = None) -> Any:
        """Admin: keep GPUs for users or groups from `start` (ISO time, epoch seconds or "+2h")
        for `duration` ("4h"), once or `repeat` "daily" / "weekly"."""
        return self._call("POST", "reservations", body=_drop_none({
            "gpus": gpus, "start": start, "duration": duration, "gpu_type": gpu_type, "host": host, "repeat": repeat,
            "users": users, "groups": groups, "name": name}))

    def accept_reservation(self, proposal: int) -> Any:
        """Reserve what a reservation_proposal finding proposes (admins; users for themselves)."""
        return self._call("POST", "reservations", body={"proposal": proposal})

    def delete_reservation(self, reservation_id: int) -> Any:
        return self._call("DELETE", f"reservations/{reservation_id}")

    # --- notifications outside Lab (e-mail, webhook)
    def notifications(self) -> Any:
        """Your notification settings: `{"email", "webhook", "events", "email_available", "kinds", ...}`."""
        return self._call("GET", "notifications")

    def set_notifications(self, *, email: Any = _KEEP, webhook: Any = _KEEP, events: Any = _KEEP) -> Any:
        """Set your notifications; what is not given keeps its value, None clears an address.
        `events`: some of started, ended, failed, warning, finding. Returns the settings."""
        body = {k: v for k, v in (("email", email), ("webhook", webhook), ("events", events)) if v is not _KEEP}
        return self._call("PUT", "notifications", body=body)

    def clear_notifications(self) -> Any:
        """Turn your notifications off."""
        return self._call("DELETE", "notifications")

    def test_notifications(self) -> Any:
        """Send a test message to your addresses now: `{"queued": ["email", "webhook"]}`."""
        return self._call("POST", "notifications/test")

    # --- other engine views
    def openapi(self) -> Any:
        return self._call("GET", "openapi.json")

    def api(self, method: str, path: str, params: dict[str, Any] | None = None, body: Any = None) -> Any:
        """Any other endpoint under gpujobs/api/ (e.g. usage, findings, metrics)."""
        return self._call(method, path, params=params, body=body)


class GPUJobsClient(_Calls):
    """Synchronous client. `GPUJobsClient()` finds the engine; or pass url= and token=."""

    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0):
        self.url, self.token = find_server(url, token)
        base, sock = http_target(self.url)
        self._http = httpx.Client(base_url=base + API, headers=_auth(self.token), timeout=timeout,
                                  transport=httpx.HTTPTransport(uds=sock) if sock else None)

    def _call(self, method: str, path: str, *, params: dict[str, Any] | None = None,
              body: Any = None, pick: Callable[[Any], Any] | None = None) -> Any:
        attempt = 1
        while True:
            try:
                r = self._http.request(method, path, params=params, json=body)
            except httpx.HTTPError as err:
                raise GPUJobsError(f"cannot reach the engine at {self.url}: {err}") from None
            delay = retry_after(r, attempt)
            if delay is None:
                break
            time.sleep(delay)
            attempt += 1
        data = _raise_for(r)
        return pick(data) if pick else data

    def wait(self, job_id: int, timeout: float | None = None, interval: float = 0.2) -> Any:
        """Block until the job ends (or `timeout` seconds pass); returns the job."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["state"] in FINAL_STATES:
                return job
            if deadline is not None and time.monotonic() > deadline:
                return job
            time.sleep(interval)

    def follow_log(self, job_id: int, offset: int = 0, interval: float = 0.2) -> Iterator[str]:
        """Yield the log as it grows, until the job has ended and all of it was read."""
        while True:
            chunk = self.log(job_id, offset)
            offset = chunk["offset"]
            if chunk["data"]:
                yield chunk["data"]
            if chunk["done"]:
                return
            if not chunk["data"]:
                time.sleep(interval)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GPUJobsClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncGPUJobsClient(_Calls):
    """Asynchronous client (every call is awaitable); plus `subscribe()` to the event websocket."""

    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0):
        self.url, self.token = find_server(url, token)
        base, sock = http_target(self.url)
        self._http = httpx.AsyncClient(base_url=base + API, headers=_auth(self.token), timeout=timeout,
                                       transport=httpx.AsyncHTTPTransport(uds=sock) if sock else None)

    async def _send(self, method: str, path: str, params: dict[str, Any] | None, body: Any,
                    pick: Callable[[Any], Any] | None) -> Any:
        attempt = 1
        while True:
            try:
                r = await self._http.request(method, path, params=params, json=body)
            except httpx.HTTPError as err:
                raise GPUJobsError(f"cannot reach the engine at {self.url}: {err}") from None
            delay = retry_after(r, attempt)
            if delay is None:
                break
            await asyncio.sleep(delay)
            attempt += 1
        data = _raise_for(r)
        return pick(data) if pick else data

    def _call(self, method: str, path: str, *, params: dict[str, Any] | None = None,
              body: Any = None, pick: Callable[[Any], Any] | None = None) -> Any:
        return self._send(method, path, params, body, pick)

    async def wait(self, job_id: int, timeout: float | None = None, interval: float = 0.2) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = await self.job(job_id)
            if job["state"] in FINAL_STATES or (deadline is not None and time.monotonic() > deadline):
                return job
            await asyncio.sleep(interval)

    async def subscribe(self) -> AsyncIterator[dict[str, Any]]:
        """Yield engine events (`{"type": "job", ...}`, `{"type": "gpus", ...}`, `{"type": "finding",
        ...}`) as they happen."""
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        base, sock = http_target(self.url)
        ws_url = "ws" + base[len("http"):] + API + "events"
        conn = await websocket_connect(HTTPRequest(ws_url, headers=_auth(self.token)),
                                       resolver=UnixResolver(sock) if sock else None)
        try:
            while True:
                msg = await conn.read_message()
                if msg is None:
                    return
                yield json.loads(msg)
        finally:
            conn.close()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncGPUJobsClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

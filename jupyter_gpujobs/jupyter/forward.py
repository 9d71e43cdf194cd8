"""A user's Jupyter server in front of the machine's shared engine: its `{base_url}gpujobs/api/`
routes (REST and the events websocket) forward to the engine's Unix socket.

Jupyter authenticates and authorizes the caller as for any of its routes (token, cookie, hub
OAuth); the request then goes to the engine over a connection this server opens, so the
engine knows it as the Unix user this server runs as (peer credentials). Only the method,
path, query, body and Content-Type are passed on: no header the caller sends can name
anyone. Front ends (the lab panel, widgets) cannot tell this server from one that hosts the
engine.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web, websocket
from tornado.httpclient import HTTPRequest

from ..client import UnixResolver, http_target
from ..engine.api.handlers import API, AUTH_RESOURCE, AuthorizedWebSocket

_PASSED_HEADERS = ("Content-Type", "Location", "Cache-Control")


class _Forwarding:
    settings: dict[str, Any]

    @property
    def engine_socket(self) -> str:
        return self.settings["gpujobs_engine_socket"]

    def engine_url(self, path: str, query: str = "", scheme: str = "http") -> str:
        base, _ = http_target("unix://" + self.engine_socket)
        url = base + API + "/" + path
        if scheme == "ws":
            url = "ws" + url[len("http"):]
        return url + ("?" + query if query else "")


class ForwardHandler(_Forwarding, APIHandler):
    """Every REST route under gpujobs/api/: passed on to the shared engine as this server's user."""

    auth_resource = AUTH_RESOURCE

    def _http(self) -> httpx.AsyncClient:
        http = self.settings.get("gpujobs_forward_http")
        if http is None:
            http = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=self.engine_socket), timeout=60.0)
            self.settings["gpujobs_forward_http"] = http
        return http

    async def _forward(self, path: str) -> None:
        headers = {}
        if "Content-Type" in self.request.headers:
            headers["Content-Type"] = self.request.headers["Content-Type"]
        try:
            r = await self._http().request(self.request.method or "GET", self.engine_url(path, self.request.query),
                                           content=self.request.body or None, headers=headers)
        except httpx.HTTPError as err:
            self.set_status(503)
            self.finish(json.dumps({"message": f"the shared GPU engine at {self.engine_socket} does not answer: "
                                               f"{err or type(err).__name__}", "field": None}))
            return
        self.set_status(r.status_code)
        for name in _PASSED_HEADERS:
            value = r.headers.get(name)
            if value is None:
                continue
            if name == "Location" and value.startswith("/" + API):
                value = self.base_url.rstrip("/") + value  # the engine's path, under this server's base URL
            self.set_header(name, value)
        self.finish(r.content, set_content_type=r.headers.get("Content-Type", "application/json"))

    @web.authenticated
    @authorized
    async def get(self, path: str) -> None:
        await self._forward(path)

    @web.authenticated
    @authorized
    async def post(self, path: str) -> None:
        await self._forward(path)

    @web.authenticated
    @authorized
    async def put(self, path: str) -> None:
        await self._forward(path)

    @web.authenticated
    @authorized
    async def patch(self, path: str) -> None:
        await self._forward(path)

    @web.authenticated
    @authorized
    async def delete(self, path: str) -> None:
        await self._forward(path)


class ForwardEventsHandler(_Forwarding, AuthorizedWebSocket):
    """The events websocket: one connection to the engine per browser connection, messages
    passed on as they come (the engine decides what this user may see)."""

    async def open(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        self._upstream: websocket.WebSocketClientConnection | None = None
        try:
            self._upstream = await websocket.websocket_connect(
                HTTPRequest(self.engine_url("events", scheme="ws")), resolver=UnixResolver(self.engine_socket),
                on_message_callback=self._from_engine)
        except Exception as err:
            self.log.warning("gpujobs: the shared engine's events at %s: %s", self.engine_socket, err)
            self.close(1011, "the shared GPU engine does not answer")

    def _from_engine(self, message: str | bytes | None) -> None:
        if message is None:  # the engine closed it (stopped or restarted): the page reconnects
            self.close(1012, "the shared GPU engine closed the connection")
            return
        try:
            self.write_message(message)
        except websocket.WebSocketClosedError:
            self.on_close()

    def on_message(self, message: str | bytes) -> None:
        pass

    def on_close(self) -> None:
        upstream = getattr(self, "_upstream", None)
        if upstream is not None:
            self._upstream = None
            upstream.close()


FORWARD_HANDLERS: list[tuple[str, type]] = [
    (rf"/{API}/events/?", ForwardEventsHandler),
    (rf"/{API}/(?P<path>.*)", ForwardHandler),
]

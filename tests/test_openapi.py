"""The OpenAPI spec kept in the repo describes exactly the handlers the server mounts."""

from __future__ import annotations

import json
import re
from typing import Any

from jupyter_gpujobs.engine.api.handlers import API, HANDLERS, SPEC_PATH

VERBS = ("get", "post", "put", "delete", "patch")


def _spec_path(pattern: str) -> str:
    path = pattern[len(f"/{API}"):]
    path = path.replace("/?", "")
    path = re.sub(r"\(\?P<\w+>[^)]*\)", "{id}", path)
    return path.replace("\\", "")


def _handlers() -> list[tuple[str, type]]:
    from jupyter_gpujobs.engine.api.accounting import ACCOUNTING_HANDLERS
    from jupyter_gpujobs.engine.api.monitor import MONITOR_HANDLERS

    return list(HANDLERS) + list(MONITOR_HANDLERS) + list(ACCOUNTING_HANDLERS)


def test_spec_matches_handlers() -> None:
    spec = json.loads(SPEC_PATH.read_text())
    mounted: dict[str, set[str]] = {}
    for pattern, handler in _handlers():
        verbs = {v for v in VERBS if v in handler.__dict__ or any(v in b.__dict__ for b in handler.__mro__[1:]
                                                                  if b.__module__.startswith("jupyter_gpujobs"))}
        mounted[_spec_path(pattern)] = verbs
    documented = {path: {v for v in item if v in VERBS} for path, item in spec["paths"].items()}
    assert documented == mounted


async def test_served_spec_names_the_base_url(api: Any, jp_base_url: str) -> None:
    status, spec = await api("GET", "openapi.json")
    assert status == 200
    assert spec["servers"][0]["url"] == jp_base_url.rstrip("/") + "/gpujobs/api"
    assert "/jobs" in spec["paths"]

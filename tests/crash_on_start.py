"""A server extension for crash tests: the server SIGKILLs itself when it starts its first job,
just before the job's supervisor is spawned (`CRASH_ON_START=before`) or just after it, before
the engine has recorded it (`CRASH_ON_START=after`). Load it with
`--ServerApp.jpserver_extensions=crash_on_start=True` and this directory on PYTHONPATH."""

from __future__ import annotations

import os
import signal
from typing import Any

from jupyter_gpujobs.engine.runners.local import LocalRunner


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "crash_on_start"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    when = os.environ.get("CRASH_ON_START", "after")
    spawn = LocalRunner.start

    def start(self: LocalRunner, *args: Any, **kwargs: Any) -> Any:
        if when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        handle = spawn(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)
        return handle

    LocalRunner.start = start  # type: ignore[method-assign]

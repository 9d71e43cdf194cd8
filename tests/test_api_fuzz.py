"""Schemathesis, driven by the OpenAPI spec the server serves, against a live server: no answer
is a server error, and every answer (status, content type, body) is one the spec documents.

The number of examples per operation is bounded (GPUJOBS_FUZZ_EXAMPLES, default 25) so the
run takes a minute or two on two cores; set it higher to search longer. The server runs with
`user_max_running_jobs=0`, so none of the generated jobs ever starts a process.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

EXAMPLES = int(os.environ.get("GPUJOBS_FUZZ_EXAMPLES", "25"))
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


def _schemathesis() -> str:
    exe = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or shutil.which("schemathesis")
    if exe is None:
        pytest.fail("schemathesis is not installed (pip install -e '.[test]')")
    return exe


@pytest.mark.timeout(600)
def test_fuzz_the_served_spec(live_server: Callable[..., Any], tmp_path: Path) -> None:
    server = live_server(config={"user_max_running_jobs": 0})
    report = tmp_path / "report"
    cmd = [
        _schemathesis(), "run", server.url + "gpujobs/api/openapi.json",
        "--header", f"Authorization: token {server.token}",
        "--checks", CHECKS,
        "--exclude-path", "/events",  # a websocket
        "--max-examples", str(EXAMPLES), "--seed", os.environ.get("GPUJOBS_FUZZ_SEED", "1"),
        # one worker: Python 3.11's parser is not safe from hypothesis' threads (SystemError)
        "--workers", "1", "--continue-on-failure", "--no-shrink", "--request-timeout", "20",
        "--report", "junit", "--report-dir", str(report),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=540, cwd=tmp_path,  # its caches go there
                          env={**os.environ, "NO_COLOR": "1"})
    tail = done.stdout[-12000:] + done.stderr[-3000:]
    assert done.returncode == 0, tail
    assert "Server error" not in done.stdout, tail
    server_errors = re.findall(r"\] 5\d\d [A-Z]+ .*", server.server_log())
    assert not server_errors, server_errors[:20]
    cases = re.search(r"(\d+) generated", done.stdout)
    print(f"schemathesis: {cases.group(1) if cases else '?'} cases, 0 server errors")

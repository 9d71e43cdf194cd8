"""`%%gpujob` and `%gpujobs` in real kernels talking to a live server on fake GPUs: live output,
the assigned GPU, pushed and pulled variables, failures, interrupts, waiting in the queue, the
tables; and one-line usage errors before anything is submitted."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import KernelManager

from jupyter_gpujobs.magics import GPUJobFailed


class Kernel:
    """A real IPython kernel whose client finds the live server through GPUJOBS_URL / GPUJOBS_TOKEN."""

    def __init__(self, server: Any, tmp: Path):
        env = {**server.env, "GPUJOBS_URL": server.url, "GPUJOBS_TOKEN": server.token,
               "IPYTHONDIR": str(tmp / "ipython")}
        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(env=env, cwd=str(server.root))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        self.execute("%load_ext jupyter_gpujobs")

    def send(self, code: str) -> str:
        return self.kc.execute(code)

    def messages(self, msg_id: str, timeout: float = 30.0) -> Iterator[tuple[float, dict[str, Any]]]:
        """(arrival time, iopub message) of one request, until the kernel is idle again."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no idle status within {timeout}s")
            try:
                msg = self.kc.get_iopub_msg(timeout=left)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            yield time.monotonic(), msg
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return

    def execute(self, code: str, timeout: float = 30.0) -> dict[str, Any]:
        """Run code; returns {"stdout", "stderr", "error", "displays" (text/plain and html), "reply"}."""
        msg_id = self.send(code)
        return self.collect(msg_id, timeout)

    def collect(self, msg_id: str, timeout: float = 30.0) -> dict[str, Any]:
        out: dict[str, Any] = {"stdout": "", "stderr": "", "error": None, "displays": []}
        for _, msg in self.messages(msg_id, timeout):
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out[content["name"]] += content["text"]
            elif kind in ("display_data", "update_display_data", "execute_result"):
                out["displays"].append(content["data"])
            elif kind == "error":
                out["error"] = content
        out["reply"] = self.kc.get_shell_msg(timeout=10)["content"]
        return out

    def value(self, expr: str) -> str:
        result = self.execute(f"print(repr({expr}))")
        assert result["error"] is None, result["error"]
        return result["stdout"].strip()

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


@pytest.fixture
def kernel_for(tmp_path: Path) -> Iterator[Any]:
    kernels: list[Kernel] = []

    def make(server: Any) -> Kernel:
        kernels.append(Kernel(server, tmp_path))
        return kernels[-1]

    yield make
    for k in kernels:
        k.close()


def test_cell_streams_live_on_its_gpu_with_pushed_and_pulled_variables(live_server: Any, kernel_for: Any) -> None:
    server = live_server(fake_gpus="2xA100")
    kernel = kernel_for(server)
    kernel.execute("scale = 3\ndef double(x):\n    return 2 * x")
    code = ("%%gpujob -g 1 -t 1m --push scale,double --pull total,gpus\n"
            "import os, time\n"
            "gpus = os.environ['CUDA_VISIBLE_DEVICES']\n"
            "print('first line', flush=True)\n"
            "time.sleep(3)\n"
            "total = double(scale) + 1\n"
            "print('second line')\n")
    msg_id = kernel.send(code)
    first_seen = None
    stdout = ""
    with server.client() as client:
        for _, msg in kernel.messages(msg_id, timeout=30):
            if msg["msg_type"] == "stream":
                stdout += msg["content"]["text"]
                if "first line" in stdout and first_seen is None:
                    first_seen = client.jobs()["jobs"][0]
        assert kernel.kc.get_shell_msg(timeout=10)["content"]["status"] == "ok"
        job = client.jobs()["jobs"][0]
    assert first_seen is not None and first_seen["state"] == "RUNNING"  # seen before the job ended
    assert "second line" in stdout
    assert job["state"] == "COMPLETED" and job["kind"] == "cell"
    assert job["cwd"] == str(server.root)
    assert kernel.value("total") == "7"
    assert kernel.value("gpus") == repr(",".join(str(i) for i in job["assigned_gpus"]))
    # the cell folder is gone once the variables are back
    assert not list((server.root / ".gpujobs" / "cells").iterdir())


def test_failing_cell_raises_with_the_reason(live_server: Any, kernel_for: Any) -> None:
    server = live_server(fake_gpus="1xA100")
    kernel = kernel_for(server)
    result = kernel.execute("%%gpujob -t 1m\nx = 1\nprint('before the error')\nx / 0\n")
    error = result["error"]
    assert error is not None and error["ename"] == "GPUJobFailed"
    assert "FAILED" in error["evalue"] and "ZeroDivisionError: division by zero" in error["evalue"]
    assert "line 4 of the cell" in error["evalue"]  # the notebook's own line numbers
    assert "exit code 1" in error["evalue"] or "exit" in error["evalue"]
    assert len(error["traceback"]) == 1  # one line, not a wall of the magic's internals
    assert "before the error" in result["stdout"]
    assert 'line 4' in result["stdout"] + result["stderr"]  # the job's traceback was streamed
    assert kernel.value("'x' in dir()") == "False"  # the cell did not run in the kernel
    with server.client() as client:
        assert client.jobs()["jobs"][0]["state"] == "FAILED"


def test_interrupt_cancels_the_job(live_server: Any, kernel_for: Any) -> None:
    server = live_server(fake_gpus="1xA100")
    kernel = kernel_for(server)
    msg_id = kernel.send("%%gpujob -t 1m\nimport time\nprint('started', flush=True)\ntime.sleep(60)\n")
    with server.client() as client:
        for _, msg in kernel.messages(msg_id, timeout=30):
            if msg["msg_type"] == "stream" and "started" in msg["content"]["text"]:
                kernel.km.interrupt_kernel()
        reply = kernel.kc.get_shell_msg(timeout=10)["content"]
        assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
        job = client.jobs()["jobs"][0]
        assert job["state"] == "CANCELLED", job


def test_second_cell_waits_for_the_only_gpu_and_shows_its_position(live_server: Any, kernel_for: Any) -> None:
    server = live_server(fake_gpus="1xA100")
    kernel = kernel_for(server)
    with server.client() as client:
        blocker = client.submit("sleep 30", gpus=1, time_limit="1m", name="blocker")
        deadline = time.monotonic() + 15
        while client.job(blocker["id"])["state"] != "RUNNING":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        msg_id = kernel.send("%%gpujob -t 1m --pull done\nprint('my turn')\ndone = True\n")
        statuses: list[str] = []
        cancelled = False
        for _, msg in kernel.messages(msg_id, timeout=30):
            if msg["msg_type"] in ("display_data", "update_display_data"):
                statuses.append(msg["content"]["data"]["text/plain"])
                assert "gpujobs-status" in msg["content"]["data"]["text/html"]
                if "position 1" in statuses[-1] and not cancelled:
                    cancelled = True
                    client.cancel(blocker["id"])
        assert kernel.kc.get_shell_msg(timeout=10)["content"]["status"] == "ok"
    pending = [s for s in statuses if "PENDING" in s]
    assert pending and "position 1 in the queue" in pending[0] and "expected start" in pending[0]
    assert any("RUNNING on GPU 0" in s for s in statuses)
    assert "COMPLETED" in statuses[-1]
    assert kernel.value("done") == "True"


def test_line_magic_tables_async_widget_and_usage_errors(live_server: Any, kernel_for: Any) -> None:
    server = live_server(fake_gpus="1xA100")
    kernel = kernel_for(server)
    # bad options: one line, nothing submitted
    for line in ("-g many", "-t soon", "--priority mega", "--push nothere", "--when tomorrow", "--env NOEQUALS",
                 "--frobnicate", "-g 5"):
        result = kernel.execute(f"%%gpujob {line}\nprint(1)")
        assert result["error"] is not None and result["error"]["ename"] == "UsageError", (line, result)
        assert len(result["error"]["traceback"]) <= 2, result["error"]["traceback"]
    with server.client() as client:
        assert client.jobs()["jobs"] == []

    result = kernel.execute("%%gpujob --async -t 1m --pull y\ny = 41 + 1")
    assert result["error"] is None, result["error"]
    widget = result["displays"][-1]
    assert "application/vnd.jupyter.widget-view+json" in widget
    result = kernel.execute("w = _\nprint(w.result(timeout=30), y)")
    assert result["error"] is None, result["error"]
    assert result["stdout"].strip() == "{'y': 42} 42"

    result = kernel.execute("%gpujobs list")
    html, text = result["displays"][0]["text/html"], result["displays"][0]["text/plain"]
    assert "<table" in html and "COMPLETED" in html and "cell" in html
    assert "COMPLETED" in text
    result = kernel.execute("%gpujobs gpus")
    assert "A100" in result["displays"][0]["text/html"] and "free" in result["displays"][0]["text/plain"]
    result = kernel.execute("%gpujobs queue")
    assert result["displays"][0]["text/plain"] == "queue is empty"
    with server.client() as client:
        job_id = client.jobs()["jobs"][0]["id"]
    result = kernel.execute(f"%gpujobs log {job_id}")
    assert result["error"] is None
    result = kernel.execute("%gpujobs cancel 999")
    assert result["error"]["ename"] == "UsageError" and "999" in result["error"]["evalue"]
    result = kernel.execute("%gpujobs frob")
    assert result["error"]["ename"] == "UsageError"


def test_gpujobs_run_queues_a_notebook(live_server: Any, kernel_for: Any) -> None:
    from test_notebooks import param_notebook

    server = live_server(fake_gpus="1xA100")
    param_notebook(server.root / "train.ipynb")
    kernel = kernel_for(server)
    result = kernel.execute("w = %gpujobs run train.ipynb -g 1 -t 5m -p alpha=0.25 -p name=x\n"
                            "job = w.wait(timeout=60)\nprint(job['state'], job['output_notebook'])")
    assert result["error"] is None, result["error"]
    state, output = result["stdout"].split()
    assert state == "COMPLETED"
    assert (server.root / output).exists()
    result = kernel.execute("%gpujobs run missing.ipynb")
    assert result["error"]["ename"] == "UsageError"


def test_usage_errors_need_no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bad options fail before the client is even made (no engine reachable here)."""
    from IPython.core.error import UsageError
    from IPython.testing.globalipapp import get_ipython

    monkeypatch.setenv("GPUJOBS_URL", "http://127.0.0.1:9/")
    ip = get_ipython()
    ip.run_line_magic("load_ext", "jupyter_gpujobs")
    magics = ip.magics_manager.registry["GPUJobMagics"]
    for line, words in [("-g x", "--gpus"), ("-t 1q", "--time"), ("--priority mega", "--priority"),
                        ("--push nothere", "no variable named nothere"), ("--pull 1x", "not a variable name"),
                        ("--when never", "offpeak"), ("--begin yesterday", "--begin")]:
        with pytest.raises(UsageError, match=words):
            magics.gpujob(line, "print(1)")
    with pytest.raises(UsageError, match="empty"):
        magics.gpujob("", "  \n")
    assert issubclass(GPUJobFailed, RuntimeError)
    assert "fresh Python process" in (magics.gpujob.__doc__ or "")


def test_gpujob_failed_carries_reason_and_log_tail() -> None:
    job = {"id": 4, "state": "TIMEOUT", "reason": "time limit of 1m reached"}
    err = GPUJobFailed(job, "a\nb\n", None)
    assert str(err) == "job 4 TIMEOUT: time limit of 1m reached"
    assert err.reason == "time limit of 1m reached" and err.log_tail == "a\nb\n"
    assert err._render_traceback_()[-2:] == ["a", "b"]

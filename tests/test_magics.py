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

from jupyter_gpujobs.notebook.magics import GPUJobFailed


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
        out["reply"] = self.reply(msg_id)
        return out

    def reply(self, msg_id: str, timeout: float = 10.0) -> dict[str, Any]:
        """The execute_reply of one request (skipping others, e.g. wait_for_ready's kernel_info)."""
        deadline = time.monotonic() + timeout
        while True:
            msg = self.kc.get_shell_msg(timeout=max(0.01, deadline - time.monotonic()))
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg["content"]

    def value(self, expr: str) -> str:
        result = self.execute(f"print(repr({expr}))")
        assert result["error"] is None, result["error"]
        return result["stdout"].strip()

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def shared_server(tmp_path_factory: pytest.TempPathFactory, fake_gpus: str = "1xA100") -> Iterator[Any]:
    """One live server for a whole test module: the `live_server` factory, module-scoped
    (a server start costs seconds; the tests leave no job behind, see `no_job_left`)."""
    from servers import live_servers

    factory = live_servers(tmp_path_factory.mktemp("live"))
    make = next(factory)
    try:
        yield make(fake_gpus=fake_gpus)
    finally:
        next(factory, None)


def cancel_active(server: Any) -> None:
    with server.client() as client:
        for job in client.jobs(state="PENDING,RUNNING")["jobs"]:
            client.cancel(job["id"])
        for job in client.jobs(state="PENDING,RUNNING")["jobs"]:
            client.wait(job["id"], timeout=15)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from shared_server(tmp_path_factory, "1xA100")


@pytest.fixture(scope="module")
def kernel(server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    k = Kernel(server, tmp_path_factory.mktemp("kernel"))
    yield k
    k.close()


@pytest.fixture(autouse=True)
def no_job_left(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "server" in request.fixturenames:
        cancel_active(request.getfixturevalue("server"))


def test_cell_streams_live_on_its_gpu_with_pushed_and_pulled_variables(server: Any, kernel: Any) -> None:
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
        assert kernel.reply(msg_id)["status"] == "ok"
        job = client.jobs()["jobs"][0]
    assert first_seen is not None and first_seen["state"] == "RUNNING"  # seen before the job ended
    assert "second line" in stdout
    assert job["state"] == "COMPLETED" and job["kind"] == "cell"
    assert job["cwd"] == str(server.root)
    assert kernel.value("total") == "7"
    assert kernel.value("gpus") == repr(",".join(str(i) for i in job["assigned_gpus"]))
    # the cell folder is gone once the variables are back
    assert not list((server.root / ".gpujobs" / "cells").iterdir())


def test_failing_cell_raises_with_the_reason(server: Any, kernel: Any) -> None:
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


def test_stderr_arrives_as_stderr_and_the_log_keeps_both(server: Any, kernel: Any) -> None:
    code = ("%%gpujob -g 0 -t 1m\n"
            "import subprocess, sys, time\n"
            "print('out 1')\n"
            "print('err 1', file=sys.stderr)\n"
            "subprocess.run([sys.executable, '-c', 'import sys; sys.stderr.write(\"sub err\\\\n\"); print(\"sub out\")'])\n"
            "time.sleep(0.3)\n"
            "print('out 2')\n")
    result = kernel.execute(code, timeout=60)
    assert result["error"] is None, result
    assert "err 1\n" in result["stderr"] and "sub err\n" in result["stderr"], result
    assert "err" not in result["stdout"], result
    assert "out 1\n" in result["stdout"] and "sub out\n" in result["stdout"] and "out 2\n" in result["stdout"]
    with server.client() as client:
        job = client.jobs(kind="cell")["jobs"][0]
    log = server.cli("log", str(job["id"])).stdout  # the log has both streams, in order
    lines = [line for line in log.splitlines() if line in ("out 1", "err 1", "sub err", "sub out", "out 2")]
    assert lines[:2] == ["out 1", "err 1"] and lines[-1] == "out 2" and len(lines) == 5, log


def test_interrupt_cancels_the_job(server: Any, kernel: Any) -> None:
    msg_id = kernel.send("%%gpujob -t 1m\nimport time\nprint('started', flush=True)\ntime.sleep(60)\n")
    with server.client() as client:
        shown: list[str] = []
        for _, msg in kernel.messages(msg_id, timeout=30):
            if msg["msg_type"] == "stream" and "started" in msg["content"]["text"]:
                kernel.km.interrupt_kernel()
            if msg["msg_type"] == "error":
                shown += msg["content"]["traceback"]
        reply = kernel.reply(msg_id)
        assert reply["status"] == "error" and reply["ename"] == "JobCancelled"
        job = client.jobs()["jobs"][0]
        assert job["state"] == "CANCELLED", job
    # one line saying what happened, not a traceback through the magic's code
    assert len(shown) == 1 and f"job {job['id']} cancelled" in shown[0], shown
    assert not list((server.root / ".gpujobs" / "cells").iterdir())  # nothing left behind


def test_second_cell_waits_for_the_only_gpu_and_shows_its_position(server: Any, kernel: Any) -> None:
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
        assert kernel.reply(msg_id)["status"] == "ok"
    pending = [s for s in statuses if "position 1 in the queue" in s]
    # nothing ran before: a bound from the blocker's time limit, not a prediction
    assert pending and "PENDING" in pending[0] and "expected start by " in pending[0], pending[0]
    assert "at the latest (in " in pending[0]
    assert any("RUNNING on GPU 0" in s for s in statuses)
    assert "COMPLETED" in statuses[-1]
    assert kernel.value("done") == "True"


def test_line_magic_tables_async_widget_and_usage_errors(server: Any, kernel: Any) -> None:
    # bad options: one line, nothing submitted
    with server.client() as client:
        jobs = client.jobs()["jobs"]
        before = jobs[0]["id"] if jobs else None
    for line in ("-g many", "-t soon", "--priority mega", "--push nothere", "--when tomorrow", "--env NOEQUALS",
                 "--frobnicate", "-g 5"):
        result = kernel.execute(f"%%gpujob {line}\nprint(1)")
        # IPython's way: one line on stderr (the reply itself is "ok")
        assert result["stderr"].startswith("UsageError: ") and result["stderr"].count("\n") == 1, result
    with server.client() as client:
        assert client.jobs()["jobs"] == [] or client.jobs()["jobs"][0]["id"] == before

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
    assert result["stderr"].startswith("UsageError: ") and "999" in result["stderr"]
    result = kernel.execute("%gpujobs frob")
    assert result["stderr"].startswith("UsageError: %gpujobs: unknown command")


def test_gpujobs_run_queues_a_notebook(server: Any, kernel: Any) -> None:
    """`%gpujobs run` submits a notebook job (its execution is tested in test_notebooks.py)."""
    from test_notebooks import param_notebook

    param_notebook(server.root / "exp" / "train.ipynb")
    kernel.execute("import os; os.chdir('exp')")
    result = kernel.execute("w = %gpujobs run train.ipynb -g 1 -t 5m -p alpha=0.25 -p name=x --priority high\n"
                            "w.stop()\nprint(w.job_id)")
    assert result["error"] is None, result["error"]
    with server.client() as client:
        job = client.job(int(result["stdout"]))
        client.cancel(job["id"])
    assert job["kind"] == "notebook" and job["priority"] == "high" and job["gpus"] == 1
    assert job["payload"]["notebook"] == str(server.root / "exp" / "train.ipynb")
    assert job["payload"]["parameters"] == {"alpha": 0.25, "name": "x"}
    assert job["output_notebook"] == f"exp/train-job{job['id']}.ipynb"
    result = kernel.execute("%gpujobs run missing.ipynb")
    assert result["stderr"].startswith("UsageError: %gpujobs run: no notebook") and "missing.ipynb" in result["stderr"]


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

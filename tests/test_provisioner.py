"""GPU kernels through a real `jupyter server` (`live_server`) on fake GPUs: a kernel started
with `POST /api/kernels` waits in the queue for its GPU, sees it in CUDA_VISIBLE_DEVICES, and
gives it back on shutdown, at its time limit, when it dies, when idle, and after a restart of
the server. Plus the pieces of the provisioner that need no server."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from servers import kernel_ready, wait_until

from jupyter_gpujobs.jupyter.provisioner import GPUKernelProvisioner, GPUKernelStartError, human_duration

# ----------------------------------------------------------------------------- helpers

#: A kernel needs none of the other server extensions; without them a server starts in half the time.
#: The fake backend sees every process of the machine marked GPUJOBS_FAKE=1, so other tests' servers
#: (a rogue-process killer among them) would see these kernels on "their" GPUs: do not mark them.
LEAN = [*(f"--ServerApp.jpserver_extensions={name}=False"
          for name in ("jupyterlab", "jupyter_lsp", "notebook_shim", "jupyter_server_terminals")),
        "--GPUKernelProvisioner.mark_fake_gpu_use=False"]


def install_spec(server: Any, name: str, *options: str) -> None:
    """Install a GPU kernelspec into the live server's JUPYTER_DATA_DIR (with the CLI)."""
    cmd = [sys.executable, "-m", "jupyter_gpujobs.cli", "kernelspec", "install", "--user", "--name", name,
           *options]
    done = subprocess.run(cmd, env=server.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


class Kernels:
    """The live server's `/api/kernels`, plus kernel clients over the connection files."""

    def __init__(self, server: Any):
        self.server = server
        self.http = httpx.Client(base_url=server.url, headers={"Authorization": f"token {server.token}"},
                                 timeout=60)
        self.clients: list[Any] = []
        self.by_kernel: dict[str, Any] = {}  # reused by evaluate(); dropped on a restart
        self.pids: list[int] = []

    def start(self, name: str) -> httpx.Response:
        return self.http.post("api/kernels", json={"name": name})

    def start_ok(self, name: str) -> str:
        r = self.start(name)
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def ids(self) -> list[str]:
        return [k["id"] for k in self.http.get("api/kernels").json()]

    def client(self, kernel_id: str) -> Any:
        from jupyter_client import BlockingKernelClient

        path = Path(self.server.env["JUPYTER_RUNTIME_DIR"]) / f"kernel-{kernel_id}.json"
        kc = BlockingKernelClient(connection_file=str(path))
        kc.load_connection_file()
        kc.start_channels()
        self.clients.append(kc)
        kernel_ready(kc)
        return kc

    def evaluate(self, kernel_id: str, expression: str) -> str:
        kc = self.by_kernel.get(kernel_id) or self.client(kernel_id)
        self.by_kernel[kernel_id] = kc
        msg_id = kc.execute("import os", user_expressions={"v": expression})
        while True:
            reply = kc.get_shell_msg(timeout=30)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        assert reply["content"]["status"] == "ok", reply["content"]
        value = reply["content"]["user_expressions"]["v"]
        assert value["status"] == "ok", value
        text = value["data"]["text/plain"]
        if expression.endswith("getpid()"):
            self.pids.append(int(text))
        return text.strip("'")

    def server_state(self, kernel_id: str) -> str:
        """The kernel's execution state as the server tracks it (from its status messages)."""
        return self.http.get(f"api/kernels/{kernel_id}").json()["execution_state"]

    def run_cell(self, kernel_id: str, code: str) -> str:
        """Execute a cell; what it printed (stdout and stderr) as the notebook shows it."""
        kc = self.by_kernel.get(kernel_id) or self.client(kernel_id)
        self.by_kernel[kernel_id] = kc
        out: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])

        reply = kc.execute_interactive(code, timeout=30, output_hook=hook)
        assert reply["content"]["status"] == "ok", reply["content"]
        return "".join(out)

    def close(self) -> None:
        for kc in self.clients:
            kc.stop_channels()
        for pid in self.pids:  # no kernel may outlive its test
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.http.close()


@pytest.fixture
def kernels() -> Iterator[Callable[[Any], Kernels]]:
    made: list[Kernels] = []

    def make(server: Any) -> Kernels:
        k = Kernels(server)
        made.append(k)
        return k

    yield make
    for k in made:
        k.close()




def kernel_jobs(client: Any) -> list[dict[str, Any]]:
    return [j for j in client.jobs(limit=100)["jobs"] if j["kind"] == "kernel"]


def gpu_holder(client: Any, index: int = 0) -> int | None:
    return next(g["job_id"] for g in client.gpus() if g["index"] == index)


# ----------------------------------------------------------------------------- acceptance


def test_kernel_gets_its_gpu_and_a_second_one_waits(live_server: Any, kernels: Any) -> None:
    # kernel_info_timeout 2 s: the queue wait (4 s here) must not count against it
    server = live_server(fake_gpus="1xA100", start=False,
                         extra_args=[*LEAN, "--MappingKernelManager.kernel_info_timeout=2"])
    install_spec(server, "python3-gpu", "--gpus", "1", "--time", "10m", "--type", "A100", "--max-wait", "1m")
    server.start()
    client = server.client()
    k = kernels(server)

    first = k.start_ok("python3-gpu")
    job = kernel_jobs(client)[0]
    assert job["state"] == "RUNNING" and job["name"] == "kernel python3-gpu"
    assert k.evaluate(first, "os.environ['CUDA_VISIBLE_DEVICES']") == "0"
    assert k.evaluate(first, "os.environ['NVIDIA_VISIBLE_DEVICES']") == "0"
    assert k.evaluate(first, "os.environ['CUDA_DEVICE_ORDER']") == "PCI_BUS_ID"
    assert k.evaluate(first, "os.environ['GPUJOBS_GPU_UUIDS']").startswith("GPU-fake-0000-")
    assert k.evaluate(first, "os.environ.get('GPUJOBS_FAKE')") == "None"  # c.GPUKernelProvisioner reached it
    assert k.evaluate(first, "os.environ['GPUJOBS_JOB_ID']") == str(job["id"])
    assert gpu_holder(client) == job["id"]
    k.evaluate(first, "os.getpid()")

    # a second GPU kernel waits in the queue...
    answer: dict[str, httpx.Response] = {}
    waiter = threading.Thread(target=lambda: answer.setdefault("r", k.start("python3-gpu")))
    waiter.start()
    queued = wait_until(lambda: [j for j in client.queue() if j["kind"] == "kernel"], 10, "second kernel queued")
    assert queued[0]["name"] == "kernel python3-gpu" and queued[0]["position"] in (1, None)
    time.sleep(4)
    assert waiter.is_alive() and "r" not in answer

    # ... and starts when the first is shut down
    assert k.http.delete(f"api/kernels/{first}").status_code == 204
    assert client.job(job["id"])["state"] == "COMPLETED"
    assert client.job(job["id"])["reason"] == "kernel shut down"
    waiter.join(30)
    assert answer["r"].status_code == 201, answer["r"].text
    second = answer["r"].json()["id"]
    assert k.evaluate(second, "os.environ['CUDA_VISIBLE_DEVICES']") == "0"
    assert k.evaluate(second, "os.environ['GPUJOBS_JOB_ID']") == str(queued[0]["id"])
    assert client.job(queued[0]["id"])["state"] == "RUNNING"


def test_time_limit_warns_in_the_cell_then_shuts_the_kernel_down(live_server: Any, kernels: Any) -> None:
    # a 20 s limit is warned 4 s before (a fifth of it, under the 60 s setting): time enough for
    # a cell after the warning to end before the kernel is shut down, even on a loaded machine
    server = live_server(fake_gpus="1xA100", config={"time_limit_warning": 60}, start=False, extra_args=LEAN)
    install_spec(server, "gpu-short", "--time", "20s")
    server.start()
    client = server.client()
    k = kernels(server)

    kernel = k.start_ok("gpu-short")
    k.evaluate(kernel, "os.getpid()")
    job = kernel_jobs(client)[0]
    assert job["warn_at"] == job["ends_at"] - 4 and job["ends_at"] == job["started_at"] + 20
    # a cell that ends before the warning time ends without the notice; when the kernel's start
    # took so long (a loaded machine) that it ended after, with it: the condition, not a window
    early = k.run_cell(kernel, "import time\nprint('ran at', time.time())")
    ran_at = float(re.search(r"ran at ([\d.]+)", early).group(1))
    if "[gpujobs]" in early:  # the notice comes after the cell's code, a moment after ran_at
        assert ran_at > job["warn_at"] - 1, (ran_at, job["warn_at"], early)
    else:
        assert ran_at < job["warn_at"], (ran_at, job["warn_at"], early)
    late = k.run_cell(kernel, "import os, time\n"
                              "time.sleep(max(0.0, float(os.environ['GPUJOBS_WARN_AT']) - time.time() + 0.3))")
    assert re.search(r"\[gpujobs\] this GPU kernel reaches its time limit of 20s in [1-4]s \(at [\d:]+\); "
                     r"it will be shut down then and its GPU given back: save your work", late), late
    wait_until(lambda: kernel not in k.ids(), 20, "timed-out kernel shut down")
    final = client.job(job["id"])
    assert final["state"] == "TIMEOUT", final
    assert "time limit" in final["reason"]
    assert "WARNING" in [e["state"] for e in client.events(job["id"])]
    assert gpu_holder(client) is None
    wait_until(lambda: not _alive(k.pids[0]), 10, "kernel process ended")


def test_restart_keeps_the_gpu_a_killed_kernel_frees_it(live_server: Any, kernels: Any) -> None:
    server = live_server(fake_gpus="1xA100", start=False, extra_args=LEAN)
    install_spec(server, "python3-gpu", "--time", "10m")
    server.start()
    client = server.client()
    k = kernels(server)

    kernel = k.start_ok("python3-gpu")
    first_pid = int(k.evaluate(kernel, "os.getpid()"))
    job = kernel_jobs(client)[0]

    # a restart keeps the allocation (same job, same GPU, new process)
    r = k.http.post(f"api/kernels/{kernel}/restart")
    assert r.status_code == 200, r.text
    k.by_kernel.pop(kernel)
    assert k.evaluate(kernel, "os.environ['GPUJOBS_JOB_ID']") == str(job["id"])
    assert k.evaluate(kernel, "os.environ['CUDA_VISIBLE_DEVICES']") == "0"
    pid = int(k.evaluate(kernel, "os.getpid()"))
    assert pid != first_pid
    assert client.job(job["id"])["state"] == "RUNNING" and gpu_holder(client) == job["id"]

    os.kill(pid, signal.SIGKILL)
    final = wait_until(lambda: (j := client.job(job["id"]))["state"] != "RUNNING" and j, 10, "job ended")
    assert final["state"] == "FAILED", final
    assert final["reason"] == "kernel died (SIGKILL)"
    assert gpu_holder(client) is None
    # not relaunched on the GPU behind the queue's back; Jupyter drops the dead kernel
    wait_until(lambda: kernel not in k.ids(), 15, "dead kernel removed")
    assert [j["state"] for j in kernel_jobs(client)] == ["FAILED"]


def test_idle_kernel_is_reclaimed_busy_one_is_not(live_server: Any, kernels: Any) -> None:
    server = live_server(fake_gpus="2xA100", start=False, extra_args=LEAN)
    install_spec(server, "gpu-idle", "--time", "10m", "--idle-timeout", "3s")
    server.start()
    client = server.client()
    k = kernels(server)

    idle = k.start_ok("gpu-idle")
    busy = k.start_ok("gpu-idle")
    jobs = {j["id"]: j for j in kernel_jobs(client)}
    by_kernel = {j["payload"]["kernel_id"]: j["id"] for j in jobs.values()}
    kc = k.client(busy)
    # the server learns that a kernel is busy from its status messages; its subscription can
    # miss the first ones, so start the cell once it has seen one (as Lab's first cell would)
    def server_saw_a_status() -> bool:
        kernel_ready(kc)  # one request answered, so one more status published
        return k.server_state(busy) != "starting"

    wait_until(server_saw_a_status, 10, "the server to see the kernel's status")
    kc.execute("import time\nt = time.time()\nwhile time.time() - t < 14:\n    pass\n")
    wait_until(lambda: k.server_state(busy) == "busy", 5, "the server to see the kernel busy")
    t0 = time.monotonic()

    wait_until(lambda: idle not in k.ids(), 15, "idle kernel reclaimed")
    reclaimed = client.job(by_kernel[idle])
    assert reclaimed["state"] == "CANCELLED", reclaimed
    assert reclaimed["reason"] == "idle for 3 s"
    time.sleep(max(0.0, 7 - (time.monotonic() - t0)))
    assert busy in k.ids()
    assert client.job(by_kernel[busy])["state"] == "RUNNING"
    holders = {g["index"]: g["job_id"] for g in client.gpus()}
    assert sorted(v for v in holders.values() if v) == [by_kernel[busy]]


def test_wait_beyond_the_maximum_fails_the_start(live_server: Any, kernels: Any) -> None:
    server = live_server(fake_gpus="1xA100", start=False, extra_args=LEAN)
    install_spec(server, "python3-gpu", "--time", "10m")
    install_spec(server, "gpu-impatient", "--time", "10m", "--max-wait", "2s")
    server.start()
    client = server.client()
    k = kernels(server)

    k.start_ok("python3-gpu")
    t0 = time.monotonic()
    r = k.start("gpu-impatient")
    assert 1.5 < time.monotonic() - t0 < 10
    assert r.status_code == 503, r.text
    message = r.json()["message"]
    assert "no GPU became free for kernel 'gpu-impatient' within 2s (max_wait)" in message
    assert "was cancelled" in message
    gave_up = [j for j in kernel_jobs(client) if j["name"] == "kernel gpu-impatient"]
    assert [j["state"] for j in gave_up] == ["CANCELLED"]
    assert client.queue() == []
    assert len(k.ids()) == 1


def test_server_restart_ends_the_jobs_of_lost_kernels(live_server: Any, kernels: Any) -> None:
    server = live_server(fake_gpus="1xA100", start=False, extra_args=LEAN)
    install_spec(server, "python3-gpu", "--time", "10m")
    server.start()
    client = server.client()
    k = kernels(server)
    kernel = k.start_ok("python3-gpu")
    pid = int(k.evaluate(kernel, "os.getpid()"))
    job = kernel_jobs(client)[0]

    server.kill()  # SIGKILL: no cleanup; ipykernel's parent poller then stops the kernel
    wait_until(lambda: not _alive(pid), 10, "orphaned kernel exited")
    server.start()
    client = server.client()
    final = wait_until(lambda: (j := client.job(job["id"]))["state"] != "RUNNING" and j, 15, "job ended")
    assert final["state"] == "FAILED" and "kernel gone" in final["reason"], final
    assert gpu_holder(client) is None


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# ----------------------------------------------------------------------------- no server


def test_human_duration() -> None:
    assert human_duration(1800) == "30 min"
    assert human_duration(7200) == "2 h"
    assert human_duration(3) == "3 s"
    assert human_duration(90) == "1m30s"


def test_bad_kernelspec_config_fails_with_the_field() -> None:
    p = GPUKernelProvisioner(gpus=1, time_limit="4x")
    with pytest.raises(GPUKernelStartError) as err:
        p._settings()
    assert err.value.status_code == 400
    assert "time_limit: cannot read duration '4x'" in str(err.value)
    assert "gpus" in str(pytest.raises(GPUKernelStartError, GPUKernelProvisioner(gpus=0)._settings).value)
    ok = GPUKernelProvisioner(gpus="2", time_limit="1h30m", idle_timeout="0", max_wait=None)._settings()
    assert ok == {"gpus": 2, "share": None, "gpu_memory": None, "gpu_type": None, "time_limit": 5400,
                  "priority": "normal", "idle_timeout": None, "max_wait": None}
    half = GPUKernelProvisioner(gpus=0.5, gpu_memory="16G")._settings()
    assert (half["gpus"], half["share"], half["gpu_memory"]) == (1, 0.5, 16 << 30)
    assert "share of one GPU below 1" in str(pytest.raises(GPUKernelStartError,
                                                          GPUKernelProvisioner(gpus=1.5)._settings).value)


def test_kernelspec_config_reaches_the_provisioner(tmp_path: Path, monkeypatch: Any) -> None:
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.provisioning import KernelProvisionerFactory

    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "data"))
    done = subprocess.run([sys.executable, "-m", "jupyter_gpujobs.cli", "kernelspec", "install", "--user",
                           "--name", "python3-gpu", "--gpus", "2", "--time", "4h", "--type", "A100",
                           "--idle-timeout", "30m", "--max-wait", "1h"],
                          capture_output=True, text=True, env={**os.environ}, timeout=60)
    assert done.returncode == 0, done.stderr
    spec = KernelSpecManager().get_kernel_spec("python3-gpu")
    factory = KernelProvisionerFactory.instance()
    assert factory.is_provisioner_available(spec)
    p = factory.create_provisioner_instance("kid", spec, parent=None)
    assert isinstance(p, GPUKernelProvisioner)
    assert p._settings() == {"gpus": 2, "share": None, "gpu_memory": None, "gpu_type": "A100", "time_limit": 14400,
                             "priority": "normal", "idle_timeout": 1800, "max_wait": 3600}


def test_notice_text_and_which_kernels_get_it() -> None:
    from jupyter_gpujobs.jupyter.provisioner import _is_ipykernel
    from jupyter_gpujobs.notebook.kernel_notice import notice

    assert notice(1000.0, 1000.0 + 299, 4 * 3600).startswith(
        "[gpujobs] this GPU kernel reaches its time limit of 4h in 4m59s (at ")
    assert notice(1000.0, 999.0, 3600) == ("[gpujobs] this GPU kernel reached its time limit of 1h: "
                                           "it is being shut down.")
    assert _is_ipykernel([sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"])
    assert not _is_ipykernel(["R", "--slave", "-e", "IRkernel::main()", "--args", "{connection_file}"])


def test_two_kernels_of_a_shared_gpu_kernelspec_run_at_once_on_one_gpu(live_server: Any, kernels: Any) -> None:
    """A kernelspec with a share (`kernelspec install -g 0.5`, or `--gpu-mem 16G`), as the Lab
    launcher starts it: two of its kernels run at once on the one GPU, a whole-GPU one waits."""
    server = live_server(fake_gpus="1xA100-80GB", start=False, extra_args=LEAN)
    install_spec(server, "python3-half", "-g", "0.5", "--time", "10m", "--max-wait", "1m")
    install_spec(server, "python3-16g", "--gpu-mem", "16G", "--time", "10m", "--max-wait", "1m")
    install_spec(server, "python3-gpu", "--gpus", "1", "--time", "10m", "--max-wait", "2s")
    server.start()
    client = server.client()
    k = kernels(server)
    specs = k.http.get("api/kernelspecs").json()["kernelspecs"]  # what the launcher shows
    assert specs["python3-half"]["spec"]["display_name"] == "Python 3 (0.5 of a GPU, 10m)"
    assert specs["python3-16g"]["spec"]["display_name"] == "Python 3 (16G of a GPU, 10m)"

    first, second = k.start_ok("python3-half"), k.start_ok("python3-16g")
    jobs = {j["name"]: j for j in kernel_jobs(client)}
    assert jobs["kernel python3-half"]["state"] == jobs["kernel python3-16g"]["state"] == "RUNNING"
    assert (jobs["kernel python3-half"]["share"], jobs["kernel python3-16g"]["gpu_memory"]) == (0.5, 16 << 30)
    assert k.evaluate(first, "os.environ['CUDA_VISIBLE_DEVICES']") == "0"
    assert k.evaluate(second, "os.environ['CUDA_VISIBLE_DEVICES']") == "0"
    # each kernel gets the memory hints of its share (docs/sharing-gpus.md)
    assert k.evaluate(first, "os.environ['GPUJOBS_GPU_MEMORY'] + ' ' + os.environ['XLA_PYTHON_CLIENT_MEM_FRACTION']") \
        == f"{40 << 30} 0.50"
    assert k.evaluate(second, "os.environ['GPUJOBS_GPU_MEMORY'] + ' ' + os.environ['GPUJOBS_GPU_MEMORY_FRACTION']") \
        == f"{16 << 30} 0.200"
    k.evaluate(first, "os.getpid()")
    k.evaluate(second, "os.getpid()")
    # the card holds shares: a whole-GPU kernel waits, and gives up at its maximum wait
    r = k.start("python3-gpu")
    assert r.status_code == 503 and "no GPU became free for kernel 'python3-gpu' within 2s" in r.text, r.text
    for kid in (first, second):
        assert k.http.delete(f"api/kernels/{kid}").status_code == 204

"""Helpers of the browser tests: start and stop a real `jupyter lab` (fake GPUs, a non-root
base_url, isolated Jupyter dirs), drive its page, take screenshots (tests/ui/screenshots/)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
BASE_URL = "/lab-under-test/"
FAKE_GPUS = "2xA100"
SCREENSHOTS = Path(__file__).with_name("screenshots")
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Lab:
    url: str  # http://127.0.0.1:PORT/lab-under-test/
    root: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def isolated_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("GPUJOBS_URL", "GPUJOBS_TOKEN", "JUPYTER_TOKEN"):
        env.pop(key, None)
    env.update({
        "JUPYTER_DATA_DIR": str(tmp / "data"),
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp / "lab-settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "lab-workspaces"),
        "IPYTHONDIR": str(tmp / "ipython"),
        "GPUJOBS_FAKE_GPUS": FAKE_GPUS,
        "JUPYTER_PLATFORM_DIRS": "1",
        # the isolated data dir before the venv's share/jupyter (jupyter_core puts a venv's
        # first): the venv holds the copy of the extension made when it was installed, and the
        # tests must load this checkout's build (use_repo_build)
        "JUPYTER_PREFER_ENV_PATH": "0",
    })
    env.update(extra)
    # No "get notified about Jupyter news?" toast over the panel in screenshots or over the
    # notifications under test: news are never fetched, and the plugin that asks is off.
    news = tmp / "lab-settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True, exist_ok=True)
    news.write_text('{"fetchNews": "false"}')
    page_config = Path(env["JUPYTER_CONFIG_DIR"]) / "labconfig" / "page_config.json"
    page_config.parent.mkdir(parents=True, exist_ok=True)
    page_config.write_text('{"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": true}}')
    return env


def use_repo_build(env: dict[str, str]) -> None:
    """Make Lab load this checkout's built extension (jupyter_gpujobs/labextension, which
    `pip install -e .` and `jlpm build` write): linked into the isolated JUPYTER_DATA_DIR, which
    comes first in Lab's extension path, so it wins over one the Python environment holds."""
    build = REPO / "jupyter_gpujobs" / "labextension"
    if not (build / "package.json").exists():
        return
    link = Path(env["JUPYTER_DATA_DIR"]) / "labextensions" / "jupyter-gpujobs"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.symlink_to(build.resolve(), target_is_directory=True)


def start_lab(tmp: Path, *, jupyter: str | None = None, env: dict[str, str] | None = None,
              extra_args: list[str] | None = None, timeout: float = 90, root: Path | None = None,
              wrapper: list[str] | None = None) -> Lab:
    """Start `jupyter lab` in `root` (default tmp/root) and wait until it answers."""
    root = root or tmp / "root"
    root.mkdir(parents=True, exist_ok=True)
    env = env or isolated_env(tmp)
    if jupyter is None:  # this environment's Lab: test this checkout's build
        use_repo_build(env)
    port = free_port()
    jupyter = jupyter or str(Path(sys.executable).with_name("jupyter"))
    log_path = tmp / "lab.log"
    cmd = [
        *(wrapper or []), jupyter, "lab", "--no-browser", "--ip", "127.0.0.1", "--port", str(port),
        "--IdentityProvider.token=", "--allow-root", f"--ServerApp.base_url={BASE_URL}",
        f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
        "--GPUJobs.tick_interval=0.5", "--GPUJobs.kill_grace=1",
        # With no token, the test's own CLI / Python client (no browser cookie) could not POST.
        "--ServerApp.disable_check_xsrf=True",
        *(extra_args or []),
    ]
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}{BASE_URL}"
    lab = Lab(url=url, root=root, env=env, proc=proc, log_path=log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {proc.returncode}:\n{lab.log_tail()}")
        try:
            r = httpx.get(url + "api/status", timeout=2)
            if r.status_code == 200:
                return lab
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    stop_lab(lab)
    raise RuntimeError(f"jupyter lab did not answer at {url} within {timeout}s:\n{lab.log_tail()}")


def stop_lab(lab: Lab) -> None:
    if lab.proc.poll() is None:
        lab.proc.terminate()
        try:
            lab.proc.wait(15)
        except subprocess.TimeoutExpired:
            lab.proc.kill()
            lab.proc.wait(5)


def open_lab(pg: Any, url: str, theme: str | None = None, workspace: str | None = None) -> None:
    """JupyterLab at `url`, in its default workspace or the named one (its own saved layout)."""
    pg.goto(url + (f"lab/workspaces/{workspace}" if workspace else "lab"), wait_until="domcontentloaded")
    pg.wait_for_function("window.jupyterapp && window.jupyterapp.started !== undefined", timeout=60000)
    pg.wait_for_selector("#jp-main-dock-panel", timeout=60000)
    pg.evaluate("window.jupyterapp.started")
    # the layout restorer puts the saved (or default) sidebar back when it is done: a panel
    # opened before that can be hidden again
    pg.evaluate("async () => { await window.jupyterapp.restored; }")
    pg.wait_for_selector(".jp-GPUJobs-status", timeout=30000)
    if theme:
        set_theme(pg, theme)


def run_command(pg: Any, command: str, args: dict[str, Any] | None = None) -> None:
    """Start a JupyterLab command; the caller waits for its effect in the page.

    The command's promise is not awaited: its result (often a widget) is too deep for
    Playwright to serialize ("object reference chain is too long"), and some commands, such
    as running every cell of a notebook, settle only long after what a test looks for. A
    command that fails logs its error to the browser console.
    """
    pg.evaluate(
        "([c, a]) => { window.jupyterapp.commands.execute(c, a)"
        ".catch(e => console.error('command ' + c + ' failed', e)); }",
        [command, args or {}],
    )


def wait_for_kernel(pg: Any, timeout: float = 60000) -> None:
    """Wait until the current notebook's kernel is connected and idle. Running cells before
    that opens JupyterLab's "Select Kernel" dialog instead of running them."""
    pg.wait_for_function(
        """() => {
            const w = window.jupyterapp.shell.currentWidget;
            const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
            return !!k && k.connectionStatus === 'connected' && k.status === 'idle';
        }""",
        timeout=timeout,
    )


def set_theme(pg: Any, theme: str) -> None:
    run_command(pg, "apputils:change-theme", {"theme": theme})
    pg.wait_for_function(
        "t => document.body.dataset.jpThemeName === t", arg=theme, timeout=20000
    )
    pg.wait_for_timeout(500)


def open_panel(pg: Any) -> Any:
    run_command(pg, "gpujobs:open-panel")
    panel = pg.locator("#gpujobs-panel")
    panel.wait_for(state="visible", timeout=10000)
    return panel


def screenshot(pg: Any, name: str, locator: Any | None = None) -> Path:
    SCREENSHOTS.mkdir(exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    (locator or pg).screenshot(path=str(path))
    return path


@contextmanager
def screenshot_on_failure(pg: Any, name: str) -> Iterator[None]:
    """Leave `FAILED-<name>.png` of the page if the block fails (tests that make their own
    page; the `page` fixture does this for the others)."""
    try:
        yield
    except Exception:
        screenshot(pg, f"FAILED-{name}")
        raise


def copy_to_docs(path: Path, name: str) -> None:
    """With GPUJOBS_UPDATE_DOCS_IMAGES=1, refresh the README images (docs/images/, committed)."""
    if os.environ.get("GPUJOBS_UPDATE_DOCS_IMAGES") != "1":
        return
    dest = REPO / "docs" / "images" / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, dest)


# ------------------------------------------------------------------ jobs and waits for UI tests


def sleeper(seconds: float, code: int = 0) -> list[str]:
    """A job that sleeps, then exits with `code`."""
    return [sys.executable, "-c", f"import sys, time; time.sleep({seconds}); sys.exit({code})"]


def burner(seconds: float, share: float) -> list[str]:
    """Busy `share` of the time: fake GPUs show the CPU use of their jobs as utilization."""
    code = (f"import time\nend = time.time() + {seconds}\n"
            f"while time.time() < end:\n    t = time.time() + {share} * 0.1\n"
            f"    while time.time() < t: pass\n    time.sleep({1 - share} * 0.1)")
    return [sys.executable, "-c", code]


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """`check()`'s first true value, polled until `timeout` (AssertionError naming `what`)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def drain_engine(client: Any) -> None:
    """Cancel every pending and running job of the Lab's engine, and wait until none is left."""
    for job in client.jobs(state="PENDING,RUNNING", limit=1000)["jobs"]:
        try:
            client.cancel(job["id"])
        except Exception:
            pass
    wait_for(lambda: not client.jobs(state="PENDING,RUNNING")["jobs"], 30, "the engine to be idle")

"""Browser tests of the JupyterLab extension: a real `jupyter lab` (fake GPUs, a non-root
base_url, isolated Jupyter dirs) driven by Debian's Chromium through Python Playwright.

The server is started once per session in a temporary root dir; every test gets a fresh page
on it. Screenshots land in tests/ui/screenshots/ (gitignored). Helpers are in labtools.py.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from labtools import (  # noqa: E402
    CHROMIUM,
    CHROMIUM_ARGS,
    SCREENSHOTS,
    Lab,
    drain_engine,
    open_lab,
    start_lab,
    stop_lab,
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ui: browser tests of the JupyterLab extension (Chromium)")
    config.addinivalue_line("markers", "slow: builds a wheel / fresh venvs; minutes")


@pytest.fixture(autouse=True)
def jp_asyncio_loop() -> Iterator[None]:
    """pytest-jupyter's autouse loop fixture would close Playwright's running loop; these tests
    talk to a server in another process and need no loop of their own."""
    yield None


@pytest.fixture(autouse=True)
def jp_server_cleanup() -> Iterator[None]:
    """No in-process server to clean up (see jp_asyncio_loop)."""
    yield None


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("lab")
    server = start_lab(tmp)
    r = httpx.get(server.url + "gpujobs/api/whoami", timeout=5)
    assert r.status_code == 200, f"the gpujobs API is not there ({r.status_code}):\n{server.log_tail()}"
    yield server
    stop_lab(server)


@pytest.fixture(scope="session")
def client(lab: Lab) -> Iterator[Any]:
    from jupyter_gpujobs.client import GPUJobsClient

    with GPUJobsClient(url=lab.url, token="") as c:
        yield c


@pytest.fixture
def idle_engine(client: Any) -> Iterator[None]:
    """The test starts (and leaves) the Lab's engine with nothing pending or running."""
    drain_engine(client)
    yield
    drain_engine(client)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium for one test module. Not for the session: while Playwright's sync API is open its
    event loop counts as running in this thread, and the test files that a parallel worker runs
    after this one would find it in place of their own (pytest-jupyter's loop)."""
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run scripts/install-browser.sh"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, lab: Lab, request: pytest.FixtureRequest) -> Iterator[Any]:
    # a fixed locale, not the machine's: the UI follows it (times, 12-hour in en-US)
    context = browser.new_context(viewport={"width": 1400, "height": 900}, locale="en-US")
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    open_lab(pg, lab.url)
    yield pg
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        SCREENSHOTS.mkdir(exist_ok=True)
        pg.screenshot(path=str(SCREENSHOTS / f"FAILED-{request.node.name}.png"))
    context.close()
    assert not [e for e in errors if "gpujobs" in e.lower()], errors


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)



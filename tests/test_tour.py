"""A new user's first notebook jobs on a live server: binder/tour.ipynb run as a notebook job
(it must finish, not cancel itself), jobs named after their notebook, and a failing assertion
that names its cell and line."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

BINDER = Path(__file__).parent.parent / "binder"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from test_magics import shared_server

    yield from shared_server(tmp_path_factory, "2xA100-80GB,2xT4")  # the tour's fake GPUs


def write(path: Path, *sources: str) -> Path:
    nb = new_notebook(cells=[new_code_cell(s) for s in sources],
                      metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(nb, str(path))
    return path


def by_name(client: Any) -> dict[str, dict[str, Any]]:
    return {j["name"]: j for j in client.jobs(limit=100)["jobs"]}


def test_the_tour_runs_as_a_notebook_job(server: Any) -> None:
    for name in ("tour.ipynb", "square.ipynb"):
        shutil.copy(BINDER / name, server.root / name)
    cli = server.cli("run-notebook", "tour.ipynb", "-g", "1", "-t", "5m", "--json")
    assert cli.returncode == 0, cli.stderr
    job = json.loads(cli.stdout)
    assert job["name"] == "tour"  # named after the notebook, as the Lab's dialog names it
    with server.client() as client:
        done = client.wait(job["id"], timeout=240)
        log = client.log(job["id"])["data"]
        assert done["state"] == "COMPLETED", (done, log)  # its tidy-up cancels only what it started
        jobs = by_name(client)
    assert jobs["tour-cell"]["state"] == "COMPLETED"
    assert jobs["square"]["kind"] == "notebook"  # `%gpujobs run square.ipynb`
    assert {jobs[f"tour-sleep-{i}"]["state"] for i in range(3)} <= {"CANCELLED", "COMPLETED"}
    nb = nbformat.read(str(server.root / done["output_notebook"]), as_version=4)
    assert nb.metadata.gpujobs.status == "completed"


def test_jobs_are_named_after_their_notebook(server: Any) -> None:
    (server.root / "exp").mkdir()
    write(server.root / "exp" / "train.ipynb", "%load_ext jupyter_gpujobs",
          "%%gpujob -g 0 -t 1m\nprint('in the cell job')")
    with server.client() as client:
        cli = server.cli("run-notebook", "exp/train.ipynb", "-g", "0", "-t", "5m", "--json")
        assert cli.returncode == 0, cli.stderr
        job = json.loads(cli.stdout)
        done = client.wait(job["id"], timeout=120)
        log = client.log(job["id"])["data"]
        assert done["state"] == "COMPLETED", (done, log)
        assert done["name"] == "train"
        assert "in the cell job" in log
        cells = [j for j in client.jobs(kind="cell", limit=100)["jobs"] if j["id"] > job["id"]]
        assert [j["name"] for j in cells] == ["cell of train.ipynb"]  # as docs/notebooks.md says
        named = client.submit_notebook("exp/train.ipynb", gpus=0, name="mine")
        assert named["name"] == "mine"
        client.cancel(named["id"])
        client.wait(named["id"], timeout=60)


def test_a_failing_assertion_names_its_cell_and_line(server: Any) -> None:
    write(server.root / "check.ipynb", "x = 1", "y = 2\nassert x == y\nprint('never')")
    with server.client() as client:
        job = client.submit_notebook("check.ipynb", gpus=0, time_limit="5m")
        done = client.wait(job["id"], timeout=120)
        log = client.log(job["id"])["data"]
    assert done["state"] == "FAILED", (done, log)
    assert "cell 2/2 failed: AssertionError at line 2: assert x == y" in log
    nb = nbformat.read(str(server.root / done["output_notebook"]), as_version=4)
    assert "at line 2: `assert x == y`" in nb.cells[0].source  # the note at the top
    assert nb.metadata.gpujobs.failed_line == 2


def readme_notebook_cells() -> list[str]:
    """The python cells of the README's "In the notebook", up to its PyTorch variant."""
    import re

    text = (Path(__file__).parent.parent / "README.md").read_text()
    section = text.split("## In the notebook", 1)[1].split("With PyTorch installed", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_readme_notebook_example_runs_as_written(server: Any) -> None:
    cells = readme_notebook_cells()
    assert cells[0].strip() == "%load_ext jupyter_gpujobs" and len(cells) == 4
    write(server.root / "readme.ipynb", *cells)
    with server.client() as client:
        job = client.submit_notebook("readme.ipynb", gpus=0, time_limit="5m")
        done = client.wait(job["id"], timeout=180)
        log = client.log(job["id"])["data"]
    assert done["state"] == "COMPLETED", (done, log)
    nb = nbformat.read(str(server.root / done["output_notebook"]), as_version=4)
    streamed = "".join(o.get("text", "") for o in nb.cells[2].outputs)
    assert "on GPU " in streamed and "step 4 loss 0.714" in streamed
    assert nb.cells[3].outputs[0]["data"]["text/plain"] == "0.7142857142857143"

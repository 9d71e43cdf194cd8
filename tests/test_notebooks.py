"""Queued notebook execution: payload checks, the job's command and output path, and real notebook
jobs on a live server (injected parameters, outputs, the error cell of a failing notebook)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from jupyter_gpujobs.model import InvalidInput, Job
from jupyter_gpujobs.notebook.notebooks import (
    INJECTED_TAG,
    check_notebook_files,
    check_notebook_payload,
    inject_parameters,
    notebook_command,
)

KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


def write_notebook(path: Path, cells: list[Any], tag_parameters: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nb = new_notebook(cells=cells, metadata={"kernelspec": KERNELSPEC})
    nbformat.write(nb, str(path))
    return path


def param_notebook(path: Path, fail: bool = False) -> Path:
    cells = [
        new_markdown_cell("# training"),
        new_code_cell("alpha = 1.0\nepochs = 1\nname = 'default'", metadata={"tags": ["parameters"]}),
        new_code_cell("import os\nprint('alpha', alpha, 'epochs', epochs, 'name', name)\n"
                      "print('gpus', os.environ.get('CUDA_VISIBLE_DEVICES'))"),
        new_code_cell("result = alpha * epochs\nresult"),
    ]
    if fail:
        cells.append(new_code_cell("raise ValueError(f'bad alpha {alpha}')"))
        cells.append(new_code_cell("print('never')"))
    return write_notebook(path, cells)


# ----------------------------------------------------------------------------- payload checks


def test_payload_is_normalised_with_absolute_paths(tmp_path: Path) -> None:
    param_notebook(tmp_path / "sub" / "train.ipynb")
    out = check_notebook_payload({"notebook": "sub/train.ipynb", "parameters": {"alpha": 0.1}}, tmp_path)
    assert out == {"notebook": str(tmp_path / "sub" / "train.ipynb"), "parameters": {"alpha": 0.1},
                   "kernel": None, "output": None}
    out = check_notebook_payload({"notebook": str(tmp_path / "sub" / "train.ipynb"), "output": "sub"}, tmp_path)
    assert out["output"] == str(tmp_path / "sub") and out["parameters"] == {}


@pytest.mark.parametrize("payload, field, words", [
    ({}, "payload.notebook", "path of the notebook"),
    ({"notebook": "missing.ipynb"}, "payload.notebook", "no such notebook"),
    ({"notebook": "train.py"}, "payload.notebook", "not a notebook"),
    ({"notebook": "junk.ipynb"}, "payload.notebook", "cannot read"),
    ({"notebook": "train.ipynb", "parameters": [1]}, "payload.parameters", "object"),
    ({"notebook": "train.ipynb", "parameters": {"not a name": 1}}, "payload.parameters", "variable name"),
    ({"notebook": "train.ipynb", "kernel": "no-such-kernel"}, "payload.kernel", "no kernel named"),
    ({"notebook": "train.ipynb", "output": "nowhere/deep/out.ipynb"}, "payload.output", "no such folder"),
    ({"notebook": "train.ipynb", "output": "train.ipynb"}, "payload.output", "overwrite"),
    ({"notebook": "train.ipynb", "colour": "red"}, "payload.colour", "unknown field"),
])
def test_bad_payload_names_the_field(tmp_path: Path, payload: dict[str, Any], field: str, words: str) -> None:
    param_notebook(tmp_path / "train.ipynb")
    (tmp_path / "train.py").write_text("")
    (tmp_path / "junk.ipynb").write_text("{not json")
    with pytest.raises(InvalidInput) as err:  # its shape, then its files as the user (here: the engine's own)
        asyncio.run(check_notebook_files(check_notebook_payload(payload, tmp_path), None))
    assert err.value.field == field
    assert words in err.value.message


def _job(payload: dict[str, Any], job_id: int = 7, array_index: int | None = None) -> Job:
    return Job(id=job_id, user="u", kind="notebook", payload=payload, array_index=array_index)


def test_command_and_default_output_next_to_the_input(tmp_path: Path) -> None:
    param_notebook(tmp_path / "sub" / "train.ipynb")
    payload = check_notebook_payload({"notebook": "sub/train.ipynb", "parameters": {"alpha": 0.1}}, tmp_path)
    command, out = notebook_command(_job(payload), tmp_path)
    assert command[:4] == [sys.executable, "-m", "jupyter_gpujobs.notebook.notebooks", "run"]
    assert command[4] == str(tmp_path / "sub" / "train.ipynb")
    assert command[command.index("--output") + 1] == str(tmp_path / "sub" / "train-job7.ipynb")
    assert json.loads(command[command.index("--parameters") + 1]) == {"alpha": 0.1}
    assert out["output"] == "sub/train-job7.ipynb"  # relative to the root, as the lab UI opens it


def test_output_folder_file_and_outside_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    param_notebook(root / "train.ipynb")
    (root / "results").mkdir()
    payload = check_notebook_payload({"notebook": "train.ipynb", "output": "results"}, root)
    assert notebook_command(_job(payload), root)[1]["output"] == "results/train-job7.ipynb"
    payload = check_notebook_payload({"notebook": "train.ipynb", "output": "results/run.ipynb"}, root)
    assert notebook_command(_job(payload), root)[1]["output"] == "results/run.ipynb"
    assert notebook_command(_job(payload, array_index=3), root)[1]["output"] == "results/run-3.ipynb"
    payload = check_notebook_payload({"notebook": "train.ipynb", "output": str(tmp_path)}, root)
    assert notebook_command(_job(payload), root)[1]["output"] == str(tmp_path / "train-job7.ipynb")


def test_parameters_go_after_the_parameters_cell_or_first(tmp_path: Path) -> None:
    nb = nbformat.read(str(param_notebook(tmp_path / "a.ipynb")), as_version=4)
    assert inject_parameters(nb, {"alpha": 0.5, "name": "run1", "layers": [1, 2], "flag": True}) == 2
    cell = nb.cells[2]
    assert cell.metadata.tags == [INJECTED_TAG]
    assert "alpha = 0.5\n" in cell.source and "name = 'run1'\n" in cell.source
    assert "layers = [1, 2]\n" in cell.source and "flag = True\n" in cell.source
    # running an output notebook again replaces the earlier injected cell
    assert inject_parameters(nb, {"alpha": 2}) == 2
    assert sum(INJECTED_TAG in c.metadata.get("tags", []) for c in nb.cells) == 1
    plain = new_notebook(cells=[new_code_cell("print(1)")])
    assert inject_parameters(plain, {"x": 1}) == 0


# ----------------------------------------------------------------------------- notebook jobs


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from test_magics import shared_server

    yield from shared_server(tmp_path_factory, "1xA100")


def _outputs_text(cell: Any) -> str:
    parts = []
    for o in cell.get("outputs", []):
        parts.append(o.get("text", "") or json.dumps(o.get("data", {})) + o.get("ename", "") + o.get("evalue", ""))
    return "".join(parts)


def test_notebook_job_writes_executed_notebook_with_parameters(server: Any) -> None:
    param_notebook(server.root / "exp" / "train.ipynb")
    with server.client() as client:
        job = client.submit_notebook("exp/train.ipynb", parameters={"alpha": 0.5, "epochs": 3, "name": "r1"},
                                     gpus=1, time_limit="5m")
        assert job["output_notebook"] == f"exp/train-job{job['id']}.ipynb"
        done = client.wait(job["id"], timeout=60)
        log = client.log(job["id"])["data"]
    assert done["state"] == "COMPLETED", (done, log)
    assert "executing cell 1/4" in log and "executing cell 4/4" in log
    assert "alpha 0.5 epochs 3 name r1" in log  # the cells' prints are in the job log
    # the job's kernel speaks over Unix sockets of the job's own, not TCP that any local user
    # could listen to (ipykernel warns about it at the top of every log)
    assert "without encryption" not in log, log
    nb = nbformat.read(str(server.root / done["output_notebook"]), as_version=4)
    injected = [c for c in nb.cells if INJECTED_TAG in c.metadata.get("tags", [])]
    assert len(injected) == 1 and "epochs = 3" in injected[0].source
    assert nb.cells.index(injected[0]) == 2  # right after the parameters cell
    printed = _outputs_text(nb.cells[3])
    assert "alpha 0.5 epochs 3 name r1" in printed
    assert f"gpus {done['assigned_gpus'][0]}" in printed  # the kernel inherited CUDA_VISIBLE_DEVICES
    assert "1.5" in _outputs_text(nb.cells[4])
    assert nb.metadata.gpujobs.status == "completed"
    assert nb.metadata.gpujobs.job_id == str(job["id"])


def test_failing_notebook_job_output_shows_the_error_cell(server: Any) -> None:
    param_notebook(server.root / "train.ipynb", fail=True)
    (server.root / "out").mkdir()
    cli = server.cli("run-notebook", str(server.root / "train.ipynb"), "-g", "1", "-t", "5m",
                     "-p", "alpha=7", "--output", str(server.root / "out"), "--json")
    assert cli.returncode == 0, cli.stderr
    job = json.loads(cli.stdout)
    assert job["output_notebook"] == f"out/train-job{job['id']}.ipynb"
    with server.client() as client:
        done = client.wait(job["id"], timeout=60)
        log = client.log(job["id"])["data"]
    assert done["state"] == "FAILED", (done, log)
    assert "cell 5/6 failed: ValueError: bad alpha 7" in log
    nb = nbformat.read(str(server.root / done["output_notebook"]), as_version=4)
    assert "failed at cell 5/6" in nb.cells[0].source  # a note at the top says where
    failed = nb.cells[nb.metadata.gpujobs.failed_cell]
    errors = [o for o in failed.outputs if o.output_type == "error"]
    assert errors and errors[0].ename == "ValueError" and errors[0].evalue == "bad alpha 7"
    assert nb.cells[-1].outputs == []  # the cells after it did not run
    assert "alpha = 7" in nb.cells[3].source  # the injected cell (after the note)


def test_rest_rejects_a_bad_notebook_payload(server: Any) -> None:
    from jupyter_gpujobs.client import GPUJobsError

    with server.client() as client:
        with pytest.raises(GPUJobsError) as err:
            client.submit_notebook("nope.ipynb")
        assert err.value.status == 400 and err.value.field == "payload.notebook"
        assert "no such notebook" in err.value.message

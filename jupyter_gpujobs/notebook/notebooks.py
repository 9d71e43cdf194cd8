"""Queued notebook execution: a job of kind `notebook` runs a whole notebook with nbclient on its
allocated GPUs, papermill-style.

This module owns both sides of it:

- the engine side, called by the engine on submission: `check_notebook_payload()` validates and
  normalises the payload (`notebook`, `parameters`, `kernel`, `output`) without touching a file the
  user named; `check_notebook_files()` then has the notebook and the output folder looked at as the
  user (`engine.userfiles`: a helper process with the user's uid, off the engine's loop, bounded in
  time and size; a file the user may not read gets the same answer as a missing one);
  `notebook_command()` gives the job its command and its output path;
- the job side, `python -m jupyter_gpujobs.notebook.notebooks run NB --output OUT [--parameters JSON]
  [--kernel K]`: injects the parameters as a cell tagged `injected-parameters` after the cell
  tagged `parameters` (or at the top), executes every cell in a kernel that inherits the job's
  `CUDA_VISIBLE_DEVICES` (and `JPY_SESSION_NAME`, the notebook's path, as a kernel started by
  Jupyter has it), prints `executing cell 3/12` lines and the cells' output to the job log, and
  writes the executed notebook after every cell, at the end, and on failure (the failing cell
  keeps its error output; a note at the top and the log name the cell and its failing line; the
  exit status is 1). Stopped by SIGTERM (cancel, time limit), it writes what it has; exit 143.
  It records the last cell completed in the job's checkpoint folder (`PROGRESS_FILE`,
  jupyter_gpujobs.checkpoint); a run of the same job after a requeue (preemption, a time limit
  with `requeue`, a lost run) resumes after that cell, from the notebook the run before wrote:
  the cells before it tagged `setup` (and the parameters) run again first to rebuild the
  kernel's state, the others keep their outputs, and the log says so.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from ..model import InvalidInput, Job

if TYPE_CHECKING:
    from ..engine.userfiles import Bounds

PAYLOAD_FIELDS = ("notebook", "parameters", "kernel", "output")
INJECTED_TAG = "injected-parameters"
PARAMETERS_TAG = "parameters"
ERROR_TAG = "gpujobs-error"
#: cells run again before a requeued run resumes (they rebuild the kernel's state: imports, data, model)
SETUP_TAG = "setup"
#: in the job's checkpoint folder: {"input", "last"} (the index of the last cell completed)
PROGRESS_FILE = "notebook-progress.json"


# ----------------------------------------------------------------------------- engine side


def _resolve(path: str, root_dir: Path) -> Path:
    p = Path(os.path.expanduser(path))
    if not p.is_absolute():
        p = Path(root_dir) / p
    return Path(os.path.normpath(p))


def check_notebook_payload(payload: dict[str, Any], root_dir: Path) -> dict[str, Any]:
    """Validate a notebook job's payload; the normalised payload (absolute paths). Opens no
    file the user named: `check_notebook_files` looks at those, as the user.

    Raises InvalidInput naming the field (`payload.notebook`, `payload.parameters`, ...)."""
    if not isinstance(payload, dict):
        raise InvalidInput("payload", "expected an object with notebook, parameters, kernel, output")
    unknown = sorted(set(payload) - set(PAYLOAD_FIELDS))
    if unknown:
        raise InvalidInput(f"payload.{unknown[0]}", "unknown field; expected notebook, parameters, kernel, output")

    notebook = payload.get("notebook")
    if not isinstance(notebook, str) or not notebook.strip():
        raise InvalidInput("payload.notebook", "give the path of the notebook to run (e.g. analysis.ipynb)")
    nb_path = _resolve(notebook, root_dir)
    if nb_path.suffix != ".ipynb":
        raise InvalidInput("payload.notebook", f"{notebook!r} is not a notebook (.ipynb)")

    parameters = payload.get("parameters")
    if parameters is None:
        parameters = {}
    if not isinstance(parameters, dict):
        raise InvalidInput("payload.parameters", "expected an object of NAME: value")
    for name, value in parameters.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise InvalidInput("payload.parameters", f"{name!r} is not a variable name")
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            raise InvalidInput("payload.parameters", f"the value of {name} is not a JSON value") from None

    kernel = payload.get("kernel")
    if kernel is not None:
        if not isinstance(kernel, str) or not kernel.strip():
            raise InvalidInput("payload.kernel", "expected a kernel name such as python3")
        from jupyter_client.kernelspec import find_kernel_specs

        specs = find_kernel_specs()
        if kernel not in specs:
            known = ", ".join(sorted(specs)) or "none"
            raise InvalidInput("payload.kernel", f"no kernel named {kernel!r}; installed: {known}")

    output = payload.get("output")
    out_path: Path | None = None
    if output is not None:
        if not isinstance(output, str) or not output.strip():
            raise InvalidInput("payload.output", "expected the path of the executed notebook or a folder")
        out_path = _resolve(output, root_dir)
        if out_path == nb_path:
            raise InvalidInput("payload.output", "the output would overwrite the input notebook")

    return {
        "notebook": str(nb_path),
        "parameters": dict(parameters),
        "kernel": kernel,
        "output": str(out_path) if out_path is not None else None,
    }


async def check_notebook_files(payload: dict[str, Any], unix_user: str | None, bounds: Bounds | None = None,
                               python: str = "") -> None:
    """Look at a normalised payload's notebook and output folder as `unix_user` (None: the
    engine's own user), off the engine's loop (`engine.userfiles.check_notebook`): the notebook
    must be a regular file of at most `bounds.max_bytes` holding a notebook, and the folder the
    executed notebook goes to must exist (or, for an output folder, its parent) and be
    writable. Raises InvalidInput naming the field; a notebook the user may not read is
    answered as a missing one, whatever root could read."""
    from ..engine.userfiles import Bounds, HelperFailed, check_notebook

    bounds = bounds or Bounds()
    notebook = payload["notebook"]
    output = payload.get("output")
    if output is None:
        folder, create = str(Path(notebook).parent), False
    elif output.endswith(".ipynb"):
        folder, create = str(Path(output).parent), False
    else:
        folder, create = output, True
    who = unix_user or "you"
    try:
        verdict = await check_notebook(unix_user, notebook, folder, create, bounds, python)
    except HelperFailed as err:
        raise InvalidInput("payload.notebook", f"could not check {notebook} as {who}: {err}") from None
    problems = {
        "missing": f"no such notebook, or {who} may not read it: {notebook}",
        "not_a_file": f"{notebook} is not a file (a folder, FIFO or device cannot be run as a notebook)",
        "too_big": f"{notebook} is larger than {_mb(bounds.max_bytes)}, the most a notebook job may be here "
                   "(c.GPUJobs.notebook_max_size)",
        "not_json": f"cannot read {notebook} as a notebook: {verdict.detail or 'not JSON'}",
        "no_cells": f"{notebook} is not a Jupyter notebook (no cells)",
    }
    if verdict.notebook != "ok":
        raise InvalidInput("payload.notebook", problems.get(verdict.notebook, f"cannot check {notebook}"))
    if verdict.folder == "missing":
        missing = output if create and output else folder
        raise InvalidInput("payload.output" if output else "payload.notebook", f"no such folder: {missing}")
    if verdict.folder == "not_writable":
        raise InvalidInput("payload.output" if output else "payload.notebook",
                           f"{who} may not write the executed notebook into {folder}")


def _mb(n: int) -> str:
    return f"{n / (1 << 20):g} MB"


def output_path(job: Job, root_dir: Path) -> Path:
    """Where the executed notebook of `job` goes: `<stem>-job<ID>.ipynb` next to the input, in the
    given folder, or the given .ipynb path (`-<array index>` added for an array task)."""
    payload = job.payload
    nb = Path(payload["notebook"])
    default_name = f"{nb.stem}-job{job.id}.ipynb"
    given = payload.get("output")
    if not given:
        return nb.parent / default_name
    out = _resolve(given, root_dir)
    if out.suffix != ".ipynb":
        return out / default_name
    if job.array_index is not None:
        return out.with_name(f"{out.stem}-{job.array_index}{out.suffix}")
    return out


def notebook_command(job: Job, root_dir: Path, python: str | None = None) -> tuple[list[str], dict[str, Any]]:
    """The command of a notebook job and its payload with `output` filled in (relative to
    `root_dir` when inside it, as the lab UI opens it by that path). `python`: the interpreter
    that runs it (default: the engine's own; jobs run as their owners need one they can run)."""
    payload = dict(job.payload)
    out = output_path(job, root_dir)
    command = [python or sys.executable, "-m", "jupyter_gpujobs.notebook.notebooks", "run", str(payload["notebook"]),
               "--output", str(out)]
    if payload.get("parameters"):
        command += ["--parameters", json.dumps(payload["parameters"])]
    if payload.get("kernel"):
        command += ["--kernel", str(payload["kernel"])]
    try:
        shown = out.relative_to(Path(root_dir).resolve()).as_posix()
    except ValueError:
        try:
            shown = out.relative_to(Path(root_dir)).as_posix()
        except ValueError:
            shown = str(out)
    payload["output"] = shown
    return command, payload


# ----------------------------------------------------------------------------- job side


def inject_parameters(nb: Any, parameters: dict[str, Any]) -> int | None:
    """Put `parameters` in a new code cell tagged `injected-parameters`, after the cell tagged
    `parameters` (or first); an injected cell of an earlier run is replaced. Returns its index."""
    import nbformat

    nb.cells = [c for c in nb.cells if INJECTED_TAG not in c.get("metadata", {}).get("tags", [])]
    if not parameters:
        return None
    where = 0
    for i, cell in enumerate(nb.cells):
        if PARAMETERS_TAG in cell.get("metadata", {}).get("tags", []):
            where = i + 1
            break
    source = "# Parameters\n" + "".join(f"{name} = {value!r}\n" for name, value in parameters.items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": [INJECTED_TAG]})
    if nb.get("nbformat_minor", 5) < 5:
        cell.pop("id", None)
    nb.cells.insert(where, cell)
    return where


def _error_note(nb: Any, text: str) -> None:
    import nbformat

    note = nbformat.v4.new_markdown_cell(text, metadata={"tags": [ERROR_TAG]})
    if nb.get("nbformat_minor", 5) < 5:
        note.pop("id", None)
    nb.cells = [c for c in nb.cells if ERROR_TAG not in c.get("metadata", {}).get("tags", [])]
    nb.cells.insert(0, note)


class _Stopped(BaseException):
    """SIGTERM (cancel, time limit, preemption) while the notebook runs."""


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def failing_line(traceback_text: str, source: str) -> tuple[int, str] | None:
    """(line number, text) of the failing cell's line in an IPython traceback: the first
    `Cell In[N], line L` frame is the cell's own (deeper ones may be other cells' functions)."""
    found = re.search(r"Cell In\[\d+\], line (\d+)", _ANSI.sub("", traceback_text))
    if not found:
        return None
    n = int(found.group(1))
    lines = source.splitlines()
    return (n, lines[n - 1].strip()) if 0 < n <= len(lines) else None


def execute_notebook(input_path: Path, output: Path, parameters: dict[str, Any] | None = None,
                     kernel: str | None = None) -> int:
    """Execute a notebook into `output`; returns the exit status (0 ok, 1 a cell failed,
    143 stopped by SIGTERM)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    from traitlets.config import Config

    from .. import checkpoint

    progress_path = checkpoint.folder() / PROGRESS_FILE if checkpoint.in_job() else None
    last = _resume_point(progress_path, input_path, output)
    nb = nbformat.read(str(output if last is not None else input_path), as_version=4)
    nb.cells = [c for c in nb.cells if ERROR_TAG not in c.get("metadata", {}).get("tags", [])]
    inject_parameters(nb, parameters or {})
    kernel_name = kernel or nb.metadata.get("kernelspec", {}).get("name") or "python3"
    runnable = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip()]
    number = {index: n + 1 for n, index in enumerate(runnable)}
    skip: set[int] = set()
    if last is not None:
        rebuild = {SETUP_TAG, PARAMETERS_TAG, INJECTED_TAG}
        again = [i for i in runnable if i <= last and rebuild & set(nb.cells[i].get("metadata", {}).get("tags", []))]
        skip = {i for i in runnable if i <= last} - set(again)
        print(f"gpujobs: run {checkpoint.restarts() + 1} of this job resumes after cell {number.get(last, '?')}/"
              f"{len(runnable)}, the last one completed; first running again the {len(again)} cell(s) before it "
              f"tagged {SETUP_TAG!r} or parameters" + (f" (cells {', '.join(str(number[i]) for i in again)})"
                                                       if again else ""), flush=True)
    current: dict[str, int] = {}
    output.parent.mkdir(parents=True, exist_ok=True)
    meta = {"job_id": os.environ.get("GPUJOBS_JOB_ID"), "input": str(input_path),
            "parameters": parameters or {}, "kernel": kernel_name,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "started_at": time.time(), "status": "running"}
    nb.metadata["gpujobs"] = meta
    meta = nb.metadata["gpujobs"]  # the notebook holds its own copy

    def save() -> None:
        tmp = output.with_name(output.name + ".tmp")
        nbformat.write(nb, str(tmp))
        os.replace(tmp, output)

    stop: dict[str, int] = {}

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        stop["signal"] = signum
        raise _Stopped(f"stopped by signal {signum}")

    def on_cell_execute(cell: Any, cell_index: int) -> None:
        current["index"] = cell_index
        print(f"executing cell {number.get(cell_index, '?')}/{len(runnable)}", flush=True)

    def on_cell_executed(cell: Any, cell_index: int, execute_reply: Any) -> None:
        save()
        ok = (execute_reply or {}).get("content", {}).get("status") == "ok"
        if progress_path is not None and ok and cell_index not in skip:
            checkpoint.write_atomic(progress_path, json.dumps({"input": str(input_path),
                                                               "last": cell_index}).encode())

    class _Client(NotebookClient):
        async def async_execute_cell(self, cell: Any, cell_index: int, execution_count: int | None = None,
                                     store_history: bool = True) -> Any:
            if cell_index in skip:  # completed by a run before this one: its outputs are kept
                return cell
            return await super().async_execute_cell(cell, cell_index, execution_count, store_history)

        def output(self, outs: list[Any], msg: dict[str, Any], display_id: str | None,
                   cell_index: int) -> Any:
            if msg["msg_type"] == "stream":  # the cells' prints go to the job log, live
                stream = sys.stderr if msg["content"].get("name") == "stderr" else sys.stdout
                stream.write(msg["content"].get("text", ""))
                stream.flush()
            return super().output(outs, msg, display_id, cell_index)

    # The kernel talks to this process over Unix sockets in a folder of the job's owner (0700):
    # over TCP on localhost any user of the machine could subscribe to its outputs, and ipykernel
    # starts every log with a warning saying so.
    sockets = tempfile.mkdtemp(prefix="gpujobs-kernel-")
    ipc = Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(sockets, "kernel")}})
    client = _Client(nb, kernel_name=kernel_name, timeout=None, startup_timeout=120, config=ipc,
                     resources={"metadata": {"path": str(input_path.parent)}},
                     on_cell_execute=on_cell_execute, on_cell_executed=on_cell_executed)
    print(f"running {input_path} with kernel {kernel_name} on GPUs "
          f"{os.environ.get('CUDA_VISIBLE_DEVICES', '(none)')}; output: {output}", flush=True)
    signal.signal(signal.SIGTERM, on_sigterm)
    status = 0
    try:
        # as Jupyter does for its kernels: the kernel knows its notebook (`%%gpujob` names its jobs after it)
        client.execute(env={**os.environ, "JPY_SESSION_NAME": str(input_path)})
        meta["status"] = "completed"
        print(f"done: {len(runnable)} cells executed; output notebook: {output}", flush=True)
    except CellExecutionError as err:
        index = current.get("index")
        which = f"cell {number.get(index, '?')}/{len(runnable)}" if index is not None else "a cell"
        error = f"{err.ename}: {err.evalue}" if err.evalue else err.ename
        at = failing_line(err.traceback, nb.cells[index].source) if index is not None else None
        where = f" at line {at[0]}: `{at[1]}`" if at else ""
        _error_note(nb, f"**This notebook failed at {which}** (the cell with the error below){where}: `{error}`")
        meta.update(status="failed", failed_cell=None if index is None else index + 1,  # after the note
                    error=error, failed_line=at[0] if at else None)
        print(f"\n{which} failed: {error}" + (f" at line {at[0]}: {at[1]}" if at else ""), file=sys.stderr,
              flush=True)
        print(str(err), file=sys.stderr, flush=True)
        status = 1
    except BaseException as err:
        if not stop and not isinstance(err, Exception):
            raise
        if stop:  # SIGTERM, whatever it interrupted inside nbclient
            meta.update(status="stopped", error=f"stopped by signal {stop['signal']}")
            print(f"notebook stopped by signal {stop['signal']}; partial output written to {output}",
                  file=sys.stderr, flush=True)
            status = 143
        else:  # the kernel died or did not start
            meta.update(status="failed", error=f"{type(err).__name__}: {err}")
            _error_note(nb, f"**This notebook could not be executed**: `{type(err).__name__}: {err}`")
            print(f"notebook failed: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
            traceback.print_exc()
            status = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        shutil.rmtree(sockets, ignore_errors=True)
        meta["ended_at"] = time.time()
        save()
    return status


def _resume_point(progress_path: Path | None, input_path: Path, output: Path) -> int | None:
    """The index of the last cell a run before this one of the same job completed, when this
    run should resume after it (that run's notebook is at `output`); None: run it all."""
    if progress_path is None or not output.exists():
        return None
    try:
        progress = json.loads(progress_path.read_text())
    except (OSError, ValueError):
        return None
    last = progress.get("last") if isinstance(progress, dict) and progress.get("input") == str(input_path) else None
    return last if isinstance(last, int) and last >= 0 else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jupyter_gpujobs.notebook.notebooks",
                                     description="Execute a notebook (what a notebook job runs).")
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="execute a notebook with parameters")
    run.add_argument("notebook")
    run.add_argument("--output", required=True)
    run.add_argument("--parameters", default="{}", help="JSON object of parameters")
    run.add_argument("--kernel", default=None)
    args = parser.parse_args(argv)
    try:
        parameters = json.loads(args.parameters)
    except ValueError as err:
        parser.error(f"--parameters is not JSON: {err}")
    if not isinstance(parameters, dict):
        parser.error("--parameters must be a JSON object")
    sys.exit(execute_notebook(Path(args.notebook).resolve(), Path(args.output).resolve(), parameters,
                              args.kernel))


if __name__ == "__main__":
    main()

"""The program a `%%gpujob` cell runs as, inside its job: `python -m jupyter_gpujobs.notebook.cell_job FOLDER`.

It owns the job side of the cell folder the magic writes (see `magics.py`):

- `cell.py`   the cell's source; line N is line N of the notebook cell (line 1 is the magic line,
              kept as a comment), so tracebacks point at the lines the user sees;
- `push.pkl`  the pushed variables (a cloudpickled dict), optional;
- `pull.json` the names of the variables to bring back, optional;

and what it writes back:

- `result.pkl` the pulled variables (a cloudpickled dict), on success only;
- `error.json` `{"type", "message", "line"}` of the exception that ended the cell, on failure.

The cell runs as `__main__` in this fresh Python process; stdout and stderr go to the job log,
which the magic streams into the notebook. Exit status: 0 on success, 1 when the cell raised,
130 on KeyboardInterrupt / SIGTERM.
"""

from __future__ import annotations

import builtins
import json
import os
import pickle
import signal
import sys
import traceback
import types
from pathlib import Path
from types import FrameType
from typing import Any

CELL_FILE = "cell.py"
PUSH_FILE = "push.pkl"
PULL_FILE = "pull.json"
RESULT_FILE = "result.pkl"
ERROR_FILE = "error.json"


def _write_error(folder: Path, exc: BaseException, cell_path: str) -> None:
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == cell_path:
            line = frame.lineno
    info = {"type": type(exc).__name__, "message": str(exc), "line": line}
    try:
        (folder / ERROR_FILE).write_text(json.dumps(info))
    except OSError:
        pass


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def run_cell(folder: Path) -> int:
    """Run the cell in `folder`; returns the exit status."""
    cell_path = str(folder / CELL_FILE)
    source = (folder / CELL_FILE).read_text()
    main = types.ModuleType("__main__")
    namespace: dict[str, Any] = main.__dict__
    namespace.update({"__builtins__": builtins, "__file__": cell_path})
    push = folder / PUSH_FILE
    if push.exists():
        with open(push, "rb") as f:
            namespace.update(pickle.load(f))
    pull_path = folder / PULL_FILE
    pull: list[str] = json.loads(pull_path.read_text()) if pull_path.exists() else []
    # the cell may import modules next to the notebook, as it could in the kernel
    sys.path.insert(0, os.getcwd())
    sys.argv = [cell_path]
    # a fresh __main__ (not this module): the cell sees only its own names and the pushed ones
    sys.modules["__main__"] = main
    try:
        code = compile(source, cell_path, "exec")
        exec(code, namespace)
        missing = [name for name in pull if name not in namespace]
        if missing:
            raise NameError(f"--pull: the cell did not define {', '.join(missing)}")
        if pull:
            import cloudpickle

            with open(folder / (RESULT_FILE + ".tmp"), "wb") as f:
                cloudpickle.dump({name: namespace[name] for name in pull}, f)
            os.replace(folder / (RESULT_FILE + ".tmp"), folder / RESULT_FILE)
    except KeyboardInterrupt as exc:
        _write_error(folder, exc, cell_path)
        print("cell interrupted", file=sys.stderr)
        return 130
    except BaseException as exc:  # noqa: B036 - the cell's own SystemExit is a failure too
        if isinstance(exc, SystemExit) and exc.code in (None, 0):
            return 0
        _write_error(folder, exc, cell_path)
        # the traceback without this module's own frame
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        traceback.print_exception(type(exc), exc, tb)
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return 0


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m jupyter_gpujobs.notebook.cell_job FOLDER", file=sys.stderr)
        sys.exit(2)
    # the log is a file: write lines as they come so the notebook sees them live
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    signal.signal(signal.SIGTERM, _on_sigterm)
    sys.exit(run_cell(Path(args[0])))


if __name__ == "__main__":
    main()

"""The program a `%%gpujob` cell runs as, inside its job: `python -m jupyter_gpujobs.notebook.cell_job FOLDER`.

It owns the job side of the cell folder the magic writes (see `magics.py`):

- `cell.py`   the cell's source; line N is line N of the notebook cell (line 1 is the magic line,
              kept as a comment), so tracebacks point at the lines the user sees;
- `push.pkl`  the pushed variables (a cloudpickled dict), optional;
- `pull.json` the names of the variables to bring back, optional;
- `checkpoint.json` the names of the variables to save at the job's signal before its end
              (`%%gpujob --checkpoint`), optional: they go to `cell.pkl` in the job's checkpoint
              folder (jupyter_gpujobs.checkpoint), and a requeued run starts the cell with them;

and what it writes back:

- `result.pkl` the pulled variables (a cloudpickled dict), on success only;
- `error.json` `{"type", "message", "line"}` of the exception that ended the cell, on failure;
- `stderr.spans` the byte ranges of the job log that the cell wrote to stderr, one `START END`
  line each, written before the bytes reach the log (see `StreamPump`).

The cell runs as `__main__` in this fresh Python process; stdout and stderr go to the job log,
which the magic streams into the notebook, stderr as stderr. Exit status: 0 on success, 1 when
the cell raised, 130 on KeyboardInterrupt / SIGTERM.
"""

from __future__ import annotations

import builtins
import json
import os
import pickle
import selectors
import signal
import stat
import sys
import threading
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
STDERR_SPANS = "stderr.spans"
CHECKPOINT_FILE = "checkpoint.json"
#: the checkpointed variables, in the job's checkpoint folder
SAVED_FILE = "cell.pkl"


class StreamPump:
    """Keeps the cell's stdout and stderr apart in the one job log the supervisor gives both.

    Fds 1 and 2 (so the cell's subprocesses too) become pipes; one thread copies what comes out
    of them into the log, in the order it comes, and before each stderr piece appends its byte
    range to `stderr.spans`. The log stays what `jupyter gpujobs log` and the panel show; the
    magic reads the spans to send stderr to the notebook as stderr. Started only when fds 1 and
    2 are the same regular file (the supervisor's log) or the same pipe (to a supervisor that
    caps the log, which says where this run's output starts in it: GPUJOBS_LOG_OFFSET; the
    spans then count from there, and are off once the supervisor cuts the log); otherwise
    they are apart already."""

    def __init__(self, folder: Path):
        self.spans_path = folder / STDERR_SPANS
        self.log_fd = os.dup(1)
        self.pipes: dict[int, int] = {}  # read end -> 1 or 2
        #: where the next byte lands in the log, when fd 1 is a pipe to the supervisor (else None: fstat says)
        self.offset: int | None = None
        if stat.S_ISFIFO(os.fstat(1).st_mode):
            self.offset = int(os.environ.get("GPUJOBS_LOG_OFFSET") or 0)
        self._thread = threading.Thread(target=self._run, name="gpujobs-streams", daemon=True)

    @staticmethod
    def wanted() -> bool:
        try:
            out, err = os.fstat(1), os.fstat(2)
        except OSError:
            return False
        return ((stat.S_ISREG(out.st_mode) or stat.S_ISFIFO(out.st_mode) and "GPUJOBS_LOG_OFFSET" in os.environ)
                and (out.st_dev, out.st_ino) == (err.st_dev, err.st_ino))

    def start(self) -> None:
        self.spans = open(self.spans_path, "a", buffering=1)
        for fd in (1, 2):
            read, write = os.pipe()
            os.dup2(write, fd)
            os.close(write)
            self.pipes[read] = fd
        self._thread.start()

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        for read in self.pipes:
            sel.register(read, selectors.EVENT_READ)
        open_ends = len(self.pipes)
        while open_ends:
            for key, _ in sel.select():
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fd)
                    os.close(key.fd)
                    open_ends -= 1
                    continue
                start = os.fstat(self.log_fd).st_size if self.offset is None else self.offset  # the log appends
                if self.pipes[key.fd] == 2:
                    self.spans.write(f"{start} {start + len(data)}\n")
                if self.offset is not None:
                    self.offset += len(data)
                while data:
                    data = data[os.write(self.log_fd, data):]

    def stop(self, timeout: float = 2.0) -> None:
        """Send what is left to the log and give fds 1 and 2 back to it."""
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self.log_fd, 1)  # closes this process's write ends of the pipes
        os.dup2(self.log_fd, 2)
        self._thread.join(timeout)  # a subprocess still holding a pipe may keep it open
        self.spans.close()


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


def _checkpointing(folder: Path, namespace: dict[str, Any]) -> None:
    """With `--checkpoint`: start the cell with the variables a run before this one saved
    (saying so), and save them at the job's signal before its end."""
    names_path = folder / CHECKPOINT_FILE
    if not names_path.exists():
        return
    from .. import checkpoint

    names: list[str] = json.loads(names_path.read_text())
    saved = checkpoint.folder() / SAVED_FILE
    if saved.exists():
        with open(saved, "rb") as f:
            values = pickle.load(f)
        namespace.update(values)
        print(f"gpujobs: run {checkpoint.restarts() + 1} of this cell starts with the variables the run before "
              f"saved at its signal: {', '.join(sorted(values)) or 'none'}", flush=True)

    def save() -> None:
        import cloudpickle

        values = {name: namespace[name] for name in names if name in namespace}
        checkpoint.write_atomic(saved, cloudpickle.dumps(values))
        print(f"gpujobs: saved {', '.join(sorted(values)) or 'nothing'} at SIG{checkpoint.signal_name()}, "
              f"{checkpoint.time_left() or 0:.0f}s before the end", flush=True)

    if checkpoint.signal_name():
        checkpoint.on_signal(save)


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
    _checkpointing(folder, namespace)
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
    pump = StreamPump(Path(args[0])) if StreamPump.wanted() else None
    if pump is not None:
        pump.start()
    try:
        code = run_cell(Path(args[0]))
    finally:
        if pump is not None:
            pump.stop()
    sys.exit(code)


if __name__ == "__main__":
    main()

"""The IPython extension: `%%gpujob` (run one cell as a queued GPU job) and `%gpujobs`
(list, queue, gpus, quota, cancel, log, job, run NOTEBOOK) for the notebook.

Load it with `%load_ext jupyter_gpujobs`, or for every kernel with the IPython config
`c.InteractiveShellApp.extensions = ["jupyter_gpujobs"]`.

How a `%%gpujob` cell travels (all through the one client, `client.py`):

1. the options are checked here, before anything is submitted (a bad one is a one-line
   `UsageError`);
2. the cell's source and the `--push` variables (cloudpickle) go into a fresh cell folder,
   `.gpujobs/cells/<uuid>/` under the kernel's working directory (or `$GPUJOBS_CELL_DIR`);
3. a job of kind `cell` is submitted whose command is
   `[sys.executable, "-m", "jupyter_gpujobs.notebook.cell_job", FOLDER]`, with the kernel's working
   directory as its `cwd`;
4. while it waits, an updating display shows its queue position and expected start; while it
   runs, its log (stdout and stderr) is streamed into the cell's output;
5. on success the `--pull` variables are loaded back into the notebook; on failure
   `GPUJobFailed` is raised with the reason and the log tail; an interrupt cancels the job.
"""

from __future__ import annotations

import html
import json
import os
import shlex
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from ..client import FINAL_STATES, GPUJobsClient, GPUJobsError
from ..model import (
    DEFAULT_SIGNAL_BEFORE_S,
    InvalidInput,
    parse_begin,
    parse_cpus,
    parse_duration,
    parse_gpu_memory,
    parse_gpus,
    parse_image,
    parse_memory,
    parse_nodes,
    parse_priority,
    parse_warn_signal,
)
from . import cell_job
from .cells import (
    GPUJobFailed,
    JobCancelled,
    cell_folder_root,
    describe,
    gpus_table,
    jobs_table,
    load_error,
    load_pulled,
    queue_table,
    tail_lines,
)

# ----------------------------------------------------------------------------- helpers


def _client() -> GPUJobsClient:
    try:
        return GPUJobsClient()
    except GPUJobsError as err:
        raise UsageError(str(err)) from None


_STATE_COLOURS = {"PENDING": "#b58900", "RUNNING": "#268bd2", "COMPLETED": "#2aa198", "FAILED": "#dc322f",
                  "CANCELLED": "#6c71c4", "TIMEOUT": "#cb4b16", "LOST": "#dc322f"}


class StatusLine:
    """The updating status shown above a `%%gpujob` cell's output (HTML with a text fallback)."""

    def __init__(self, job: dict[str, Any]):
        self.job = job
        self.text = describe(job)

    def _repr_html_(self) -> str:
        colour = _STATE_COLOURS.get(self.job["state"], "inherit")
        return (f'<div class="gpujobs-status" style="font-family: var(--jp-code-font-family, monospace); '
                f'font-size: 90%; color: {colour}">{html.escape(self.text)}</div>')

    def __repr__(self) -> str:
        return self.text


def _env_pairs(pairs: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env {pair!r}: expected NAME=VALUE")
        out[key] = value
    return out


def _names(text: str | None, option: str) -> list[str]:
    if not text:
        return []
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if not name.isidentifier():
            raise UsageError(f"{option}: {name!r} is not a variable name")
    return names


def job_options(args: Any) -> dict[str, Any]:
    """The submission fields of the options shared by `%%gpujob` and `%gpujobs run`, checked
    here so a bad one fails before anything is submitted."""
    try:
        gpus, share = parse_gpus(args.gpus, "--gpus")
        body: dict[str, Any] = {"gpus": share if share is not None else gpus}
        if args.gpu_memory is not None:
            parse_gpu_memory(args.gpu_memory, "--gpu-mem")
            body["gpu_memory"] = args.gpu_memory
        if getattr(args, "nodes", None) is not None:
            body["nodes"] = parse_nodes(args.nodes)  # (the engine refuses more than one but under Slurm)
        if args.time is not None:
            parse_duration(args.time, "--time")
            body["time_limit"] = args.time
        if args.priority is not None:
            body["priority"] = parse_priority(args.priority, "--priority")
        if args.begin is not None:
            parse_begin(args.begin, time.time(), "--begin")
            body["begin"] = args.begin
        if args.mem is not None:
            parse_memory(args.mem, "--mem")
            body["mem"] = args.mem
        if args.cpus is not None:
            body["cpus"] = parse_cpus(args.cpus, "--cpus")
        if args.signal is not None:
            parse_warn_signal(args.signal, None, "--signal")
            body["signal"] = args.signal
        if getattr(args, "image", None) is not None:
            body["image"] = parse_image(args.image)
    except InvalidInput as err:
        raise UsageError(str(err)) from None
    if args.when is not None:
        if args.when != "offpeak":
            raise UsageError(f"--when: only 'offpeak' is known, got {args.when!r}")
        body["when"] = "offpeak"
    for key in ("gpu_type", "group", "name"):
        value = getattr(args, key)
        if value is not None:
            body[key] = value
    if args.requeue:
        body["requeue"] = True
    env = _env_pairs(args.env)
    if env:
        body["env"] = env
    return body


def _submit(client: GPUJobsClient, submit: Callable[..., Any], *a: Any, **body: Any) -> dict[str, Any]:
    """Submit; an answer naming a wrong field is a usage error (one line), not a traceback."""
    try:
        return submit(*a, **body)
    except GPUJobsError as err:
        if err.status is not None and 400 <= err.status < 500:
            where = f"{err.field}: " if err.field and not err.message.startswith(err.field) else ""
            raise UsageError(f"the engine refused the job: {where}{err.message}") from None
        raise


# ----------------------------------------------------------------------------- waiting for a cell


class CellRun:
    """Waits for one `%%gpujob` job: shows its status, streams its log, cancels it on interrupt."""

    fast_interval = 0.05  # seconds between polls in the first seconds of each phase
    slow_interval = 0.25
    status_interval = 1.0  # refresh the status line of a running job this often
    unreachable_timeout = 120.0  # keep following through an engine restart this long

    def __init__(self, client: GPUJobsClient, job: dict[str, Any], folder: Path, pull: list[str],
                 write: Callable[[str], None] | None = None, write_err: Callable[[str], None] | None = None):
        self.client = client
        self.job = job
        self.folder = folder
        self.pull = pull
        self.write = write or self._write_stdout
        self.write_err = write_err or (self._write_stderr if write is None else self.write)
        self.offset = 0
        self.output: list[str] = []
        self._handle: Any = None
        self._shown = ""

    @staticmethod
    def _write_stdout(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    @staticmethod
    def _write_stderr(text: str) -> None:
        sys.stderr.write(text)
        sys.stderr.flush()

    def _stderr_spans(self) -> list[tuple[int, int]]:
        """The log's byte ranges the cell wrote to stderr (cell_job.STDERR_SPANS)."""
        from .cell_job import STDERR_SPANS

        try:
            text = (self.folder / STDERR_SPANS).read_text()
        except OSError:
            return []
        spans = []
        for line in text.splitlines():
            start, _, end = line.partition(" ")
            if start.isdigit() and end.isdigit():
                spans.append((int(start), int(end)))
        return spans

    def _stream(self, data: str, start: int) -> None:
        """Write the log bytes [start, start + len) to the cell: stderr pieces as stderr."""
        raw = data.encode("utf-8", errors="surrogateescape")
        end = start + len(raw)
        spans = [(max(a, start), min(b, end)) for a, b in self._stderr_spans() if a < end and b > start]
        if not spans or "\ufffd" in data:  # no stderr here, or bytes the engine could not decode
            self.write(data)
            return
        at = start
        for a, b in sorted(spans) + [(end, end)]:
            if a > at:
                self.write(raw[at - start:a - start].decode("utf-8", errors="replace"))
            if b > a:
                self.write_err(raw[a - start:b - start].decode("utf-8", errors="replace"))
            at = max(at, b)

    def _show(self) -> None:
        status = StatusLine(self.job)
        if status.text == self._shown:
            return
        self._shown = status.text
        if self._handle is None:
            self._handle = display(status, display_id=True)
        else:
            self._handle.update(status)

    def _read_log(self) -> tuple[bool, bool]:
        """(got data, log done)."""
        chunk = self.client.log(self.job["id"], self.offset)
        start, self.offset = self.offset, chunk["offset"]
        if chunk["data"]:
            self.output.append(chunk["data"])
            del self.output[:-200]
            self._stream(chunk["data"], start)
        return bool(chunk["data"]), bool(chunk["done"])

    def wait(self) -> dict[str, Any]:
        """Block until the job ends; returns it (final)."""
        job_id = self.job["id"]
        phase_start = time.monotonic()
        phase = self.job["state"]
        last_status = 0.0
        unreachable_since: float | None = None
        self._show()
        try:
            while True:
                now = time.monotonic()
                try:
                    if self.job["state"] == "PENDING" or now - last_status >= self.status_interval:
                        self.job = self.client.job(job_id)
                        last_status = now
                        if self.job["state"] != phase:
                            phase, phase_start = self.job["state"], now
                        self._show()
                    if self.job["state"] == "PENDING":
                        time.sleep(self._interval(phase_start))
                        continue
                    got, done = self._read_log()
                    unreachable_since = None
                except GPUJobsError as err:
                    # the engine restarting: the job survives it, so keep following for a while
                    if err.status is not None:
                        raise
                    unreachable_since = unreachable_since or now
                    if now - unreachable_since > self.unreachable_timeout:
                        raise
                    time.sleep(1.0)
                    continue
                if done:
                    break
                if not got:
                    time.sleep(self._interval(phase_start))
            self.job = self.client.job(job_id)
            if self.job["state"] not in FINAL_STATES:  # log done means ended; wait for the record
                self.job = self.client.wait(job_id, timeout=10)
        except KeyboardInterrupt:
            self.cancel()
            raise JobCancelled(self.job) from None
        self._show()
        return self.job

    def _interval(self, since: float) -> float:
        return self.fast_interval if time.monotonic() - since < 3.0 else self.slow_interval

    def cancel(self) -> None:
        """Cancel the job (on interrupt); a fresh connection, as the interrupted one may be broken."""
        try:
            with GPUJobsClient(url=self.client.url, token=self.client.token) as fresh:
                self.job = fresh.cancel(self.job["id"])
                if self.job["state"] not in FINAL_STATES:
                    self.job = fresh.wait(self.job["id"], timeout=15)
            self._show()
        except GPUJobsError as err:
            print(f"could not cancel job {self.job['id']}: {err}", file=sys.stderr)

    def finish(self) -> dict[str, Any]:
        """The pulled variables of a completed job, or GPUJobFailed. Removes the cell folder."""
        try:
            if self.job["state"] != "COMPLETED":
                raise GPUJobFailed(self.job, tail_lines("".join(self.output)), load_error(self.folder),
                                   log_shown=True)
            return load_pulled(self.folder) if self.pull else {}
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


# ----------------------------------------------------------------------------- the magics


def _job_arguments(func: Callable[..., Any]) -> Callable[..., Any]:
    """The options shared by `%%gpujob` and `%gpujobs run`."""
    for decorator in reversed([
        argument("-g", "--gpus", default="1", help="number of GPUs (default 1; 0 for none), or a share of one "
                 "GPU, e.g. 0.25"),
        argument("--gpu-mem", dest="gpu_memory", default=None, help="GPU memory on one shared GPU, e.g. 20G"),
        argument("-N", "--nodes", default=None, help="nodes of a multi-node job (Slurm runner), --gpus on each"),
        argument("-t", "--time", default=None, help="time limit, e.g. 30m, 2h (default: the server's)"),
        argument("--type", dest="gpu_type", default=None, help="GPU model, e.g. A100"),
        argument("--priority", default=None, help="low, normal, high or urgent"),
        argument("--group", default=None, help="project the job is accounted to"),
        argument("--name", default=None, help="job name"),
        argument("--env", action="append", default=None, metavar="NAME=VALUE",
                 help="environment variable of the job (repeat for more)"),
        argument("--when", default=None, help="'offpeak': start only in the off-peak hours"),
        argument("--begin", default=None, help="not before this time, e.g. 2026-12-24T20:00 or +2h"),
        argument("--mem", default=None, help="host memory limit, e.g. 32G"),
        argument("--cpus", default=None, help="CPU limit in cores, e.g. 8"),
        argument("--signal", default=None, help="a signal before the end, e.g. USR1@5m (also sent at once when "
                 "preempted; jupyter_gpujobs.checkpoint.on_signal registers what to do then)"),
        argument("--requeue", action="store_true", help="back to the queue at the time limit (or a lost run), "
                 "with the job's checkpoint folder"),
        argument("--image", default=None, help="container image to run in (docs/containers.md), e.g. "
                 "localhost/pytorch:2.3; the kernel's Python (sys.executable) must be there in it"),
    ]):
        func = decorator(func)
    return func


@magics_class
class GPUJobMagics(Magics):
    """`%%gpujob` and `%gpujobs`."""

    def __init__(self, shell: Any = None):
        super().__init__(shell)
        self._clients: dict[tuple[str | None, str | None], GPUJobsClient] = {}

    @property
    def client(self) -> GPUJobsClient:
        """A client for the engine named by the kernel's environment (GPUJOBS_URL / GPUJOBS_TOKEN)."""
        key = (os.environ.get("GPUJOBS_URL"), os.environ.get("GPUJOBS_TOKEN"))
        if key not in self._clients:
            self._clients[key] = _client()
        return self._clients[key]

    @magic_arguments()
    @_job_arguments
    @argument("--push", default=None, metavar="a,b",
              help="notebook variables to send to the job (cloudpickle)")
    @argument("--pull", default=None, metavar="x,y",
              help="variables of the cell to bring back into the notebook when it completes")
    @argument("--checkpoint", action="store_true",
              help="save the --pull variables at the signal before the end (--signal, USR1@1m by default) and "
                   "requeue the job at its limit; a requeued run starts the cell with the saved ones")
    @argument("--async", dest="run_async", action="store_true",
              help="do not wait: return a JobWidget at once (.wait(), .result() pulls the variables)")
    @argument("--test-only", dest="test_only", action="store_true",
              help="submit nothing: say when the cell would start, what nearby choices would start sooner, and "
                   "advice from your earlier runs of its name (as sbatch --test-only)")
    @cell_magic
    def gpujob(self, line: str, cell: str) -> Any:
        """Run this cell as a GPU job: it waits its turn in the queue, then runs on its own GPUs.

        The cell body runs in a fresh Python process on the allocated GPUs, not in this kernel:
        it sees none of the notebook's variables except those named in --push, and none of its
        variables come back except those named in --pull. CUDA_VISIBLE_DEVICES is set to the
        assigned GPUs. It runs in the kernel's working directory, with the kernel's Python;
        write plain Python (no %magics or !shell lines).

        While the job waits, the cell shows its queue position and expected start; while it runs,
        its stdout and stderr stream into the cell's output. Interrupting the cell cancels the
        job. A job that does not complete raises GPUJobFailed with the reason and the end of its
        output.

        Example::

            %%gpujob -g 1 -t 30m --push config --pull losses
            import torch
            losses = train(config)

        With --checkpoint the --pull variables are saved at the job's signal before its end
        (USR1 a minute before, or --signal) and the job is requeued at its limit; the requeued
        run starts the cell with the saved values already defined (docs/long-jobs.md).
        """
        args = parse_argstring(self.gpujob, line)
        body = job_options(args)
        push = _names(args.push, "--push")
        pull = _names(args.pull, "--pull")
        user_ns = self.shell.user_ns if self.shell is not None else {}
        missing = [name for name in push if name not in user_ns]
        if missing:
            raise UsageError(f"--push: no variable named {', '.join(missing)} in the notebook")
        if not cell.strip():
            raise UsageError("%%gpujob: the cell is empty")
        if args.checkpoint:
            if not pull:
                raise UsageError("--checkpoint saves the --pull variables at the signal: name them with --pull")
            body.setdefault("signal", f"USR1@{DEFAULT_SIGNAL_BEFORE_S}")
            body["requeue"] = True
        client = self.client
        cwd = os.getcwd()
        if args.test_only:  # nothing written, nothing submitted: the engine checks and answers
            from ..whatif_text import format_what_if

            body.setdefault("name", _default_name())
            answer = _submit(client, client.what_if, [sys.executable, "-m", cell_job.__name__, cwd], kind="cell",
                             cwd=cwd, **body)
            print(format_what_if(answer, time.time()))
            return None
        folder = self._write_folder(cwd, line, cell, {name: user_ns[name] for name in push}, pull, args.checkpoint)
        body.setdefault("name", _default_name())
        body["env"] = {"PYTHONUNBUFFERED": "1", **body.get("env", {})}
        command = [sys.executable, "-m", cell_job.__name__, str(folder)]
        try:
            job = _submit(client, client.submit, command, kind="cell", cwd=cwd, **body)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        if args.run_async:
            from .widgets import JobWidget

            return JobWidget(job["id"], client=client, job=job, folder=folder, pull=pull, namespace=user_ns)
        run = CellRun(client, job, folder, pull)
        try:
            run.wait()
        except BaseException:  # interrupted (the job was cancelled) or the engine went away
            shutil.rmtree(folder, ignore_errors=True)
            raise
        pulled = run.finish()
        user_ns.update(pulled)
        return None

    def _write_folder(self, cwd: str, line: str, cell: str, pushed: dict[str, Any], pull: list[str],
                      checkpoint: bool = False) -> Path:
        folder = cell_folder_root(cwd) / uuid.uuid4().hex
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.mkdir(mode=0o700)  # pushed variables are the user's data
        try:
            # line 1 stands for the magic line, so line numbers match the notebook cell's
            (folder / cell_job.CELL_FILE).write_text(f"# %%gpujob {line}\n{cell}")
            if pushed:
                import cloudpickle

                for name, value in pushed.items():
                    try:
                        cloudpickle.dumps(value)
                    except Exception as err:
                        raise UsageError(f"--push: cannot send {name}: {type(err).__name__}: {err}") from None
                with open(folder / cell_job.PUSH_FILE, "wb") as f:
                    cloudpickle.dump(pushed, f)
            if pull:
                (folder / cell_job.PULL_FILE).write_text(json.dumps(pull))
            if checkpoint:
                (folder / cell_job.CHECKPOINT_FILE).write_text(json.dumps(pull))
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return folder

    # ------------------------------------------------------------------ %gpujobs

    @line_magic
    def gpujobs(self, line: str) -> Any:
        """Look at and manage the GPU job queue.

        %gpujobs list [--all] [--state S] [-n N]   your jobs (everyone's with --all)
        %gpujobs queue                            pending jobs in scheduling order
        %gpujobs gpus                             the GPUs and who holds them
        %gpujobs quota                            your quota and usage (a live widget)
        %gpujobs job ID                           one job (a live widget with a cancel button)
        %gpujobs cancel ID [ID ...]               cancel jobs
        %gpujobs log ID                           a job's output so far
        %gpujobs notify [--email A] [--webhook URL] [--events started,ended,failed,warning,finding]
                        [--no-email] [--no-webhook] [--off] [--test]
                                                  be told of your jobs outside Lab (e-mail, Slack, ...)
        %gpujobs run NOTEBOOK [-p NAME=VALUE ...] [-g N] [-t TIME] [--kernel K] [--output PATH] ...
                                                  queue a whole notebook (see %gpujobs run -h)
        """
        try:
            words = shlex.split(line)
        except ValueError as err:
            raise UsageError(f"%gpujobs: {err}") from None
        if not words or words[0] in ("help", "-h", "--help"):
            print(self.gpujobs.__doc__)
            return None
        cmd, rest = words[0], " ".join(shlex.quote(w) for w in words[1:])
        handler = getattr(self, f"_gpujobs_{cmd}", None)
        if handler is None:
            raise UsageError(f"%gpujobs: unknown command {cmd!r}; use list, queue, gpus, quota, job, cancel, "
                             "log, notify or run")
        if ("-h" in words[1:] or "--help" in words[1:]) and hasattr(handler, "parser"):
            print(handler.parser.format_help())
            return None
        try:
            return handler(rest)
        except GPUJobsError as err:
            where = f" ({err.field})" if err.field and not err.message.startswith(err.field) else ""
            raise UsageError(f"%gpujobs {cmd}{where}: {err.message}") from None

    @magic_arguments()
    @argument("--all", action="store_true", help="everyone's jobs")
    @argument("--state", default=None, help="e.g. RUNNING,PENDING")
    @argument("-n", "--limit", type=int, default=50)
    def _gpujobs_list(self, rest: str) -> None:
        args = parse_argstring(self._gpujobs_list, rest)
        client = self.client
        user = None if args.all else client.whoami()["user"]
        display(jobs_table(client.jobs(state=args.state, user=user, limit=args.limit)["jobs"]))

    def _gpujobs_queue(self, rest: str) -> None:
        page = self.client.queue_page(limit=50)
        display(queue_table(page["jobs"], total=page["total"]))

    def _gpujobs_gpus(self, rest: str) -> None:
        display(gpus_table(self.client.gpus()))

    def _gpujobs_quota(self, rest: str) -> Any:
        from .widgets import QuotaWidget

        return QuotaWidget(client=self.client)

    def _gpujobs_job(self, rest: str) -> Any:
        from .widgets import JobWidget

        return JobWidget(_one_id(rest, "job"), client=self.client)

    def _gpujobs_cancel(self, rest: str) -> None:
        ids = _ids(rest, "cancel")
        for job_id in ids:
            job = self.client.cancel(job_id)
            print(f"job {job_id} {job['state']}")

    def _gpujobs_log(self, rest: str) -> None:
        job_id = _one_id(rest, "log")
        offset = 0
        while True:
            chunk = self.client.log(job_id, offset)
            sys.stdout.write(chunk["data"])
            if not chunk["data"] or chunk["offset"] == offset:
                break
            offset = chunk["offset"]
        sys.stdout.flush()

    def _gpujobs_notify(self, rest: str) -> None:
        from .. import cli

        try:
            args = cli.notify_parser("%gpujobs notify").parse_args(shlex.split(rest))
        except cli.UsageError as err:
            raise UsageError(str(err)) from None
        print(cli.format_notifications(cli.notify(self.client, args)))

    @magic_arguments()
    @_job_arguments
    @argument("notebook", help="the notebook to execute (relative to this kernel's working directory)")
    @argument("-p", "--parameter", action="append", default=None, metavar="NAME=VALUE",
              help="papermill-style parameter (the value is read as JSON when it parses)")
    @argument("--kernel", default=None, help="kernel name (default: the notebook's own)")
    @argument("--output", default=None, help="path of the executed notebook (default: <stem>-job<ID>.ipynb)")
    def _gpujobs_run(self, rest: str) -> Any:
        args = parse_argstring(self._gpujobs_run, rest)
        body = job_options(args)
        params: dict[str, Any] = {}
        for pair in args.parameter or []:
            key, sep, value = pair.partition("=")
            if not sep or not key.isidentifier():
                raise UsageError(f"-p {pair!r}: expected NAME=VALUE")
            try:
                params[key] = json.loads(value)
            except ValueError:
                params[key] = value
        notebook = os.path.abspath(args.notebook)
        if not notebook.endswith(".ipynb") or not os.path.isfile(notebook):
            raise UsageError(f"%gpujobs run: no notebook {args.notebook!r} (expected an existing .ipynb file)")
        output = os.path.abspath(args.output) if args.output else None
        client = self.client
        job = _submit(client, client.submit_notebook, notebook, parameters=params, kernel=args.kernel,
                      output=output, **body)
        from .widgets import JobWidget

        return JobWidget(job["id"], client=client, job=job)


# the usage line of the subcommands
GPUJobMagics._gpujobs_list.parser.prog = "%gpujobs list"  # type: ignore[attr-defined]
GPUJobMagics._gpujobs_run.parser.prog = "%gpujobs run"  # type: ignore[attr-defined]
GPUJobMagics.gpujob.parser.prog = "%%gpujob"  # type: ignore[attr-defined]


def _ids(text: str, cmd: str) -> list[int]:
    words = shlex.split(text)
    if not words or not all(w.isdigit() for w in words):
        raise UsageError(f"%gpujobs {cmd}: expected job ids, e.g. %gpujobs {cmd} 12")
    return [int(w) for w in words]


def _one_id(text: str, cmd: str) -> int:
    ids = _ids(text, cmd)
    if len(ids) != 1:
        raise UsageError(f"%gpujobs {cmd}: expected one job id")
    return ids[0]


def _default_name() -> str:
    session = os.environ.get("JPY_SESSION_NAME")
    return f"cell of {os.path.basename(session)}" if session else "notebook cell"


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(GPUJobMagics)


def unload_ipython_extension(ipython: Any) -> None:
    pass


__all__ = ["GPUJobFailed", "GPUJobMagics", "load_ipython_extension", "describe"]

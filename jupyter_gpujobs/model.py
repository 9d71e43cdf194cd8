"""The domain of jupyter-gpujobs: jobs, GPUs, states, the policy knobs, and the parsing and
validation of everything a user types ("1h30m", "2xA100", "urgent").

This module imports nothing of the project; every other part speaks in these types.
Validation errors are `InvalidInput`, which names the field that is wrong so the REST API
can answer 400 with a message a person can act on.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from itertools import compress
from typing import Any


class InvalidInput(ValueError):
    """A value given by a user is wrong. `field` names it (e.g. "gpus", "time_limit")."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class JobState(str, Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    LOST = "LOST"

    @property
    def is_final(self) -> bool:
        return self not in (JobState.PENDING, JobState.RUNNING)


FINAL_STATES = frozenset(s for s in JobState if s.is_final)

#: Priority classes, lowest first. The index is the class rank used by the scheduler.
PRIORITIES: tuple[str, ...] = ("low", "normal", "high", "urgent")
PRIORITY_RANK: dict[str, int] = {name: rank for rank, name in enumerate(PRIORITIES)}

#: What a job is: a script/command, a notebook cell (%%gpujob), a whole notebook, a kernel.
JOB_KINDS: tuple[str, ...] = ("script", "cell", "notebook", "kernel")


# --------------------------------------------------------------------------- parsing

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(d|h|m|s)", re.IGNORECASE)
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}

#: Bounds of what a user may type, checked where it is read so that no stored value can make
#: a later computation overflow: the longest duration (ten years), how far ahead a job may be
#: deferred (`begin`, one year), the most GPUs one job or quota may name, and the largest id.
MAX_DURATION_S = 10 * 365 * 86400
MAX_BEGIN_AHEAD_S = 366 * 86400
MAX_GPUS = 4096
MAX_ID = (1 << 63) - 1
#: Array jobs: the most tasks, the largest task index, and the longest array text.
MAX_ARRAY_TASKS = 10000
MAX_ARRAY_INDEX = 1_000_000
MAX_ARRAY_TEXT = 1000
MAX_DEPENDENCIES = 1000
#: A command's size, checked before it is split: long enough for any real command line (Linux
#: takes at most 128 KiB in one argument), short enough that splitting stays a few ms.
MAX_COMMAND_CHARS = 64 * 1024
MAX_COMMAND_WORDS = 4096
#: What one job's environment (names and values) and payload (as JSON) may hold, and what one
#: submission stores of command, environment and payload over all its tasks
MAX_ENV_CHARS = 64 * 1024
MAX_PAYLOAD_CHARS = 64 * 1024
MAX_SUBMISSION_CHARS = 16 * 1024 * 1024


def parse_duration(value: Any, field_name: str = "time_limit") -> int:
    """Seconds from `90`, `"90"`, `"30m"`, `"1h30m"`, `"2d"`, `"1:30:00"` (h:m:s) or `"45:00"` (m:s).

    Raises InvalidInput naming `field_name` for anything else, zero or negative.
    """
    if isinstance(value, bool):
        raise InvalidInput(field_name, f"expected a duration such as 30m or 1h30m, got {value!r}")
    if isinstance(value, (int, float)):
        if value != value:
            raise InvalidInput(field_name, f"expected a duration such as 30m or 1h30m, got {value!r}")
        seconds = float(value) if abs(value) <= 2 * MAX_DURATION_S else float("inf")
    elif isinstance(value, str):
        text = value.strip().lower()
        if len(text) > 100:
            raise InvalidInput(field_name, f"duration of {len(text)} characters is too long; use e.g. 30m or 1h30m")
        if not text:
            raise InvalidInput(field_name, "empty duration; use e.g. 30m, 1h30m or 3600")
        if re.fullmatch(r"\d+(\.\d+)?", text):
            seconds = float(text)
        elif re.fullmatch(r"\d+(:\d{1,2}){1,2}", text):
            parts = [int(p) for p in text.split(":")]
            if len(parts) == 2:
                parts.insert(0, 0)
            hours, minutes, secs = parts
            if minutes >= 60 or secs >= 60:
                raise InvalidInput(field_name, f"bad clock duration {value!r}; use H:MM:SS")
            seconds = hours * 3600 + minutes * 60 + secs
        else:
            pos = 0
            seconds = 0.0
            compact = text.replace(" ", "")
            for match in _DURATION_PART.finditer(compact):
                if match.start() != pos:
                    break
                seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]
                pos = match.end()
            if pos != len(compact) or pos == 0:
                raise InvalidInput(
                    field_name, f"cannot read duration {value!r}; use e.g. 30m, 1h30m, 2d or 3600"
                )
    else:
        raise InvalidInput(field_name, f"expected a duration such as 30m or 1h30m, got {value!r}")
    if seconds <= 0:
        raise InvalidInput(field_name, f"duration must be positive, got {value!r}")
    if seconds > MAX_DURATION_S:
        raise InvalidInput(field_name, f"duration {value!r} is longer than the maximum of "
                                       f"{format_duration(MAX_DURATION_S)}")
    return int(round(seconds))


def format_duration(seconds: float | None) -> str:
    """`5400` -> `"1h30m"`; `None` -> `"-"`."""
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    out = ""
    if days:
        out += f"{days}d"
    if hours:
        out += f"{hours}h"
    if minutes:
        out += f"{minutes}m"
    if secs and not days:
        out += f"{secs}s"
    return out


def format_bytes(n: int | None) -> str:
    """`1536` -> `"1.5 KiB"`; `None` -> `"size unknown"`."""
    if n is None:
        return "size unknown"
    size = float(n)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def format_relative(t: float | None, now: float, unknown: str = "-") -> str:
    """`"in 5m"`, `"3m ago"`, `"now"`, or `unknown` when there is no time."""
    if not t:
        return unknown
    delta = t - now
    if abs(delta) < 1:
        return "now"
    return f"in {format_duration(delta)}" if delta > 0 else f"{format_duration(-delta)} ago"


def _clock(t: float, now: float) -> str:
    """A time on the local clock, with the weekday or date when not within the next 20 hours."""
    local = time.localtime(t)
    if t - now < 20 * 3600:
        return time.strftime("%H:%M", local)
    if t - now < 6 * 86400:
        return time.strftime("%a %H:%M", local)
    return time.strftime("%b %d %H:%M", local)


def format_expected_start(t: float | None, kind: str | None, now: float, unknown: str = "unknown",
                          span: Sequence[float] | None = None) -> str:
    """An expected start as a user should read it: a prediction from runtimes as `"about 13:40
    (in 4m)"`, a bound from time limits as `"by 14:05 at the latest (in 29m)"` (local clock;
    the weekday or date when it is not within the next 20 hours), `"now"` when it is due.
    With its range (`span`, the view's `expected_start_range`) a minute or more wide:
    `"14:20-15:05 (about 14:40, in 24m)"`; a bound is its range's end: `"by 15:05 at the latest
    (in 49m; from 14:20)"`.
    An expected start that already passed is `unknown`: it is known to be wrong."""
    if not t or t < now - 60:
        return unknown
    if t - now < 1 and not (span and span[1] - now >= 60):
        return "now"
    rel = format_relative(t, now)
    clock = _clock(t, now)
    if span and span[1] - span[0] >= 60:
        lo, hi = max(span[0], now), span[1]
        first = "now" if lo - now < 60 else _clock(lo, now)
        last = _clock(hi, now)
        if kind == "prediction":
            return f"{first}-{last} (about {clock}, {rel})" if t - now >= 1 else f"{first}-{last} (likely now)"
        return f"by {clock} at the latest ({rel}; from {first})"
    return f"about {clock} ({rel})" if kind == "prediction" else f"by {clock} at the latest ({rel})"


def parse_gpu_count(value: Any, field_name: str = "gpus") -> int:
    """A whole, non-negative number of GPUs."""
    if isinstance(value, bool) or value is None:
        raise InvalidInput(field_name, f"expected a whole number of GPUs, got {value!r}")
    if isinstance(value, str) and re.fullmatch(r"\s*[0-9]{1,6}\s*", value):
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int):
        raise InvalidInput(field_name, f"expected a whole number of GPUs, got {value!r}")
    if value < 0:
        raise InvalidInput(field_name, f"cannot ask for a negative number of GPUs ({value})")
    if value > MAX_GPUS:
        raise InvalidInput(field_name, f"{value} GPUs is more than the {MAX_GPUS} any server has")
    return value


#: The smallest share of one GPU a job may ask for (`gpus: 0.01`).
MIN_SHARE = 0.01


def parse_gpus(value: Any, field_name: str = "gpus") -> tuple[int, float | None]:
    """A GPU request: a whole number of GPUs (`2` -> (2, None); `0`: no GPU) or a share of one
    GPU strictly between 0 and 1 (`0.25` or `"0.25"` -> (1, 0.25): one card, a quarter of its
    memory and time). A share job's `gpus` is 1: it needs one card, which it shares."""
    if isinstance(value, str) and re.fullmatch(r"\s*[0-9]{0,6}\.[0-9]{1,6}\s*", value):
        value = float(value)
    if isinstance(value, float) and not isinstance(value, bool) and not value.is_integer():
        if value != value or value < 0:
            raise InvalidInput(field_name, f"expected a number of GPUs such as 1, 2 or a share such as 0.25, "
                                           f"got {value!r}")
        if value > 1:
            raise InvalidInput(field_name, f"cannot ask for {value:g} GPUs: ask for a whole number of GPUs "
                                           f"(e.g. {int(value) + 1}) or a share of one GPU below 1 (e.g. 0.5)")
        if value < MIN_SHARE:
            raise InvalidInput(field_name, f"a share of {value:g} of a GPU is below the smallest, {MIN_SHARE:g}")
        return 1, round(value, 4)
    return parse_gpu_count(value, field_name), None


#: Bytes of GPU memory: the smallest a share may ask for.
MIN_GPU_MEMORY = 64 << 20


def parse_gpu_memory(value: Any, field_name: str = "gpu_memory") -> int:
    """Bytes of GPU memory asked for on one card: "20G", "512M", "20GB", "16GiB", or a number of
    megabytes (as --mem)."""
    size = _parse_size(value, field_name)
    if size < MIN_GPU_MEMORY:
        raise InvalidInput(field_name, f"{_short(value)} is below the smallest GPU memory share, 64M")
    if size > MAX_MEM_BYTES:
        raise InvalidInput(field_name, f"{_short(value)} is more GPU memory than any GPU has")
    return size


def is_share(job: Job) -> bool:
    """Does the job ask for part of one GPU (a share or a GPU memory amount) rather than whole GPUs?"""
    return job.share is not None or job.gpu_memory is not None


def share_memory_bytes(job: Job, gpu_total_bytes: int) -> int | None:
    """The GPU memory a share job may use on a card of `gpu_total_bytes`: its `gpu_memory`
    when it asked for an amount, else its share of the card's memory. None for a job of whole
    GPUs (it may use all of each card)."""
    if job.gpu_memory is not None:
        return job.gpu_memory
    if job.share is not None:
        return int(job.share * gpu_total_bytes)
    return None


def share_fraction(job: Job, gpu_total_bytes: int) -> float:
    """The part of one card a share job takes on a card of `gpu_total_bytes` (its time-slice,
    and what quotas and fair-share count): its `share`, else its memory over the card's (1.0 when
    the card's memory is unknown). For a job of whole GPUs: its number of GPUs."""
    if job.share is not None:
        return job.share
    if job.gpu_memory is not None:
        return min(1.0, job.gpu_memory / gpu_total_bytes) if gpu_total_bytes > 0 else 1.0
    return float(job.gpus)


def parse_id(value: Any, field_name: str = "id") -> int:
    """A job (or other record) id: a whole number from 1 to 2^63-1, as a number or its ASCII digits."""
    if isinstance(value, str) and re.fullmatch(r"[0-9]{1,19}", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(field_name, f"expected a job id (a whole number), got {_short(value)}")
    if not 1 <= value <= MAX_ID:
        raise InvalidInput(field_name, f"job ids are between 1 and {MAX_ID}, got {_short(value)}")
    return value


def _short(value: Any, limit: int = 60) -> str:
    """repr() of a value a user sent, cut to `limit` characters for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


#: A word of a shell-like command string: runs of plain characters, backslash escapes, and
#: single- or double-quoted strings, with no white space between them.
_SHELL_WORD = re.compile(r"""(?:[^ \t\r\n'"\\]+|\\.|'[^']*'|"(?:[^"\\]+|\\.)*")+""", re.S)
#: The pieces of one word, to take its quotes and escapes off.
_SHELL_PIECE = re.compile(r"""([^'"\\]+)|\\(.)|'([^']*)'|""" r'"((?:[^"\\]+|\\.)*)"', re.S)
_SHELL_SPACE = " \t\r\n"


def split_command(text: str) -> list[str]:
    """Split a command string into words as `shlex.split` does (POSIX rules, no comments).

    The words are found by one regular expression, so the time is linear in the text and spent
    in C: `shlex` grows each word a character at a time, which took seconds for a single word
    of a few hundred kB, and a submission must not hold the server that long. Raises ValueError
    for an unclosed quote or a trailing backslash, as shlex does."""
    words = _SHELL_WORD.findall(text)
    special = [i for i, w in enumerate(words) if "'" in w or '"' in w or "\\" in w]
    spaces_in_words = sum(words[i].count(c) for i in special for c in _SHELL_SPACE)
    spaces = sum(text.count(c) for c in _SHELL_SPACE) - spaces_in_words
    if sum(map(len, words)) + spaces != len(text):  # a character no word or space took
        raise ValueError("it has an unclosed quote or ends in a backslash")
    for i in special:
        words[i] = "".join(plain or escaped or single or _unescape_double(double)
                           for plain, escaped, single, double in _SHELL_PIECE.findall(words[i]))
    return words


def _unescape_double(text: str) -> str:
    """The inside of a double-quoted string: a backslash escapes only `"` and itself. `text`
    is whole backslash pairs and other characters, so replacing from the left keeps pairs."""
    if "\\" not in text:
        return text
    return text.replace("\\\\", "\x00").replace('\\"', '"').replace("\x00", "\\")


#: Characters refused in names and never printed raw: C0/C1 controls (escape sequences, NUL,
#: backspace, carriage return), and the bidirectional and zero-width format characters that
#: make text display as something other than what it is.
_UNSAFE_TEXT = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")


def safe_text(text: Any) -> str:
    """`text` fit to print in someone else's terminal or table: each control, bidi or
    zero-width character becomes a visible escape (`\\x1b`, `\\u202e`)."""
    text = str(text)
    if not _UNSAFE_TEXT.search(text):
        return text
    return _UNSAFE_TEXT.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def check_plain_text(value: str, field_name: str) -> None:
    """Refuse a name that holds control, bidi or zero-width characters."""
    bad = _UNSAFE_TEXT.search(value)
    if bad:
        raise InvalidInput(field_name, f"contains the control character {safe_text(bad.group())} at position "
                                       f"{bad.start()}; use printable text")


#: How long a reason given with an action (ending a job, draining a GPU) may be.
MAX_REASON = 2000


def parse_reason(value: Any, field_name: str = "reason") -> str:
    """The free-text reason of an action: a string of at most MAX_REASON characters without NUL
    (None or "" -> "")."""
    if value is None or value == "":
        return ""
    if not isinstance(value, str) or len(value) > MAX_REASON or "\x00" in value:
        raise InvalidInput(field_name, f"expected a string of at most {MAX_REASON} characters")
    return value


def parse_priority(value: Any, field_name: str = "priority") -> str:
    if not isinstance(value, str) or value.strip().lower() not in PRIORITY_RANK:
        raise InvalidInput(field_name, f"unknown priority {value!r}; choose one of {', '.join(PRIORITIES)}")
    return value.strip().lower()


# --------------------------------------------------------------------------- what others see

#: What anyone may be told of why a job ended: its end, in words. The reason itself is its
#: owner's: it may name the job's command, paths or output ("command not found: /home/...").
PUBLIC_END_REASONS: Mapping[str, str] = {"COMPLETED": "completed", "FAILED": "failed", "CANCELLED": "cancelled",
                                         "TIMEOUT": "time limit reached", "LOST": "lost"}


def retry_reason(run: int, runs: int, why: str, wait: str) -> str:
    """Why a job waits after its failed run `run` of `runs` (`why`: how it ended, private)."""
    return f"run {run} of {runs} failed: {why}; retry {run} of {runs - 1} after {wait}"


def requeue_reason(why: str, requeue: int, most: int) -> str:
    """Why a job waits after a run that ended at its time limit or was lost (`why`, private)."""
    return f"requeued ({why}): requeue {requeue} of at most {most}; it starts again with its checkpoint folder"


#: The reasons above with how the run ended, which is private as an ended job's reason is
#: ("command not found: /home/..."), and what is left of them for others
_RUN_ENDED = (
    (re.compile(r"(run \d+ of \d+ failed): .*(; retry \d+ of \d+ after .*)", re.DOTALL), r"\1\2"),
    (re.compile(r"requeued \(.*\)(: requeue \d+ of at most .*)", re.DOTALL), r"requeued\1"),
)


def public_reason(state: str | None, reason: str | None) -> str | None:
    """A job's (or event's) reason as someone who may not see the job's private data may
    read it: why a job waits or runs is the queue's (the scheduler's words, public), less how
    its last run ended (`retry_reason`, `requeue_reason`); why it ended is only its end
    (`PUBLIC_END_REASONS`)."""
    reason = PUBLIC_END_REASONS.get(state or "", reason)
    for words, public in _RUN_ENDED if reason else ():
        if words.fullmatch(reason):  # type: ignore[arg-type]
            return words.sub(public, reason)  # type: ignore[arg-type]
    return reason


# --------------------------------------------------------------------------- who may use what

#: Who may use each priority class unless the admin says otherwise (c.GPUJobs.priority_tiers):
#: `urgent` (it preempts and has the reserve) is the admins' alone; every other class is open.
DEFAULT_PRIORITY_TIERS: Mapping[str, tuple[str, ...]] = {"urgent": ()}

_TIER_NAME = re.compile(r"\*|@?[A-Za-z0-9_.][A-Za-z0-9_.@-]{0,63}")


def parse_priority_tiers(value: Any, field_name: str = "priority_tiers") -> dict[str, tuple[str, ...]]:
    """`{"urgent": ["alice", "@oncall"], "high": ["*"]}`: who may submit at each priority class
    (a user name, "@group" for the members of a Unix group, "*" for everyone); a class it does
    not name is open to everyone, `[]` is for admins only. InvalidInput names what is wrong."""
    if not isinstance(value, Mapping):
        raise InvalidInput(field_name, "expected {class: [users, '@groups']}, e.g. {'urgent': ['@oncall']}")
    out: dict[str, tuple[str, ...]] = {}
    for cls, who in value.items():
        if not isinstance(cls, str) or cls.strip().lower() not in PRIORITY_RANK:
            raise InvalidInput(field_name, f"unknown priority class {_short(cls)}; classes are {', '.join(PRIORITIES)}")
        if isinstance(who, str):
            who = [w for w in who.split(",") if w.strip()]
        if not isinstance(who, (list, tuple)):
            raise InvalidInput(f"{field_name}.{cls}", "expected a list of user names, '@group' or '*'")
        names = []
        for name in who:
            if not isinstance(name, str) or not _TIER_NAME.fullmatch(name.strip()):
                raise InvalidInput(f"{field_name}.{cls}", f"{_short(name)} is not a user name, '@group' or '*'")
            names.append(name.strip())
        out[cls.strip().lower()] = tuple(names)
    return out


def may_use_priority(tiers: Mapping[str, Sequence[str]], priority: str, user: str,
                     member_of: Callable[[str], bool]) -> bool:
    """Whether `user` may submit at `priority` under `tiers` (`parse_priority_tiers`);
    `member_of(group)`: whether the user is in that Unix group (asked only for the groups a
    restricted class names). Admins are not asked: they may use every class."""
    allowed = tiers.get(priority)
    if allowed is None:
        return True
    return any(who in ("*", user) or (who.startswith("@") and member_of(who[1:])) for who in allowed)


def priorities_for(tiers: Mapping[str, Sequence[str]], user: str, member_of: Callable[[str], bool]) -> list[str]:
    """The priority classes `user` may submit at, lowest first (an admin: all of them)."""
    return [p for p in PRIORITIES if may_use_priority(tiers, p, user, member_of)]


def priority_refusal(tiers: Mapping[str, Sequence[str]], priority: str, user: str,
                     member_of: Callable[[str], bool]) -> str | None:
    """Why `user` may not submit at `priority` (a sentence naming the class and what they may
    use), or None when they may."""
    if may_use_priority(tiers, priority, user, member_of):
        return None
    mine = priorities_for(tiers, user, member_of)
    return (f"priority {priority!r} is not open to {user} here (c.GPUJobs.priority_tiers); "
            f"you may use {', '.join(mine) or 'none'}, or ask an admin")


def array_cap_refusal(cap: int | None, tasks: int) -> str | None:
    """Why an array of `tasks` tasks is more than one user may submit at once (`cap`:
    c.GPUJobs.user_max_array_tasks; None: no cap), or None."""
    if cap is None or tasks <= cap:
        return None
    return (f"{tasks} array tasks are more than the {cap} one user may submit at once here "
            "(c.GPUJobs.user_max_array_tasks); split the array or ask an admin")


def pending_cap_refusal(cap: int | None, pending: int, adding: int) -> str | None:
    """Why `adding` more waiting jobs to a user's `pending` ones goes past the most one user
    may have waiting (`cap`: c.GPUJobs.user_max_pending_jobs; None: no cap), or None."""
    if cap is None or pending + adding <= cap:
        return None
    jobs = "this job" if adding == 1 else f"these {adding} jobs"
    return (f"you have {pending} jobs waiting and {jobs} would make more than {cap}, the most one user "
            "may have waiting here (c.GPUJobs.user_max_pending_jobs); wait for some to start or cancel some")


@dataclass(frozen=True)
class FakeGPUSpec:
    count: int
    model: str
    memory_mb: int
    #: MIG instances each card of this kind is partitioned into (profile names such as
    #: "1g.18gb", one per instance); empty: a whole GPU
    mig: tuple[str, ...] = ()
    #: memory the driver keeps for itself ("[reserved:616M]"): NVML v1 "used" counts it, v2 not
    reserved_mb: int = 0
    #: the driver has NVML's v2 memory info (used without reserved); "[nvml:v1]": it has not
    nvml_v2: bool = True
    #: NVML reports the processes with pids of another pid namespace, as in a container ("[pidns:other]")
    other_pidns: bool = False


_FAKE_PART = re.compile(r"^(?:(\d+)\s*[x×*]\s*)?([A-Za-z][\w.-]*?)(?:-(\d+)\s*GB)?(?:\s*\[(.*)\])?$", re.IGNORECASE)
#: A MIG profile: "<compute slices>g.<memory>gb", e.g. "1g.18gb", "3g.71gb", "1g.10gb+me"
MIG_PROFILE = re.compile(r"(\d+)g\.(\d+)gb(?:\+me)?", re.IGNORECASE)
_MIG_ITEM = re.compile(r"^\s*(\d+g\.\d+gb(?:\+me)?)\s*(?:[x×*]\s*(\d+))?\s*$", re.IGNORECASE)
#: Compute slices of a MIG-capable card (A100, H100, H200: 7)
MIG_SLICES = 7

#: Memory of common models when a fake spec does not say (MB).
_KNOWN_MEMORY_MB = {
    "A100": 40960, "H100": 81920, "H200": 143771, "T4": 15360, "V100": 16384,
    "L4": 23034, "L40S": 46068, "A10": 23028, "RTX4090": 24564, "P100": 16384, "K80": 12206,
}


def _split_outside_brackets(spec: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in spec:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth <= 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def _parse_mig(text: str, part: str, memory_mb: int) -> tuple[str, ...]:
    """`"mig:3g.71gb,1g.18gb*2"` -> ("3g.71gb", "1g.18gb", "1g.18gb"), checked against the card."""
    body = text.strip()
    if not body.lower().startswith("mig:"):
        raise InvalidInput("fake_gpus", f"cannot read [{text}] in {part!r}; write e.g. H200-141GB[mig:1g.18gb*7]")
    out: list[str] = []
    for item in re.split(r"[,+](?!me\b)", body[4:], flags=re.IGNORECASE):
        match = _MIG_ITEM.match(item)
        if not match:
            raise InvalidInput("fake_gpus", f"cannot read the MIG profile {item.strip()!r} in {part!r}; "
                                            "write e.g. 1g.18gb or 3g.71gb*2")
        count = int(match.group(2) or 1)
        if not 1 <= count <= MIG_SLICES:
            raise InvalidInput("fake_gpus", f"{item.strip()!r} in {part!r}: 1 to {MIG_SLICES} instances per profile")
        out.extend([match.group(1).lower()] * count)
    slices = sum(int(MIG_PROFILE.match(p).group(1)) for p in out)  # type: ignore[union-attr]
    mem = sum(int(MIG_PROFILE.match(p).group(2)) * 1024 for p in out)  # type: ignore[union-attr]
    if slices > MIG_SLICES:
        raise InvalidInput("fake_gpus", f"the MIG instances in {part!r} use {slices} compute slices; "
                                        f"a card has {MIG_SLICES}")
    if mem > memory_mb:
        raise InvalidInput("fake_gpus", f"the MIG instances in {part!r} need {mem // 1024} GB; "
                                        f"the card has {memory_mb // 1024} GB")
    return tuple(out)


def _parse_card_options(text: str, part: str, memory_mb: int) -> dict[str, Any]:
    """The bracketed options of a fake card, `;` (or `][`) between them: `mig:...` (_parse_mig),
    `reserved:616M` (memory the driver keeps for itself), `nvml:v1` (a driver without NVML's v2
    memory info), `pidns:other` (NVML reports pids of another pid namespace, as in a container)."""
    options: dict[str, Any] = {}
    for item in re.split(r";|\]\s*\[", text):
        key, _, value = item.strip().partition(":")
        key, value = key.strip().lower(), value.strip()
        if key == "mig":
            options["mig"] = _parse_mig(item, part, memory_mb)
        elif key == "reserved":
            reserved = _parse_size(value, "fake_gpus") // (1024 * 1024)
            if reserved >= memory_mb:
                raise InvalidInput("fake_gpus", f"reserved:{value} in {part!r} is not less than the card's memory")
            options["reserved_mb"] = reserved
        elif key == "nvml" and value.lower() in ("v1", "v2"):
            options["nvml_v2"] = value.lower() == "v2"
        elif key == "pidns" and value.lower() in ("other", "same"):
            options["other_pidns"] = value.lower() == "other"
        else:
            raise InvalidInput("fake_gpus", f"cannot read [{item.strip()}] in {part!r}; write e.g. "
                                            "H200-141GB[mig:1g.18gb*7] or H200-141GB[reserved:616M;nvml:v1;pidns:other]")
    return options


def mig_profile_memory_mb(profile: str) -> int:
    """Memory of a MIG instance from its profile name: "1g.18gb" -> 18432 (MB)."""
    match = MIG_PROFILE.search(profile)
    return int(match.group(2)) * 1024 if match else 0


def parse_fake_gpus(spec: str) -> list[FakeGPUSpec]:
    """`"4xA100-80GB,2xT4"` -> [FakeGPUSpec(4, "A100-80GB", 81920), FakeGPUSpec(2, "T4", 15360)].

    A card partitioned with MIG lists its instances in brackets:
    `"1xH200-141GB[mig:1g.18gb*7]"`, `"A100-80GB[mig:3g.40gb,2g.20gb,1g.10gb*2]"` (profiles
    "<slices>g.<GB>gb", `*N` for N alike; at most 7 slices and the card's memory in all).
    What the driver does is said the same way (`_parse_card_options`), as on a real H200:
    `"1xH200-141GB[reserved:616M]"`, `"2xH100[reserved:500M;nvml:v1;pidns:other]"`.
    """
    out: list[FakeGPUSpec] = []
    if not spec or not spec.strip():
        return out
    for raw in _split_outside_brackets(spec):
        part = raw.strip()
        if not part:
            continue
        match = _FAKE_PART.match(part)
        if not match:
            raise InvalidInput("fake_gpus", f"cannot read {part!r}; write e.g. 4xA100-80GB,2xT4")
        count = int(match.group(1) or 1)
        base = match.group(2)
        if count <= 0:
            raise InvalidInput("fake_gpus", f"count must be positive in {part!r}")
        if match.group(3):
            memory = int(match.group(3)) * 1024
            model = f"{base}-{match.group(3)}GB"
        else:
            memory = _KNOWN_MEMORY_MB.get(base.upper(), 16384)
            model = base
        options = _parse_card_options(match.group(4), part, memory) if match.group(4) is not None else {}
        out.append(FakeGPUSpec(count, model, memory, **options))
    return out


def gpu_matches_type(gpu_name: str, wanted: str | None) -> bool:
    """Does a GPU's model name satisfy a `gpu_type` constraint?

    Matching is case-insensitive on the model's words, so "A100" matches "NVIDIA A100-SXM4-80GB"
    and "A100-80GB", "a100-80gb" matches "A100-80GB", and "T4" does not match "RTX A4000".
    A MIG instance ("H200 1g.18gb") matches only a type that names its profile ("1g.18gb",
    "H200 1g.18gb"): who asks for an H200 means a whole one.
    """
    if not wanted:
        return True
    name = gpu_name.lower().replace("nvidia", " ")
    want = wanted.lower().strip()
    profile = MIG_PROFILE.search(name)
    if profile and f"{profile.group(1)}g.{profile.group(2)}gb" not in want:
        return False  # a MIG instance is asked for by its profile ("1g.18gb", "H200 1g.18gb")
    tokens = re.split(r"[\s_/]+", name)
    if want in tokens:
        return True
    for token in tokens:
        if token == want or token.startswith(want + "-"):
            return True
    return bool(re.search(r"(^|[\s-])" + re.escape(want) + r"($|[\s-])", name))


# --------------------------------------------------------------------------- domain types


@dataclass(frozen=True)
class GPU:
    """One GPU as the scheduler and the API see it."""

    index: int
    uuid: str
    name: str
    host: str = "localhost"
    memory_total_mb: int = 0
    memory_used_mb: int = 0  # used by processes: never the driver's own reservation
    utilization: float = 0.0  # percent, 0-100
    healthy: bool = True
    draining: bool = False
    # in use outside the queue (e.g. "in use outside the queue (7.6 GiB held by pid 1234, python,
    # user bob)"): busy for the scheduler until released or an admin overrides; None: not
    foreign: str | None = None
    memory_reserved_mb: int = 0  # kept by the driver for itself, apart from memory_used_mb (as nvidia-smi)


@dataclass(frozen=True)
class Dependency:
    """`after:17` (17 ended, any state) or `afterok:17` (17 COMPLETED)."""

    kind: str  # "after" | "afterok"
    job_id: int


def parse_dependencies(value: Any, field_name: str = "depends") -> tuple[Dependency, ...]:
    """`"afterok:3:4,after:5"`, `["afterok:3", "after:5"]` or `[3, 4]` (afterok)."""
    if value in (None, "", []):
        return ()
    items: list[Any]
    if isinstance(value, str):
        items = [p for p in value.split(",") if p.strip()]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise InvalidInput(field_name, f"expected e.g. 'afterok:12' or a list of job ids, got {value!r}")
    if len(items) > MAX_DEPENDENCIES:
        raise InvalidInput(field_name, f"{len(items)} dependencies is more than the {MAX_DEPENDENCIES} allowed")
    deps: list[Dependency] = []
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool):
            deps.append(Dependency("afterok", parse_id(item, field_name)))
            continue
        if not isinstance(item, str):
            raise InvalidInput(field_name, f"cannot read dependency {_short(item)}")
        parts = item.strip().split(":")
        if len(parts) == 1 and parts[0].isdigit():
            deps.append(Dependency("afterok", parse_id(parts[0], field_name)))
            continue
        kind = parts[0].lower()
        if kind not in ("after", "afterok") or len(parts) < 2:
            raise InvalidInput(field_name, f"cannot read dependency {_short(item)}; use after:ID or afterok:ID")
        for jid in parts[1:]:
            if not (jid.isascii() and jid.isdigit()):
                raise InvalidInput(field_name, f"job id {_short(jid)} in {_short(item)} is not a number")
            deps.append(Dependency(kind, parse_id(jid, field_name)))
        if len(deps) > MAX_DEPENDENCIES:
            raise InvalidInput(field_name, f"more than the {MAX_DEPENDENCIES} dependencies allowed")
    return tuple(deps)


@dataclass(slots=True)
class Job:
    """A job: what was asked (the spec fields) and what happened (the state fields).

    The scheduler reads Jobs from its snapshot and never changes them; the service owns the
    state fields.
    """

    id: int
    user: str
    command: list[str] = field(default_factory=list)
    kind: str = "script"
    name: str = ""
    gpus: int = 1  # whole GPUs; 1 for a share job (one card, shared)
    gpu_type: str | None = None
    time_limit_s: int | None = None
    priority: str = "normal"
    group: str | None = None
    preemptible: bool = False
    requeue: bool = True
    begin: float | None = None  # epoch seconds; None = now
    offpeak: bool = False  # start only inside the configured off-peak windows
    depends: tuple[Dependency, ...] = ()
    array_job_id: int | None = None
    array_index: int | None = None
    array_max_running: int | None = None  # the %N of --array 0-15%N
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    payload: dict[str, Any] = field(default_factory=dict)  # kind-specific (notebook path, params...)
    mem_bytes: int | None = None  # host memory limit (--mem), enforced by the job's cgroup
    cpus: float | None = None  # CPU limit in cores (--cpus), enforced by the job's cgroup
    # part of one GPU (`gpus: 0.25`): 0 < share < 1 of the card's memory and time; None for whole GPUs
    share: float | None = None
    gpu_memory: int | None = None  # bytes of one card's memory asked for (`gpu_memory: "20G"`)
    # nodes of a multi-node job (issue 30; the Slurm runner only): `gpus` GPUs on each
    nodes: int = 1
    # a signal before the end (`signal: "USR1@5m"`), normalised as WarnSignal.text(): "B:USR1@300"
    warn_signal: str | None = None
    # requeued at a time limit or a lost run up to this many times (None: only when preempted)
    max_requeues: int | None = None
    # retries of a failed run (`retries: 3`): at most this many more runs, the first after
    # `retry_backoff_s`, each next one after twice the wait before; an out-of-memory end only
    # with `retry_oom`; a cancel, a time limit or a preemption never counts as a failure here
    retries: int = 0
    retry_backoff_s: int = 30
    retry_oom: bool = False
    # the container image it runs in (issue 29; engine/containers): None for the host's environment
    image: str | None = None
    # --- state
    state: JobState = JobState.PENDING
    submitted_at: float = 0.0
    started_at: float | None = None
    ended_at: float | None = None
    host: str | None = None
    assigned_gpus: tuple[int, ...] = ()
    borrowed: bool = False  # running beyond its guarantee on idle GPUs; may be reclaimed
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    run_seconds: float = 0.0  # accumulated over earlier runs of a requeued job
    restarts: int = 0
    requeues: int = 0  # times requeued at a time limit or a lost run (max_requeues bounds them)
    held: bool = False  # a pending job kept out of scheduling until released (shown as HELD)
    retried: int = 0  # runs started again after a failure (`retries`)
    expected_start: float | None = None
    position: int | None = None
    predicted_runtime_s: float | None = None
    # (10th, 90th percentile) of the runtimes its prediction rests on, at any confidence: the
    # spread that its own and later jobs' expected-start ranges come from (plan_predict.py)
    predicted_runtime_range: tuple[float, float] | None = None
    # the runtimes its predicted_runtime_s rests on, sorted: a running job past that prediction
    # is predicted to end at the median of those longer than it has run (plan_predict.py)
    predicted_runtimes: tuple[float, ...] | None = None

    def replace(self, **changes: Any) -> Job:
        return replace(self, **changes)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


@dataclass(frozen=True)
class Quota:
    """Layered quota of one user or group. None means no limit (or no guarantee)."""

    guaranteed_gpus: int = 0
    max_gpus: int | None = None
    max_running_jobs: int | None = None
    max_time_limit_s: int | None = None
    elastic: bool = True  # may borrow idle GPUs beyond the guarantee


@dataclass(frozen=True)
class OffpeakWindow:
    """Weekdays 0=Monday..6=Sunday, hours [start_hour, end_hour) local time; end may wrap past 24."""

    days: tuple[int, ...]
    start_hour: float
    end_hour: float


@dataclass(frozen=True)
class Policy:
    """Everything the scheduler may be told. Built by the service from traitlets config."""

    default_time_limit_s: int = 3600
    max_time_limit_s: int | None = 7 * 86400
    user_max_running_jobs: int | None = None
    user_max_gpus: int | None = None
    backfill: bool = True
    # multifactor priority
    weight_age: float = 1.0
    weight_fairshare: float = 2.0
    weight_class: float = 4.0
    weight_size: float = 0.25
    age_saturation_s: float = 7 * 86400  # the wait that makes the age factor 1 (it grows on past it)
    age_max: float | None = None  # cap of the age factor (1.0: Slurm's PriorityMaxAge); None: no cap
    # every job that waited its time limit goes first in its class, oldest first (docs/scheduling.md)
    oldest_first: bool = True
    fairshare_half_life_s: float = 7 * 86400
    fairshare: bool = True
    user_shares: Mapping[str, float] = field(default_factory=dict)
    group_shares: Mapping[str, float] = field(default_factory=dict)
    # layered quotas
    user_quotas: Mapping[str, Quota] = field(default_factory=dict)
    group_quotas: Mapping[str, Quota] = field(default_factory=dict)
    default_user_quota: Quota | None = None
    urgent_reserve_gpus: int = 0
    # who may submit at each priority class (parse_priority_tiers; admins: every class), and how
    # much one user may queue: waiting jobs and tasks of one array (None: no cap; admins: none)
    priority_tiers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    user_max_pending_jobs: int | None = None
    user_max_array_tasks: int | None = None
    # preemption
    preemption: bool = True
    preempt_grace_s: int = 30
    # the most a job's signal before the end (`signal: "USR1@5m"`) may stretch a preemption's
    # grace to (its signal time plus the kill grace); a job asking for more gets this, and is told
    preempt_grace_max_s: int = 600
    kill_grace_s: int = 10
    # how many times a job with `requeue: true` goes back to the queue at a time limit or a lost run
    max_requeues: int = 3
    # a running job is no victim before it ran this long (each run: a requeued job starts anew),
    # so a job is never preempted again straight after it (re)started
    preempt_min_runtime_s: int = 60
    # deferral
    offpeak_windows: tuple[OffpeakWindow, ...] = ()
    # local time of the off-peak windows, begin and reservation texts: the IANA zone `time_zone`
    # (its real offset at each instant: scheduler/deferral.py LocalClock), else UTC + utc_offset_s
    time_zone: str = ""
    utc_offset_s: int = 0
    # expected starts from predicted runtimes (Job.predicted_runtime_s, set when confident) where
    # those are earlier than the time limits' start (Plan.predicted); starts and reservations
    # always follow the time limits
    use_predictions: bool = True
    # GPU-hour budgets (issue 30): how many seconds of one GPU count as one GPU-hour (3600;
    # less compresses time, for tests and demos)
    budget_hour_s: float = 3600.0
    # scheduler knobs added with the scheduler package (see docs/scheduling.md)
    strict_classes: bool = True  # a higher class always goes first; False: class is one weighted factor
    fairshare_default_share: float = 1.0  # share of users/groups not in user_shares/group_shares
    # scheduler cost (docs/scheduling.md, "Performance"): the first `reservation_depth` jobs that
    # cannot start get a reservation on the GPU time line (backfill never delays them); deeper
    # jobs get a cheap aggregate estimate instead (None: every job is reserved, slow on deep queues)
    reservation_depth: int | None = 100


@dataclass(frozen=True)
class Start:
    job_id: int
    host: str
    gpus: tuple[int, ...]  # GPU indices on that host (one for a share job)
    borrowed: bool = False
    share: float | None = None  # a share job: the part of the card it takes (`share_fraction`)


@dataclass(frozen=True)
class Claim:
    """GPUs being freed for a preemptor: the victims it preempted (those still running in
    their grace) and when their grace ends. The scheduler keeps those GPUs for it and places
    it before every other job until it starts."""

    job_id: int  # the preemptor
    victims: tuple[int, ...]  # its victims still running
    until: float  # when their grace ends (epoch seconds)


@dataclass(frozen=True)
class Preemption:
    job_id: int  # the victim
    by_job_id: int
    reason: str  # e.g. "preempted by job 42 (guarantee of group vision)"


class Reasons(MutableMapping[int, str]):
    """Why each still-pending job waits: job id -> reason, as a dictionary.

    A planner gives most of a deep queue's reasons one per class of jobs (`add_by_class`):
    they become entries when the mapping is first read, so a cycle whose reasons nobody reads
    does not write one entry per job. A reason set for a job itself wins over its class's."""

    __slots__ = ("_own", "_by_class")

    def __init__(self, reasons: Mapping[int, str] | None = None):
        self._own: dict[int, str] = dict(reasons or {})
        self._by_class: list[tuple[Sequence[int], Sequence[int], Mapping[int, str], int]] = []

    def add_by_class(self, ids: Sequence[int], classes: Sequence[int], reason_of: Mapping[int, str],
                     start: int = 0) -> None:
        """Job ids[n] waits for reason_of[classes[n]] (no reason when its class has none), for
        n from `start` on. The three must not change afterwards."""
        self._by_class.append((ids, classes, reason_of, start))

    def _all(self) -> dict[int, str]:
        if self._by_class:
            out: dict[int, str] = {}
            for ids, classes, reason_of, start in self._by_class:
                cls = classes[start:]
                has = list(map(reason_of.__contains__, cls))
                out.update(zip(compress(ids[start:], has), map(reason_of.__getitem__, compress(cls, has))))
            out.update(self._own)
            self._own, self._by_class = out, []
        return self._own

    def __getitem__(self, job_id: int) -> str:
        return self._all()[job_id]

    def get(self, job_id: int, default: Any = None) -> Any:  # type: ignore[override]
        return self._all().get(job_id, default)

    def __setitem__(self, job_id: int, reason: str) -> None:
        self._own[job_id] = reason

    def __delitem__(self, job_id: int) -> None:
        del self._all()[job_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._all()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Reasons):
            other = other._all()
        return self._all() == other if isinstance(other, Mapping) else NotImplemented

    def __repr__(self) -> str:
        return f"Reasons({self._all()!r})"


@dataclass
class Plan:
    """What one scheduling cycle decided."""

    starts: list[Start] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    order: list[int] = field(default_factory=list)  # pending job ids in scheduling order
    reasons: Reasons = field(default_factory=Reasons)  # why each still-pending job waits
    expected_start: dict[int, float | None] = field(default_factory=dict)
    # the jobs whose expected start is a prediction from runtimes (Policy.use_predictions);
    # every other expected start is a bound: from time limits, kept if jobs run to them
    predicted: set[int] = field(default_factory=set)
    # (earliest, latest) of a waiting job's expected start (plan_predict.py): its start when
    # the jobs ahead run to the 10th and to the 90th percentile of their runtimes' spread
    expected_range: dict[int, tuple[float, float]] = field(default_factory=dict)
    cancels: list[tuple[int, str]] = field(default_factory=list)  # e.g. afterok dependency failed
    # the priority order this cycle used (scheduler.priority.QueueOrder), for the next cycles
    queue_order: Any = field(default=None, compare=False, repr=False)


# --------------------------------------------------------------------------- job requests

SUBMIT_FIELDS = {
    "command", "kind", "name", "gpus", "gpu_type", "time_limit", "priority", "group",
    "preemptible", "requeue", "begin", "when", "depends", "array", "cwd", "env", "payload",
    "mem", "cpus", "gpu_memory", "nodes", "signal", "max_requeues", "retries", "retry_backoff", "retry_oom", "hold",
    "image",
}

#: An image reference (`image: "localhost/pytorch:2.3"`, `"docker.io/library/python:3.12"`) or an
#: image file's absolute path (`"/shared/images/cuda.sif"`): no spaces, no control characters.
IMAGE_PATTERN = re.compile(r"[A-Za-z0-9/][A-Za-z0-9._/:@+-]{0,511}")


def parse_image(value: Any) -> str | None:
    """The container image a job runs in (issue 29): None when none was given (the site's
    default), "" for none at all (the host's own environment), else the reference as given."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput("image", f"expected an image name such as localhost/pytorch:2.3, got {_short(value)}")
    image = value.strip()
    if image and (not IMAGE_PATTERN.fullmatch(image) or "//" in image.replace("://", "", 1)):
        raise InvalidInput("image", f"{_short(value)} is not an image name (such as localhost/pytorch:2.3 or "
                                    "docker.io/library/python:3.12) nor an image file's absolute path "
                                    "(/shared/images/cuda.sif)")
    return image

#: Smallest and largest host memory limit a job may ask for, and the most CPUs.
MIN_MEM_BYTES = 16 << 20
MAX_MEM_BYTES = 1 << 50
MAX_CPUS = 4096
_MEM_UNITS = {"": 1 << 20, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _parse_size(value: Any, field_name: str) -> int:
    """Bytes from "32G", "512M", "1.5T", "20GB", "16GiB" or a number of megabytes."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidInput(field_name, f"expected a size such as 32G or 512M, got {_short(value)}")
    m = re.fullmatch(r"\s*(\d{1,15}(?:\.\d{1,9})?)\s*([KMGT]?)(?:I?B)?\s*", str(value), re.IGNORECASE)
    if not m:
        raise InvalidInput(field_name, f"cannot read the size {_short(value)}; use e.g. 32G or 512M")
    return int(float(m.group(1)) * _MEM_UNITS[m.group(2).upper()])


def parse_memory(value: Any, field_name: str = "mem") -> int:
    """Bytes of a host memory limit: "32G", "512M", "1.5T", or a number of megabytes (as Slurm's --mem)."""
    size = _parse_size(value, field_name)
    if not MIN_MEM_BYTES <= size <= MAX_MEM_BYTES:
        raise InvalidInput(field_name, f"{value!r} is out of range; a host memory limit is between 16M and 1024T")
    return size


def parse_cpus(value: Any, field_name: str = "cpus") -> float:
    """A CPU limit in cores: a number above 0 (0.5 is half a core), at most 4096."""
    try:
        cpus = float(value) if not isinstance(value, bool) else float("nan")
    except (TypeError, ValueError):
        raise InvalidInput(field_name, f"expected a number of CPUs such as 8 or 0.5, got {value!r}") from None
    if not 0.01 <= cpus <= MAX_CPUS:
        raise InvalidInput(field_name, f"{value!r} is out of range; ask for 0.01 to {MAX_CPUS} CPUs")
    return cpus


def parse_array(value: Any, field_name: str = "array") -> tuple[list[int], int | None]:
    """`"0-15%4"` -> (indices 0..15, at most 4 running); `"1,3,5"`; `"0-9:2"` (step).

    Sizes are checked before anything is expanded: at most MAX_ARRAY_TASKS tasks, indices up
    to MAX_ARRAY_INDEX, and MAX_ARRAY_TEXT characters of text."""
    if value in (None, ""):
        return [], None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InvalidInput(field_name, f"expected a range such as 0-15%4 or 1,3,5, got {_short(value)}")
    text = str(value).strip()
    if len(text) > MAX_ARRAY_TEXT:
        raise InvalidInput(field_name, f"array text of {len(text)} characters is over the {MAX_ARRAY_TEXT} allowed")
    limit: int | None = None
    if "%" in text:
        text, lim = text.split("%", 1)
        if not re.fullmatch(r"[0-9]{1,6}", lim) or int(lim) <= 0:
            raise InvalidInput(field_name, f"bad concurrency limit in {_short(value)}; use e.g. 0-15%4")
        limit = min(int(lim), MAX_ARRAY_TASKS)
    ranges: list[range] = []
    count = 0
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"([0-9]{1,9})(?:-([0-9]{1,9})(?::([0-9]{1,9}))?)?", part)
        if not m:
            raise InvalidInput(field_name, f"cannot read {_short(value)}; use e.g. 0-15%4 or 1,3,5")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        step = int(m.group(3)) if m.group(3) else 1
        if hi < lo or step <= 0:
            raise InvalidInput(field_name, f"bad range {part!r} in {_short(value)}")
        if hi > MAX_ARRAY_INDEX:
            raise InvalidInput(field_name, f"array index {hi} is over the largest allowed, {MAX_ARRAY_INDEX}")
        ranges.append(range(lo, hi + 1, step))
        count += len(ranges[-1])
        if count > MAX_ARRAY_TASKS:
            raise InvalidInput(field_name, f"{_short(value)} is more than the {MAX_ARRAY_TASKS} array tasks allowed")
    return sorted({i for r in ranges for i in r}), limit


def _is_unicode(value: Any) -> bool:
    """No string in a JSON value holds a lone surrogate (JSON allows "\\ud800"; UTF-8, the
    database, file names and process arguments do not)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, Mapping):
        return all(_is_unicode(k) and _is_unicode(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_is_unicode(v) for v in value)
    return True


def validate_submission(
    body: Mapping[str, Any],
    gpus: Sequence[GPU],
    policy: Policy,
    now: float,
) -> dict[str, Any]:
    """Check a submission (the JSON of `POST jobs`) and return normalised Job fields.

    Raises InvalidInput naming the first wrong field. `gpus` is the current inventory, used to
    refuse requests that can never run here (more GPUs than one host has, an unknown type).
    """
    if not isinstance(body, Mapping):
        raise InvalidInput("body", "expected a JSON object")
    unknown = sorted(set(body) - SUBMIT_FIELDS)
    if unknown:
        raise InvalidInput(unknown[0], f"unknown field; known fields are {', '.join(sorted(SUBMIT_FIELDS))}")
    for key, value in body.items():
        if not _is_unicode(value):
            raise InvalidInput(key, "contains text that is not valid Unicode (a lone surrogate such as "
                                    "\\ud800); send UTF-8 text")

    kind = body.get("kind", "script")
    if not isinstance(kind, str) or kind not in JOB_KINDS:
        raise InvalidInput("kind", f"unknown kind {_short(kind)}; choose one of {', '.join(JOB_KINDS)}")

    command = body.get("command")
    if isinstance(command, str):
        if len(command) > MAX_COMMAND_CHARS:
            raise InvalidInput("command", f"is {len(command):,} characters, more than the {MAX_COMMAND_CHARS:,} "
                                          "allowed; put a long command in a script and run the script")
        if "\x00" in command:
            raise InvalidInput("command", "contains a NUL character, which no program argument can hold")
        try:
            command_list = split_command(command)
        except ValueError as err:
            raise InvalidInput("command", f"cannot split command: {err}") from None
    elif isinstance(command, (list, tuple)) and all(isinstance(c, str) for c in command):
        if len(command) > MAX_COMMAND_WORDS or sum(map(len, command)) > MAX_COMMAND_CHARS:
            raise InvalidInput("command", f"is longer than the {MAX_COMMAND_WORDS:,} words or "
                                          f"{MAX_COMMAND_CHARS:,} characters allowed; put a long command in "
                                          "a script and run the script")
        command_list = list(command)
    elif command is None:
        command_list = []
    else:
        raise InvalidInput("command", "expected a string or a list of strings, e.g. \"python train.py\"")
    if len(command_list) > MAX_COMMAND_WORDS:
        raise InvalidInput("command", f"has {len(command_list):,} words, more than the {MAX_COMMAND_WORDS:,} "
                                      "allowed; put a long command in a script and run the script")
    if any("\x00" in c for c in command_list):
        raise InvalidInput("command", "contains a NUL character, which no program argument can hold")
    if kind == "script" and not command_list:
        raise InvalidInput("command", "a script job needs a command, e.g. \"python train.py\"")

    n_gpus, share = parse_gpus(body.get("gpus", 1))
    nodes = parse_nodes(body.get("nodes", 1))
    if nodes > 1 and share is not None:
        raise InvalidInput("nodes", "a share of one GPU runs on one node; ask for whole GPUs per node")
    gpu_memory = None
    if body.get("gpu_memory") not in (None, ""):
        gpu_memory = parse_gpu_memory(body["gpu_memory"])
        if n_gpus != 1:
            raise InvalidInput("gpu_memory", f"asks for memory on one shared GPU; it cannot go with gpus: {n_gpus} "
                                             "(ask for gpus: 1 or a share such as 0.5)")
    gpu_type = body.get("gpu_type")
    if gpu_type is not None:
        if not isinstance(gpu_type, str) or not gpu_type.strip():
            raise InvalidInput("gpu_type", f"expected a GPU model such as A100, got {gpu_type!r}")
        gpu_type = gpu_type.strip()
        check_plain_text(gpu_type, "gpu_type")

    if n_gpus > 0 and gpus:
        candidates = [g for g in gpus if gpu_matches_type(g.name, gpu_type)]
        if gpu_type and not candidates:
            models = sorted({g.name for g in gpus})
            raise InvalidInput("gpu_type", f"no {gpu_type} GPUs on this server; it has {', '.join(models)}")
        per_host: dict[str, int] = {}
        for g in candidates:
            per_host[g.host] = per_host.get(g.host, 0) + 1
        most = max(per_host.values())
        if n_gpus > most:
            what = f"{gpu_type} GPUs" if gpu_type else "GPUs"
            raise InvalidInput("gpus", f"asked for {n_gpus} but this server has only {most} {what}")
        largest = max(candidates, key=lambda g: g.memory_total_mb)
        if gpu_memory is not None and largest.memory_total_mb and gpu_memory > largest.memory_total_mb << 20:
            raise InvalidInput("gpu_memory", f"{format_bytes(gpu_memory)} is more than any "
                                             f"{gpu_type + ' ' if gpu_type else ''}GPU here has (the largest, "
                                             f"{largest.name}, has {format_bytes(largest.memory_total_mb << 20)})")
    elif gpu_type and not gpus and n_gpus > 0:
        pass  # no inventory (yet): the job waits with "no GPUs on this server"

    if body.get("time_limit") in (None, ""):
        time_limit = policy.default_time_limit_s
    else:
        time_limit = parse_duration(body["time_limit"], "time_limit")
    if policy.max_time_limit_s is not None and time_limit > policy.max_time_limit_s:
        raise InvalidInput(
            "time_limit",
            f"{format_duration(time_limit)} is over the maximum of {format_duration(policy.max_time_limit_s)}",
        )

    priority = parse_priority(body.get("priority", "normal"))

    name = body.get("name") or ""
    if not isinstance(name, str) or len(name) > 200:
        raise InvalidInput("name", "expected a string of at most 200 characters")
    check_plain_text(name, "name")
    group = body.get("group")
    if group is not None and (not isinstance(group, str) or not re.fullmatch(r"[\w.-]{1,64}", group)):
        raise InvalidInput("group", f"expected a project name of letters, digits, '.', '_' or '-', got {group!r}")

    for flag in ("preemptible", "requeue", "retry_oom", "hold"):
        if flag in body and not isinstance(body[flag], bool):
            raise InvalidInput(flag, f"expected true or false, got {body[flag]!r}")

    cwd = body.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or "\x00" in cwd or len(cwd) > 4096):
        raise InvalidInput("cwd", "expected a directory path")
    env = body.get("env") or {}
    if not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise InvalidInput("env", "expected an object of string names to string values")
    for key in env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise InvalidInput("env", f"{_short(key)} is not a valid environment variable name")
        if "\x00" in env[key]:
            raise InvalidInput("env", f"the value of {key} contains a NUL character")
    env_chars = sum(len(k) + len(v) for k, v in env.items())
    if env_chars > MAX_ENV_CHARS:
        raise InvalidInput("env", f"holds {env_chars:,} characters, more than the {MAX_ENV_CHARS:,} allowed; "
                                  "put large values in a file the job reads")

    begin: float | None = None
    offpeak = False
    when = body.get("when")
    if when is not None:
        if when != "offpeak":
            raise InvalidInput("when", f"unknown value {_short(when)}; the only choice is 'offpeak'")
        offpeak = True
    raw_begin = body.get("begin")
    if raw_begin not in (None, ""):
        begin = parse_begin(raw_begin, now)

    payload = body.get("payload") or {}
    if not isinstance(payload, Mapping):
        raise InvalidInput("payload", "expected an object")
    payload_chars = len(json.dumps(payload, default=str))
    if payload_chars > MAX_PAYLOAD_CHARS:
        raise InvalidInput("payload", f"is {payload_chars:,} characters of JSON, more than the "
                                      f"{MAX_PAYLOAD_CHARS:,} allowed; put large parameters in a file")

    warn_signal = None
    if body.get("signal") not in (None, ""):
        warn_signal = parse_warn_signal(body["signal"], time_limit).text()
    max_requeues = parse_requeue(body, policy)

    array, array_limit = parse_array(body.get("array"))
    # each task stores the job's command, environment and payload: a 1 MiB body of 1000 tasks
    # stored a GB, filling the engine's disk and holding its loop for 10 s
    stored = (sum(map(len, command_list)) + env_chars + payload_chars) * (len(array) if array else 1)
    if stored > MAX_SUBMISSION_CHARS:
        raise InvalidInput("array", f"{len(array or ()):,} tasks of {stored // max(1, len(array or ())):,} "
                                    f"characters each (command, env, payload) are more than the "
                                    f"{MAX_SUBMISSION_CHARS:,} one submission may store; give the tasks less "
                                    "to carry (a file they read) or submit fewer at once")
    mem = body.get("mem")
    cpus = body.get("cpus")

    return {
        "kind": kind,
        "command": command_list,
        "name": name,
        "gpus": n_gpus,
        "gpu_type": gpu_type,
        "time_limit_s": time_limit,
        "priority": priority,
        "group": group,
        "preemptible": bool(body.get("preemptible", False)),
        "requeue": bool(body.get("requeue", True)),
        "begin": begin,
        "offpeak": offpeak,
        "depends": parse_dependencies(body.get("depends")),
        "cwd": cwd,
        "env": dict(env),
        "payload": dict(payload),
        "array": array,
        "array_max_running": array_limit,
        "mem_bytes": parse_memory(mem) if mem not in (None, "") else None,
        "cpus": parse_cpus(cpus) if cpus not in (None, "") else None,
        "share": share,
        "gpu_memory": gpu_memory,
        "nodes": nodes,
        "warn_signal": warn_signal,
        "max_requeues": max_requeues,
        **parse_retries(body),
        "held": bool(body.get("hold", False)),
        "image": parse_image(body.get("image")),
    }


#: The most nodes one multi-node job may ask for.
MAX_NODES = 1024


def parse_nodes(value: Any) -> int:
    """The nodes of a job (`nodes: 2`, the CLI's `-N 2`): a whole number from 1 to MAX_NODES."""
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit():
        raise InvalidInput("nodes", f"expected a whole number of nodes such as 2, got {_short(value)}")
    n = int(str(value).strip())
    if not 1 <= n <= MAX_NODES:
        raise InvalidInput("nodes", f"must be between 1 and {MAX_NODES}, got {n}")
    return n


#: The most retries one job may ask for, and the longest first wait before one.
MAX_RETRIES = 100
MAX_RETRY_BACKOFF_S = 86400
#: The state a pending job that is held shows everywhere (API, tables, panel): it is PENDING
#: in the store and for the engine, with `held` set (`view_state`).
HELD = "HELD"


def view_state(job: Job) -> str:
    """The state a person reads: HELD for a held pending job, else the job's state."""
    return HELD if job.held and job.state is JobState.PENDING else job.state.value


def retry_wait_s(job: Job) -> int:
    """How long a failed run of `job` waits before its next try: `retry_backoff_s` before
    the first retry, twice as long before each next one (capped at a day)."""
    return int(min(MAX_RETRY_BACKOFF_S, job.retry_backoff_s * (2 ** min(job.retried, 20))))


def parse_retries(body: Mapping[str, Any]) -> dict[str, Any]:
    """The retry fields of a submission: `retries` (a whole number 0-100), `retry_backoff` (a
    duration, 30s when not given) and `retry_oom` (true/false)."""
    retries = body.get("retries", 0)
    if retries in (None, ""):
        retries = 0
    if isinstance(retries, str) and re.fullmatch(r"\s*[0-9]{1,3}\s*", retries):
        retries = int(retries)
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= MAX_RETRIES:
        raise InvalidInput("retries", f"expected a whole number of retries from 0 to {MAX_RETRIES}, "
                                      f"got {_short(retries)}")
    backoff = 30
    if body.get("retry_backoff") not in (None, ""):
        backoff = parse_duration(body["retry_backoff"], "retry_backoff")
        if backoff > MAX_RETRY_BACKOFF_S:
            raise InvalidInput("retry_backoff", f"at most {format_duration(MAX_RETRY_BACKOFF_S)}")
    return {"retries": retries, "retry_backoff_s": backoff, "retry_oom": bool(body.get("retry_oom", False))}


#: What `PATCH jobs/{id}` may change.
UPDATE_FIELDS = ("time_limit", "priority", "name", "begin")


def validate_update(body: Any, policy: Policy, now: float) -> dict[str, Any]:
    """Check a job update (the JSON of `PATCH jobs/{id}`): any of `time_limit`, `priority`,
    `name`, `begin` (null: now). Returns the Job fields to change; InvalidInput names a wrong
    field. What depends on the job and its user (its state, the user's maximum, the priority
    classes open to them) is checked by the engine."""
    if not isinstance(body, Mapping):
        raise InvalidInput("body", "expected a JSON object")
    unknown = sorted(set(body) - set(UPDATE_FIELDS))
    if unknown:
        raise InvalidInput(str(unknown[0])[:60], f"cannot be changed; a job's {', '.join(UPDATE_FIELDS)} can")
    if not body:
        raise InvalidInput("body", f"nothing to change; give one of {', '.join(UPDATE_FIELDS)}")
    out: dict[str, Any] = {}
    if "time_limit" in body:
        limit = parse_duration(body["time_limit"], "time_limit")
        if policy.max_time_limit_s is not None and limit > policy.max_time_limit_s:
            raise InvalidInput("time_limit", f"{format_duration(limit)} is over the maximum of "
                                             f"{format_duration(policy.max_time_limit_s)}")
        out["time_limit_s"] = limit
    if "priority" in body:
        out["priority"] = parse_priority(body["priority"])
    if "name" in body:
        name = body["name"] if body["name"] is not None else ""
        if not isinstance(name, str) or len(name) > 200:
            raise InvalidInput("name", "expected a string of at most 200 characters")
        check_plain_text(name, "name")
        out["name"] = name
    if "begin" in body:
        out["begin"] = None if body["begin"] in (None, "") else parse_begin(body["begin"], now, "begin",
                                                                             policy.time_zone)
    return out


#: Signals a job may ask for before its end; never KILL or STOP, which no program can catch.
WARN_SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "QUIT", "ALRM", "URG", "CONT", "WINCH", "XCPU", "PWR")
#: Slurm's default time before the end when `--signal USR1` gives none.
DEFAULT_SIGNAL_BEFORE_S = 60
#: The most a job may ask for itself (`max_requeues`).
MAX_REQUEUES = 1000


@dataclass(frozen=True)
class WarnSignal:
    """A signal sent `before_s` seconds before a job's time limit, and at once when it is
    preempted (before its grace ends): to the whole job, or only to its first process when
    `first_only` (Slurm's `B:`)."""

    name: str  # "USR1" (no SIG prefix)
    before_s: int
    first_only: bool = False

    def text(self) -> str:
        """How it is stored and shown: "USR1@300", "B:USR1@300" (Slurm's --signal form)."""
        return f"{'B:' if self.first_only else ''}{self.name}@{self.before_s}"

    def describe(self) -> str:
        """For people: "SIGUSR1 5m before the end (its first process only)"."""
        return (f"SIG{self.name} {format_duration(self.before_s)} before the end"
                + (" (its first process only)" if self.first_only else ""))


def parse_warn_signal(value: Any, time_limit_s: int | None = None, field_name: str = "signal") -> WarnSignal:
    """A signal before the end from "USR1@5m", "SIGUSR2@300", "B:USR1@90s" or "USR1" (60 s
    before). Raises InvalidInput naming `field_name` for an unknown signal, a bad time, or a
    time not shorter than the job's `time_limit_s`."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(field_name, f"expected a signal and a time before the end such as USR1@5m, got "
                                       f"{_short(value)}")
    text = value.strip()
    first_only = False
    if text[:2].upper() == "B:":
        first_only, text = True, text[2:]
    name, at, when = text.partition("@")
    name = name.strip().upper()
    name = name[3:] if name.startswith("SIG") else name
    if name not in WARN_SIGNALS:
        raise InvalidInput(field_name, f"unknown signal {_short(name)} in {_short(value)}; choose one of "
                                       f"{', '.join(WARN_SIGNALS)} (e.g. USR1@5m)")
    before = parse_duration(when, field_name) if at else DEFAULT_SIGNAL_BEFORE_S
    if time_limit_s is not None and before >= time_limit_s:
        raise InvalidInput(field_name, f"asks for SIG{name} {format_duration(before)} before the end, but the time "
                                       f"limit is {format_duration(time_limit_s)}: ask for less than the limit")
    return WarnSignal(name, before, first_only)


def preempt_grace(job: Job, policy: Policy) -> tuple[int, str]:
    """The grace a preempted `job` gets (seconds) and, when its signal before the end asks for
    more than the policy allows, why it gets less ("" otherwise). A job with a signal gets it
    at once and its SIGTERM when the asked time has passed: a grace of at least that plus the
    kill grace, up to the policy's preempt_grace_max_s."""
    if not job.warn_signal:
        return policy.preempt_grace_s, ""
    asked = parse_warn_signal(job.warn_signal).before_s + policy.kill_grace_s
    most = max(policy.preempt_grace_s, policy.preempt_grace_max_s)
    if asked <= most:
        return max(policy.preempt_grace_s, asked), ""
    return most, (f"its signal asks for {format_duration(asked - policy.kill_grace_s)} before the end, more than "
                  f"a preemption gives (c.GPUJobs.preempt_grace_max is {format_duration(most)}): it gets "
                  f"SIGTERM {format_duration(most - policy.kill_grace_s)} after its signal")


def parse_requeue(body: Mapping[str, Any], policy: Policy) -> int | None:
    """How many times a job goes back to the queue at a time limit or a lost run: None unless
    it asks (`requeue: true`, or `max_requeues: N`); the policy's max_requeues by default.
    (`requeue` alone also says whether a preempted job is requeued, as before: true unless false.)"""
    asked = body.get("max_requeues")
    if asked in (None, ""):
        return policy.max_requeues if body.get("requeue") is True else None
    if isinstance(asked, bool) or not isinstance(asked, (int, str)) or not str(asked).strip().isdigit():
        raise InvalidInput("max_requeues", f"expected a whole number of requeues such as 3, got {_short(asked)}")
    count = int(str(asked).strip())
    if count > MAX_REQUEUES:
        raise InvalidInput("max_requeues", f"{count} is more than the {MAX_REQUEUES} allowed")
    if body.get("requeue") is False and count:
        raise InvalidInput("max_requeues", "goes with requeue: true, not requeue: false")
    return count


def parse_begin(value: Any, now: float, field_name: str = "begin", zone: str = "") -> float:
    """Epoch seconds from an epoch number, an ISO time ("2026-12-02T22:00": in the IANA zone
    `zone`, or the server's local time without one, unless it has an offset), or a delay
    ("now+2h", "+30m"). A time may be in the past (the job may start now) but not before 1970,
    and at most MAX_BEGIN_AHEAD_S (a year) ahead."""
    from datetime import datetime
    from zoneinfo import ZoneInfo

    if isinstance(value, (int, float)) and not isinstance(value, bool):
        when_s = float(value) if abs(value) < 1e15 else float("inf")
    elif isinstance(value, str):
        text = value.strip()
        if len(text) > 100:
            raise InvalidInput(field_name, f"time of {len(text)} characters is too long; use e.g. 2026-12-02T22:00")
        for prefix in ("now+", "+"):
            if text.startswith(prefix):
                delay = parse_duration(text[len(prefix):], field_name)
                if delay > MAX_BEGIN_AHEAD_S:
                    raise InvalidInput(field_name, f"{value!r} is more than {format_duration(MAX_BEGIN_AHEAD_S)} "
                                                   "ahead")
                return now + delay
        try:
            when = datetime.fromisoformat(text)
            if when.tzinfo is None and zone:
                when = when.replace(tzinfo=ZoneInfo(zone))
            when_s = when.timestamp()  # naive: the server's local time
        except (ValueError, OverflowError, OSError):
            raise InvalidInput(field_name, f"cannot read time {_short(value)}; use e.g. 2026-12-02T22:00 or "
                                           "+2h") from None
    else:
        raise InvalidInput(field_name, f"expected a time such as 2026-12-02T22:00 or +2h, got {_short(value)}")
    if when_s != when_s or not 0 <= when_s <= now + MAX_BEGIN_AHEAD_S:
        raise InvalidInput(field_name, f"{_short(value)} is not a time between 1970 and "
                                       f"{format_duration(MAX_BEGIN_AHEAD_S)} from now")
    return when_s


# --------------------------------------------------------------------------- reservations

REPEATS = ("daily", "weekly")
RESERVATION_FIELDS = {"name", "gpus", "gpu_type", "host", "start", "duration", "repeat", "users", "groups"}
#: The most users or groups one reservation may name, and the longest occurrence.
MAX_RESERVATION_HOLDERS = 100
MAX_RESERVATION_S = 366 * 86400
_NAME_RE = re.compile(r"[\w.@-]{1,64}")


@dataclass(frozen=True)
class Reservation:
    """GPUs kept for some users or groups: `gpus` GPUs (of `gpu_type`, on `host` when given)
    from `start` for `duration_s`, once or again every day or week (`repeat`). The scheduler
    keeps them free for everyone else (only jobs that end before an occurrence starts run on
    them) and lets the holders use them (engine/scheduler/reservations.py)."""

    id: int
    gpus: int
    start: float  # epoch seconds of the first occurrence
    duration_s: int
    name: str = ""
    gpu_type: str | None = None
    host: str | None = None
    repeat: str | None = None  # None (once), "daily" or "weekly"
    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    created_by: str = ""
    created_at: float = 0.0

    @property
    def label(self) -> str:
        return self.name or f"reservation {self.id}"

    def holds(self, user: str, group: str | None) -> bool:
        """May this user (submitting in this group) use the reserved GPUs?"""
        return user in self.users or (group is not None and group in self.groups)

    def holders_text(self) -> str:
        """"group vision", "users alice, bob", "user alice and group vision"."""
        parts = []
        if self.users:
            parts.append(("user " if len(self.users) == 1 else "users ") + ", ".join(self.users))
        if self.groups:
            parts.append(("group " if len(self.groups) == 1 else "groups ") + ", ".join(self.groups))
        return " and ".join(parts) or "nobody"


def _names(value: Any, field_name: str, what: str) -> tuple[str, ...]:
    """A list of user or group names, or one comma-separated string of them."""
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)) or len(value) > MAX_RESERVATION_HOLDERS:
        raise InvalidInput(field_name, f"expected a list of at most {MAX_RESERVATION_HOLDERS} {what} names")
    out: list[str] = []
    for v in value:
        if not isinstance(v, str) or not _NAME_RE.fullmatch(v):
            raise InvalidInput(field_name, f"expected {what} names of letters, digits, '.', '_', '@' or '-', "
                                           f"got {_short(v)}")
        if v not in out:
            out.append(v)
    return tuple(out)


def validate_reservation(body: Any, now: float, gpus: Sequence[GPU] = ()) -> dict[str, Any]:
    """Check a reservation request (REST body or CLI options); returns the Reservation fields
    (without id, created_by, created_at). `gpus`: the server's GPUs, to refuse a type or count
    it cannot hold (none: not checked). Raises InvalidInput naming the wrong field."""
    if not isinstance(body, Mapping):
        raise InvalidInput("body", "expected a JSON object")
    unknown = sorted(set(body) - RESERVATION_FIELDS)
    if unknown:
        raise InvalidInput(str(unknown[0]), f"unknown field; known are {', '.join(sorted(RESERVATION_FIELDS))}")
    if "gpus" not in body:
        raise InvalidInput("gpus", "how many GPUs to reserve is required")
    n = parse_gpu_count(body["gpus"])
    if n < 1:
        raise InvalidInput("gpus", "reserve at least 1 GPU")
    gpu_type = body.get("gpu_type")
    if gpu_type is not None:
        if not isinstance(gpu_type, str) or not gpu_type.strip() or len(gpu_type) > 64:
            raise InvalidInput("gpu_type", f"expected a GPU model such as A100, got {_short(gpu_type)}")
        gpu_type = gpu_type.strip()
        check_plain_text(gpu_type, "gpu_type")
    host = body.get("host")
    if host is not None and (not isinstance(host, str) or not re.fullmatch(r"[\w.-]{1,253}", host)):
        raise InvalidInput("host", f"expected a host name, got {_short(host)}")
    if gpus:
        usable = [g for g in gpus if gpu_matches_type(g.name, gpu_type) and (host is None or g.host == host)]
        if not usable:
            what = f"{gpu_type} GPUs" if gpu_type else "GPUs"
            raise InvalidInput("gpu_type" if gpu_type else "host", f"no {what}{f' on {host}' if host else ''} "
                                                                   "on this server")
        per_host: dict[str, int] = {}
        for g in usable:
            per_host[g.host] = per_host.get(g.host, 0) + 1
        if n > max(per_host.values()):
            raise InvalidInput("gpus", f"{n} GPUs is more than one host has ({max(per_host.values())})")
    if "start" not in body:
        raise InvalidInput("start", "when the reservation starts is required (e.g. 2026-12-04T09:00 or +1h)")
    start = parse_begin(body["start"], now, "start")
    if "duration" not in body:
        raise InvalidInput("duration", "how long it lasts is required (e.g. 4h)")
    duration = parse_duration(body["duration"], "duration")
    if duration < 60:
        raise InvalidInput("duration", "a reservation lasts at least a minute")
    if duration > MAX_RESERVATION_S:
        raise InvalidInput("duration", f"at most {format_duration(MAX_RESERVATION_S)}")
    repeat = body.get("repeat")
    if repeat in ("", "none", "once"):
        repeat = None
    if repeat is not None:
        if not isinstance(repeat, str) or repeat.strip().lower() not in REPEATS:
            raise InvalidInput("repeat", f"expected one of {', '.join(REPEATS)} (or none), got {_short(repeat)}")
        repeat = repeat.strip().lower()
        period = 86400 if repeat == "daily" else 7 * 86400
        if duration > period:
            raise InvalidInput("duration", f"a {repeat} reservation lasts at most {format_duration(period)}")
    elif start + duration <= now:
        raise InvalidInput("start", "the reservation would be over before it is made")
    users = _names(body.get("users"), "users", "user")
    groups = _names(body.get("groups"), "groups", "group")
    if not users and not groups:
        raise InvalidInput("users", "name the users or groups the GPUs are reserved for")
    name = body.get("name") or ""
    if not isinstance(name, str) or len(name) > 100:
        raise InvalidInput("name", "expected a name of at most 100 characters")
    check_plain_text(name, "name")
    return {"name": name.strip(), "gpus": n, "gpu_type": gpu_type, "host": host, "start": start,
            "duration_s": duration, "repeat": repeat, "users": users, "groups": groups}

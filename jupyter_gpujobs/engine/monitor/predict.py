"""Runtime prediction from history: how long will this job run, and how sure are we?

A job's key is `(user, signature, gpu_type)`: the signature is its name, or when it has none
a signature of its command (`command_signature`). Past runs are (key, runtime) records.
A prediction looks at the finest level of the key that has history — user+signature+GPU
type, then user+signature, then user, then everyone — and predicts the median of the
latest runs there, with their 10th and 90th percentiles as its spread. Its confidence
(0..1) grows with the number of runs behind it and falls with every coarser level it had to
fall back to; not with their spread (`RuntimePredictor.predict`).

`RuntimePredictor` keeps the history incrementally (the engine feeds it each ended job and
asks it for each new one); `predict_runtime()` is the same as one pure function over a list
of records. No I/O, no clock.
"""

from __future__ import annotations

import os
import re
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from statistics import median

#: Levels of a key, finest first: how many leading parts of (user, signature, gpu_type) count.
LEVELS: tuple[tuple[str, int], ...] = (("user+name+gpu", 3), ("user+name", 2), ("user", 1), ("global", 0))

#: Confidence factor of each level (a user's other jobs say less about this one).
LEVEL_WEIGHT = {"user+name+gpu": 1.0, "user+name": 0.9, "user": 0.5, "global": 0.2}

Key = tuple[Hashable, ...]


@dataclass(frozen=True)
class Prediction:
    seconds: float | None  # None: no history at all
    confidence: float  # 0..1
    level: str  # which level answered ("none" without history)
    runs: int  # how many past runs the estimate rests on
    upper_s: float | None = None  # the longest of those runs: a cautious bound for backfill
    low_s: float | None = None  # their 10th percentile ...
    high_s: float | None = None  # ... and 90th: the spread that expected-start ranges come from
    runs_s: tuple[float, ...] = ()  # those runs, sorted (a running job's rest: plan_predict.py)


_NUMBER = re.compile(r"\d+")


def command_signature(command: Sequence[str]) -> str:
    """What identifies "the same job" in a command line: the program and the script it runs,
    without options and with numbers masked. `["python", "train.py", "--lr", "0.1"]` ->
    `"python train.py"`; `["/usr/bin/python3.11", "-u", "exp_3.py"]` -> `"python#.# exp_#.py"`."""
    parts: list[str] = []
    for token in command:
        if token.startswith("-"):
            if parts and parts[-1].startswith("python") and token in ("-u", "-O", "-B"):
                continue
            if token == "-m":
                continue
            break
        if "=" in token:
            break
        base = os.path.basename(token) if "/" in token else token
        parts.append(_NUMBER.sub("#", base))
        if len(parts) == 3:
            break
    return " ".join(parts)


def job_key(user: str, name: str | None, command: Sequence[str], gpu_type: str | None) -> Key:
    """The prediction key of a job (see the module docstring)."""
    return (user, name or command_signature(command), (gpu_type or "").lower())


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The q-quantile of sorted values, linear between neighbours."""
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class RuntimePredictor:
    """History of runtimes by key level; `add()` past runs, `predict()` new ones."""

    def __init__(self, window: int = 8, min_runs: int = 1):
        self.window = window
        self.min_runs = min_runs
        self._runs: dict[tuple[int, Key], deque[float]] = {}
        self._counts: dict[tuple[int, Key], int] = {}

    def add(self, key: Key, runtime_s: float) -> None:
        if runtime_s is None or runtime_s < 0:
            return
        for _, depth in LEVELS:
            k = (depth, tuple(key[:depth]))
            runs = self._runs.get(k)
            if runs is None:
                runs = self._runs[k] = deque(maxlen=self.window if depth else max(self.window, 101))
            runs.append(float(runtime_s))
            self._counts[k] = self._counts.get(k, 0) + 1

    def predict(self, key: Key) -> Prediction:
        """The prediction at the finest level of `key` with history. Its confidence is the
        level's weight times n / (n + 1) for the n runs seen there; a spread of runtimes does not
        lower it. A confident prediction is what expected starts use (`Job.predicted_runtime_s`,
        `Job.predicted_runtimes`), and they use the spread themselves: a running job past its
        prediction ends as its owner's runs longer than it has run (plan_predict.py), a waiting
        job's range comes from their percentiles (`low_s`, `high_s`). When a spread lowered the
        confidence (by 1 / (1 + 2 x relative median absolute deviation)), most of a user's
        histories (runs of 1 min and of hours) were unconfident, and their running jobs held
        their GPUs to their time limits on the line of predicted ends: the worst guess (figures:
        docs/scheduling.md, "How good are the expected starts?")."""
        for level, depth in LEVELS:
            k = (depth, tuple(key[:depth]))
            runs = self._runs.get(k)
            if not runs or len(runs) < self.min_runs:
                continue
            values = sorted(runs)
            n = self._counts[k]
            confidence = LEVEL_WEIGHT[level] * n / (n + 1.0)
            return Prediction(seconds=median(values), confidence=round(confidence, 3), level=level, runs=len(values),
                              upper_s=values[-1], low_s=_quantile(values, 0.1), high_s=_quantile(values, 0.9),
                              runs_s=tuple(values))
        return Prediction(seconds=None, confidence=0.0, level="none", runs=0)


def job_fields(p: Prediction, time_limit_s: float | None, min_confidence: float) -> dict[str, object]:
    """What a prediction sets on a job (the monitor on the engine's jobs, `sim` on a replay's),
    each within the job's time limit: `predicted_runtime_s` and the runs behind it
    (`predicted_runtimes`) when at least `min_confidence` sure; `predicted_runtime_range`, the
    10th-90th percentile of those runs, at any confidence when they are the owner's own (not
    everyone's): expected-start ranges (plan_predict.py)."""
    cap = float(time_limit_s) if time_limit_s else float("inf")
    out: dict[str, object] = {}
    if p.seconds is not None and p.confidence >= min_confidence:
        out["predicted_runtime_s"] = max(1.0, min(p.seconds, cap))
        out["predicted_runtimes"] = tuple(min(r, cap) for r in p.runs_s)
    if p.low_s is not None and p.high_s is not None and p.level != "global":
        out["predicted_runtime_range"] = (max(1.0, min(p.low_s, cap)), max(1.0, min(p.high_s, cap)))
    return out


def predict_runtime(history: Iterable[tuple[Key, float]], key: Key, window: int = 8) -> tuple[float | None, float]:
    """(predicted runtime in seconds or None, confidence 0..1) of a job with `key` from past
    (key, runtime) records, oldest first."""
    predictor = RuntimePredictor(window=window)
    for past_key, runtime in history:
        predictor.add(past_key, runtime)
    p = predictor.predict(key)
    return p.seconds, p.confidence


__all__ = ["LEVELS", "Prediction", "RuntimePredictor", "command_signature", "job_fields", "job_key",
           "predict_runtime"]

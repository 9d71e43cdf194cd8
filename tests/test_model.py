"""Parsing and validation of what users type: durations, GPU specs, submissions."""

from __future__ import annotations

import time
from typing import Any

import pytest

from jupyter_gpujobs.model import (
    GPU,
    InvalidInput,
    Policy,
    format_duration,
    format_expected_start,
    gpu_matches_type,
    parse_array,
    parse_dependencies,
    parse_duration,
    parse_fake_gpus,
    split_command,
    validate_submission,
)

GPUS = [GPU(0, "u0", "A100-80GB"), GPU(1, "u1", "A100-80GB"), GPU(2, "u2", "T4")]


@pytest.mark.parametrize("text,seconds", [
    ("30m", 1800), ("1h30m", 5400), ("2d", 172800), ("90", 90), (90, 90), ("1:30:00", 5400),
    ("45:00", 2700), ("1h 30m", 5400), ("10s", 10), ("1.5h", 5400),
])
def test_durations(text: object, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "soon", "10x", "-5", 0, -3, "1h30", True, None, "1:99:00"])
def test_bad_durations_name_the_field(bad: object) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_duration(bad, "time_limit")
    assert err.value.field == "time_limit"


def test_format_duration_round_trips() -> None:
    for seconds in (5, 60, 5400, 86400 + 3600):
        assert parse_duration(format_duration(seconds)) == seconds


def test_expected_starts_say_whether_they_are_a_bound_or_a_prediction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        now = 1_700_000_000.0  # Tue 14 Nov 2023 22:13:20 UTC
        assert format_expected_start(now + 294, "bound", now) == "by 22:18 at the latest (in 4m54s)"
        assert format_expected_start(now + 57, "prediction", now) == "about 22:14 (in 57s)"
        assert format_expected_start(now + 2 * 86400, "prediction", now) == "about Thu 22:13 (in 2d)"
        assert format_expected_start(now + 30 * 86400, "bound", now) == "by Dec 14 22:13 at the latest (in 30d)"
        assert format_expected_start(now - 5, "bound", now) == "now"
        assert format_expected_start(None, None, now) == "unknown"
        # a range a minute or more wide: "starts 22:18-23:03", with the most likely start
        span = (now + 294, now + 294 + 2700)
        assert format_expected_start(now + 900, "prediction", now, span=span) == "22:18-23:03 (about 22:28, in 15m)"
        assert format_expected_start(now + 2994, "bound", now, span=span) == (
            "by 23:03 at the latest (in 49m54s; from 22:18)")
        assert format_expected_start(now + 30, "prediction", now, span=(now - 100, now + 600)) == (
            "now-22:23 (about 22:13, in 30s)")
        assert format_expected_start(now + 57, "prediction", now, span=(now + 57, now + 80)) == "about 22:14 (in 57s)"
        # a start that passed while the job still waits is known to be wrong: unknown
        assert format_expected_start(now - 300, "prediction", now, span=span) == "unknown"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_fake_gpu_spec() -> None:
    spec = parse_fake_gpus("4xA100-80GB,2xT4")
    assert [(s.count, s.model, s.memory_mb) for s in spec] == [(4, "A100-80GB", 81920), (2, "T4", 15360)]
    with pytest.raises(InvalidInput, match="fake_gpus"):
        parse_fake_gpus("4x")


def test_gpu_type_matching() -> None:
    assert gpu_matches_type("NVIDIA A100-SXM4-80GB", "A100")
    assert gpu_matches_type("A100-80GB", "a100")
    assert gpu_matches_type("A100-80GB", "A100-80GB")
    assert not gpu_matches_type("Tesla T4", "A100")
    assert not gpu_matches_type("NVIDIA RTX A4000", "T4")
    assert gpu_matches_type("anything", None)


def test_dependencies_and_arrays() -> None:
    deps = parse_dependencies("afterok:3:4,after:5")
    assert [(d.kind, d.job_id) for d in deps] == [("afterok", 3), ("afterok", 4), ("after", 5)]
    assert parse_array("0-15%4") == (list(range(16)), 4)
    assert parse_array("1,3,5") == ([1, 3, 5], None)
    with pytest.raises(InvalidInput, match="array"):
        parse_array("5-1")


def test_submission_is_normalised() -> None:
    out = validate_submission({"command": "python train.py --lr 0.1", "gpus": 2, "gpu_type": "A100",
                               "time_limit": "30m"}, GPUS, Policy(), now=0)
    assert out["command"] == ["python", "train.py", "--lr", "0.1"]
    assert out["time_limit_s"] == 1800
    assert out["priority"] == "normal"


@pytest.mark.parametrize("body,field,words", [
    ({"command": "x", "gpus": -1}, "gpus", "negative"),
    ({"command": "x", "gpus": 1.5}, "gpus", "whole number"),
    ({"command": "x", "gpus": 4}, "gpus", "only 3"),
    ({"command": "x", "gpus": 3, "gpu_type": "A100"}, "gpus", "only 2 A100"),
    ({"command": "x", "gpu_type": "H100"}, "gpu_type", "no H100"),
    ({"command": "x", "time_limit": "soon"}, "time_limit", "duration"),
    ({"command": "x", "time_limit": "30d"}, "time_limit", "maximum"),
    ({"command": "x", "priority": "asap"}, "priority", "unknown priority"),
    ({"command": "x", "colour": "red"}, "colour", "unknown field"),
    ({"command": 5}, "command", "string"),
    ({"gpus": 1}, "command", "needs a command"),
    ({"command": "x", "env": {"1BAD": "v"}}, "env", "not a valid"),
])
def test_bad_submissions(body: dict, field: str, words: str) -> None:
    with pytest.raises(InvalidInput) as err:
        validate_submission(body, GPUS, Policy(), now=0)
    assert err.value.field == field
    assert words in err.value.message


def test_command_strings_split_as_a_shell_does() -> None:
    """`split_command` gives shlex's words (and its errors) on every string of shell-ish
    characters up to 10 long: quotes, escapes, white space, and text around them."""
    import random
    import shlex

    def words(split: Any, text: str) -> Any:
        try:
            return split(text)
        except ValueError:
            return "error"

    rng = random.Random(7)
    alphabet = "ab \t\n'\"\\é$"
    for _ in range(50_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10)))
        assert words(split_command, text) == words(shlex.split, text), repr(text)
    assert split_command('python -c "print(\\"hi\\")" \'x y\'') == ["python", "-c", 'print("hi")', "x y"]
    with pytest.raises(ValueError, match="unclosed quote"):
        split_command("echo 'oops")

"""GPU shares: asking for part of one GPU (`gpus: 0.25`, `gpu_memory: "20G"`), and the store
holding several shares of one card but never a share beside a whole-GPU job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import MetaData, insert

from jupyter_gpujobs.engine.store import GPUAlreadyAllocated, Store
from jupyter_gpujobs.model import (
    GPU,
    InvalidInput,
    Job,
    JobState,
    Policy,
    parse_gpus,
    share_fraction,
    share_memory_bytes,
    validate_submission,
)

GiB = 1 << 30
GPUS = [GPU(0, "u0", "A100-80GB", memory_total_mb=81920), GPU(1, "u1", "T4", memory_total_mb=15360)]


@pytest.mark.parametrize("value,parsed", [
    (0.25, (1, 0.25)), ("0.5", (1, 0.5)), (".25", (1, 0.25)), (0, (0, None)), (1, (1, None)), (2.0, (2, None)),
    ("3", (3, None)), (1.0, (1, None)),
])
def test_a_gpu_request_is_whole_gpus_or_a_share_of_one(value: object, parsed: tuple) -> None:
    assert parse_gpus(value) == parsed


@pytest.mark.parametrize("value,words", [
    (1.5, "whole number of GPUs (e.g. 2) or a share of one GPU below 1"),
    ("2.5", "whole number"),
    (0.001, "below the smallest"),
    (-0.5, "share such as 0.25"),
    (float("nan"), "share such as 0.25"),
])
def test_an_impossible_share_is_refused_with_what_to_ask_instead(value: object, words: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_gpus(value)
    assert err.value.field == "gpus" and words in err.value.message


def test_a_share_submission_keeps_one_card_and_the_share() -> None:
    out = validate_submission({"command": "x", "gpus": 0.25}, GPUS, Policy(), now=0)
    assert (out["gpus"], out["share"], out["gpu_memory"]) == (1, 0.25, None)
    out = validate_submission({"command": "x", "gpu_memory": "20G", "gpu_type": "A100"}, GPUS, Policy(), now=0)
    assert (out["gpus"], out["share"], out["gpu_memory"]) == (1, None, 20 * GiB)
    out = validate_submission({"command": "x", "gpus": 2}, GPUS, Policy(), now=0)
    assert (out["gpus"], out["share"], out["gpu_memory"]) == (2, None, None)
    out = validate_submission({"command": "x", "gpus": 0}, GPUS, Policy(), now=0)
    assert (out["gpus"], out["share"]) == (0, None)


@pytest.mark.parametrize("body,field,words", [
    ({"gpus": 2, "gpu_memory": "20G"}, "gpu_memory", "cannot go with gpus: 2"),
    ({"gpus": 0, "gpu_memory": "20G"}, "gpu_memory", "cannot go with gpus: 0"),
    ({"gpu_memory": "100G"}, "gpu_memory", "more than any GPU here has (the largest, A100-80GB, has 80.0 GiB)"),
    ({"gpu_memory": "20G", "gpu_type": "T4"}, "gpu_memory", "more than any T4 GPU here has"),
    ({"gpu_memory": "lots"}, "gpu_memory", "cannot read the size"),
    ({"gpu_memory": "1M"}, "gpu_memory", "below the smallest"),
    ({"gpus": 1.5}, "gpus", "whole number"),
])
def test_bad_share_submissions_name_the_field(body: dict, field: str, words: str) -> None:
    with pytest.raises(InvalidInput) as err:
        validate_submission({"command": "x", **body}, GPUS, Policy(), now=0)
    assert err.value.field == field
    assert words in err.value.message


def test_the_enforced_memory_share_and_the_counted_fraction() -> None:
    card = 80 * GiB
    quarter = Job(1, "a", share=0.25)
    twenty = Job(2, "a", gpu_memory=20 * GiB)
    both = Job(3, "a", share=0.5, gpu_memory=10 * GiB)
    whole = Job(4, "a", gpus=2)
    assert share_memory_bytes(quarter, card) == 20 * GiB
    assert share_memory_bytes(twenty, card) == 20 * GiB
    assert share_memory_bytes(both, card) == 10 * GiB
    assert share_memory_bytes(whole, card) is None
    assert share_fraction(quarter, card) == 0.25
    assert share_fraction(twenty, card) == 0.25
    assert share_fraction(both, card) == 0.5
    assert share_fraction(whole, card) == 2.0
    assert share_fraction(twenty, 0) == 1.0  # a card of unknown memory: counted whole


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    s = Store(f"sqlite:///{tmp_path / 'gpujobs.sqlite'}")
    s.migrate()
    yield s
    s.close()


def _add(store: Store, n: int, **fields: object) -> list[int]:
    jobs = store.add_jobs([{"user": "alice", "command": ["true"], **fields} for _ in range(n)], actor="alice", now=1.0)
    return [j.id for j in jobs]


def test_four_quarter_shares_hold_one_card_and_a_fifth_or_a_whole_job_is_refused(store: Store) -> None:
    shares = _add(store, 5, gpus=1, share=0.25)
    whole = _add(store, 1, gpus=1)[0]
    for jid in shares[:4]:
        job = store.start(jid, "localhost", [(0, "u0")], now=2.0, share=0.25)
        assert job is not None and job.share == 0.25 and job.assigned_gpus == (0,)
    with pytest.raises(GPUAlreadyAllocated, match="no room for a share"):
        store.start(shares[4], "localhost", [(0, "u0")], now=2.0, share=0.25)
    with pytest.raises(GPUAlreadyAllocated, match="holds shares"):
        store.start(whole, "localhost", [(0, "u0")], now=2.0)
    assert sorted(a["share"] for a in store.active_allocations()) == [0.25] * 4
    store.transition(shares[0], JobState.COMPLETED, "runner", "completed", now=3.0)
    assert store.start(shares[4], "localhost", [(0, "u0")], now=4.0, share=0.25) is not None


def test_a_share_is_refused_on_a_card_a_whole_job_holds(store: Store) -> None:
    whole, share = _add(store, 1, gpus=1)[0], _add(store, 1, gpus=1, share=0.5)[0]
    assert store.start(whole, "localhost", [(0, "u0")], now=2.0) is not None
    with pytest.raises(GPUAlreadyAllocated):
        store.start(share, "localhost", [(0, "u0")], now=2.0, share=0.5)
    assert store.start(share, "localhost", [(1, "u1")], now=2.0, share=0.5) is not None


def test_shares_and_gpu_memory_survive_an_upgrade_from_the_schema_before_shares(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'gpujobs.sqlite'}"
    old = Store(url)
    old.migrate("0004")  # the schema before shares, written through its own tables
    meta = MetaData()
    meta.reflect(old.engine)
    with old.engine.begin() as conn:
        jid = conn.execute(insert(meta.tables["jobs"]).values(
            user="alice", kind="script", command=["true"], gpus=1, priority="normal", preemptible=False,
            requeue=True, offpeak=False, depends=[], env={}, payload={}, state="RUNNING", submitted_at=1.0,
            started_at=2.0, host="localhost", assigned_gpus=[0], borrowed=False, reason="", run_seconds=0.0,
            restarts=0, runner_handle={})).inserted_primary_key[0]
        conn.execute(insert(meta.tables["allocations"]).values(job_id=jid, host="localhost", gpu_index=0,
                                                                gpu_uuid="u0", started_at=2.0))
    old.close()
    store = Store(url)
    try:
        store.migrate()
        assert store.get(jid).share is None and store.get(jid).assigned_gpus == (0,)
        [new] = _add(store, 1, gpus=1, share=0.5, gpu_memory=10 * GiB)
        assert (store.get(new).share, store.get(new).gpu_memory) == (0.5, 10 * GiB)
        with pytest.raises(GPUAlreadyAllocated):  # the whole job kept from before still holds GPU 0
            store.start(new, "localhost", [(0, "u0")], now=3.0, share=0.5)
    finally:
        store.close()


async def test_the_api_takes_a_share_and_refuses_an_impossible_one(api: Any) -> None:
    status, body = await api("POST", "jobs", {"command": ["true"], "gpus": 0.25, "gpu_memory": "2G",
                                              "begin": "+1h"})
    assert status == 201, body
    assert (body["gpus"], body["share"], body["gpu_memory"]) == (1, 0.25, 2 * GiB)
    status, body = await api("POST", "jobs", {"command": ["true"], "gpus": 1.5})
    assert status == 400
    assert "whole number of GPUs (e.g. 2) or a share of one GPU below 1" in body["message"]
    status, body = await api("POST", "jobs", {"command": ["true"], "gpus": 2, "gpu_memory": "20G"})
    assert status == 400 and "cannot go with gpus: 2" in body["message"]


async def test_four_quarter_jobs_run_at_once_on_one_gpu_and_a_whole_job_runs_on_another(api: Any) -> None:
    import sys

    from servers import wait_for

    code = "import os, time; print('gpu=' + os.environ['CUDA_VISIBLE_DEVICES'], flush=True); time.sleep(60)"
    ids = []
    for n in range(4):
        status, body = await api("POST", "jobs", {"command": [sys.executable, "-c", code], "gpus": 0.25,
                                                  "time_limit": "1m", "name": f"quarter{n}"})
        assert status == 201, body
        ids.append(body["id"])
    status, body = await api("POST", "jobs", {"command": [sys.executable, "-c", code], "gpus": 1, "time_limit": "1m"})
    assert status == 201, body
    whole = body["id"]

    async def all_running() -> Any:
        jobs = [(await api("GET", f"jobs/{i}"))[1] for i in [*ids, whole]]
        return jobs if all(j["state"] == "RUNNING" for j in jobs) else None

    jobs = await wait_for(all_running, timeout=30)
    cards = {tuple(j["assigned_gpus"]) for j in jobs[:4]}
    assert len(cards) == 1 and len(next(iter(cards))) == 1, "the four quarters share one card"
    assert tuple(jobs[4]["assigned_gpus"]) not in cards, "the whole-GPU job has a card of its own"
    assert all(j["share"] == 0.25 and "share of GPU" in j["reason"] for j in jobs[:4])
    status, quota = await api("GET", "quota")
    assert status == 200 and quota["running_gpus"] == 2, "four quarters and one whole GPU make 2 GPUs in use"
    for i in [*ids, whole]:
        assert (await api("DELETE", f"jobs/{i}"))[0] in (200, 202)


def test_the_cli_and_the_cell_magic_ask_for_a_share() -> None:
    from types import SimpleNamespace

    from jupyter_gpujobs.cli import UsageError, _job_body, build_parser, gpus_text
    from jupyter_gpujobs.notebook.magics import job_options

    args = build_parser().parse_args(["submit", "-g", "0.25", "--gpu-mem", "20G", "--", "python", "x.py"])
    assert {k: _job_body(args)[k] for k in ("gpus", "gpu_memory")} == {"gpus": 0.25, "gpu_memory": "20G"}
    assert _job_body(build_parser().parse_args(["submit", "-g", "1.5", "--", "true"]))["gpus"] == 1.5  # the server says no
    with pytest.raises(UsageError, match="a share of one GPU"):
        _job_body(build_parser().parse_args(["submit", "-g", "half", "--", "true"]))
    assert gpus_text({"gpus": 1, "share": 0.25, "assigned_gpus": [0]}) == "0.25 [0]"
    assert gpus_text({"gpus": 1, "gpu_memory": 20 * GiB, "gpu_type": "A100"}) == "20GxA100"
    options = dict(gpus="0.5", gpu_memory="10G", time=None, priority=None, begin=None, mem=None, cpus=None,
                   when=None, gpu_type=None, group=None, name=None, env=None, signal=None,
                   requeue=False)
    body = job_options(SimpleNamespace(**options))
    assert (body["gpus"], body["gpu_memory"]) == (0.5, "10G")
    from IPython.core.error import UsageError as MagicUsageError

    with pytest.raises(MagicUsageError, match="--gpu-mem"):
        job_options(SimpleNamespace(**{**options, "gpu_memory": "lots"}))

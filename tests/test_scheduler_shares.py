"""The scheduler with GPU shares: shares are packed onto cards that already hold shares, whole
cards stay free for whole-GPU jobs, and quotas, fair-share, backfill and expected starts count
a share as its part of one GPU."""

from __future__ import annotations

from jupyter_gpujobs.engine.scheduler import decay_and_add, schedule
from jupyter_gpujobs.model import GPU, Job, JobState, Plan, Policy

NOW = 1_700_000_000.0
PLAIN = Policy(fairshare=False, weight_age=0.0, weight_size=0.0, preemption=False)
GiB = 1 << 30


def cards(n: int = 2, name: str = "A100", memory_gb: int = 80, host: str = "h0") -> list[GPU]:
    return [GPU(i, f"{host}-{i}", name, host=host, memory_total_mb=memory_gb * 1024) for i in range(n)]


def job(jid: int, user: str = "alice", gpus: int = 1, limit: int = 3600, **kw: object) -> Job:
    return Job(id=jid, user=user, gpus=gpus, submitted_at=NOW - 1000 + jid, time_limit_s=limit, **kw)  # type: ignore[arg-type]


def share(jid: int, fraction: float = 0.25, **kw: object) -> Job:
    return job(jid, share=fraction, **kw)


def run(jid: int, idx: tuple[int, ...], user: str = "bob", started: float = NOW - 100, limit: int = 3600,
        host: str = "h0", **kw: object) -> Job:
    return Job(id=jid, user=user, gpus=1 if kw.get("share") or kw.get("gpu_memory") else len(idx),
               state=JobState.RUNNING, host=host, assigned_gpus=idx, started_at=started, time_limit_s=limit,
               submitted_at=started - 10, **kw)  # type: ignore[arg-type]


def starts(plan: Plan) -> dict[int, tuple[int, ...]]:
    return {s.job_id: s.gpus for s in plan.starts}


def test_four_quarter_shares_run_on_one_card_and_a_whole_job_takes_another() -> None:
    plan = schedule(NOW, [share(1), share(2), share(3), share(4), job(5)], [], cards(2), PLAIN)
    got = starts(plan)
    assert got[1] == got[2] == got[3] == got[4] and len(got[1]) == 1
    assert got[5] != got[1], "a whole-GPU job never shares a card"
    assert {s.job_id: s.share for s in plan.starts} == {1: 0.25, 2: 0.25, 3: 0.25, 4: 0.25, 5: None}


def test_a_card_holding_shares_is_not_free_for_a_whole_gpu_job() -> None:
    running = [run(10, (0,), share=0.25)]
    plan = schedule(NOW, [job(1), job(2)], running, cards(2), PLAIN)
    assert starts(plan) == {1: (1,)}
    assert plan.reasons[2] == "waiting for 1 free GPU"
    assert plan.expected_start[2] == NOW - 100 + 3600, "it starts when the last share on a card ends"


def test_shares_pack_onto_the_card_that_already_holds_shares_best_fit_by_memory() -> None:
    # card 0 holds 60 GB of shares, card 1 holds 20 GB: a 20 GB share goes where it fits tightest
    running = [run(10, (0,), gpu_memory=60 * GiB), run(11, (1,), gpu_memory=20 * GiB)]
    plan = schedule(NOW, [job(1, gpu_memory=20 * GiB), job(2, gpu_memory=30 * GiB)], running, cards(3), PLAIN)
    assert starts(plan) == {1: (0,), 2: (1,)}, "no new card is opened while cards with shares have room"


def test_a_share_opens_a_new_card_only_when_no_card_with_shares_has_room() -> None:
    running = [run(10, (0,), share=0.75)]
    plan = schedule(NOW, [share(1, 0.5), share(2, 0.25)], running, cards(3), PLAIN)
    assert starts(plan)[2] == (0,)
    assert starts(plan)[1] in ((1,), (2,))


def test_shares_leave_whole_cards_that_a_reserved_whole_job_needs() -> None:
    # one free card; a 2-GPU job waits for it and for card 0 (ends in 10 min): a 2 h share
    # must not take the free card, a 5 min one may (backfill)
    running = [run(10, (0,), started=NOW - 3000)]
    pending = [job(1, gpus=2, limit=3600), share(2, 0.5, limit=7200), share(3, 0.5, limit=300)]
    plan = schedule(NOW, pending, running, cards(2), PLAIN)
    assert 1 not in starts(plan) and 2 not in starts(plan)
    assert starts(plan)[3] == (1,)
    assert plan.expected_start[1] == NOW + 600


def test_the_reason_names_the_memory_and_the_model_and_the_start_is_when_a_card_has_room() -> None:
    running = [run(10, (0,), gpu_memory=70 * GiB, started=NOW - 600)]
    plan = schedule(NOW, [job(1, gpu_memory=20 * GiB, gpu_type="A100")], running, cards(1), PLAIN)
    assert plan.reasons[1] == "waiting for 20 GB on an A100"
    assert plan.expected_start[1] == NOW - 600 + 3600
    plan = schedule(NOW, [share(1, 0.5)], [run(10, (0,), share=0.75)], cards(1), PLAIN)
    assert plan.reasons[1] == "waiting for a 0.5 share of a GPU"


def test_estimates_book_room_so_two_waiting_shares_do_not_get_the_same_start() -> None:
    running = [run(10, (0,), share=0.5, started=NOW - 600), run(11, (0,), share=0.5, started=NOW - 300)]
    plan = schedule(NOW, [share(1, 0.75), share(2, 0.75)], running, cards(1), PLAIN)
    assert plan.expected_start[1] == NOW - 300 + 3600
    assert plan.expected_start[2] == NOW - 300 + 3600 + 3600


def test_a_share_larger_than_every_card_never_starts_and_says_why() -> None:
    plan = schedule(NOW, [job(1, gpu_memory=100 * GiB)], [], cards(1), PLAIN)
    assert plan.starts == [] and plan.expected_start[1] is None
    assert plan.reasons[1] == "asks for 100 GB of GPU memory but the largest of the GPUs has 80 GB"


def test_quotas_count_shares_as_fractions_of_a_gpu() -> None:
    policy = Policy(fairshare=False, weight_age=0.0, weight_size=0.0, preemption=False, user_max_gpus=1)
    plan = schedule(NOW, [share(i) for i in range(1, 7)], [], cards(2), policy)
    assert sorted(starts(plan)) == [1, 2, 3, 4], "four quarters make the one GPU alice may use"
    assert "user limit of 1 GPUs reached" in plan.reasons[5]
    running = [run(10, (0,), user="alice", share=0.5)]
    plan = schedule(NOW, [share(1, 0.5), job(2)], running, cards(2), policy)
    assert sorted(starts(plan)) == [1]


def test_fair_share_usage_counts_a_share_as_its_fraction_of_gpu_seconds() -> None:
    running = [run(10, (0,), user="alice", share=0.25), run(11, (1,), user="bob")]
    usage = decay_and_add(None, running, 100.0, 0.0)
    assert usage.users == {"alice": 25.0, "bob": 100.0}


def test_shares_deep_in_the_queue_start_and_wait_as_shares_in_every_kind_of_cycle() -> None:
    # 30 whole jobs block on a busy cluster; the short shares behind them, past the reservation
    # depth, still pack onto the card with shares (ending before job 1's reservation of it) and
    # wait for room with their own reason
    policy = Policy(fairshare=False, weight_age=0.0, weight_size=0.0, preemption=False, reservation_depth=3)
    running = [run(10, (0,), share=0.5), run(11, (1,))]
    pending = [job(i, limit=7200) for i in range(1, 31)] + [share(40, 0.5, limit=600), share(41, 0.5, limit=600),
                                                            job(42, gpu_memory=GiB, limit=600)]
    for estimate in (True, False):
        plan = schedule(NOW, pending, running, cards(2), policy, estimate=estimate)
        assert starts(plan) == {40: (0,)}
        assert plan.reasons[41] == "waiting for a 0.5 share of a GPU"
        assert plan.reasons[42] == "waiting for 1 GB on a GPU"
        assert plan.reasons[30] == "waiting for 1 free GPU"
        if estimate:
            assert plan.expected_start[41] == NOW + 600  # when 40 ends, before job 1's reservation
            assert plan.expected_start[1] == NOW + 3500  # when the last share of card 0 ends


def test_the_simulator_replays_a_trace_with_shares() -> None:
    from jupyter_gpujobs.sim import POLICIES, TraceJob, simulate

    # eight quarter-GPU sessions of an hour on 2 GPUs: all start at once, as 4 whole ones would
    shares = [TraceJob(i, f"u{i}", 0.0, 3600.0, 1, share=0.25) for i in range(1, 9)]
    res = simulate(shares, POLICIES["default"], hosts=1, gpus_per_host=2, memory_mb=81920)
    assert res.wait == [0.0] * 8
    assert res.busy_gpu_s == 8 * 0.25 * 3600.0
    whole = [TraceJob(i, f"u{i}", 0.0, 3600.0, 1) for i in range(1, 9)]
    assert max(simulate(whole, POLICIES["default"], hosts=1, gpus_per_host=2).wait) == 3 * 3600.0


def test_a_share_joins_a_card_only_if_it_ends_before_an_advance_reservation_of_it() -> None:
    from jupyter_gpujobs.model import Reservation

    # GPU 0 holds a share and is reserved for group vision in an hour; GPU 1 is busy for 4 h
    reserved = [Reservation(id=1, gpus=1, start=NOW + 3600, duration_s=7200, name="vision", groups=("vision",))]
    running = [run(10, (0,), share=0.25, limit=1800), run(11, (1,), limit=4 * 3600)]
    pending = [share(1, limit=7200), share(2, limit=1800)]
    plan = schedule(NOW, pending, running, cards(2), PLAIN, reservations=reserved)
    assert starts(plan) == {2: (0,)}, "the 30-minute share ends before the reservation, the 2-hour one would not"
    assert plan.reasons[1] == "waiting for a 0.25 share of a GPU"


def test_a_deep_estimate_waits_for_the_card_a_share_just_took() -> None:
    policy = Policy(fairshare=False, weight_age=0.0, weight_size=0.0, preemption=False, reservation_depth=0)
    plan = schedule(NOW, [share(1, limit=600), job(2, limit=3600), job(3)], [], cards(2), policy)
    assert sorted(starts(plan)) == [1, 2]
    assert plan.expected_start[3] == NOW + 600, "the card of the share frees when the share ends, not now"

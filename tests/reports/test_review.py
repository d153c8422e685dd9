"""The monthly review: exact reconciliation, measured use, recommendations, cost, output."""

from __future__ import annotations

import csv
import html
import json
import math
import random
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpupool.cli.main import build_parser, main
from gpupool.cli.report import load
from gpupool.errors import SpecError
from gpupool.reports.review import MS_PER_HOUR, ReviewRules, build_review, iso
from gpupool.reports.review_csv import cell, write_csv
from gpupool.reports.review_data import (
    Allocation,
    DownInterval,
    GpuRecord,
    JobReview,
    LatencySample,
    ReviewData,
    ReviewTariff,
    UsageSample,
)
from gpupool.reports.review_html import SECTIONS, render_html

T0 = 1_793_491_200.0  # 2026-11-01T00:00:00Z
H = 3600.0
DAY = 86400.0
A100 = 81920


def gpu(gid: str, gpu_type: str = "A100-80GB", mem: int = A100) -> GpuRecord:
    node, index = gid.split("/")
    return GpuRecord(gid, node, int(index), gpu_type, mem_total_mib=mem)


def job(job_id: str, team: str = "vision", kind: str = "training", **kw: object) -> JobReview:
    fields: dict[str, object] = {"gpu_count": 1, "submit_s": T0, "state": "completed"}
    fields.update(kw)
    return JobReview(job_id, team, kind, **fields)  # type: ignore[arg-type]


def samples(
    gid: str,
    t0: float,
    t1: float,
    sm: float,
    mem: float,
    period: float = 600.0,
    power: float | None = None,
    jitter: float = 0.0,
    seed: int = 0,
) -> list[UsageSample]:
    rng = random.Random(seed)
    out = []
    t = t0
    while t < t1:
        s = max(0.0, sm + rng.uniform(-jitter, jitter)) if jitter else sm
        out.append(UsageSample(gid, t, period, mem, s, power))
        t += period
    return out


def data(**kw: object) -> ReviewData:
    base: dict[str, object] = {"source": "test", "start_s": T0, "end_s": T0 + DAY}
    base.update(kw)
    return ReviewData(**base)  # type: ignore[arg-type]


# ---- reconciliation ----------------------------------------------------------------------
def test_reconciliation_is_exact_with_shares_down_time_and_clipping() -> None:
    d = data(
        gpus=(gpu("n1/0"), gpu("n1/1"), gpu("n2/0", "L4", 23034)),
        allocations=(
            # clipped to the period on both sides
            Allocation("early", "n1/0", T0 - 5 * H, T0 + 2 * H),
            Allocation("late", "n1/0", T0 + 20 * H, T0 + DAY + 9 * H),
            # two shares of one card, overlapping a down interval
            Allocation("half-a", "n1/1", T0 + 1 * H, T0 + 11 * H, share_milli=500),
            Allocation("half-b", "n1/1", T0 + 1 * H, T0 + 11 * H, share_milli=333),
            # a third-second fraction: odd milliseconds
            Allocation("odd", "n2/0", T0 + 0.0017, T0 + 7 * H + 0.3331, share_milli=777),
        ),
        down=(
            DownInterval("n1/1", T0 + 5 * H, T0 + 7 * H, "node lost"),
            DownInterval("n1/1", T0 + 6 * H, T0 + 8 * H, "unhealthy"),  # overlaps the first
            DownInterval("n2/0", T0 - H, T0 + 0.5 * H, "drained"),  # clipped at the start
        ),
        jobs=(
            job("early"),
            job("late"),
            job("half-a", team="nlp"),
            job("half-b", team="nlp"),
            job("odd", team="speech"),
        ),
    )
    rec = build_review(d).reconciliation
    unit = MS_PER_HOUR * 1000
    assert rec.capacity == 3 * 24 * unit
    assert rec.allocated + rec.idle + rec.down == rec.capacity
    assert rec.down == (3 * unit) + unit // 2
    # early: 2 h; late: 4 h; halves: (10 h - 3 h down) x (500 + 333); odd: clipped by down
    odd_ms = round((T0 + 7 * H + 0.3331) * 1000) - round((T0 + 0.5 * H) * 1000)
    want = 6 * unit + 7 * MS_PER_HOUR * (500 + 333) + 777 * odd_ms
    assert rec.allocated == want
    assert sum(v for _, v in rec.by_team) == rec.allocated
    assert rec.team("vision") == 6 * unit
    assert rec.team("speech") == 777 * odd_ms
    review = build_review(d)
    assert sum(t.allocated_mgpu_ms for t in review.teams) == rec.allocated
    assert sum(g.allocated_mgpu_ms for g in review.gpus) == rec.allocated
    assert sum(g.idle_mgpu_ms for g in review.gpus) == rec.idle


def test_overfull_card_is_refused_with_a_clear_message() -> None:
    d = data(
        gpus=(gpu("n1/0"),),
        allocations=(
            Allocation("a", "n1/0", T0, T0 + DAY),
            Allocation("b", "n1/0", T0, T0 + H, share_milli=500),
        ),
        jobs=(job("a"), job("b")),
    )
    with pytest.raises(SpecError, match="allocated more than the whole card from 2026-11-01"):
        build_review(d)
    # overfull for one hour of a day: idle would stay positive, the check still catches it
    d = data(
        gpus=(gpu("n1/0"),),
        allocations=(
            Allocation("a", "n1/0", T0, T0 + 2 * H),
            Allocation("b", "n1/0", T0 + H, T0 + 3 * H),
        ),
        jobs=(job("a"), job("b")),
    )
    with pytest.raises(SpecError, match="01:00:00Z"):
        build_review(d)
    # a rounding-sized overlap as one job ends and the next starts is let through
    d = data(
        gpus=(gpu("n1/0"),),
        allocations=(
            Allocation("a", "n1/0", T0, T0 + H + 0.4),
            Allocation("b", "n1/0", T0 + H, T0 + 3 * H),
        ),
        jobs=(job("a"), job("b")),
    )
    assert build_review(d).reconciliation.allocated == 1000 * (3 * 3_600_000 + 400)


def test_unknown_gpu_in_an_allocation_is_refused() -> None:
    d = data(gpus=(gpu("n1/0"),), allocations=(Allocation("a", "n9/0", T0, T0 + H),))
    with pytest.raises(SpecError, match="does not list"):
        build_review(d)


# ---- measured use, utilisation ----------------------------------------------------------
def test_shared_card_use_is_attributed_by_share() -> None:
    d = data(
        gpus=(gpu("n1/0"),),
        allocations=(
            Allocation("big", "n1/0", T0, T0 + 12 * H, share_milli=750),
            Allocation("small", "n1/0", T0, T0 + 12 * H, share_milli=250),
        ),
        usage=tuple(samples("n1/0", T0, T0 + DAY, sm=40.0, mem=40000.0)),
        jobs=(job("big"), job("small", team="nlp")),
    )
    review = build_review(d)
    rows = {r.job_id: r for r in review.jobs}
    assert rows["big"].mean_sm_pct == pytest.approx(30.0)
    assert rows["small"].mean_sm_pct == pytest.approx(10.0)
    assert rows["big"].peak_mem_mib == pytest.approx(30000.0)
    assert rows["big"].used_gpu_h == pytest.approx(12 * 0.4 * 0.75)
    assert rows["big"].allocated_gpu_h == pytest.approx(9.0)
    card = review.gpus[0]
    assert card.mean_sm_pct == pytest.approx(40.0)
    assert card.used_gpu_h == pytest.approx(24 * 0.4)
    teams = {t.team: t for t in review.teams}
    assert teams["vision"].used_gpu_h + teams["nlp"].used_gpu_h == pytest.approx(12 * 0.4)


def test_utilisation_by_local_hour_uses_the_offset_and_day_window() -> None:
    # One card busy 09:00-10:00 UTC every day; at UTC+2 that is the local 11 o'clock hour.
    busy = []
    for day in range(2):
        busy += samples("n1/0", T0 + day * DAY + 9 * H, T0 + day * DAY + 10 * H, 90.0, 1000.0)
    d = data(
        end_s=T0 + 2 * DAY,
        gpus=(gpu("n1/0"),),
        usage=tuple(busy),
        utc_offset_h=2.0,
        day_window=(8, 20),
    )
    review = build_review(d)
    hours = {r.hour: r for r in review.by_hour}
    assert review.summary.day_used_pct == pytest.approx(100 * 1.8 / (12 * 2), abs=1e-3)
    assert review.summary.night_used_pct == 0.0
    assert hours[11].used_gpu_h == pytest.approx(2 * 0.9)
    assert hours[11].window == "day"
    assert hours[3].window == "night"
    assert sum(r.used_gpu_h for r in hours.values()) == pytest.approx(1.8)
    assert all(r.capacity_gpu_h == pytest.approx(2.0) for r in hours.values())


def test_utilisation_by_type_and_team_sum_to_the_cluster() -> None:
    d = data(
        gpus=(gpu("n1/0"), gpu("n1/1"), gpu("n2/0", "L4", 23034)),
        allocations=(
            Allocation("a", "n1/0", T0, T0 + 10 * H),
            Allocation("b", "n2/0", T0, T0 + 5 * H),
        ),
        usage=tuple(
            samples("n1/0", T0, T0 + 10 * H, 50.0, 9000.0)
            + samples("n2/0", T0, T0 + 5 * H, 80.0, 9000.0)
        ),
        jobs=(job("a"), job("b", team="nlp")),
    )
    review = build_review(d)
    types = {t.gpu_type: t for t in review.by_type}
    assert types["A100-80GB"].allocated_gpu_h == pytest.approx(10.0)
    assert types["A100-80GB"].used_gpu_h == pytest.approx(5.0)
    assert types["L4"].used_pct == pytest.approx(100 * 4.0 / 24, abs=1e-3)
    assert sum(t.allocated_gpu_h for t in review.teams) == pytest.approx(15.0)


# ---- recommendations ---------------------------------------------------------------------
def test_never_used_fires_on_an_idle_holder_not_on_a_near_miss() -> None:
    d = data(
        gpus=(gpu("n1/0"), gpu("n1/1"), gpu("n1/2")),
        allocations=(
            Allocation("idle-holder", "n1/0", T0, T0 + DAY),
            Allocation("barely-used", "n1/1", T0, T0 + DAY),
            Allocation("hardly-measured", "n1/2", T0, T0 + DAY),
        ),
        usage=tuple(
            samples("n1/0", T0, T0 + DAY, 0.4, 300.0, jitter=0.4)
            # idle while measured, but measured for only 4 of its 24 hours: no claim
            + samples("n1/2", T0, T0 + 4 * H, 0.0, 0.0)
            # peaks above 1 % SM once: used, if hardly
            + samples("n1/1", T0, T0 + DAY, 0.2, 300.0)
            + [UsageSample("n1/1", T0 + 3 * H + 30, 60.0, 300.0, 1.5)]
        ),
        jobs=(job("idle-holder"), job("barely-used"), job("hardly-measured")),
    )
    review = build_review(d)
    never = review.recommendations_of("never-used")
    assert [r.subjects for r in never] == [("idle-holder",)]
    assert "SM peaked at" in never[0].evidence
    # the idle holder's card is reclaimable too; both cards are (under 30 %)
    assert {r.subjects[0] for r in review.recommendations_of("reclaimable-card")} == {
        "n1/0",
        "n1/1",
        "n1/2",
    }
    assert {r.job_id: r.sampled_pct for r in review.jobs}["hardly-measured"] == pytest.approx(
        100 * 4 / 24, abs=1e-3
    )


def test_card_memory_falls_back_to_the_catalogue() -> None:
    d = data(
        gpus=(gpu("n1/0", mem=0),),  # a source that did not record the card's memory
        allocations=(Allocation("idle-holder", "n1/0", T0, T0 + DAY),),
        usage=tuple(samples("n1/0", T0, T0 + DAY, 0.0, 0.0)),
        jobs=(job("idle-holder"),),
    )
    review = build_review(d)
    assert review.jobs[0].card_mem_mib == round(78.8 * 1024)  # the catalogue's usable GiB
    (cost,) = review.cost_by_type  # and, with no price in the data, the catalogue's price
    assert cost.price_from == "catalogue" and cost.price_per_gpu_h > 0
    assert [r.subjects for r in review.recommendations_of("never-used")] == [("idle-holder",)]


def test_reclaimable_card_threshold() -> None:
    d = data(
        gpus=(gpu("n1/0"), gpu("n1/1")),
        allocations=(Allocation("a", "n1/0", T0, T0 + DAY), Allocation("b", "n1/1", T0, T0 + DAY)),
        usage=tuple(
            samples("n1/0", T0, T0 + DAY, 29.0, 30000.0) + samples("n1/1", T0, T0 + DAY, 31.0, 3e4)
        ),
        jobs=(job("a"), job("b")),
    )
    recs = build_review(d).recommendations_of("reclaimable-card")
    assert [r.subjects for r in recs] == [("n1/0",)]
    assert "29.0 %" in recs[0].evidence
    looser = build_review(d, ReviewRules(reclaimable_mean_sm_pct=35.0))
    assert len(looser.recommendations_of("reclaimable-card")) == 2


def _pairs(
    mem_a: float, mem_b: float, sm_a: float, sm_b: float, kind_b: str = "training"
) -> ReviewData:
    return data(
        gpus=(gpu("n1/0"), gpu("n1/1")),
        allocations=(
            Allocation("pair-a", "n1/0", T0, T0 + 20 * H),
            Allocation("pair-b", "n1/1", T0 + 2 * H, T0 + 22 * H),
        ),
        usage=tuple(
            samples("n1/0", T0, T0 + 20 * H, sm_a, mem_a)
            + samples("n1/1", T0 + 2 * H, T0 + 22 * H, sm_b, mem_b)
        ),
        jobs=(job("pair-a"), job("pair-b", team="nlp", kind=kind_b)),
    )


def test_share_a_card_fires_when_both_fit_and_not_on_near_misses() -> None:
    fits = build_review(_pairs(20000.0, 30000.0, 35.0, 40.0)).recommendations_of("share-a-card")
    assert [r.subjects for r in fits] == [("pair-a", "pair-b")]
    assert "20000 + 30000 MiB" in fits[0].evidence
    # memory: 40000 + 35000 > 81920 x 0.9 = 73728
    assert not build_review(_pairs(40000.0, 35000.0, 35.0, 40.0)).recommendations_of("share-a-card")
    # SM: 55 + 50 > 100
    assert not build_review(_pairs(20000.0, 30000.0, 55.0, 50.0)).recommendations_of("share-a-card")


def test_right_size_plain_and_with_the_planner() -> None:
    d = data(
        gpus=(gpu("n1/0"), gpu("n1/1"), gpu("n1/2")),
        allocations=(
            Allocation("over-asker", "n1/0", T0, T0 + 10 * H),
            Allocation("fair-asker", "n1/1", T0, T0 + 10 * H),
            Allocation("llm", "n1/2", T0, T0 + 10 * H),
        ),
        usage=tuple(
            samples("n1/0", T0, T0 + 10 * H, 60.0, 10000.0)
            + samples("n1/1", T0, T0 + 10 * H, 60.0, 10500.0)
            + samples("n1/2", T0, T0 + 10 * H, 60.0, 18000.0)
        ),
        jobs=(
            job("over-asker", gpu_mem_mib=40960),
            job("fair-asker", gpu_mem_mib=20480),  # 1.95x: a near miss
            job("llm", kind="online-inference", model="llama-3-8b"),  # asks the whole card
        ),
    )
    recs = {r.subjects[0]: r for r in build_review(d).recommendations_of("right-size")}
    assert set(recs) == {"over-asker", "llm"}
    assert "asks 40.0 GiB per GPU, peaks at 9.8 GiB" in recs["over-asker"].evidence
    assert "ask 12 GiB" in recs["over-asker"].evidence
    assert "gpupool plan --model llama-3-8b" in recs["llm"].evidence


def _latency(levels: list[tuple[float, float]], seed: int = 3) -> list[LatencySample]:
    """(duration_s, p99_ms) steps, 5-minute buckets, +-3 ms noise."""
    rng = random.Random(seed)
    out = []
    t = T0
    for dur, level in levels:
        end = t + dur
        while t < end:
            out.append(LatencySample("drifty", t, level + rng.uniform(-3, 3), 100.0))
            t += 300.0
    return out


def test_latency_drift_finds_the_step_and_its_date() -> None:
    d = data(
        end_s=T0 + 10 * DAY,
        gpus=(gpu("n1/0"),),
        latency=tuple(_latency([(4 * DAY + 7 * H, 50.0), (6 * DAY - 7 * H, 80.0)])),
    )
    review = build_review(d)
    (rec,) = review.recommendations_of("latency-drift")
    assert rec.subjects == ("drifty",)
    row = review.latency[0]
    assert row.drifted
    moved = T0 + 4 * DAY + 7 * H
    assert abs((datetime_s(row.changed_at)) - moved) <= 900, row.changed_at  # within three buckets
    assert row.before_p99_ms == pytest.approx(50.0, abs=1.5)
    assert row.after_p99_ms == pytest.approx(80.0, abs=1.5)
    assert iso(moved)[:13] in rec.evidence


def datetime_s(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def test_latency_drift_near_misses_small_step_and_transient_spike() -> None:
    small = _latency([(5 * DAY, 50.0), (5 * DAY, 56.0)])
    spike = _latency([(5 * DAY, 50.0), (3 * H, 80.0), (5 * DAY - 3 * H, 50.0)])
    for series in (small, spike):
        d = data(end_s=T0 + 10 * DAY, gpus=(gpu("n1/0"),), latency=tuple(series))
        assert not build_review(d).recommendations_of("latency-drift")


# ---- queueing, cost, energy --------------------------------------------------------------
def test_queue_wait_preemptions_and_reasons() -> None:
    d = data(
        gpus=(gpu("n1/0"),),
        jobs=(
            job("a", submit_s=T0, first_start_s=T0 + 100, wait_s_by_reason={"Resources": 100}),
            job("b", submit_s=T0, first_start_s=T0 + 300, wait_s_by_reason={"Priority": 300}),
            job("c", submit_s=T0 + DAY - 50, wait_s_by_reason={"QuotaMax": 50}),  # still waits
            job("d", team="nlp", preemptions=2, lost_gpu_s=1800.0, first_start_s=T0),
        ),
    )
    review = build_review(d)
    waits = {(w.kind, w.team): w for w in review.queue_wait}
    vision = waits[("training", "vision")]
    assert (vision.jobs, vision.started) == (3, 2)
    assert vision.mean_wait_s == pytest.approx(150.0)
    assert vision.p95_wait_s == pytest.approx(300.0)
    assert waits[("training", "(all)")].jobs == 4
    pre = {p.team: p for p in review.preemptions}
    assert (pre["nlp"].preemptions, pre["nlp"].lost_gpu_h) == (2, 0.5)
    reasons = {r.reason: r for r in review.wait_reasons}
    assert reasons["Priority"].share_pct == pytest.approx(100 * 300 / 450, abs=1e-3)


def test_cost_and_energy_from_samples_at_the_hourly_tariff() -> None:
    prices = tuple(0.10 if h < 12 else 0.30 for h in range(24))
    carbon = tuple(100.0 for _ in range(24))
    d = data(
        gpus=(gpu("n1/0"),),
        allocations=(Allocation("a", "n1/0", T0, T0 + 6 * H),),
        usage=tuple(samples("n1/0", T0, T0 + DAY, 50.0, 1000.0, power=400.0)),
        jobs=(job("a", energy_kwh=99.0),),  # ignored: samples have power
        tariff=ReviewTariff("flat-ish", prices, "EUR", carbon, pue=1.5),
        gpu_price_per_hour={"A100-80GB": 2.0},
    )
    review = build_review(d)
    s = review.summary
    assert s.energy_source == "samples"
    assert s.energy_kwh == pytest.approx(0.4 * 24 * 1.5)
    assert s.energy_cost == pytest.approx(0.4 * 1.5 * (12 * 0.10 + 12 * 0.30))
    assert s.carbon_kg == pytest.approx(0.4 * 24 * 1.5 * 0.1)
    assert s.currency == "EUR"
    (cost,) = review.cost_by_type
    assert cost.price_from == "data"
    assert cost.capacity_cost == pytest.approx(48.0)
    assert cost.allocated_cost == pytest.approx(12.0)
    assert cost.held_unused_cost == pytest.approx(6.0)  # 6 h held, used half
    assert cost.unallocated_cost == pytest.approx(36.0)
    (jrow,) = review.jobs
    assert jrow.idle_cost == pytest.approx(6.0)


def test_energy_from_jobs_when_samples_have_no_power() -> None:
    d = data(
        gpus=(gpu("n1/0"),),
        allocations=(Allocation("a", "n1/0", T0 + 10 * H, T0 + 12 * H),),
        usage=tuple(samples("n1/0", T0, T0 + DAY, 50.0, 1000.0)),
        jobs=(job("a", energy_kwh=3.0),),
        tariff=ReviewTariff("hourly", tuple(float(h) for h in range(24))),
    )
    review = build_review(d)
    assert review.summary.energy_source == "jobs"
    hours = {e.hour: e for e in review.energy_by_hour}
    assert hours[10].kwh == pytest.approx(1.5)
    assert hours[11].cost == pytest.approx(1.5 * 11)
    assert review.summary.carbon_kg is None
    assert math.isclose(review.summary.energy_kwh, 3.0)


def test_a_review_is_deterministic() -> None:
    d = _pairs(20000.0, 30000.0, 35.0, 40.0)
    assert build_review(d) == build_review(d)


# ---- HTML, CSV, command line -------------------------------------------------------------
def _small_month() -> ReviewData:
    """Two days with every section populated: shares, down time, a drift, waits, power."""
    levels = [(DAY, 50.0), (DAY, 80.0)]
    return data(
        end_s=T0 + 2 * DAY,
        gpus=(gpu("n1/0"), gpu("n1/1"), gpu("n2/0", "L4", 23034)),
        allocations=(
            Allocation("idle-holder", "n1/0", T0, T0 + 2 * DAY),
            Allocation("pair-a", "n1/1", T0, T0 + DAY, share_milli=500),
            Allocation("pair-b", "n1/1", T0, T0 + DAY, share_milli=500),
            Allocation("svc-0", "n2/0", T0, T0 + 2 * DAY),
        ),
        down=(DownInterval("n1/1", T0 + DAY + 2 * H, T0 + DAY + 5 * H, "node lost"),),
        usage=tuple(
            samples("n1/0", T0, T0 + 2 * DAY, 0.0, 0.0, power=60.0)
            + samples("n1/1", T0, T0 + DAY, 60.0, 30000.0, power=300.0, jitter=5.0)
            + samples("n2/0", T0, T0 + 2 * DAY, 45.0, 9000.0, power=50.0, jitter=5.0)
        ),
        latency=tuple(
            LatencySample(s.service, s.t_s, s.p99_ms, s.rps) for s in _latency(levels)
        ),
        jobs=(
            job("idle-holder", first_start_s=T0, wait_s_by_reason={}),
            job("pair-a", team="nlp", kind="batch", first_start_s=T0),
            job("pair-b", team="nlp", kind="batch", submit_s=T0 + 60, first_start_s=T0 + 600,
                wait_s_by_reason={"Resources": 540.0}, preemptions=1, lost_gpu_s=900.0),
            job("svc-0", team="nlp", kind="online-inference", service="drifty",
                first_start_s=T0),
        ),
        tariff=ReviewTariff("tou", tuple(0.1 + 0.01 * h for h in range(24)), "USD",
                      tuple(200.0 for _ in range(24)), 1.2),
        gpu_price_per_hour={"A100-80GB": 1.79, "L4": 0.44},
        utc_offset_h=1.0,
    )  # fmt: skip


@pytest.fixture(scope="module")
def small_html() -> str:
    """The small month's HTML, rendered once for the module (matplotlib is the slow part)."""
    return render_html(build_review(_small_month()))


def test_html_is_self_contained(small_html: str) -> None:
    text = small_html
    assert "http://" not in text and "https://" not in text and "<script" not in text
    assert "<link" not in text and "@import" not in text and "url(" not in text.split("<svg")[0]
    assert "@media print" in text and "break-before: page" in text
    assert text.count("<svg") == len(SECTIONS)
    ids = re.findall(r'\bid="([^"]+)"', text)
    assert len(ids) == len(set(ids))  # charts' ids are scoped, never clash
    s = build_review(_small_month()).summary
    assert f"{s.allocated_pct:.1f} %" in text
    assert "idle-holder" in text and "latency-drift" in text


def test_csv_holds_the_same_numbers_as_the_tables(tmp_path: Path, small_html: str) -> None:
    review = build_review(_small_month())
    written = write_csv(review, tmp_path / "csv")
    names = {p.stem for p in written}
    assert {t.name for t in review.tables()} | {"summary", "reconciliation"} == names
    html_text = small_html
    for table in review.tables():
        with (tmp_path / "csv" / f"{table.name}.csv").open() as fh:
            rows = list(csv.reader(fh))
        assert rows[0] == list(table.columns())
        assert rows[1:] == [[cell(v) for v in row] for row in table.values()]
        for row in rows[1:]:
            for value in row:
                assert html.escape(value) in html_text
    with (tmp_path / "csv" / "reconciliation.csv").open() as fh:
        recon = {(r["scope"], r["part"]): int(r["mgpu_ms"]) for r in csv.DictReader(fh)}
    r = review.reconciliation
    assert (
        recon[("cluster", "allocated")] + recon[("cluster", "idle")] + recon[("cluster", "down")]
        == recon[("cluster", "capacity")]
    )
    assert sum(v for (scope, _), v in recon.items() if scope.startswith("team:")) == r.allocated


def test_report_command_on_a_review_data_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], small_html: str
) -> None:
    source = tmp_path / "result.json"
    _small_month().write(source)
    out = tmp_path / "review.html"
    code = main(["report", "--scenario", str(source), "--html", str(out), "--csv",
                 str(tmp_path / "csv")])  # fmt: skip
    assert code == 0
    said = capsys.readouterr().out
    assert f"wrote {out}" in said and "CSV files" in said
    # same input, built and written again: byte-identical HTML
    assert out.read_bytes() == small_html.encode("utf-8")


def test_report_period_and_wrapped_simulation_result(tmp_path: Path) -> None:
    source = tmp_path / "result.json"
    _small_month().write(source)
    parser = build_parser()
    args = parser.parse_args(["report", "--scenario", str(source), "--from", "2026-11-01",
                              "--to", "2026-11-01T12:00:00Z", "--html", "x.html"])  # fmt: skip
    day1 = load(args)
    assert (day1.start_s, day1.end_s) == (T0, T0 + 12 * H)
    assert build_review(day1).reconciliation.capacity == 3 * 12 * MS_PER_HOUR * 1000
    # a simulation result carries the record under "review"
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"summary": {}, "review": _small_month().to_json()}))
    args = parser.parse_args(["report", "--scenario", str(wrapped), "--html", "x.html"])
    assert load(args) == _small_month()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--from", "2026-13-01"], "not a date"),
        (["--from", "2026-11-02", "--to", "2026-11-01"], "is not before"),
        (["--from", "2027-01-01"], "outside it"),
    ],
)
def test_report_command_refuses_bad_periods(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    source = tmp_path / "result.json"
    _small_month().write(source)
    code = main(["report", "--scenario", str(source), "--html", str(tmp_path / "r.html"), *extra])
    assert code == 2
    assert message in capsys.readouterr().err


def test_report_command_refuses_missing_file_and_empty_period(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", "--scenario", str(tmp_path / "nope.json"), "--html", "x.html"]) == 2
    assert "no such file" in capsys.readouterr().err
    quiet = data(end_s=T0 + 2 * DAY, gpus=(gpu("n1/0"),), jobs=(job("a", submit_s=T0 + DAY),))
    source = tmp_path / "quiet.json"
    quiet.write(source)
    code = main(["report", "--scenario", str(source), "--to", "2026-11-01T12:00",
                 "--html", str(tmp_path / "q.html")])  # fmt: skip
    assert code == 2
    assert "nothing happened" in capsys.readouterr().err


def test_simulation_times_are_shifted_by_the_origin() -> None:
    base = _small_month()
    shifted = data(
        start_s=0.0,
        end_s=2 * DAY,
        origin_s=T0,
        gpus=base.gpus,
        allocations=tuple(
            Allocation(a.job_id, a.gpu_id, a.start_s - T0, a.end_s - T0, a.share_milli)
            for a in base.allocations
        ),
        down=tuple(
            DownInterval(d.gpu_id, d.start_s - T0, d.end_s - T0, d.reason) for d in base.down
        ),
        usage=tuple(
            UsageSample(u.gpu_id, u.t_s - T0, u.period_s, u.mem_used_mib, u.sm_util_pct, u.power_w)
            for u in base.usage
        ),
        latency=tuple(LatencySample(x.service, x.t_s - T0, x.p99_ms, x.rps) for x in base.latency),
        jobs=tuple(
            JobReview(**{**j.__dict__, "submit_s": j.submit_s - T0,
                         "first_start_s": None if j.first_start_s is None
                         else j.first_start_s - T0})
            for j in base.jobs
        ),
        tariff=base.tariff,
        gpu_price_per_hour=base.gpu_price_per_hour,
        utc_offset_h=base.utc_offset_h,
    )  # fmt: skip
    assert build_review(shifted) == build_review(base)

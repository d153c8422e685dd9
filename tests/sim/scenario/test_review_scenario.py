"""The review of a simulated run of islands-pool with planted jobs.

scenarios/review-planted.yaml is islands-pool.yaml at a 30-day horizon plus the jobs the
review must find (see its description). The tests run it cut to a week (`week_raw`: the
planted jobs' work and drifty's update at the same share of the run), which holds every
planted effect; the whole month is `gpupool simulate scenario scenarios/review-planted.yaml`
(minutes: a benchmark, not a test). The record the simulator writes accounts for every
card-second, and the planted jobs measure what they were planted to measure.
"""

from __future__ import annotations

import copy
import json
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from gpupool.reports.review import Reconciliation, build_review
from gpupool.reports.review_data import ReviewData
from gpupool.sim.scenario.config import parse_scenario
from gpupool.sim.scenario.review_source import ORIGIN_S
from gpupool.sim.scenario.runner import ScenarioResult, run_scenario
from gpupool.traces.location import find_traces_dir

pytestmark = pytest.mark.slow

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"
PLANTED = ("idle-holder", "pair-a", "pair-b", "over-asker", "drifty")
H = 3600.0
MONTH_H, MONTH_UPDATE_H = 720, 400
"""review-planted.yaml's horizon and drifty's update hour."""
HOURS = 168
"""The run the tests review: the month's first week."""
UPDATE_H = round(MONTH_UPDATE_H * HOURS / MONTH_H)


def planted_raw() -> dict[str, Any]:
    """islands-pool.yaml at 30 days with the planted entries of review-planted.yaml."""
    raw: dict[str, Any] = yaml.safe_load((SCENARIOS / "islands-pool.yaml").read_text())
    planted = yaml.safe_load((SCENARIOS / "review-planted.yaml").read_text())
    raw["horizon_h"] = MONTH_H
    raw["workload"] += [w for w in planted["workload"] if w.get("name") in PLANTED]
    for key in ("name", "description"):
        raw[key] = planted[key]
    assert raw == planted, "review-planted.yaml is islands-pool.yaml plus the planted jobs"
    return raw


def week_raw() -> dict[str, Any]:
    """review-planted.yaml cut to HOURS: each planted job's work and drifty's update at the
    same share of the run as in the month (the idle holder holds its card throughout, the
    pair and the over-asker two thirds of it, the update comes at 5/9 of it)."""
    raw = copy.deepcopy(planted_raw())
    assert raw["horizon_h"] == MONTH_H
    scale = HOURS / MONTH_H
    raw["horizon_h"] = HOURS
    for w in raw["workload"]:
        if w.get("name") not in PLANTED:
            continue
        if "work_min" in w:
            w["work_min"] = round(w["work_min"] * scale)
        if "update" in w:
            assert w["update"]["at_h"] == MONTH_UPDATE_H
            w["update"]["at_h"] = UPDATE_H
    return raw


@pytest.fixture(scope="module")
def month() -> ScenarioResult:
    cfg = parse_scenario(week_raw(), str(SCENARIOS / "review-planted.yaml"))
    result = run_scenario(cfg, find_traces_dir(SCENARIOS), review=True)
    assert result.review is not None
    return result


def ms(t_s: float) -> int:
    return round(t_s * 1000)


def test_the_month_accounts_for_every_card_millisecond(month: ScenarioResult) -> None:
    data = month.review
    assert data is not None
    assert (data.start_s, data.end_s, data.origin_s) == (0.0, HOURS * H, ORIGIN_S)
    assert len(data.gpus) == 200
    capacity = len(data.gpus) * (ms(data.end_s) - ms(data.start_s)) * 1000
    allocated = sum((ms(a.end_s) - ms(a.start_s)) * a.share_milli for a in data.allocations)
    teams = {j.job_id: j.team for j in data.jobs}
    by_team: dict[str, int] = defaultdict(int)
    for a in data.allocations:
        by_team[teams[a.job_id]] += (ms(a.end_s) - ms(a.start_s)) * a.share_milli
    assert sum(by_team.values()) == allocated
    assert allocated / capacity == pytest.approx(month.summary["gpu_hours_utilization"], abs=1e-4)
    for team, t in month.summary["teams"].items():
        assert by_team[team] / 3.6e9 == pytest.approx(t["gpu_hours"], abs=0.06)
    assert not data.down  # one on-premises pool: nothing was down
    samples = {(s.gpu_id, s.t_s) for s in data.usage}
    assert len(samples) == len(data.usage) == 200 * HOURS


def card_samples(data: ReviewData, job_id: str) -> list[Any]:
    """The samples of the card(s) a job held, over the buckets it held them whole."""
    allocs = [a for a in data.allocations if a.job_id == job_id]
    assert allocs, f"{job_id} never ran"
    return [
        s
        for a in allocs
        for s in data.usage
        if s.gpu_id == a.gpu_id and a.start_s <= s.t_s and s.t_s + s.period_s <= a.end_s
    ]


def test_the_planted_jobs_measure_what_they_were_planted_for(month: ScenarioResult) -> None:
    data = month.review
    assert data is not None
    card = data.gpus[0].mem_total_mib
    jobs = {j.job_id: j for j in data.jobs}
    for job_id in ("idle-holder", "pair-a", "pair-b", "over-asker"):
        assert jobs[job_id].first_start_s == 0.0, f"{job_id} started late"
    idle = card_samples(data, "idle-holder")
    assert len(idle) >= HOURS * 5 // 6  # the month's 600 of 720 hours
    assert max(s.sm_util_pct for s in idle) < 1.0
    assert max(s.mem_peak_mib or s.mem_used_mib for s in idle) < 0.02 * card
    pair = [card_samples(data, j) for j in ("pair-a", "pair-b")]
    peaks = [max(s.mem_peak_mib or 0 for s in p) for p in pair]
    sms = [float(np.mean([s.sm_util_pct for s in p])) for p in pair]
    assert sum(peaks) < 0.6 * card and sum(sms) < 60
    over = card_samples(data, "over-asker")
    assert max(s.mem_peak_mib or 0 for s in over) < card / 4


def test_the_planted_update_steps_drifty_from_50_to_80_ms(month: ScenarioResult) -> None:
    data = month.review
    assert data is not None
    p99 = {round(s.t_s / H): s.p99_ms for s in data.latency if s.service == "drifty"}
    assert len(p99) == HOURS
    before = [p99[h] for h in range(UPDATE_H)]
    after = [p99[h] for h in range(UPDATE_H, HOURS)]
    assert np.median(before) == pytest.approx(50.0, rel=0.05)
    assert np.median(after) == pytest.approx(80.0, rel=0.05)
    first = min(h for h, v in p99.items() if v >= 1.2 * np.median(before) and h >= 24)
    assert abs(first - UPDATE_H) <= 1


def test_the_review_reconciles_exactly_and_names_the_planted_jobs(month: ScenarioResult) -> None:
    data = month.review
    assert data is not None
    review = build_review(ReviewData.from_json(json.loads(json.dumps(data.to_json()))))
    rec = review.reconciliation
    assert rec.allocated + rec.idle + rec.down == rec.capacity
    assert sum(v for _, v in rec.by_team) == rec.allocated
    assert rec.capacity == 200 * HOURS * Reconciliation.UNIT_PER_GPU_HOUR
    assert rec.down == 0
    allocated = sum((ms(a.end_s) - ms(a.start_s)) * a.share_milli for a in data.allocations)
    assert rec.allocated == allocated  # every allocation counted, none twice
    # the summary's utilisation is rounded to 4 decimals: 200 x HOURS GPU-h x 0.00005
    assert rec.gpu_hours(rec.allocated) == pytest.approx(
        month.summary["gpu_hours_utilization"] * 200 * HOURS, abs=200 * HOURS * 0.00005
    )
    found = {(r.kind, r.subjects) for r in review.recommendations}
    assert ("never-used", ("idle-holder",)) in found
    assert ("right-size", ("over-asker",)) in found
    assert ("share-a-card", ("pair-a", "pair-b")) in found
    assert ("latency-drift", ("drifty",)) in found
    never = [r.subjects for r in review.recommendations_of("never-used")]
    assert never == [("idle-holder",)], "only the planted holder never used its card"
    row = next(r for r in review.latency if r.service == "drifty")
    assert row.drifted
    at = datetime.strptime(row.changed_at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert abs(at.timestamp() - (ORIGIN_S + UPDATE_H * H)) <= H
    assert row.before_p99_ms == pytest.approx(50.0, rel=0.05)
    assert row.after_p99_ms == pytest.approx(80.0, rel=0.05)

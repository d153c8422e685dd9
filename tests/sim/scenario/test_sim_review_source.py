"""A simulation as a review source: the ReviewData of a small scenario says what the run did.

Allocations are exactly the GPU time the run counted, every card has a sample per bucket,
each job's wait splits by the core's reason codes into its whole wait, a planted model
update shows as a latency step, the same seed gives the same record, and recording for a
review (or declaring usage) changes no scheduling decision.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.errors import SpecError
from gpupool.reports.review_data import ReviewData
from gpupool.sim.scenario.config import ScenarioConfig, parse_scenario
from gpupool.sim.scenario.generators import GenContext, build_workload
from gpupool.sim.scenario.review_source import ORIGIN_S, review_data, wait_by_reason
from gpupool.sim.scenario.runner import run_scenario
from gpupool.sim.scenario.summary import scenario_summary
from gpupool.sim.scenario.usage import IDLE_MEM_FRACTION
from gpupool.sim.scenario.world import ScenarioSim
from gpupool.traces.location import find_traces_dir

H = 3600.0
SMALL = """
name: review-small
seed: 3
horizon_h: 48
cycle_s: 60
cluster:
  - {gpu_type: A100-80GB, nodes: 2, gpus_per_node: 4}
share_cap: 2
preemption: {min_runtime_s: 900, max_per_job: 3}
energy: {tariff: guangdong-tou, pue: 1.3}
teams:
  - {name: A, guaranteed: {A100-80GB: 4}, max: {A100-80GB: 8}}
  - {name: B, guaranteed: {A100-80GB: 4}, max: {A100-80GB: 8}}
workload:
  - {generator: job, name: idle-holder, team: A, gpus: 1, work_min: 1800, priority: 2,
     usage: {sm_pct: 0, mem_mib: 0}}
  - {generator: job, name: small-user, team: B, gpus: 1, work_min: 600, priority: 2,
     usage: {sm_pct: 35, mem_mib: 9000, mem_peak_mib: 12000}}
  - {generator: mixed, name: a-mixed, team: A, jobs_per_day: 40, max_work_h: 10}
  - {generator: mixed, name: b-mixed, team: B, jobs_per_day: 40, max_work_h: 10}
  - {generator: diurnal-service, name: drifty, team: B, base_rps: 10, peak_rps: 40,
     replica_rps: 20, base_p99_ms: 50, update: {at_h: 24, base_p99_ms: 80}}
"""


def small(**changes: Any) -> tuple[ScenarioConfig, dict[str, Any]]:
    raw = yaml.safe_load(SMALL)
    raw.update(changes)
    return parse_scenario(raw), raw


def simulate(cfg: ScenarioConfig, review: bool = True) -> ScenarioSim:
    ctx = GenContext(cfg.horizon_s, find_traces_dir(Path(__file__).parent))
    sim = ScenarioSim(cfg, build_workload(cfg.workload, cfg.seed, ctx))
    if review:
        sim.record_for_review()
    sim.run()
    return sim


@pytest.fixture(scope="module")
def run() -> tuple[ScenarioSim, ReviewData]:
    sim = simulate(small()[0])
    return sim, review_data(sim)


def test_allocations_are_exactly_the_gpu_time_the_run_counted(
    run: tuple[ScenarioSim, ReviewData],
) -> None:
    sim, data = run
    held: dict[str, float] = defaultdict(float)
    for a in data.allocations:
        assert data.start_s <= a.start_s < a.end_s <= data.end_s
        held[a.job_id] += (a.end_s - a.start_s) * a.share_milli / 1000
    runs = sim.runs
    assert set(held) == {j for j, r in runs.items() if r.gpu_s > 0}
    for job_id, r in runs.items():
        # times are kept to the millisecond: at most 1 ms per interval and card
        assert held.get(job_id, 0.0) == pytest.approx(r.gpu_s, abs=0.01), job_id
    replicas = [j for j in held if runs[j].service == "drifty"]
    assert replicas, "service replicas are allocations too"
    total = sum(held.values())
    capacity = len(data.gpus) * sim.cfg.horizon_s
    summary = scenario_summary(sim, 0.0)
    assert round(total / capacity, 4) == summary["gpu_hours_utilization"]
    for team, t in summary["teams"].items():
        mine = sum(h for j, h in held.items() if runs[j].spec.team == team)
        assert round(mine / 3600, 1) == t["gpu_hours"]
    # no card is held past its capacity at any moment
    edges: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for a in data.allocations:
        edges[a.gpu_id] += [(a.start_s, a.share_milli), (a.end_s, -a.share_milli)]
    for marks in edges.values():
        level = 0
        for _, d in sorted(marks, key=lambda x: (x[0], x[1])):
            level += d
            assert level <= 1000


def test_every_card_has_a_sample_per_bucket_idle_ones_too(
    run: tuple[ScenarioSim, ReviewData],
) -> None:
    sim, data = run
    assert [g.gpu_id for g in data.gpus][:2] == ["A100-80GB-000/0", "A100-80GB-000/1"]
    card = round(sim.catalog["A100-80GB"].memory_gib * 1024)  # the catalogue's usable memory
    assert all(g.mem_total_mib == card and g.gpu_type == "A100-80GB" for g in data.gpus)
    buckets = int(sim.cfg.horizon_s // H)
    by_gpu: dict[str, list[float]] = defaultdict(list)
    for s in data.usage:
        by_gpu[s.gpu_id].append(s.t_s)
        assert s.period_s == H and 0 <= s.sm_util_pct <= 100
        assert s.mem_used_mib <= (s.mem_peak_mib or 0) <= card
        assert s.power_w is not None and s.power_w > 0 and s.temp_c is not None
    assert set(by_gpu) == {g.gpu_id for g in data.gpus}
    for times in by_gpu.values():
        assert times == [k * H for k in range(buckets)]
    # energy: what the cards drew (no PUE) is the meter's total over the PUE
    drawn_kwh = sum((s.power_w or 0) * s.period_s for s in data.usage) / 3.6e6
    assert drawn_kwh * 1.3 == pytest.approx(sim.meter.total().energy_kwh, rel=1e-3)


def test_planted_usage_shows_on_the_card_it_held(run: tuple[ScenarioSim, ReviewData]) -> None:
    _, data = run
    baseline = IDLE_MEM_FRACTION * data.gpus[0].mem_total_mib
    for job_id, sm, mem in (("idle-holder", 0.0, 0.0), ("small-user", 35.0, 9000.0)):
        allocs = [a for a in data.allocations if a.job_id == job_id]
        assert len(allocs) == 1
        a = allocs[0]
        whole = [
            s
            for s in data.usage
            if s.gpu_id == a.gpu_id and a.start_s <= s.t_s and s.t_s + s.period_s <= a.end_s
        ]
        assert len(whole) >= 9
        for s in whole:
            assert s.sm_util_pct == pytest.approx(sm, abs=0.01)
            assert s.mem_used_mib == pytest.approx(mem + baseline, abs=0.1)
        if job_id == "small-user":  # the peak it declared, in every bucket it held the card
            for s in whole:
                assert s.mem_peak_mib == pytest.approx(12000 + baseline, abs=0.1)


def test_wait_reasons_sum_to_each_jobs_wait(run: tuple[ScenarioSim, ReviewData]) -> None:
    sim, data = run
    spans: dict[str, set[tuple[float, float]]] = defaultdict(set)
    for a in data.allocations:
        spans[a.job_id].add((a.start_s, a.end_s))
    codes: set[str] = set()
    waited = 0
    for j in data.jobs:
        end = data.end_s if j.end_s is None else min(j.end_s, data.end_s)
        held = sum(b - a for a, b in spans.get(j.job_id, set()))
        wait = end - j.submit_s - held
        assert sum(j.wait_s_by_reason.values()) == pytest.approx(wait, abs=0.01), j.job_id
        codes |= set(j.wait_s_by_reason)
        waited += wait > H
    assert waited >= 5, "the scenario must make jobs wait"
    assert codes - {"Scheduling"}, f"only {codes}: no reason code from the core was used"
    assert codes <= set(sim.waited_with) | {"Scheduling"}


def test_wait_split_follows_the_last_reason_told() -> None:
    told = [(10.0, "Resources"), (40.0, "Priority"), (70.0, ""), (90.0, "Resources")]
    got = wait_by_reason(0.0, 100.0, [(50.0, 80.0)], told)
    # 0-10 nothing told yet, 10-40 Resources, 40-50 Priority, held 50-80,
    # 80-90 after an empty reason, 90-100 Resources
    assert got == {"Scheduling": 20.0, "Resources": 40.0, "Priority": 10.0}


def test_a_planted_model_update_steps_the_latency(run: tuple[ScenarioSim, ReviewData]) -> None:
    _, data = run
    p99 = {round(s.t_s / H): s.p99_ms for s in data.latency if s.service == "drifty"}
    assert set(p99) == set(range(48))
    assert {p99[h] for h in range(24)} == {50.0}
    assert {p99[h] for h in range(24, 48)} == {80.0}
    rps = {round(s.t_s / H): s.rps for s in data.latency}
    assert rps[3] == pytest.approx(10.0) and rps[11] == pytest.approx(40.0)


def test_jobs_carry_their_life_energy_and_team_quotas(run: tuple[ScenarioSim, ReviewData]) -> None:
    sim, data = run
    jobs = {j.job_id: j for j in data.jobs}
    assert set(jobs) == set(sim.runs)
    holder = jobs["idle-holder"]
    assert holder.state == "finished" and holder.first_start_s == 0.0
    assert holder.end_s == pytest.approx(30 * H, abs=120)
    assert (holder.energy_kwh or 0) > 0
    assert {j.service for j in data.jobs} == {None, "drifty"}
    preempted = [j for j in data.jobs if j.preemptions]
    assert all(j.lost_gpu_s >= 0 for j in preempted)
    assert {t.team: t.guaranteed for t in data.teams} == {
        "A": {"A100-80GB": 4},
        "B": {"A100-80GB": 4},
    }
    assert data.tariff is not None and len(data.tariff.price_per_kwh) == 24
    assert data.tariff.pue == 1.3 and len(set(data.tariff.price_per_kwh)) > 1
    assert data.gpu_price_per_hour == {"A100-80GB": sim.catalog["A100-80GB"].price_usd_per_hour}
    # scenario seconds, with the Unix time of t=0 beside them
    assert (data.start_s, data.end_s, data.origin_s) == (0.0, 48 * H, ORIGIN_S)


def test_same_seed_same_record_and_recording_changes_no_decision(
    run: tuple[ScenarioSim, ReviewData], tmp_path: Path
) -> None:
    sim, data = run
    again = run_scenario(small()[0], find_traces_dir(Path(__file__).parent), review=True)
    assert again.review is not None
    assert json.dumps(again.review.to_json()) == json.dumps(data.to_json())
    names = tuple(n.name for n in sim.cluster.nodes)
    log = sim.engine.log.render(names)
    assert log.count("\n") > 100
    plain = simulate(small()[0], review=False)
    assert plain.recorder is None
    assert plain.engine.log.render(names) == log
    # usage is the world's: without it the same decisions are taken
    _, raw = small()
    for entry in raw["workload"]:
        entry.pop("usage", None)
    bare = simulate(parse_scenario(raw), review=False)
    assert bare.engine.log.render(names) == log
    path = tmp_path / "review.json"
    data.write(path)
    assert ReviewData.read(path) == data


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"usage": {"sm": 1}}, "unknown usage key"),
        ({"usage": {"sm_pct": 120}}, "0..100"),
        ({"usage": {"mem_mib": 10, "mem_peak_mib": 5}}, "mem_peak_mib must be >= mem_mib"),
        ({"update": {"at_h": 1, "base_p99_ms": 80}}, "this entry has none"),
    ],
)
def test_bad_world_keys_say_what_to_write(entry: dict[str, Any], message: str) -> None:
    raw = {"generator": "job", "name": "x", "team": "A", "work_min": 10, **entry}
    with pytest.raises(SpecError, match=message):
        build_workload([raw], 1, GenContext(3600.0, None))


def test_a_run_that_kept_nothing_says_how_to_get_a_review() -> None:
    cfg, _ = small(horizon_h=1)
    with pytest.raises(SpecError, match="--json"):
        review_data(simulate(cfg, review=False))

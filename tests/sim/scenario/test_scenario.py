"""Scenario simulator: preemption with checkpoints, quotas, co-location, services, modes.

Expected outcomes are computed here by hand from the documented models, not read back from
the simulator. Regenerate the golden decision log only on purpose:
GPUPOOL_REGOLD=1 pytest tests/sim/scenario/test_scenario.py
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.domain.calibration import GIB_PER_GB, CheckpointModel
from gpupool.domain.engine import Decision
from gpupool.domain.lifecycle import TERMINAL, JobState
from gpupool.domain.model import Cluster, JobKind, JobSpec, Node, NodeShare, Placement
from gpupool.domain.state import ClusterState
from gpupool.errors import PlanRejected
from gpupool.sim.scenario.config import ScenarioConfig, parse_scenario
from gpupool.sim.scenario.runner import ScenarioResult, run_scenario
from gpupool.sim.scenario.summary import scenario_summary
from gpupool.sim.scenario.workload import LoadCurve, ServiceSpec, Workload
from gpupool.sim.scenario.world import ScenarioSim

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
H = 3600.0
GPU = "H200"


def config(
    teams: list[dict[str, Any]], nodes: int = 1, horizon_h: float = 12, **extra: Any
) -> ScenarioConfig:
    raw: dict[str, Any] = {
        "name": "t",
        "horizon_h": horizon_h,
        "cycle_s": 60,
        "cluster": [{"gpu_type": GPU, "nodes": nodes, "gpus_per_node": 8}],
        "teams": teams,
        "workload": [],
    }
    raw.update(extra)
    return parse_scenario(raw)


def team(name: str, guaranteed: int, maximum: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "guaranteed": {GPU: guaranteed}}
    if maximum is not None:
        out["max"] = {GPU: maximum}
    return out


class CheckedSim(ScenarioSim):
    """Runs `check(sim, now)` after every cycle (after jobs progressed and vacated)."""

    def __init__(
        self,
        cfg: ScenarioConfig,
        workload: Workload,
        check: Callable[[ScenarioSim, float], None],
    ) -> None:
        super().__init__(cfg, workload)
        self.check = check
        self.cycles = 0

    def check_guarantees(self, owed: Any, now: float, end: float) -> None:
        super().check_guarantees(owed, now, end)
        self.cycles += 1
        self.check(self, now)


def run_checked(
    cfg: ScenarioConfig, wl: Workload, check: Callable[[ScenarioSim, float], None]
) -> tuple[CheckedSim, dict[str, Any]]:
    sim = CheckedSim(cfg, wl, check)
    sim.run()
    assert sim.cycles == int(cfg.horizon_s // cfg.scheduling.cycle_s)
    return sim, scenario_summary(sim, 0.0)


def decisions(result: ScenarioResult | ScenarioSim) -> list[Decision]:
    if isinstance(result, ScenarioSim):
        return result.engine.log.decisions
    return result.log.decisions


def preempts(ds: Iterable[Decision]) -> list[Decision]:
    return [d for d in ds if d.action.startswith("preempt")]


def by_action(ds: Iterable[Decision], action: str, job_id: str) -> list[Decision]:
    return [d for d in ds if d.action == action and d.job_id == job_id]


def check_state(state: ClusterState) -> None:
    """No GPU, CPU or memory over-committed; the books add up (as in test_properties)."""
    real = np.arange(state.gpu_left.shape[1])[None, :] < state.gpu_count[:, None]
    assert (state.gpu_left[real] <= 1000).all(), "a GPU holds more than 1000 milli"
    assert (state.gpu_left[real] >= 0).all(), "a GPU is over-committed"
    assert (state.gpu_left[~real] < 0).all(), "a missing GPU slot got capacity"
    assert (state.cpu_left >= 0).all() and (state.mem_left >= 0).all()
    held = sum(j.total_gpu_milli for j in state.jobs.values())
    assert state.used_gpu_milli == held == int((1000 - state.gpu_left[real]).sum())
    milli = np.zeros_like(state.gpu_left)
    for job_id, placement in state.placements.items():
        for share in placement.shares:
            for g in share.gpus:
                milli[share.node, g] += state.jobs[job_id].gpu_milli
    assert (milli[real] == 1000 - state.gpu_left[real]).all()


# ---- a. preemption keeps checkpointed progress (acceptance) ----------------------------------
def test_preempted_job_resumes_with_its_checkpointed_progress() -> None:
    cfg = config([team("own", 8), team("borrower", 0, 8)], horizon_h=8)
    ck = CheckpointModel.calibrated()
    assert (ck.write_gbps, ck.restore_gbps, ck.process_start_s) == (0.45, 1.2, 5.0)
    borrow = JobSpec(
        "borrow",
        gpu_count=8,
        team="borrower",
        submit_s=0.0,
        duration_s=4 * H,
        checkpoint_interval_s=1800.0,
        state_gib_per_gpu=16.0,
    )
    arrive = 2 * H + 10 * 60
    own = JobSpec(
        "own", gpu_count=8, team="own", submit_s=arrive, duration_s=2 * H, state_gib_per_gpu=4.0
    )
    result = run_scenario(cfg, workload=Workload(jobs=(borrow, own)))
    log = decisions(result)

    gb = 16 * 2**30 / 1e9  # 16 GiB in GB
    write_s = gb / 0.45  # ~38.18 s with the GPUs still held
    restore_s = gb / 1.2 + 5.0  # read it back, restart the process
    assert write_s == pytest.approx(38.18, abs=0.01)
    assert ck.write_s(16.0) == pytest.approx(write_s)
    # borrow starts at 0, runs from 5 s (process start); at 2h10m it has run 7795 s; its
    # snapshots fall at 1800, 3600, 5400, 7200 s of run time: 595 s are lost
    ran = arrive - 5.0
    saved = 1800.0 * (ran // 1800.0)
    lost = ran - saved
    assert (saved, lost) == (7200.0, 595.0)
    vacated = arrive + write_s
    own_end = vacated + 5.0 + 2 * H
    # the next cycle after `own` finishes: borrow resumes with the rest of its work
    resume_at = 60.0 * -(-own_end // 60.0)
    borrow_end = resume_at + restore_s + (4 * H - saved)

    (p,) = preempts(log)
    assert p.job_id == "borrow" and p.time_s == arrive
    assert p.action.startswith("preempt (reclaimed for own")
    assert f"loses {lost:.0f}s" in p.action
    (suspend,) = by_action(log, "suspend", "borrow")
    assert suspend.time_s == pytest.approx(vacated)
    starts = by_action(log, "start", "own")
    assert [d.time_s for d in starts] == [suspend.time_s]  # the moment the GPUs are free
    assert starts[0].seq == suspend.seq + 1
    (own_fin,) = by_action(log, "finish", "own")
    assert own_fin.time_s == pytest.approx(own_end)
    (resume,) = by_action(log, "resume", "borrow")
    assert resume.time_s == resume_at
    (borrow_fin,) = by_action(log, "finish", "borrow")
    assert borrow_fin.time_s == pytest.approx(borrow_end)
    assert f"{borrow_fin.time_s:.3f}" == f"{borrow_end:.3f}"
    assert [d.job_id for d in log if d.action == "start"] == ["borrow", "own"]

    s = result.summary
    assert s["jobs_finished"] == 2
    assert s["preemptions"] == 1
    assert s["lost_work_gpu_hours"] == pytest.approx(lost * 8 / H, abs=0.005)
    assert s["guarantee_violation_s"] == 0
    assert s["jobs_lost"] == 0
    assert s["end_reasons"] == {"completed": 2}
    assert s["teams"]["borrower"]["preemptions"] == 1
    assert s["teams"]["own"]["preemptions"] == 0


def test_checkpoint_model_costs_follow_the_per_gpu_state() -> None:
    ck = CheckpointModel(write_gbps=0.5, restore_gbps=2.0, process_start_s=3.0)
    gib = 2**30 / 1e9
    assert pytest.approx(1 / gib) == GIB_PER_GB
    assert ck.write_s(10.0) == pytest.approx(10 * gib / 0.5)
    assert ck.resume_s(10.0) == pytest.approx(10 * gib / 2.0 + 3.0)
    assert ck.resume_s(0.0) == 3.0


def test_preemption_inside_the_first_snapshot_loses_everything_run_so_far() -> None:
    cfg = config([team("own", 8), team("borrower", 0, 8)], horizon_h=4)
    borrow = JobSpec(
        "borrow", gpu_count=8, team="borrower", duration_s=H, checkpoint_interval_s=1800.0
    )
    own = JobSpec("own", gpu_count=8, team="own", submit_s=1200.0, duration_s=600.0)
    result = run_scenario(cfg, workload=Workload(jobs=(borrow, own)))
    (p,) = preempts(decisions(result))
    assert "loses 1195s" in p.action  # 1200 s minus the 5 s process start
    # no state to write: the owner starts in the same instant
    assert by_action(decisions(result), "start", "own")[0].time_s == 1200.0
    # the borrower redoes all its work: started again after own ends at 1200 + 605
    (fin,) = by_action(decisions(result), "finish", "borrow")
    assert fin.time_s == pytest.approx(1860.0 + 5.0 + H)
    assert result.summary["lost_work_gpu_hours"] == pytest.approx(1195 * 8 / H, abs=0.005)


# ---- b. quota invariants (property tests) ---------------------------------------------------
KINDS = (JobKind.TRAINING, JobKind.OFFLINE, JobKind.BATCH)


@st.composite
def quota_scenarios(
    draw: st.DrawFn, whole_nodes: bool = False, reservations: bool = False
) -> tuple[ScenarioConfig, Workload, dict[str, tuple[int, int]]]:
    nodes = draw(st.integers(1, 3))
    pool = nodes * 8
    names = ["t0", "t1", "t2"][: draw(st.integers(2, 3))]
    quotas: dict[str, tuple[int, int]] = {}
    left = pool
    for name in names:
        g = draw(st.integers(0, left))
        left -= g
        m = draw(st.one_of(st.none(), st.integers(g, pool)))
        quotas[name] = (g, pool if m is None else m)
    teams = [
        team(n, g, None if m == pool and draw(st.booleans()) else m) for n, (g, m) in quotas.items()
    ]
    jobs = []
    for i in range(draw(st.integers(5, 25))):
        jobs.append(
            JobSpec(
                f"j{i:02d}",
                gpu_count=8 if whole_nodes else draw(st.sampled_from((1, 2, 4, 8))),
                team=draw(st.sampled_from(names)),
                priority=draw(st.integers(0, 2)),
                kind=draw(st.sampled_from(KINDS)),
                submit_s=float(draw(st.integers(0, 12 * 3600 - 1))),
                duration_s=float(draw(st.integers(60, 6 * 3600))),
                checkpoint_interval_s=float(draw(st.sampled_from((600, 1800, 3600)))),
                # 16 GiB writes in 38 s, within a cycle; 60 GiB takes 143 s, over two
                state_gib_per_gpu=float(draw(st.sampled_from((0, 4, 16, 60)))),
            )
        )
    # the default online reserve (0.2) stays on: its gating takes part
    cfg = config(
        teams, nodes=nodes, horizon_h=12, seed=draw(st.integers(0, 1000)), reservations=reservations
    )
    return cfg, Workload(jobs=tuple(jobs)), quotas


def quota_checker(
    quotas: Mapping[str, tuple[int, int]],
) -> Callable[[ScenarioSim, float], None]:
    def check(sim: ScenarioSim, now: float) -> None:
        check_state(sim.state)
        running: dict[str, int] = defaultdict(int)
        holding: set[str] = set()
        for r in sim.runs.values():
            if r.state is JobState.RUNNING:
                running[r.spec.team] += r.spec.gpu_count
            if r.state in (JobState.RUNNING, JobState.PREEMPTING):
                holding.add(r.spec.job_id)
        # (iii) the state holds exactly the jobs that run or vacate
        assert holding == set(sim.state.placements)
        for name, (_, maximum) in quotas.items():
            # (i) no team above its maximum (vacating jobs are on their way out)
            assert running[name] <= maximum, f"{name} holds {running[name]} > max {maximum}"
            assert sim.usage(name, GPU) == running[name]

    return check


def replay_reclaims(
    log: Iterable[Decision], specs: Mapping[str, JobSpec], quotas: Mapping[str, tuple[int, int]]
) -> int:
    """Replay the log; every reclaim must take GPUs from a team above its guarantee."""
    held: dict[str, int] = defaultdict(int)
    counted: set[str] = set()
    reclaims = 0
    for d in log:
        spec = specs[d.job_id]
        if d.action in ("start", "resume"):
            assert d.job_id not in counted
            counted.add(d.job_id)
            held[spec.team] += spec.gpu_count
        elif d.action.startswith("preempt"):
            assert d.job_id in counted, f"{d.job_id} preempted while not running"
            if d.action.startswith("preempt (reclaimed for"):
                reclaims += 1
                guaranteed = quotas[spec.team][0]
                assert held[spec.team] > guaranteed, (
                    f"at {d.time_s} reclaimed {d.job_id} from {spec.team}, which held "
                    f"{held[spec.team]} <= its guarantee {guaranteed}"
                )
            counted.discard(d.job_id)
            held[spec.team] -= spec.gpu_count
        elif d.action in ("finish", "stop") and d.job_id in counted:
            counted.discard(d.job_id)
            held[spec.team] -= spec.gpu_count
    return reclaims


def check_endings(sim: ScenarioSim, summary: Mapping[str, Any], wl: Workload) -> None:
    # (iv) nothing lost: every job ends, with a reason
    assert summary["jobs_lost"] == 0
    assert summary["jobs_submitted"] == len(wl.jobs)
    assert set(sim.runs) == {j.job_id for j in wl.jobs}
    for r in sim.runs.values():
        assert r.state in TERMINAL and r.end_reason, r.spec.job_id
        assert r.end_s is not None and r.end_s <= sim.cfg.horizon_s
    ended = summary["jobs_finished"] + summary["jobs_cancelled"] + summary["jobs_failed"]
    assert ended == len(wl.jobs)
    for j in wl.jobs:
        r = sim.runs[j.job_id]
        if r.state is JobState.FINISHED:
            # did all its work, and at least that long after its submit
            assert r.done_s == pytest.approx(j.duration_s)
            assert r.end_s is not None and r.end_s >= j.submit_s + (j.duration_s or 0.0)


@settings(max_examples=30, deadline=None)
@given(quota_scenarios())
def test_quota_invariants_hold_every_cycle(
    case: tuple[ScenarioConfig, Workload, dict[str, tuple[int, int]]],
) -> None:
    cfg, wl, quotas = case
    sim, summary = run_checked(cfg, wl, quota_checker(quotas))
    specs = {j.job_id: j for j in wl.jobs}
    reclaims = replay_reclaims(decisions(sim), specs, quotas)
    assert reclaims <= summary["preemptions"]
    check_endings(sim, summary, wl)


@settings(max_examples=30, deadline=None)
@given(quota_scenarios(whole_nodes=True))
def test_whole_node_jobs_get_their_guarantee_back(
    case: tuple[ScenarioConfig, Workload, dict[str, tuple[int, int]]],
) -> None:
    cfg, wl, quotas = case
    sim, summary = run_checked(cfg, wl, quota_checker(quotas))
    replay_reclaims(decisions(sim), {j.job_id: j for j in wl.jobs}, quotas)
    check_endings(sim, summary, wl)
    # (v) guarantees fit the pool, jobs are whole nodes: borrowing is always returned
    assert summary["guarantee_violation_s"] == 0
    assert all(t["guarantee_violation_s"] == 0 for t in summary["teams"].values())


@settings(max_examples=20, deadline=None)
@given(quota_scenarios(reservations=True))
def test_quota_invariants_hold_with_reservations(
    case: tuple[ScenarioConfig, Workload, dict[str, tuple[int, int]]],
) -> None:
    """Reservations keep GPUs and team room for waiting jobs; they never take a team past
    its maximum or lose a job."""
    cfg, wl, quotas = case
    sim, summary = run_checked(cfg, wl, quota_checker(quotas))
    check_endings(sim, summary, wl)


@settings(max_examples=20, deadline=None)
@given(quota_scenarios(whole_nodes=True, reservations=True))
def test_whole_node_jobs_get_their_guarantee_back_with_reservations(
    case: tuple[ScenarioConfig, Workload, dict[str, tuple[int, int]]],
) -> None:
    """Room a team keeps for its own older job is not a guarantee owed to the jobs behind
    it (regression: an entitled job ahead of the team's held one was refused the room)."""
    cfg, wl, quotas = case
    sim, summary = run_checked(cfg, wl, quota_checker(quotas))
    check_endings(sim, summary, wl)
    assert summary["guarantee_violation_s"] == 0


def test_online_reserve_does_not_hand_an_entitled_node_to_a_borrower() -> None:
    """Regression, found by the property above: the online reserve (default 0.2, no online
    work at all) refused an entitled job with a slow checkpoint because the plan did not count
    a job it had just started as quick to vacate; a borrower got the node, then was reclaimed."""
    cfg = config([team("t0", 16), team("t1", 0)], nodes=2, horizon_h=1)

    def job(job_id: str, owner: str, submit_s: float, state_gib: float) -> JobSpec:
        return JobSpec(
            job_id,
            gpu_count=8,
            team=owner,
            submit_s=submit_s,
            duration_s=60.0,
            checkpoint_interval_s=600.0,
            state_gib_per_gpu=state_gib,
        )

    jobs = (
        job("j00", "t0", 0.0, 0.0),
        job("j01", "t0", 1.0, 60.0),  # 60 GiB: a 143 s checkpoint, more than a cycle
        job("j02", "t0", 0.0, 0.0),
        job("j03", "t0", 0.0, 0.0),
        job("j04", "t1", 0.0, 0.0),
    )
    result = run_scenario(cfg, workload=Workload(jobs=jobs))
    log = decisions(result)
    # j00, j02 run 0-65 on both nodes; at the 120 s cycle t0 (guaranteed the whole pool)
    # wants two nodes for j03 and j01: both are owed, t1 only borrows
    assert by_action(log, "start", "j03")[0].time_s == 120.0
    assert by_action(log, "start", "j01")[0].time_s == 120.0  # was 180, after a reclaim
    assert result.summary["preemptions"] == 0  # j04 was preempted at 180
    assert result.summary["guarantee_violation_s"] == 0  # was 55 s


def test_online_reserve_does_not_starve_an_entitled_job() -> None:
    """Regression: the online reserve gated jobs within their guarantee, so on one node an
    entitled job with a slow checkpoint never started while a borrower got the node."""
    cfg = config([team("t0", 8), team("t1", 0)], nodes=1, horizon_h=1)
    own = JobSpec(
        "own", gpu_count=8, team="t0", submit_s=30.0, duration_s=600.0, state_gib_per_gpu=60.0
    )
    lend = JobSpec("lend", gpu_count=8, team="t1", submit_s=30.0, duration_s=600.0)
    result = run_scenario(cfg, workload=Workload(jobs=(own, lend)))
    starts = {d.job_id: d.time_s for d in decisions(result) if d.action == "start"}
    # both arrive at the 60 s cycle; t0 is guaranteed the whole node, t1 only borrows
    assert starts == {"own": 60.0, "lend": 720.0}  # was {"lend": 60.0}, own never
    assert result.summary["guarantee_violation_s"] == 0  # was 3510 s


def test_pending_claim_counts_against_the_team_maximum() -> None:
    """Regression, found by the properties above with 60 GiB checkpoints (143 s, over two
    cycles): a job waiting on its claim was not counted in its team's usage, so the team
    started another job meanwhile, and the claim's start raised PlanRejected (over max)."""
    cfg = config(
        [team("own", 8, 8), team("other", 0, 16)], nodes=2, horizon_h=2, online_reserve=0.0
    )
    slow = JobSpec(
        "x-slow", gpu_count=8, team="other", duration_s=H, state_gib_per_gpu=60.0
    )  # a 60 GiB checkpoint takes 143 s to write
    short = JobSpec("x-short", gpu_count=8, team="other", priority=1, duration_s=95.0)
    a = JobSpec("own-a", gpu_count=8, team="own", submit_s=60.0, duration_s=600.0)
    b = JobSpec("own-b", gpu_count=8, team="own", submit_s=120.0, duration_s=600.0)
    sim = CheckedSim(
        cfg,
        Workload(jobs=(slow, short, a, b)),
        quota_checker({"own": (8, 8), "other": (0, 16)}),
    )
    sim.run()  # raised PlanRejected at 203.17 s, when x-slow vacated for own-a
    log = decisions(sim)
    # at 60 own-a reclaims x-slow (lowest priority); x-short ends at 100, and own-a, still
    # waiting for x-slow's 143 s checkpoint, takes that node at the next cycle (a claimant
    # takes GPUs that free up before its victims have left); at 120 own-b must wait, own
    # holding its maximum
    (start_a,) = by_action(log, "start", "own-a")
    assert start_a.time_s == pytest.approx(120.0)
    write_s = 60 * 2**30 / 1e9 / 0.45
    (suspend,) = by_action(log, "suspend", "x-slow")
    assert suspend.time_s == pytest.approx(60.0 + write_s)  # the preemption still completes
    (start_b,) = by_action(log, "start", "own-b")
    assert start_b.time_s >= start_a.time_s + 605.0


def test_reclaim_property_has_teeth() -> None:
    """The log replay spots a reclaim from a team within its guarantee."""
    spec = {"a": JobSpec("a", gpu_count=4, team="x"), "b": JobSpec("b", gpu_count=4, team="y")}
    quotas = {"x": (4, 8), "y": (4, 8)}
    place = Placement((NodeShare(0, (0, 1, 2, 3), 1000),))
    ok = [Decision(0, 0.0, "start", "a", place), Decision(1, 0.0, "start", "b", place)]
    good = [*ok, Decision(2, 60.0, "start", "b", place)]
    with pytest.raises(AssertionError):
        replay_reclaims(good, spec, quotas)  # b started twice
    bad = [*ok, Decision(2, 60.0, "preempt (reclaimed for z (training); loses 0s)", "a")]
    with pytest.raises(AssertionError, match="guarantee"):
        replay_reclaims(bad, spec, quotas)


# ---- c. co-location rule --------------------------------------------------------------------
def test_colocation_rule_holds_every_cycle() -> None:
    cfg = config(
        [team("web", 4), team("batch", 4, 8)],
        nodes=1,
        horizon_h=8,
        share_cap=2,
        online_reserve=0.0,
    )
    load = LoadCurve((0.0, 2 * H, 4 * H, 6 * H), (10.0, 60.0, 30.0, 70.0))
    # small replicas with a low p99 and a floor of 4: sharing pays (fewer GPUs, SLO kept)
    svc = ServiceSpec(
        "chat",
        "web",
        load,
        replica_rps=40.0,
        replica_gpu_milli=500,
        base_p99_ms=40.0,
        min_replicas=4,
    )
    rng = np.random.default_rng(5)
    jobs = tuple(
        JobSpec(
            f"half{i:02d}",
            gpu_count=1,
            gpu_milli=500,
            team="batch" if i % 3 else "web",
            kind=(JobKind.OFFLINE, JobKind.TRAINING)[i % 2],
            submit_s=float(rng.integers(0, 6 * 3600)),
            duration_s=float(rng.integers(600, 3 * 3600)),
        )
        for i in range(24)
    )
    seen = {"online_pair": 0, "other_pair": 0, "replicas": 0}

    def check(sim: ScenarioSim, now: float) -> None:
        st_ = sim.state
        check_state(st_)
        real = np.arange(st_.gpu_left.shape[1])[None, :] < st_.gpu_count[:, None]
        online, other = st_.online_on_gpu[real], st_.other_on_gpu[real]
        assert ((online == 0) | (other == 0)).all(), f"online shares with batch at {now}"
        assert (online <= 2).all(), f"more than share_cap replicas on a GPU at {now}"
        # the counters follow the placements
        count = np.zeros_like(st_.online_on_gpu)
        for job_id, placement in st_.placements.items():
            if st_.jobs[job_id].kind is JobKind.ONLINE:
                for share in placement.shares:
                    count[share.node, list(share.gpus)] += 1
        assert (count == st_.online_on_gpu).all()
        seen["online_pair"] += int((online == 2).sum())
        seen["other_pair"] += int((other == 2).sum())
        seen["replicas"] = max(seen["replicas"], int(online.sum()))

    _, summary = run_checked(cfg, Workload(jobs=jobs, services=(svc,)), check)
    # the scenario did exercise sharing on both sides of the rule
    assert seen["online_pair"] > 0 and seen["other_pair"] > 0
    # 70 rps x 1.1 headroom / (40 rps x 0.73 / 2 sharers) -> 6 replicas at the peak
    assert seen["replicas"] == 6
    assert summary["jobs_lost"] == 0


def colocation_state() -> ClusterState:
    state = ClusterState(Cluster("c", (Node("n0", GPU, 2, 64_000, 65_536),)))
    state.share_cap = 2
    replica = JobSpec("svc-r1", gpu_count=1, gpu_milli=300, kind=JobKind.ONLINE)
    plan = Placement((NodeShare(0, (0,), 300),))
    state.validate(replica, plan)
    state.allocate(replica, plan)
    return state


def test_validate_refuses_training_next_to_an_online_replica() -> None:
    state = colocation_state()
    train = JobSpec("train", gpu_count=1, gpu_milli=500, kind=JobKind.TRAINING)
    with pytest.raises(PlanRejected, match="training may not share a GPU with online inference"):
        state.validate(train, Placement((NodeShare(0, (0,), 500),)))
    offline = JobSpec("off", gpu_count=1, gpu_milli=200, kind=JobKind.OFFLINE)
    with pytest.raises(PlanRejected, match="offline-inference may not share a GPU with online"):
        state.validate(offline, Placement((NodeShare(0, (0,), 200),)))
    state.validate(train, Placement((NodeShare(0, (1,), 500),)))  # the other GPU is fine
    # and the placement filter agrees
    assert state.usable_gpus(train)[0].tolist() == [False, True]


def test_validate_refuses_online_next_to_training_and_over_the_cap() -> None:
    state = colocation_state()
    train = JobSpec("train", gpu_count=1, gpu_milli=500)
    state.allocate(train, Placement((NodeShare(0, (1,), 500),)))
    online = JobSpec("svc-r2", gpu_count=1, gpu_milli=300, kind=JobKind.ONLINE)
    with pytest.raises(PlanRejected, match="online inference may share a GPU only with online"):
        state.validate(online, Placement((NodeShare(0, (1,), 300),)))
    state.validate(online, Placement((NodeShare(0, (0,), 300),)))
    state.allocate(online, Placement((NodeShare(0, (0,), 300),)))
    third = JobSpec("svc-r3", gpu_count=1, gpu_milli=300, kind=JobKind.ONLINE)
    with pytest.raises(PlanRejected, match="at most 2 online replicas per GPU"):
        state.validate(third, Placement((NodeShare(0, (0,), 300),)))
    assert not state.usable_gpus(third).any()


def test_without_share_cap_there_is_no_colocation_rule() -> None:
    state = colocation_state()
    state.share_cap = None
    train = JobSpec("train", gpu_count=1, gpu_milli=500)
    state.validate(train, Placement((NodeShare(0, (0,), 500),)))


# ---- d. online is never preempted and meets its SLO ------------------------------------------
def test_online_service_reclaims_borrowed_gpus_and_keeps_its_slo() -> None:
    cfg = config([team("web", 8, 8), team("ml", 8, 16)], nodes=2, horizon_h=6, online_reserve=0.0)
    # 50 rps until 2 h, then up to 500 rps by 3 h: 6 replicas of 100 rps (1.1 headroom)
    load = LoadCurve((0.0, 2 * H, 3 * H), (50.0, 50.0, 500.0))
    svc = ServiceSpec("chat", "web", load, replica_rps=100.0)
    jobs = tuple(
        JobSpec(
            f"ml{i:02d}",
            team="ml",
            duration_s=10 * H,
            checkpoint_interval_s=1800.0,
            state_gib_per_gpu=16.0,
        )
        for i in range(16)
    )
    peak = {"replicas": 0, "idle_at_2h": -1}

    def check(sim: ScenarioSim, now: float) -> None:
        check_state(sim.state)
        mine = [r for r in sim.replicas["chat"].values() if r.state is JobState.RUNNING]
        peak["replicas"] = max(peak["replicas"], len(mine))
        if now == 2 * H - 60:
            peak["idle_at_2h"] = int(sim.state.whole_free.sum())

    sim, summary = run_checked(cfg, Workload(jobs=jobs, services=(svc,)), check)
    log = decisions(sim)
    assert peak["idle_at_2h"] == 0  # borrowed training filled the pool
    assert peak["replicas"] == 6  # ceil(500 * 1.1 / 100)
    ps = preempts(log)
    assert len(ps) == 5  # one replica ran from the start; five more took ml GPUs
    assert all(d.job_id.startswith("ml") for d in ps)
    assert not any(d.job_id.startswith("chat-r") for d in ps)
    assert all(d.action.startswith("preempt (reclaimed for chat-r") for d in ps)
    # ml kept at least its guarantee throughout: 16 - 6 replicas = 10 >= 8
    assert summary["online_slo_attainment"] >= 0.999
    assert summary["teams"]["web"]["online_slo_attainment"] >= 0.999
    assert summary["guarantee_violation_s"] == 0
    assert summary["jobs_lost"] == 0
    for r in sim.runs.values():
        if r.service is not None:
            assert r.preemptions == 0


# ---- e. static mode ---------------------------------------------------------------------------
def test_static_mode_confines_teams_to_their_islands() -> None:
    cfg = config([team("a", 16), team("b", 8)], nodes=3, horizon_h=12, mode="static")
    island = {"a": {"H200-000", "H200-001"}, "b": {"H200-002"}}
    rng = np.random.default_rng(3)
    jobs = [
        JobSpec(
            f"{t}{i:02d}",
            gpu_count=int(rng.choice([1, 2, 4, 8])),
            team=t,
            submit_s=float(rng.integers(0, 4 * 3600)),
            duration_s=float(rng.integers(600, 2 * 3600)),
        )
        for i in range(12)
        for t in ("a", "b")
    ]
    jobs.append(JobSpec("b-huge", gpu_count=16, team="b", submit_s=600.0, duration_s=H))
    jobs.append(JobSpec("a-huge", gpu_count=16, team="a", submit_s=900.0, duration_s=H))
    result = run_scenario(cfg, workload=Workload(jobs=tuple(jobs)))
    specs = {j.job_id: j for j in jobs}
    starts = [d for d in result.log.decisions if d.action in ("start", "resume")]
    assert {specs[d.job_id].team for d in starts} == {"a", "b"}
    for d in starts:
        assert d.placement is not None
        names = {result.node_names[s.node] for s in d.placement.shares}
        assert names <= island[specs[d.job_id].team], d.line(result.node_names)
    # b's 16-GPU job can never fit its one node; a's fits its two
    (huge,) = [d for d in result.log.decisions if d.job_id == "b-huge"]
    assert huge.action == "unplaceable" and huge.time_s == 600.0
    assert any(d.job_id == "a-huge" and d.action == "start" for d in starts)
    s = result.summary
    assert s["jobs_failed"] == 1
    assert s["end_reasons"]["needs 16 GPUs, at most 8 usable"] == 1
    assert s["preemptions"] == 0
    assert s["jobs_lost"] == 0


def test_static_mode_does_not_lend_idle_islands() -> None:
    cfg = config([team("a", 8), team("b", 8)], nodes=2, horizon_h=4, mode="static")
    jobs = tuple(JobSpec(f"b{i}", gpu_count=8, team="b", duration_s=H) for i in range(2))
    result = run_scenario(cfg, workload=Workload(jobs=jobs))
    starts = [d for d in result.log.decisions if d.action == "start"]
    assert [(d.time_s, d.job_id) for d in starts] == [(0.0, "b0"), (3660.0, "b1")]
    assert all(result.node_names[d.placement.nodes[0]] == "H200-001" for d in starts if d.placement)
    # pool mode lends a's idle node instead
    pooled = run_scenario(
        config([team("a", 8), team("b", 8)], nodes=2, horizon_h=4), workload=Workload(jobs=jobs)
    )
    assert [d.time_s for d in pooled.log.decisions if d.action == "start"] == [0.0, 0.0]


# ---- f. fifo vs backfill ---------------------------------------------------------------------
def queue_trace() -> Workload:
    return Workload(
        jobs=(
            JobSpec("j1-half", gpu_count=4, team="t", submit_s=0.0, duration_s=H),
            JobSpec("j2-head", gpu_count=8, team="t", submit_s=60.0, duration_s=H),
            JobSpec("j3-short", gpu_count=4, team="t", submit_s=120.0, duration_s=1800.0),
        )
    )


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        # j1 ends at 5 + 3600 = 3605, the head starts at the next cycle (3660) and ends at
        # 3660 + 5 + 3600 = 7265; fifo holds j3 behind it until the cycle at 7320
        ("fifo", {"j1-half": 0.0, "j2-head": 3660.0, "j3-short": 7320.0}),
        # backfill: the head's reservation is 3605; j3 (ends ~1920) fits before it and
        # starts at once on the 4 idle GPUs, without moving the head
        ("backfill", {"j1-half": 0.0, "j2-head": 3660.0, "j3-short": 120.0}),
    ],
)
def test_fifo_versus_backfill(policy: str, expected: dict[str, float]) -> None:
    cfg = config([team("t", 8)], horizon_h=4, policy=policy)
    result = run_scenario(cfg, workload=queue_trace())
    starts = {d.job_id: d.time_s for d in result.log.decisions if d.action == "start"}
    assert starts == expected
    ends = {d.job_id: d.time_s for d in result.log.decisions if d.action == "finish"}
    durations = {j.job_id: j.duration_s for j in queue_trace().jobs}
    assert ends == pytest.approx({j: starts[j] + 5.0 + durations[j] for j in starts})
    assert result.summary["jobs_finished"] == 3


def test_backfill_does_not_start_a_job_that_would_delay_the_head() -> None:
    # like above, but the short job would run past the head's reservation (3605)
    jobs = (
        *queue_trace().jobs[:2],
        JobSpec("j3-long", gpu_count=4, team="t", submit_s=120.0, duration_s=2 * H),
    )
    cfg = config([team("t", 8)], horizon_h=6, policy="backfill")
    result = run_scenario(cfg, workload=Workload(jobs=jobs))
    starts = {d.job_id: d.time_s for d in result.log.decisions if d.action == "start"}
    assert starts == {"j1-half": 0.0, "j2-head": 3660.0, "j3-long": 7320.0}


# ---- g. golden decision log --------------------------------------------------------------------
def small_scenario() -> tuple[ScenarioConfig, Workload]:
    cfg = config(
        [team("web", 8, 12), team("ml", 8, 16)], nodes=2, horizon_h=24, seed=11, share_cap=2
    )
    day = LoadCurve(
        (0.0, 6 * H, 10 * H, 14 * H, 20 * H, 24 * H),
        (15.0, 10.0, 70.0, 80.0, 40.0, 15.0),
        period_s=24 * H,
    )
    services = (
        ServiceSpec("chat", "web", day, replica_rps=20.0),
        ServiceSpec(
            "embed",
            "web",
            day,
            replica_rps=80.0,
            base_p99_ms=60.0,
            replica_gpu_milli=500,
            max_replicas=4,
        ),
    )
    rng = np.random.default_rng(2024)
    jobs = []
    for i in range(20):
        size = int(rng.choice([1, 1, 2, 4, 8]))
        kind = KINDS[int(rng.integers(0, 3))]
        jobs.append(
            JobSpec(
                f"job{i:02d}",
                gpu_count=size,
                gpu_milli=500 if size == 1 and kind is JobKind.OFFLINE else 1000,
                team="ml" if i % 4 else "web",
                priority=int(rng.integers(0, 2)),
                kind=kind,
                submit_s=float(rng.integers(0, 20 * 3600)),
                duration_s=float(rng.integers(1800, 8 * 3600)),
                checkpoint_interval_s=1800.0,
                state_gib_per_gpu=float(rng.choice([0.0, 8.0, 40.0])),
            )
        )
    return cfg, Workload(jobs=tuple(jobs), services=services)


def golden_log() -> tuple[str, dict[str, Any]]:
    cfg, wl = small_scenario()
    result = run_scenario(cfg, workload=wl)
    return result.log.render(result.node_names), result.summary


def test_golden_scenario_log() -> None:
    log, summary = golden_log()
    again, _ = golden_log()
    assert log == again, "the same scenario and seed gave different decision logs"
    assert summary["jobs_lost"] == 0
    # it covers the interesting decisions
    actions = {line.split()[2] for line in log.splitlines()}
    assert {"start", "finish", "preempt", "suspend", "resume"} <= actions
    assert any(" chat-r" in line for line in log.splitlines())
    path = GOLDEN / "scenario_small.log"
    if os.environ.get("GPUPOOL_REGOLD"):
        path.write_text(log, encoding="utf-8")
    assert path.exists(), f"{path} missing; create it with GPUPOOL_REGOLD=1"
    assert log == path.read_text(encoding="utf-8"), f"decision log differs from {path}"

"""Fair share inside a team (scheduler/user_shares.py): a team's queue is ordered by its
users' decayed GPU use, in the simulator's core as live."""

from __future__ import annotations

import math

import pytest

from gpupool.domain.model import JobSpec
from gpupool.errors import SpecError
from gpupool.scheduler.config import FairShareConfig
from gpupool.scheduler.jobs import JobRecord
from gpupool.scheduler.user_shares import QUANTUM_S, UserShares, fair_order, priority_boosts
from gpupool.sim.scenario.config import parse_scenario
from gpupool.sim.scenario.runner import run_scenario
from gpupool.sim.scenario.workload import Workload

H = 3600.0


def _starts(
    jobs: tuple[JobSpec, ...], policy: str, fair_share: dict[str, object]
) -> dict[str, float]:
    cfg = parse_scenario(
        {
            "name": "users",
            "horizon_h": 30,
            "cycle_s": 60,
            "policy": policy,
            "fair_share": fair_share,
            "cluster": [{"gpu_type": "H200", "nodes": 1, "gpus_per_node": 2}],
            "teams": [{"name": "t", "guaranteed": {"H200": 2}, "max": {"H200": 2}}],
            "workload": [],
        }
    )
    rows = run_scenario(cfg, workload=Workload(jobs=jobs)).jobs
    return {r["job_id"]: math.inf if r["start_s"] is None else r["start_s"] for r in rows}


def _twenty_and_one() -> tuple[JobSpec, ...]:
    alice = tuple(
        JobSpec(f"alice{k:02d}", team="t", user="alice", submit_s=k, duration_s=H)
        for k in range(20)
    )
    return (*alice, JobSpec("bob", team="t", user="bob", submit_s=60.0, duration_s=H))


def test_one_users_twenty_jobs_do_not_all_go_ahead_of_anothers_one() -> None:
    """Two GPUs, one team: alice submits 20 one-hour jobs, then bob one. Bob's job takes
    the first GPU that frees (at about 1 h), before alice's third job; without fair share
    it waits behind all 20 (10 h)."""
    fair = _starts(_twenty_and_one(), "priority-quota", {})
    alice = sorted(t for j, t in fair.items() if j.startswith("alice"))
    assert fair["bob"] < alice[2], (fair["bob"], alice[:4])
    assert fair["bob"] < 1.1 * H
    plain = _starts(_twenty_and_one(), "priority-quota", {"users": False})
    assert plain["bob"] >= 9.9 * H, plain["bob"] / H


def test_past_use_puts_a_user_behind_until_it_has_decayed() -> None:
    """Alice ran two 5-h jobs; at 10 h both users queue two jobs each: bob's both start
    first (alice's 36,000 GPU-s outweigh bob's queued hours). With a half-life of 1 h her
    use has decayed to 1/1024 of it by then, so they alternate, alice's older job first."""
    early = (
        JobSpec("alice-early-a", team="t", user="alice", submit_s=0.0, duration_s=5 * H),
        JobSpec("alice-early-b", team="t", user="alice", submit_s=0.0, duration_s=5 * H),
    )
    later = (
        JobSpec("alice-a", team="t", user="alice", submit_s=10 * H + 1, duration_s=H),
        JobSpec("alice-b", team="t", user="alice", submit_s=10 * H + 2, duration_s=H),
        JobSpec("bob-a", team="t", user="bob", submit_s=10 * H + 3, duration_s=H),
        JobSpec("bob-b", team="t", user="bob", submit_s=10 * H + 4, duration_s=H),
        # a blocker that holds both GPUs until all four are queued
        JobSpec("block", team="t", user="carol", gpu_count=2, submit_s=10 * H, duration_s=60),
    )
    week = _starts(early + later, "priority-quota", {})
    assert max(week["bob-a"], week["bob-b"]) < min(week["alice-a"], week["alice-b"]), week
    hour = _starts(early + later, "priority-quota", {"half_life_h": 1})
    assert hour["alice-a"] <= hour["bob-a"] < hour["alice-b"], hour


def test_fifo_keeps_its_submit_order() -> None:
    """fifo and backfill order by submit time, users or not."""
    fifo = _starts(_twenty_and_one(), "fifo", {})
    assert fifo["bob"] >= 9.9 * H


def _record(job_id: str, user: str, submit_s: float, gpus: int = 1) -> JobRecord:
    spec = JobSpec(job_id, gpu_count=gpus, team="t", user=user, submit_s=submit_s)
    return JobRecord(spec, "H200", ready_s=submit_s)


def test_use_halves_every_half_life_and_running_jobs_count_so_far() -> None:
    shares = UserShares(FairShareConfig(half_life_h=2.0))
    ran = _record("a", "alice", 0.0, gpus=2)
    ran.run_started_s = 0.0
    shares.stopped(ran, H)  # 2 GPUs for an hour
    assert shares.decayed(("t", "alice"), H) == pytest.approx(2 * H)
    assert shares.decayed(("t", "alice"), 3 * H) == pytest.approx(H)
    running = _record("b", "bob", 0.0)
    running.run_started_s = 2 * H
    used = shares.usage(3 * H, [running])
    assert used == {("t", "alice"): pytest.approx(H), ("t", "bob"): pytest.approx(H)}


def test_the_fair_order_alternates_equal_users_and_charges_each_queued_job() -> None:
    jobs = [_record(f"a{k}", "alice", k) for k in range(4)] + [_record("b0", "bob", 10.0)]
    order = [r.job_id for r in fair_order(jobs, {})]
    assert order == ["a0", "b0", "a1", "a2", "a3"]
    # bob has used 2.5 queued hours more than alice: alice's first three go first
    order = [r.job_id for r in fair_order(jobs, {("t", "bob"): 2.5 * QUANTUM_S})]
    assert order == ["a0", "a1", "a2", "b0", "a3"]


def test_one_user_per_team_changes_nothing() -> None:
    shares = UserShares(FairShareConfig())
    for k in range(3):
        shares.note(JobSpec(f"j{k}", team=f"team{k % 2}", user=""))
    assert not shares.active
    shares.note(JobSpec("j9", team="team0", user="zoe"))
    assert shares.active
    off = UserShares(FairShareConfig(users=False))
    off.note(JobSpec("x", team="t", user="a"))
    off.note(JobSpec("y", team="t", user="b"))
    assert not off.active


def test_a_bad_fair_share_section_is_refused_with_the_key() -> None:
    with pytest.raises(SpecError, match=r"fair_share\.half_life_h"):
        _starts((), "priority-quota", {"half_life_h": -1})
    with pytest.raises(SpecError, match="fair_share"):
        _starts((), "priority-quota", {"user": True})


def _priorities(jobs: tuple[JobSpec, ...], aging_h: float | None) -> dict[str, float]:
    cfg = parse_scenario(
        {
            "name": "aging",
            "horizon_h": 30,
            "cycle_s": 60,
            "priority_aging_h": aging_h,
            "cluster": [{"gpu_type": "H200", "nodes": 1, "gpus_per_node": 1}],
            "teams": [{"name": "t", "guaranteed": {"H200": 1}}],
            "workload": [],
        }
    )
    rows = run_scenario(cfg, workload=Workload(jobs=jobs)).jobs
    return {r["job_id"]: math.inf if r["start_s"] is None else r["start_s"] for r in rows}


def test_a_low_priority_job_rises_with_its_wait() -> None:
    """One GPU: a priority-0 job waits from 0 behind a stream of 1-h priority-5 jobs
    submitted every hour. Without aging it waits for the whole stream (20 h); with a
    point per hour it outranks the stream's new jobs once it has waited 5 h, and runs
    next (the running job is not preempted: aging orders the queue only)."""
    stream = tuple(
        JobSpec(f"hi{k:02d}", team="t", priority=5, submit_s=k * H, duration_s=H - 60)
        for k in range(20)
    )
    low = JobSpec("low", team="t", priority=0, submit_s=30.0, duration_s=600.0)
    plain = _priorities((*stream, low), None)
    assert plain["low"] >= 19 * H, plain["low"] / H
    aged = _priorities((*stream, low), 1.0)
    assert 5 * H <= aged["low"] <= 7 * H, aged["low"] / H
    assert aged["hi00"] == 0.0  # and nothing was preempted for it


def test_priority_boosts_count_whole_periods_and_say_when_the_next_comes() -> None:
    waiting = [_record("a", "", 0.0), _record("b", "", 1800.0)]
    boosts, next_s = priority_boosts(2 * H + 60, waiting, H)
    assert boosts == {"a": 2, "b": 1} and next_s == 2.5 * H

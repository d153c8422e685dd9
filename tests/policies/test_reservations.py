"""Reservations with backfill in every cycle policy (policies/cycle/reservations.py), in the
simulator: a wide job behind a stream of narrow ones starts when the running jobs' ends
leave it room, not after the stream; a job its team's guarantee cannot hold yet keeps the
room its team's jobs free as they end. Expected times are worked out from the jobs' sizes
(with the 5-s process start the simulator charges), not read back from it."""

from __future__ import annotations

import math

import pytest

from gpupool.domain.model import JobSpec
from gpupool.policies.cycle.reservations import earliest_gpus
from gpupool.sim.scenario.config import parse_scenario
from gpupool.sim.scenario.runner import run_scenario
from gpupool.sim.scenario.workload import Workload

H = 3600.0
POLICIES = ("fifo", "backfill", "priority-quota", "las", "gittins")


def _run(
    policy: str,
    jobs: tuple[JobSpec, ...],
    guaranteed: int,
    maximum: int,
    reservations: bool = True,
) -> dict[str, float]:
    cfg = parse_scenario(
        {
            "name": "reservations",
            "horizon_h": 40,
            "cycle_s": 60,
            "policy": policy,
            "reservations": reservations,
            "cluster": [{"gpu_type": "H200", "nodes": 2, "gpus_per_node": 8}],
            "teams": [{"name": "t", "guaranteed": {"H200": guaranteed}, "max": {"H200": maximum}}],
            "workload": [],
        }
    )
    rows = run_scenario(cfg, workload=Workload(jobs=jobs)).jobs
    return {r["job_id"]: math.inf if r["start_s"] is None else r["start_s"] for r in rows}


def _stream(start_h: float, every_h: float, count: int, work_h: float) -> tuple[JobSpec, ...]:
    return tuple(
        JobSpec(f"narrow{k}", gpu_count=1, team="t", submit_s=(start_h + k * every_h) * H,
                duration_s=work_h * H)
        for k in range(count)
    )  # fmt: skip


@pytest.mark.parametrize("policy", POLICIES)
def test_a_wide_job_starts_when_its_reservation_comes_not_after_the_stream(policy: str) -> None:
    """Two 8-GPU nodes. Two 6-GPU jobs run from 0 (one 10 h, one 12 h of work). A 16-GPU
    job arrives at 1 h; from 1.5 h a 1-GPU job of 3 h arrives every 30 min until 30 h.
    Without a reservation the narrow jobs keep some GPU of each node busy until the
    stream ends (past 30 h); with it, the wide job starts when the second 6-GPU job
    ends (12 h and its start), and narrow jobs ending before then still backfill."""
    started = _run(policy, _wide_behind_a_stream(), guaranteed=16, maximum=16)
    assert started["wide"] <= 12 * H + 15 * 60, started["wide"] / H
    if policy == "fifo":
        return  # strict order: nothing passes the wide job
    # the narrow jobs that end before 12 h ran beside the six-GPU jobs meanwhile
    backfilled = [j for j, t in started.items() if j.startswith("narrow") and t < 8 * H]
    assert len(backfilled) >= 4, sorted(started.items(), key=lambda kv: kv[1])[:12]


def _wide_behind_a_stream() -> tuple[JobSpec, ...]:
    return (
        JobSpec("six-a", gpu_count=6, team="t", submit_s=0.0, duration_s=10 * H),
        JobSpec("six-b", gpu_count=6, team="t", submit_s=0.0, duration_s=12 * H),
        JobSpec("wide", gpu_count=16, team="t", submit_s=1 * H, duration_s=2 * H),
        *_stream(1.5, 0.5, 58, 3.0),
    )


@pytest.mark.parametrize("policy", ("priority-quota", "las"))
def test_without_reservations_the_wide_job_waits_for_the_stream(policy: str) -> None:
    """The same jobs with `reservations: false`: priority-quota's narrow jobs fit the
    team's guarantee, so they are entitled and keep taking the GPUs the six-GPU jobs free
    (its one EASY reservation guards only borrowing). (backfill's EASY reservation, counted
    in GPUs, holds here: the wide job needs every GPU of the pool.)"""
    started = _run(policy, _wide_behind_a_stream(), 16, 16, reservations=False)
    assert started["wide"] > 20 * H, started["wide"] / H


@pytest.mark.parametrize("policy", ("backfill", "priority-quota", "las", "gittins"))
def test_a_job_its_teams_limit_holds_is_not_overtaken_by_the_teams_narrow_jobs(
    policy: str,
) -> None:
    """The team may hold 4 GPUs of 16. A 1-GPU job of 6 h runs from 0, with three more of
    10 h; a 4-GPU job arrives at 1 h, then a 1-GPU job of 5 h every 30 min. The 4-GPU job
    starts when the team's four jobs have ended (10 h): the stream may take a GPU the team
    frees only where it ends by then, and none of its 5-h jobs does. Without the hold the
    stream refills each GPU the team frees, and the 4-GPU job waits for the stream's end."""
    jobs = (
        JobSpec("first", gpu_count=1, team="t", submit_s=0.0, duration_s=6 * H),
        *(
            JobSpec(f"long{k}", gpu_count=1, team="t", submit_s=0.0, duration_s=10 * H)
            for k in range(3)
        ),
        JobSpec("four", gpu_count=4, team="t", submit_s=1 * H, duration_s=2 * H),
        *_stream(1.5, 0.5, 40, 5.0),
    )
    started = _run(policy, jobs, guaranteed=4, maximum=4)
    assert started["four"] <= 10 * H + 15 * 60, started["four"] / H
    assert started["four"] < min(t for j, t in started.items() if j.startswith("narrow3"))


def _starts(
    nodes: int, teams: list[dict[str, object]], jobs: tuple[JobSpec, ...]
) -> dict[str, float | None]:
    """Start times under priority-quota with reservations, on `nodes` 8-GPU nodes."""
    cfg = parse_scenario(
        {
            "name": "teams",
            "horizon_h": 80,
            "cycle_s": 60,
            "policy": "priority-quota",
            "reservations": True,
            "cluster": [{"gpu_type": "H200", "nodes": nodes, "gpus_per_node": 8}],
            "teams": teams,
            "workload": [],
        }
    )
    rows = run_scenario(cfg, workload=Workload(jobs=jobs)).jobs
    return {r["job_id"]: r["start_s"] for r in rows}


def test_a_job_waiting_past_a_day_borrows_before_the_fair_share_order() -> None:
    """Three 8-GPU nodes, two teams guaranteed nothing. Team x runs a 16-GPU job for 60 h
    and asks for a third node's 8 GPUs at 2 h; team y, which has used less, sends a 1-GPU
    job of 3 h every 30 min from 1 h. The fair-share order puts y's jobs first each cycle,
    so they take each GPU the third node frees and x's job would wait for the stream's end
    (53.5 h). Once it has waited a day (26 h) it borrows first, its reservation drains the
    node, and it starts when y's running jobs have ended (within 3 h)."""
    jobs = (
        JobSpec("long", gpu_count=16, team="x", submit_s=0.0, duration_s=60 * H),
        JobSpec("node", gpu_count=8, team="x", submit_s=2 * H, duration_s=2 * H),
        *(
            JobSpec(f"y{k}", gpu_count=1, team="y", submit_s=(1 + 0.5 * k) * H, duration_s=3 * H)
            for k in range(100)
        ),
    )
    start = _starts(3, [{"name": "x"}, {"name": "y"}], jobs)
    assert start["node"] is not None
    assert 26 * H <= start["node"] <= 29 * H + 15 * 60, start["node"] / H


def test_an_older_job_wider_than_the_guarantee_is_not_behind_the_teams_held_job() -> None:
    """Team t is guaranteed 4 of 16 GPUs; team o runs 8 GPUs for 30 h. t asks for 12 GPUs
    at 30 min (it can only borrow) and sends a 1-GPU job of 5 h every hour: one of them
    always waits for t's guaranteed room, and holds it. The 12-GPU job came first, and
    that room can never hold it, so it is not behind the held job: it starts when o's job
    ends (30 h), not after the stream (50 h)."""
    jobs = (
        JobSpec("other", gpu_count=8, team="o", submit_s=0.0, duration_s=30 * H),
        JobSpec("wide", gpu_count=12, team="t", submit_s=0.5 * H, duration_s=10 * H),
        *(
            JobSpec(f"n{k}", gpu_count=1, team="t", submit_s=k * H, duration_s=5 * H)
            for k in range(50)
        ),
    )
    teams = [{"name": "t", "guaranteed": {"H200": 4}}, {"name": "o", "guaranteed": {"H200": 12}}]
    start = _starts(2, teams, jobs)
    assert start["wide"] is not None
    assert 30 * H <= start["wide"] <= 30 * H + 15 * 60, start["wide"] / H


def test_the_earliest_gpus_on_one_node_or_whole_nodes() -> None:
    now = 100.0
    times = {0: [now, 500.0, 300.0, now], 1: [200.0, 200.0, 200.0, 200.0], 2: [math.inf] * 4}
    # two GPUs: node 0 has two idle now
    assert earliest_gpus(times, [0, 1, 2], 2) == (now, ((0, 0), (0, 3)))
    # four: node 1 is whole at 200, node 0 only at 500
    assert earliest_gpus(times, [0, 1, 2], 4) == (200.0, tuple((1, g) for g in range(4)))
    # eight: whole nodes 1 and 0, when the later of them is free
    assert earliest_gpus(times, [0, 1, 2], 8) == (500.0, (*((0, g) for g in range(4)),
                                                      *((1, g) for g in range(4))))  # fmt: skip
    # a GPU that is never free: no reservation
    assert earliest_gpus(times, [2], 2) is None


@pytest.mark.parametrize("policy", ("fifo", "backfill", "priority-quota"))
def test_a_team_at_a_maximum_as_big_as_the_pool_is_not_started_past_it(policy: str) -> None:
    """Regression: a maximum equal to the pool was left to capacity with reservations on,
    but jobs sharing a GPU count a whole GPU each against it, so a whole-GPU job found a
    free GPU and its start was refused by the core (PlanRejected). It waits instead, with
    GPUs reserved, and starts once the shares end."""
    cfg = parse_scenario(
        {
            "name": "shares-at-max",
            "horizon_h": 6,
            "cycle_s": 60,
            "policy": policy,
            "reservations": True,
            "cluster": [{"gpu_type": "H200", "nodes": 1, "gpus_per_node": 2}],
            "teams": [{"name": "t", "max": {"H200": 2}}],
            "workload": [],
        }
    )
    shares = tuple(
        JobSpec(f"share{k}", team="t", gpu_milli=500, submit_s=0.0, duration_s=H) for k in range(2)
    )
    whole = JobSpec("whole", team="t", submit_s=60.0, duration_s=600.0)
    rows = run_scenario(cfg, workload=Workload(jobs=(*shares, whole))).jobs
    start = {r["job_id"]: r["start_s"] for r in rows}
    assert start["share0"] == start["share1"] == 0.0
    assert start["whole"] is not None and start["whole"] >= H, start

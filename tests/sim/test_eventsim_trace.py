"""The trace driver of the event simulator: jobs with run times in, placements out.

A hand-computed case on two 2-GPU nodes: a guaranteed online job reclaims a borrowed
training job, which resumes later and needs only the work it had left.
"""

from __future__ import annotations

import pytest

from gpupool.domain.model import JobKind, JobSpec
from gpupool.domain.quota import TeamQuota
from gpupool.errors import SpecError
from gpupool.policies.preemption import PreemptionRules
from gpupool.scheduler import Finished, Submitted
from gpupool.server.loop.config import build_fleet
from gpupool.sim.eventsim import run_events, run_trace

TEAMS = (
    TeamQuota("serving", {"A100-80GB": 2}, {}),  # research is guaranteed nothing: it borrows
    TeamQuota("research", {}, {}),
)
RULES = PreemptionRules(min_runtime_s=0.0, max_per_job=3)


def _job(job_id: str, kind: JobKind, gpus: int, submit: float, run: float) -> JobSpec:
    online = kind is JobKind.ONLINE
    return JobSpec(
        job_id,
        gpu_count=gpus,
        team="serving" if online else "research",
        kind=kind,
        priority=100 if online else 0,
        submit_s=submit,
        duration_s=run,
    )


JOBS = [
    _job("1", JobKind.TRAINING, 2, 0.0, 200.0),
    _job("2", JobKind.TRAINING, 2, 10.0, 50.0),
    _job("3", JobKind.ONLINE, 1, 20.0, 30.0),
    _job("4", JobKind.TRAINING, 2, 60.0, 10.0),
]


def test_trace_places_preempts_and_resumes_with_the_work_left() -> None:
    cluster, _ = build_fleet([("n1", "A100-80GB", 2), ("n2", "A100-80GB", 2)], "c")
    got = run_trace(cluster, JOBS, TEAMS, "priority-quota", RULES)
    assert got == [
        (0.0, "start", "1", (("n1", 0), ("n1", 1))),
        (10.0, "start", "2", (("n2", 0), ("n2", 1))),
        # 3 is within serving's guarantee and nothing is free: 2 (the cheaper victim, it
        # has run 10 s against 1's 20 s) checkpoints and leaves at once, 3 takes its node
        (20.0, "preempt", "2", ()),
        (20.0, "start", "3", (("n2", 0),)),
        # 3 ends at 50; 2 resumes with 40 s of its 50 s left, so it ends at 90, not 100
        (50.0, "resume", "2", (("n2", 0), ("n2", 1))),
        # 4 (submitted at 60) waits for 2's GPUs; 1 runs until 200
        (90.0, "start", "4", (("n2", 0), ("n2", 1))),
    ]


def test_trace_agrees_with_the_event_driver() -> None:
    """The same run told as events (with the completions the trace driver implies) gives
    the same decisions to run_events, the driver tests/parity/test_parity.py holds to the live
    service."""
    cluster, _ = build_fleet([("n1", "A100-80GB", 2), ("n2", "A100-80GB", 2)], "c")
    traced = run_trace(cluster, JOBS, TEAMS, "priority-quota", RULES)
    events: list[Submitted | Finished] = [Submitted(j.submit_s, j) for j in JOBS]
    events += [Finished(t, job_id) for t, job_id in ((50.0, "3"), (90.0, "2"), (100.0, "4"))]
    events.append(Finished(200.0, "1"))
    assert run_events(cluster, events, TEAMS, "priority-quota", RULES) == [
        (t, action, job_id) for t, action, job_id, _ in traced
    ]


def test_trace_jobs_run_on_their_own_when_nothing_competes() -> None:
    cluster, _ = build_fleet([("n1", "A100-80GB", 2), ("n2", "A100-80GB", 2)], "c")
    jobs = [_job("a", JobKind.TRAINING, 1, 5.0, 10.0), _job("b", JobKind.TRAINING, 4, 5.0, 1.0)]
    # b needs both nodes' 4 GPUs: it waits until a ends at 15
    assert run_trace(cluster, jobs, TEAMS, "priority-quota", RULES) == [
        (5.0, "start", "a", (("n1", 0),)),
        (15.0, "start", "b", (("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1))),
    ]


def test_trace_needs_run_times() -> None:
    cluster, _ = build_fleet([("n1", "A100-80GB", 2)], "c")
    with pytest.raises(SpecError, match="duration_s"):
        run_trace(cluster, [JobSpec("x", submit_s=0.0)], TEAMS)

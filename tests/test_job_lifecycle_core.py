"""The decision core's lifecycle controls: team limits on running and CPU-only jobs, the
wall-time limit of a run, hold/release, requeue and node drains. Events with times in,
commands out; no clock, no process."""

from __future__ import annotations

import pytest

from gpupool.core.lifecycle import JobState
from gpupool.core.model import Cluster, JobKind, JobSpec, Node
from gpupool.errors import ConflictError
from gpupool.policies.cycle import PreemptionRules
from gpupool.scheduler import (
    Drain,
    Expire,
    Finished,
    Hold,
    Launch,
    Release,
    Requeue,
    Scheduler,
    SchedulerConfig,
    Stop,
    Submitted,
    Vacated,
    Wait,
)
from gpupool.scheduler.config import TeamLimits


def _core(
    limits: dict[str, TeamLimits] | None = None,
    time_limits: dict[str, float] | None = None,
    nodes: int = 1,
    gpus: int = 8,
) -> Scheduler:
    fleet = tuple(Node(f"n{k}", "A100", gpus, 1_000_000, 1 << 30) for k in range(nodes))
    config = SchedulerConfig(
        policy="fifo",
        cycle_s=1.0,
        online_reserve=0.0,
        preemption=PreemptionRules(0.0, 3),
        team_limits=limits or {},
        time_limit_s=time_limits or {},
    )
    return Scheduler(Cluster("c", fleet), config)


def _job(job_id: str, team: str = "a", gpus: int = 1, **kw: object) -> JobSpec:
    return JobSpec(job_id, gpu_count=gpus, team=team, **kw)  # type: ignore[arg-type]


def _launched(commands: list[object]) -> list[str]:
    return [c.job_id for c in commands if isinstance(c, Launch)]


def test_a_team_at_its_running_limit_starts_no_more() -> None:
    core = _core({"a": TeamLimits(max_running_jobs=2)})
    for k in range(5):
        core.observe(Submitted(0.0, _job(f"a{k}")))
    core.observe(Submitted(0.0, _job("b0", team="b")))
    out = core.cycle(0.0)
    assert sorted(_launched(out)) == ["a0", "a1", "b0"]
    waits = {c.job_id: c.reason for c in out if isinstance(c, Wait)}
    assert waits["a2"] == "team a at its limit of 2 running jobs"
    assert set(waits) == {"a2", "a3", "a4"}
    # plenty of GPUs, cycle after cycle: still two of team a
    for t in range(1, 6):
        assert _launched(core.cycle(float(t))) == []
    assert sum(r.spec.team == "a" for r in core.running.values()) == 2
    # one ends: exactly one more starts, and the next waits with the reason still
    core.observe(Finished(6.0, "a0"))
    out = core.cycle(6.0)
    assert _launched(out) == ["a2"]
    assert not any(isinstance(c, Wait) and c.job_id == "a3" for c in out)  # told already


def test_cpu_only_jobs_have_their_own_limit() -> None:
    core = _core({"a": TeamLimits(max_cpu_jobs=1)})
    core.observe(Submitted(0.0, _job("c0", gpus=0)))
    core.observe(Submitted(0.0, _job("c1", gpus=0)))
    core.observe(Submitted(0.0, _job("g0", gpus=1)))
    core.observe(Submitted(0.0, _job("g1", gpus=1)))
    out = core.cycle(0.0)
    assert sorted(_launched(out)) == ["c0", "g0", "g1"]
    assert [c.reason for c in out if isinstance(c, Wait)] == [
        "team a at its limit of 1 running CPU-only jobs"
    ]
    core.observe(Finished(1.0, "c0"))
    assert _launched(core.cycle(1.0)) == ["c1"]


def test_a_run_past_its_time_limit_is_stopped_and_fails_with_the_reason() -> None:
    core = _core(time_limits={"batch": 3600.0})
    core.observe(Submitted(0.0, _job("t", time_limit_s=4 * 3600.0)))
    core.observe(Submitted(0.0, _job("d", kind=JobKind.BATCH)))
    core.observe(Submitted(0.0, _job("free")))  # training: no default, no limit
    assert sorted(_launched(core.cycle(0.0))) == ["d", "free", "t"]
    assert core.cycle(3599.0) == []
    out = core.cycle(3600.0)
    assert out == [Expire("d", "ran past its 1h time limit")]
    assert core.records["d"].state is JobState.PREEMPTING
    assert core.cycle(3601.0) == []  # asked once
    core.observe(Finished(3630.0, "d", JobState.FAILED, "ran past its 1h time limit"))
    assert core.records["d"].state is JobState.FAILED
    assert core.cycle(4 * 3600.0) == [Expire("t", "ran past its 4h time limit")]
    assert core.records["free"].state is JobState.RUNNING


def test_the_time_limit_counts_each_run_from_its_start() -> None:
    core = _core()
    core.observe(Submitted(0.0, _job("t", time_limit_s=100.0)))
    core.cycle(0.0)
    assert core.requeue("t", 60.0) == [Stop("t", "requeued on request")]
    core.observe(Vacated(61.0, "t"))
    assert _launched(core.cycle(61.0)) == ["t"]
    assert core.cycle(160.0) == []  # 99 s into its second run
    assert core.cycle(161.0) == [Expire("t", "ran past its 1m40s time limit")]


def test_hold_release_and_requeue_round_trip() -> None:
    core = _core(gpus=1)
    core.observe(Submitted(0.0, _job("x")))
    core.observe(Hold(0.0, "x"))
    assert _launched(core.cycle(0.0)) == []
    assert _launched(core.cycle(5.0)) == []
    core.observe(Release(6.0, "x"))
    assert _launched(core.cycle(6.0)) == ["x"]
    with pytest.raises(ConflictError, match="job x is running; requeue it"):
        core.hold("x", 7.0)
    assert core.observe(Requeue(7.0, "x")) == [Stop("x", "requeued on request")]
    core.observe(Hold(7.0, "x"))  # held once it has left
    core.observe(Vacated(8.0, "x"))
    assert core.records["x"].state is JobState.SUSPENDED
    assert _launched(core.cycle(8.0)) == []
    core.observe(Release(9.0, "x"))
    out = core.cycle(9.0)
    assert next(c for c in out if isinstance(c, Launch)).resume
    with pytest.raises(ConflictError, match="not on hold"):
        core.release("x", 10.0)
    core.observe(Submitted(10.0, _job("y")))
    with pytest.raises(ConflictError, match="job y is waiting in the queue already"):
        core.requeue("y", 10.0)


def test_a_held_job_keeps_its_place_in_the_queue() -> None:
    core = _core(gpus=1)
    core.observe(Submitted(0.0, _job("first")))
    core.observe(Submitted(1.0, _job("second")))
    core.observe(Submitted(2.0, _job("third")))
    core.observe(Hold(2.0, "first"))
    assert _launched(core.cycle(2.0)) == ["second"]
    core.observe(Release(3.0, "first"))
    core.observe(Finished(4.0, "second"))
    assert _launched(core.cycle(4.0)) == ["first"]


def test_a_drained_node_takes_nothing_new_and_its_jobs_run_on() -> None:
    core = _core(nodes=2, gpus=2)
    core.observe(Submitted(0.0, _job("on0", gpus=2)))
    core.cycle(0.0)
    node = core.state.placements["on0"].nodes[0]
    name = core.cluster.nodes[node].name
    core.observe(Drain(1.0, name))
    assert core.draining(name) == "draining"
    for k in range(3):
        core.observe(Submitted(1.0, _job(f"n{k}", gpus=2)))
    out = core.cycle(1.0)
    assert len(_launched(out)) == 1
    other = [r for r in core.running.values() if r.job_id != "on0"]
    assert all(core.state.placements[r.job_id].nodes[0] != node for r in other)
    assert core.records["on0"].state is JobState.RUNNING  # unaffected
    core.observe(Finished(2.0, "on0"))
    assert core.draining(name) == "drained"
    assert _launched(core.cycle(2.0)) == []  # the free node takes nothing
    core.observe(Drain(3.0, name, undo=True))
    assert core.draining(name) is None
    assert len(_launched(core.cycle(3.0))) == 1

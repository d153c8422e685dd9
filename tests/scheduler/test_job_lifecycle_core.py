"""The decision core's lifecycle controls: team limits on running and CPU-only jobs, the
wall-time limit of a run, hold/release, requeue and node drains. Events with times in,
commands out; no clock, no process."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.domain.lifecycle import JobState
from gpupool.domain.model import Cluster, JobKind, JobSpec, Node
from gpupool.errors import ConflictError, SpecError
from gpupool.policies.preemption import PreemptionRules
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
from gpupool.scheduler.config_schema import parse_scheduling
from gpupool.sim.eventsim import replay, run_trace
from gpupool.sim.scenario.config import load_scenario
from gpupool.sim.scenario.generators import GenContext, build_workload
from gpupool.sim.scenario.world import ScenarioSim

LIMITED = """
name: limited
seed: 3
horizon_h: 48
cycle_s: 60
policy: priority-quota
cluster:
  - {gpu_type: A100-80GB, nodes: 4, gpus_per_node: 8}
online_reserve: 0
teams:
  - {name: training, max_running_jobs: 5}
  - {name: other}
default_time_limit_h: {training: 12}
workload:
  - {generator: backlog, name: train, team: training, count: 40, submit_h: 0, spread_h: 24,
     gpu_choices: [1, 2, 4], gpu_weights: [0.4, 0.4, 0.2], work_h_min: 2, work_h_max: 20,
     state_gib_per_gpu: 8}
  - {generator: backlog, name: more, team: other, count: 20, submit_h: 0, spread_h: 24,
     gpu_choices: [1, 2], gpu_weights: [0.5, 0.5], work_h_min: 2, work_h_max: 20}
"""


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


def test_the_scheduling_section_reads_team_limits_and_kind_time_limits() -> None:
    raw = {
        "teams": [
            {"name": "a", "max_running_jobs": 4, "max_cpu_jobs": 2, "submit_per_min": 30},
            {"name": "b", "guaranteed": {"A100": 2}},
        ],
        "default_time_limit_h": {"batch": 4, "training": 72},
    }
    cfg = parse_scheduling(raw, "teams.yaml")
    assert cfg.team_limits == {"a": TeamLimits(4, 2, 30.0)}
    assert cfg.time_limit_s == {"batch": 4 * 3600.0, "training": 72 * 3600.0}
    assert [t.team for t in cfg.teams] == ["a", "b"]
    with pytest.raises(SpecError, match=r"teams\.yaml: teams\[0\]: unknown key\(s\) max_jobs"):
        parse_scheduling({"teams": [{"name": "a", "max_jobs": 1}]}, "teams.yaml")
    with pytest.raises(SpecError, match=r"teams\[0\]\.max_running_jobs: 0 must be >= 1"):
        parse_scheduling({"teams": [{"name": "a", "max_running_jobs": 0}]}, "teams.yaml")
    with pytest.raises(SpecError, match=r"teams\[0\]\.submit_per_min: .*must be > 0"):
        parse_scheduling({"teams": [{"name": "a", "submit_per_min": 0}]}, "teams.yaml")
    with pytest.raises(SpecError, match=r"default_time_limit_h: unknown key\(s\) gpu"):
        parse_scheduling({"default_time_limit_h": {"gpu": 1}}, "teams.yaml")


def test_the_simulator_ends_expired_runs_as_the_core_decides(tmp_path: Path) -> None:
    """Time limits and team limits in a scenario: jobs past their limit fail with the
    reason, a team never runs more than its limit, and the recorded events replayed into
    a fresh core give the same decision log and commands (no side channel)."""
    path = tmp_path / "limited.yaml"
    path.write_text(LIMITED, encoding="utf-8")
    cfg = load_scenario(path)
    sim = ScenarioSim(cfg, build_workload(cfg.workload, cfg.seed, GenContext(cfg.horizon_s, None)))
    sim.recorded, sim.commands = [], []
    sim.run()
    expired = [c for _, c in sim.commands if isinstance(c, Expire)]
    assert expired and all(c.reason == "ran past its 12h time limit" for c in expired)
    for c in expired:
        r = sim.core.records[c.job_id]
        assert (r.state, r.end_reason) == (JobState.FAILED, c.reason)
    assert _peak_running(sim, "training") == 5  # at its limit, never past it
    assert _peak_running(sim, "other") > 5
    fresh = sim.new_core()
    assert replay(fresh, sim.recorded) == sim.commands
    names = tuple(n.name for n in sim.cluster.nodes)
    assert fresh.log.render(names) == sim.engine.log.render(names)


def _peak_running(sim: ScenarioSim, team: str) -> int:
    """The most jobs of `team` that held GPUs at once, from the decision log."""
    held: set[str] = set()
    peak = 0
    for d in sim.engine.log.decisions:
        r = sim.core.records.get(d.job_id)
        if r is None or r.spec.team != team:
            continue
        if d.action in ("start", "resume"):
            held.add(d.job_id)
        elif d.action in ("finish", "stop", "suspend") or d.action.startswith("lost"):
            held.discard(d.job_id)
        peak = max(peak, len(held))
    return peak


def test_the_trace_driver_ends_a_run_at_its_time_limit() -> None:
    cluster = Cluster("c", (Node("n0", "A100", 1, 1_000_000, 1 << 30),))
    jobs = [
        JobSpec("long", duration_s=500.0, time_limit_s=100.0),
        JobSpec("next", duration_s=50.0, submit_s=1.0),
    ]
    out = run_trace(cluster, jobs, policy="fifo")
    assert [(t, action, job) for t, action, job, _ in out] == [
        (0.0, "start", "long"),
        (100.0, "expire", "long"),
        (100.0, "start", "next"),
    ]

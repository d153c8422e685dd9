"""Priority classes, preemption rules and the online reserve, through the decision core.

A small world drives `gpupool.scheduler.Scheduler` alone: jobs arrive, run at speed 1,
checkpoint every interval, write their checkpoint when stopped (the calibrated write
time) and end when their work is done. The core decides; the world checks what it
decided against the rules: online inference is never preempted, an online job that
fits in its pool's reserve starts within one cycle plus its victims' checkpoint time,
no job is preempted past its budget, before its minimum runtime (unless online work
needed the GPUs) or with more lost work than the bound, and every job finishes.
"""

from __future__ import annotations

import heapq
import math
import re
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.domain.model import Cluster, JobKind, JobSpec, Node
from gpupool.errors import PlanRejected
from gpupool.policies.preemption import PreemptionRules, outranks
from gpupool.scheduler import Scheduler
from gpupool.scheduler.commands import Launch, Stop
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.events import Finished, Submitted, Vacated

MODEL = "A100-80GB"
CYCLE_S = 60.0
CLAIMANT = re.compile(r"(?:preempted|reclaimed) for (\S+) ")


def cluster(nodes: int = 2, per_node: int = 4) -> Cluster:
    return Cluster(
        "c",
        tuple(Node(f"n{i}", MODEL, per_node, 64_000, 512 * 1024) for i in range(nodes)),
    )


@dataclass
class World:
    """Runs the core's Launch and Stop commands as jobs would, in simulated time."""

    core: Scheduler
    specs: dict[str, JobSpec] = field(default_factory=dict)
    events: list[tuple[float, int, str, str, int]] = field(default_factory=list)
    seq: int = 0
    saved: dict[str, float] = field(default_factory=dict)
    """Work each job has checkpointed."""
    run: dict[str, tuple[float, float, int]] = field(default_factory=dict)
    """Running jobs: (started at, work at start, run number)."""
    runs: dict[str, int] = field(default_factory=dict)
    starts: dict[str, list[float]] = field(default_factory=dict)
    stops: list[tuple[float, str, str, float, float]] = field(default_factory=list)
    """(time, victim, reason, ran s, lost work s) of every preemption."""
    vacate_s: dict[str, float] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    arrivals: dict[str, tuple[float, int]] = field(default_factory=dict)
    """Online jobs: (arrival, online GPUs held or queued ahead of it in its pool then)."""

    def push(self, t: float, what: str, job_id: str, run: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, what, job_id, run))

    def submit(self, job: JobSpec) -> None:
        self.specs[job.job_id] = job
        self.saved[job.job_id] = 0.0
        self.push(job.submit_s, "submit", job.job_id)

    def _overhead(self, job: JobSpec, resumed: bool) -> float:
        ck = self.core.config.checkpoint
        return ck.resume_s(job.state_gib_per_gpu) if resumed else ck.process_start_s

    def _work(self, job_id: str, now: float) -> float:
        started, work0, _ = self.run[job_id]
        job = self.specs[job_id]
        overhead = self._overhead(job, self.runs[job_id] > 1)
        return work0 + max(0.0, now - started - overhead)

    def carry_out(self, now: float, commands: list[object]) -> None:
        for c in commands:
            if isinstance(c, Launch):
                job = self.specs[c.job_id]
                self.runs[c.job_id] = self.runs.get(c.job_id, 0) + 1
                n = self.runs[c.job_id]
                self.run[c.job_id] = (now, self.saved[c.job_id], n)
                self.starts.setdefault(c.job_id, []).append(now)
                left = (job.duration_s or 0.0) - self.saved[c.job_id]
                self.push(now + self._overhead(job, n > 1) + left, "finish", c.job_id, n)
            elif isinstance(c, Stop):
                job = self.specs[c.job_id]
                done = self._work(c.job_id, now)
                interval = job.checkpoint_interval_s
                saved = self.saved[c.job_id]
                saved += ((done - saved) // interval) * interval
                started = self.run.pop(c.job_id)[0]
                self.stops.append((now, c.job_id, c.reason, now - started, done - saved))
                self.saved[c.job_id] = saved
                write = self.core.config.checkpoint.write_s(job.state_gib_per_gpu)
                self.vacate_s[c.job_id] = write
                self.push(now + write, "vacate", c.job_id)

    def online_ahead(self) -> int:
        """Online GPUs running or waiting now (the reserve they use up)."""
        return sum(
            s.gpu_count
            for j, s in self.specs.items()
            if s.kind is JobKind.ONLINE and j in self.arrivals and j not in self.finished
        )

    def go(self, horizon_s: float) -> None:
        next_cycle = 0.0
        while self.events or self.core.waiting() or self.run:
            t_event = self.events[0][0] if self.events else math.inf
            now = min(t_event, next_cycle)
            assert now <= horizon_s, "jobs still waiting or running at the horizon"
            if t_event <= next_cycle:
                t, _, what, job_id, run = heapq.heappop(self.events)
                if what == "submit":
                    job = self.specs[job_id]
                    if job.kind is JobKind.ONLINE:
                        self.arrivals[job_id] = (t, self.online_ahead())
                    self.carry_out(t, self.core.observe(Submitted(t, job)))
                elif what == "finish" and job_id in self.run and self.run[job_id][2] == run:
                    del self.run[job_id]
                    self.finished.add(job_id)
                    self.carry_out(t, self.core.observe(Finished(t, job_id)))
                elif what == "vacate":
                    self.carry_out(t, self.core.observe(Vacated(t, job_id)))
            else:
                self.carry_out(now, self.core.cycle(now))
                next_cycle = now + CYCLE_S


@st.composite
def workloads(draw: st.DrawFn) -> list[JobSpec]:
    jobs: list[JobSpec] = []
    t = 0.0
    for i in range(draw(st.integers(2, 18))):
        t += draw(st.sampled_from((0.0, 30.0, 300.0, 900.0, 1800.0)))
        online = draw(st.integers(0, 3)) == 0
        kind = (
            JobKind.ONLINE
            if online
            else draw(st.sampled_from((JobKind.TRAINING, JobKind.BATCH, JobKind.OFFLINE)))
        )
        jobs.append(
            JobSpec(
                f"j{i}",
                gpu_count=1 if online else draw(st.sampled_from((1, 1, 2, 4))),
                team=draw(st.sampled_from(("a", "b"))),
                kind=kind,
                priority=100 if online else draw(st.sampled_from((0, 0, 50, 100))),
                submit_s=t,
                duration_s=draw(st.sampled_from((600.0, 1800.0, 3600.0, 7200.0))),
                checkpoint_interval_s=draw(st.sampled_from((300.0, 900.0, 3600.0))),
                state_gib_per_gpu=draw(st.sampled_from((0.0, 5.0, 20.0, 80.0))),
            )
        )
    return jobs


@st.composite
def rule_sets(draw: st.DrawFn) -> PreemptionRules:
    return PreemptionRules(
        min_runtime_s=draw(st.sampled_from((0.0, 600.0, 1800.0))),
        max_per_job=draw(st.integers(1, 3)),
        max_lost_work_s=draw(st.sampled_from((None, 600.0, 3600.0))),
        by_priority=draw(st.booleans()),
        reserve_vacate_s=draw(st.sampled_from((None, 30.0, 120.0))),
    )


def simulate(jobs: list[JobSpec], rules: PreemptionRules, reserve: float = 0.25) -> World:
    config = SchedulerConfig(cycle_s=CYCLE_S, online_reserve=reserve, preemption=rules)
    world = World(Scheduler(cluster(), config))
    for job in jobs:
        world.submit(job)
    world.go(horizon_s=30 * 86_400.0)
    return world


@settings(max_examples=60, deadline=None)
@given(workloads(), rule_sets())
def test_priorities_and_the_reserve_hold_over_random_arrivals(
    jobs: list[JobSpec], rules: PreemptionRules
) -> None:
    world = simulate(jobs, rules)
    specs = world.specs
    reserve = world.core.fleet.reserve[MODEL]
    # (d) no job lost: every one finished its work
    assert world.finished == set(specs)
    for _t, victim, reason, ran_s, lost_s in world.stops:
        job = specs[victim]
        # (a) online inference is never preempted
        assert job.kind is not JobKind.ONLINE, (victim, reason)
        claimant = CLAIMANT.search(reason)
        assert claimant is not None, reason
        by = specs[claimant.group(1)]
        assert outranks(by, job), (victim, by.job_id)
        # (c) minimum runtime, unless online work needed the GPUs
        if by.kind is not JobKind.ONLINE:
            assert rules.by_priority
            assert ran_s >= rules.min_runtime_s - 1e-6, (victim, ran_s)
        if rules.max_lost_work_s is not None:
            assert lost_s <= rules.max_lost_work_s + 1e-6, (victim, lost_s)
    # (c) the per-job preemption budget
    for job_id in specs:
        assert sum(1 for s in world.stops if s[1] == job_id) <= rules.max_per_job
    # (b) an online job that fits in the reserve starts within a cycle plus its victims'
    # checkpoint writes
    for job_id, (arrived, ahead) in world.arrivals.items():
        if ahead + specs[job_id].gpu_count > reserve:
            continue
        victims = [s[1] for s in world.stops if CLAIMANT.search(s[2])[1] == job_id]  # type: ignore[index]
        bound = CYCLE_S + max((world.vacate_s[v] for v in victims), default=0.0)
        waited = world.starts[job_id][0] - arrived
        assert waited <= bound + 1e-6, (job_id, waited, bound, victims)


def training(job_id: str, **kw: object) -> JobSpec:
    base = JobSpec(
        job_id,
        team="a",
        kind=JobKind.TRAINING,
        priority=0,
        duration_s=10_000.0,
        checkpoint_interval_s=300.0,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def online(job_id: str, submit_s: float) -> JobSpec:
    return JobSpec(
        job_id,
        team="b",
        kind=JobKind.ONLINE,
        priority=100,
        submit_s=submit_s,
        duration_s=600.0,
    )


def test_online_preempts_training_of_another_team_without_quotas() -> None:
    """The live report: two low-priority jobs fill both GPUs; the online job of another
    team gets one within a cycle plus the victim's checkpoint, minimum runtime or not."""
    rules = PreemptionRules(min_runtime_s=3600.0, max_per_job=3)
    jobs = [training("t1", state_gib_per_gpu=10.0), training("t2"), online("o", 120.0)]
    config = SchedulerConfig(cycle_s=CYCLE_S, online_reserve=0.0, preemption=rules)
    world = World(Scheduler(cluster(1, 2), config))
    for job in jobs:
        world.submit(job)
    world.go(horizon_s=86_400.0)
    assert [s[1] for s in world.stops] == ["t2"]  # the cheaper victim: nothing to write
    assert world.starts["o"][0] - 120.0 <= CYCLE_S
    assert len(world.starts["t2"]) == 2 and world.finished == {"t1", "t2", "o"}


def test_a_victim_that_would_lose_too_much_work_is_skipped_for_another() -> None:
    """t1 checkpoints hourly, t2 every 5 minutes: with a 10-minute bound on lost work the
    online job takes t2's GPU although t1 would have been cheaper otherwise (lower
    priority)."""
    rules = PreemptionRules(min_runtime_s=0.0, max_per_job=3, max_lost_work_s=600.0)
    jobs = [
        training("t1", checkpoint_interval_s=3600.0, priority=0),
        training("t2", checkpoint_interval_s=300.0, priority=50),
        online("o", 1800.0),
    ]
    config = SchedulerConfig(cycle_s=CYCLE_S, online_reserve=0.0, preemption=rules)
    world = World(Scheduler(cluster(1, 2), config))
    for job in jobs:
        world.submit(job)
    world.go(horizon_s=86_400.0)
    assert [s[1] for s in world.stops] == ["t2"]
    assert all(s[4] <= 600.0 for s in world.stops)
    # without the bound the lowest priority goes first
    world = World(
        Scheduler(
            cluster(1, 2),
            replace(config, preemption=replace(rules, max_lost_work_s=None)),
        )
    )
    for job in jobs:
        world.submit(job)
    world.go(horizon_s=86_400.0)
    assert [s[1] for s in world.stops] == ["t1"]


@pytest.mark.parametrize("by_priority", [False, True])
def test_higher_priority_training_preempts_only_when_enabled(by_priority: bool) -> None:
    rules = PreemptionRules(min_runtime_s=600.0, max_per_job=3, by_priority=by_priority)
    jobs = [
        training("low", priority=0),
        training("high", priority=100, submit_s=60.0, duration_s=1200.0),
    ]
    config = SchedulerConfig(cycle_s=CYCLE_S, online_reserve=0.0, preemption=rules)
    world = World(Scheduler(cluster(1, 1), config))
    for job in jobs:
        world.submit(job)
    world.go(horizon_s=86_400.0)
    if by_priority:  # after the victim's minimum runtime, not before
        assert [s[1] for s in world.stops] == ["low"]
        assert world.stops[0][0] >= 600.0
        assert world.starts["high"][0] < 10_000.0
    else:
        assert world.stops == []
        assert world.starts["high"][0] >= 10_000.0


def test_training_that_cannot_vacate_quickly_stays_out_of_the_reserve() -> None:
    """4 GPUs, reserve 1: 80 GiB checkpoints take minutes to write, so only three such
    jobs run; one whose checkpoint is written within reserve_vacate_s takes the fourth."""
    rules = PreemptionRules(min_runtime_s=0.0, max_per_job=3, reserve_vacate_s=30.0)
    config = SchedulerConfig(cycle_s=CYCLE_S, online_reserve=0.25, preemption=rules)
    core = Scheduler(cluster(1, 4), config)
    for k in range(4):
        core.observe(Submitted(0.0, training(f"slow{k}", state_gib_per_gpu=80.0)))
    started = [c.job_id for c in core.cycle(0.0) if isinstance(c, Launch)]
    assert len(started) == 3
    core.observe(Submitted(1.0, training("quick", state_gib_per_gpu=5.0, submit_s=1.0)))
    assert [c.job_id for c in core.cycle(60.0) if isinstance(c, Launch)] == ["quick"]


def test_the_reserve_can_wait_for_the_first_online_job() -> None:
    """`online-seen`: a fleet that never served keeps every GPU for training; once an
    online job was submitted the pool keeps its reserve."""
    rules = PreemptionRules(min_runtime_s=0.0, max_per_job=3)
    config = SchedulerConfig(
        cycle_s=CYCLE_S, online_reserve=0.25, online_reserve_on="online-seen", preemption=rules
    )
    core = Scheduler(cluster(1, 4), config)
    assert core.fleet.reserve_now() == {MODEL: 0}
    for k in range(4):
        core.observe(Submitted(0.0, training(f"slow{k}", state_gib_per_gpu=80.0)))
    assert sum(isinstance(c, Launch) for c in core.cycle(0.0)) == 4
    core.observe(Submitted(10.0, online("o", 10.0)))
    assert core.fleet.reserve_now() == {MODEL: 1}
    commands = core.cycle(60.0)
    stops = [c.job_id for c in commands if isinstance(c, Stop)]
    assert len(stops) == 1 and core.claim_eta_s("o") is not None
    assert core.claim_eta_s("o") == pytest.approx(  # type: ignore[operator]
        60.0 + config.checkpoint.write_s(80.0)
    )


def test_the_core_refuses_a_priority_preemption_the_rules_forbid() -> None:
    rules = PreemptionRules(min_runtime_s=600.0, max_per_job=1, max_lost_work_s=100.0)
    low, high = training("low"), training("high", priority=100)
    # batch work does not preempt by priority unless enabled
    with pytest.raises(PlanRejected, match="by_priority"):
        rules.check(low, 0, True, 900.0, False, None, claimant=high)
    enabled = replace(rules, by_priority=True)
    with pytest.raises(PlanRejected, match="minimum time"):
        enabled.check(low, 0, True, 60.0, False, None, claimant=high)
    with pytest.raises(PlanRejected, match="does not outrank"):
        enabled.check(high, 0, True, 900.0, False, None, claimant=low)
    with pytest.raises(PlanRejected, match="within its guarantee"):
        enabled.check(low, 0, False, 900.0, False, None, claimant=replace(high, team="b"))
    enabled.check(low, 0, False, 900.0, False, None, claimant=high)  # its own team's
    with pytest.raises(PlanRejected, match="max_lost_work_s"):
        enabled.check(low, 0, True, 900.0, False, None, lost_work_s=101.0, claimant=high)
    with pytest.raises(PlanRejected, match="preempted 1 times"):
        enabled.check(low, 1, True, 900.0, False, None, claimant=high)
    # online work outranks the minimum runtime, never its own class
    rules.check(low, 0, True, 1.0, False, None, claimant=online("o", 0.0))
    with pytest.raises(PlanRejected, match="never preempted"):
        rules.check(online("o2", 0.0), 0, True, 900.0, False, None, claimant=online("o", 0.0))

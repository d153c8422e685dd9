"""The ordered policies of the decision core (las, gittins, learned), shadow mode, the guard.

A small world drives `gpupool.scheduler.Scheduler` alone: jobs arrive, run at speed 1,
checkpoint every interval, write their checkpoint when stopped and end when their work
is done. Test-local predictors stand for a good model (it knows each job's GPU-time) and
for wrong ones (the inverse order, a job said to be huge), so that what the rules keep
is seen whatever the model says.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.domain.model import Cluster, JobKind, JobSpec, Node
from gpupool.domain.quota import TeamQuota
from gpupool.errors import SpecError
from gpupool.learning.config import LearningConfig
from gpupool.learning.guard import GuardConfig
from gpupool.learning.history import History, JobFacts, Outcome
from gpupool.learning.predictor import ModelInfo, Prediction
from gpupool.policies import cycle_names
from gpupool.policies.preemption import PreemptionRules, outranks
from gpupool.scheduler import Scheduler
from gpupool.scheduler.commands import Command, Launch, LearnGuard, LearnShadow, Stop
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.config_schema import parse_scheduling
from gpupool.scheduler.events import Finished, Requeue, Submitted, Vacated
from gpupool.sim.eventsim import replay
from gpupool.sim.scenario.config import load_scenario
from gpupool.sim.scenario.generators import GenContext, build_workload
from gpupool.sim.scenario.world import ScenarioSim

MODEL = "A100-80GB"
CYCLE_S = 60.0
CLAIMANT = re.compile(r"(?:preempted|reclaimed) for (\S+) ")
SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "learned-shadow.yaml"


# ---- test-local predictors ------------------------------------------------------------
class TablePredictor:
    """Predicts each job's GPU-time from a table (the world knows the truth): `factor`
    1 is a good model, `invert` turns the order upside down; `override` says some jobs
    are other than they are. Trained at its first chance, once."""

    def __init__(
        self,
        truth: dict[str, float],
        invert: bool = False,
        override: dict[str, float] | None = None,
    ) -> None:
        self.truth = truth
        self.invert = invert
        self.override = override or {}
        self._info: ModelInfo | None = None

    @property
    def info(self) -> ModelInfo | None:
        return self._info

    def retrain_due(self, history: History, now_s: float) -> bool:
        return self._info is None

    def retrain(self, history: History, now_s: float) -> ModelInfo | None:
        self._info = ModelInfo(1, now_s, history.finished_by(now_s), "table")
        return self._info

    def predict(self, facts: JobFacts, history: History) -> Prediction | None:
        x = self.override.get(facts.job_id, self.truth.get(facts.job_id, 3600.0))
        if self.invert:
            x = 1e9 / max(x, 1.0)
        return Prediction(0.8 * x, x, 1.2 * x, 1)


def gpu_time(jobs: list[JobSpec]) -> dict[str, float]:
    return {j.job_id: (j.duration_s or 0.0) * j.gpu_count for j in jobs}


# ---- a small world --------------------------------------------------------------------
def cluster(nodes: int = 1, per_node: int = 1) -> Cluster:
    return Cluster(
        "c", tuple(Node(f"n{i}", MODEL, per_node, 64_000, 512 * 1024) for i in range(nodes))
    )


@dataclass
class World:
    """Carries out the core's Launch and Stop as jobs would, in simulated time."""

    core: Scheduler
    specs: dict[str, JobSpec] = field(default_factory=dict)
    events: list[tuple[float, int, str, str, int]] = field(default_factory=list)
    seq: int = 0
    saved: dict[str, float] = field(default_factory=dict)
    run: dict[str, tuple[float, float, int]] = field(default_factory=dict)
    runs: dict[str, int] = field(default_factory=dict)
    starts: dict[str, list[float]] = field(default_factory=dict)
    stops: list[tuple[float, str, str, float, float]] = field(default_factory=list)
    """(time, victim, reason, ran s, lost work s) of every preemption."""
    vacate_s: dict[str, float] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    commands: list[tuple[float, Command]] = field(default_factory=list)
    held: Counter[str] = field(default_factory=Counter)
    """GPUs each team holds now (launched, not yet stopped or finished)."""
    peak: Counter[str] = field(default_factory=Counter)

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

    def carry_out(self, now: float, commands: list[Command]) -> None:
        self.commands += [(now, c) for c in commands]
        for c in commands:
            if isinstance(c, Launch):
                job = self.specs[c.job_id]
                self.runs[c.job_id] = n = self.runs.get(c.job_id, 0) + 1
                self.run[c.job_id] = (now, self.saved[c.job_id], n)
                self.starts.setdefault(c.job_id, []).append(now)
                self.held[job.team] += job.gpu_count
                self.peak[job.team] = max(self.peak[job.team], self.held[job.team])
                left = (job.duration_s or 0.0) - self.saved[c.job_id]
                self.push(now + self._overhead(job, n > 1) + left, "finish", c.job_id, n)
            elif isinstance(c, Stop):
                job = self.specs[c.job_id]
                started, work0, n = self.run.pop(c.job_id)
                done = work0 + max(0.0, now - started - self._overhead(job, n > 1))
                saved = self.saved[c.job_id]
                saved += ((done - saved) // job.checkpoint_interval_s) * job.checkpoint_interval_s
                self.stops.append((now, c.job_id, c.reason, now - started, done - saved))
                self.saved[c.job_id] = saved
                self.held[job.team] -= job.gpu_count
                write = self.core.config.checkpoint.write_s(job.state_gib_per_gpu)
                self.vacate_s[c.job_id] = write
                self.push(now + write, "vacate", c.job_id)

    def go(self, horizon_s: float, until_s: float = math.inf) -> None:
        next_cycle = 0.0 if not self.commands else self.commands[-1][0]
        while self.events or self.core.waiting() or self.run:
            t_event = self.events[0][0] if self.events else math.inf
            now = min(t_event, next_cycle)
            if now > until_s:
                return
            assert now <= horizon_s, "jobs still waiting or running at the horizon"
            if t_event <= next_cycle:
                t, _, what, job_id, run = heapq.heappop(self.events)
                if what == "submit":
                    self.carry_out(t, self.core.observe(Submitted(t, self.specs[job_id])))
                elif what == "finish" and job_id in self.run and self.run[job_id][2] == run:
                    del self.run[job_id]
                    self.finished.add(job_id)
                    self.held[self.specs[job_id].team] -= self.specs[job_id].gpu_count
                    self.carry_out(t, self.core.observe(Finished(t, job_id)))
                elif what == "vacate":
                    self.carry_out(t, self.core.observe(Vacated(t, job_id)))
                elif what == "requeue" and job_id in self.run:
                    self.carry_out(t, self.core.observe(Requeue(t, job_id)))
            else:
                self.carry_out(now, self.core.cycle(now))
                next_cycle = now + CYCLE_S

    def launch_stream(self) -> list[tuple[float, str, str]]:
        return [
            (t, type(c).__name__, c.job_id)
            for t, c in self.commands
            if isinstance(c, Launch | Stop)
        ]

    def of(self, kind: type) -> list[Command]:
        return [c for _, c in self.commands if isinstance(c, kind)]


def learning(**kw: object) -> LearningConfig:
    """A guard that judges after ten finished jobs, no cold start, on the accuracy of the
    predictions: these worlds are a dozen jobs of 300-900 s, whose pairs give the order
    judge (the default, tested in tests/learning) well under its 1 % margin to go on."""
    guard = GuardConfig(window_jobs=10, min_finished=10, cold_start_s=0.0, judge="accuracy")
    return dataclasses.replace(LearningConfig(guard=guard), **kw)  # type: ignore[arg-type]


def core(
    policy: str,
    learn: LearningConfig | None = None,
    predictor: object = None,
    c: Cluster | None = None,
    **kw: object,
) -> Scheduler:
    kw.setdefault("online_reserve", 0.0)
    config = SchedulerConfig(
        policy=policy,
        cycle_s=CYCLE_S,
        learning=learn or LearningConfig(),
        **kw,  # type: ignore[arg-type]
    )
    return Scheduler(c or cluster(), config, predictor=predictor)  # type: ignore[arg-type]


def job(job_id: str, submit_s: float, duration_s: float, **kw: object) -> JobSpec:
    base = JobSpec(
        job_id,
        team="a",
        kind=JobKind.TRAINING,
        submit_s=submit_s,
        duration_s=duration_s,
        checkpoint_interval_s=300.0,
    )
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def first_start(world: World, job_id: str) -> float:
    return world.starts[job_id][0]


# ---- registry and rule orders -----------------------------------------------------------
def test_the_ordered_policies_are_cycle_policies_of_the_one_registry() -> None:
    assert {"las", "gittins", "learned"} <= set(cycle_names())


def requeued_world(policy: str) -> World:
    """X runs 2 h and is requeued (7200 GPU-s attained, past LAS's first queue); Z was
    waiting and runs next; Y arrives meanwhile with nothing attained. When Z ends, X has
    waited longer (ready earlier) but attained more than Y."""
    world = World(core(policy))
    for j in (job("X", 0.0, 20_000.0), job("Z", 10.0, 1_000.0), job("Y", 7_800.0, 500.0)):
        world.submit(j)
    world.push(7_200.0, "requeue", "X")
    world.go(horizon_s=86_400.0)
    return world


def test_las_runs_the_job_with_least_attained_service_first() -> None:
    las, age = requeued_world("las"), requeued_world("priority-quota")
    assert first_start(las, "Y") < las.starts["X"][1]  # Y before X's resume
    assert first_start(age, "Y") > age.starts["X"][1]  # priority-quota: X waited longer
    assert las.finished == age.finished == {"X", "Y", "Z"}


def test_gittins_orders_by_the_index_of_finished_jobs() -> None:
    """With finished jobs that all took 1000 GPU-s, a job with 7200 GPU-s attained has
    outlived them all: the index ranks it behind a fresh job, as LAS does."""
    world = World(core("gittins"))
    world.core.learning_seed(
        [Outcome(JobFacts(f"h{i}", float(i), 1), 1_000.0 + i, 1_000.0 + 10 * i) for i in range(30)]
    )
    for j in (job("X", 0.0, 20_000.0), job("Z", 10.0, 1_000.0), job("Y", 7_800.0, 500.0)):
        world.submit(j)
    world.push(7_200.0, "requeue", "X")
    world.go(horizon_s=86_400.0)
    assert first_start(world, "Y") < world.starts["X"][1]


# ---- active with a good model -----------------------------------------------------------
WARM = [job(f"w{i}", 10.0 * i, 300.0 + 97.0 * (i % 7)) for i in range(14)]
"""Warm-up: fourteen jobs of varied length that finish one after another (the guard
judges ten predictions before it trusts the model)."""


def short_after_long(policy: str, mode: str = "active") -> World:
    """After the warm-up, a blocker holds the one GPU; a long job arrives, then a short
    one; when the blocker ends one of them gets the GPU."""
    t0 = 20_000.0
    probe = [job("B", t0, 600.0), job("L", t0 + 100, 20_000.0), job("S", t0 + 110, 400.0)]
    jobs = WARM + probe
    learn = learning(mode=mode) if policy == "learned" else None
    world = World(core(policy, learn, TablePredictor(gpu_time(jobs))))
    for j in jobs:
        world.submit(j)
    world.go(horizon_s=10 * 86_400.0)
    return world


def test_active_with_a_good_model_starts_the_short_job_first() -> None:
    learned, las = short_after_long("learned"), short_after_long("las")
    assert learned.core.learning_status()["guard"] == "trusted"  # type: ignore[index]
    for world in (learned, las):  # the blocker ran first, the other two waited for it
        assert first_start(world, "B") < min(first_start(world, "S"), first_start(world, "L"))
    assert first_start(learned, "S") < first_start(learned, "L")
    assert first_start(las, "L") < first_start(las, "S")  # the rule: first come in queue 0
    trusted = [g for g in learned.of(LearnGuard) if isinstance(g, LearnGuard)]
    assert trusted and trusted[0].state == "trusted" and "within 2x" in trusted[0].reason


def test_the_order_also_picks_which_waiting_jobs_a_cycle_looks_at() -> None:
    """The cycle sees two waiting jobs per team (queue_depth 2); the short job is sixth in
    its team's queue by age, and still the next to start under the learned order."""
    t0 = 20_000.0
    longs = [job(f"L{i}", t0 + 100 + i, 20_000.0) for i in range(5)]
    probe = [job("B", t0, 600.0), *longs, job("S", t0 + 110, 400.0)]
    jobs = WARM + probe
    world = World(
        core("learned", learning(mode="active"), TablePredictor(gpu_time(jobs)), queue_depth=2)
    )
    for j in jobs:
        world.submit(j)
    world.go(horizon_s=30 * 86_400.0)
    assert first_start(world, "S") < min(first_start(world, j.job_id) for j in longs)


def test_a_waiting_job_is_told_it_waits_behind_the_job_the_order_puts_first() -> None:
    """While the blocker runs, the long job waits behind the short one in the learned
    order (and its reason says so), though it came first."""
    t0 = 20_000.0
    probe = [job("B", t0, 600.0), job("L", t0 + 100, 20_000.0), job("S", t0 + 110, 400.0)]
    jobs = WARM + probe
    world = World(core("learned", learning(mode="active"), TablePredictor(gpu_time(jobs))))
    for j in jobs:
        world.submit(j)
    world.go(horizon_s=10 * 86_400.0, until_s=t0 + 300)
    reasons = world.core.explain_waits(t0 + 300)
    assert reasons["L"].code == "Priority"
    assert "ahead in the learned order (first: S)" in reasons["L"].sentence
    assert "B" in world.starts and "S" not in world.starts and "L" not in world.starts


def test_shadow_decisions_never_reach_the_executor() -> None:
    """Shadow: the Launch/Stop stream is the rule policy's exactly, and the cycle where
    the learned order would have started the short job is recorded as a LearnShadow."""
    shadow, rule = short_after_long("learned", "shadow"), short_after_long("gittins")
    assert shadow.launch_stream() == rule.launch_stream()  # learning.rule: gittins
    records = [r for r in shadow.of(LearnShadow) if isinstance(r, LearnShadow)]
    assert any(r.rule_starts == ("L",) and r.learned_starts == ("S",) for r in records)
    assert all(not r.agree for r in records)
    status = shadow.core.learning_status()
    assert status is not None and status["mode"] == "shadow"
    assert status["shadow_cycles"] >= len(records) and 0 < status["agreement"] < 1  # type: ignore[operator]


def test_promotion_makes_the_learned_order_decide() -> None:
    world = short_after_long("learned", "shadow")
    cfg = world.core.config
    promoted = World(
        core("learned", cfg.learning, TablePredictor(gpu_time(list(world.specs.values()))))
    )
    for j in world.specs.values():
        promoted.submit(j)
    promoted.go(horizon_s=10 * 86_400.0, until_s=19_000.0)
    change = promoted.core.set_learning_mode("active", 19_000.0, "replay of 14 days: 12% better")
    assert change == LearnGuard(19_000.0, "promoted", "replay of 14 days: 12% better")
    promoted.go(horizon_s=10 * 86_400.0)
    assert first_start(promoted, "S") < first_start(promoted, "L")
    assert promoted.core.learning_status()["mode"] == "active"  # type: ignore[index]
    demoted = promoted.core.set_learning_mode("shadow", 90_000.0, "model drifted")
    assert demoted.state == "demoted"
    with pytest.raises(SpecError, match="shadow, active"):
        promoted.core.set_learning_mode("off", 90_000.0, "")
    with pytest.raises(SpecError, match="set policy: learned"):
        core("las").set_learning_mode("active", 0.0, "")


# ---- the guard ----------------------------------------------------------------------------
class DriftingPredictor(TablePredictor):
    """Right until `flip_s`, then the inverse order (a workload that drifted)."""

    def __init__(self, truth: dict[str, float], flip_s: float) -> None:
        super().__init__(truth)
        self.flip_s = flip_s

    def predict(self, facts: JobFacts, history: History) -> Prediction | None:
        self.invert = facts.submit_s >= self.flip_s
        return super().predict(facts, history)


def test_the_guard_falls_back_with_its_sentence_and_the_rule_order_returns() -> None:
    """Ten good predictions: trusted. Then the model inverts: after ten bad ones the
    guard falls back (LearnGuard with the figures), and a short job submitted before a
    long one runs first again, as 2D-LAS has it (the inverted model would run the long)."""
    flip, t0 = 10_000.0, 40_000.0
    drifted = [job(f"d{i}", flip + 10.0 * i, 300.0 + 97.0 * (i % 7)) for i in range(14)]
    probe = [job("B", t0, 600.0), job("S", t0 + 100, 400.0), job("L", t0 + 110, 20_000.0)]
    jobs = WARM + drifted + probe
    world = World(core("learned", learning(mode="active"), DriftingPredictor(gpu_time(jobs), flip)))
    for j in jobs:
        world.submit(j)
    world.go(horizon_s=10 * 86_400.0)
    changes = [g for g in world.of(LearnGuard) if isinstance(g, LearnGuard)]
    assert [g.state for g in changes][:2] == ["trusted", "fallback"]
    fell = changes[1]
    assert (
        fell.reason.startswith("model drifted, rules decide") and "rank correlation" in fell.reason
    )
    assert flip < fell.t_s < t0
    assert first_start(world, "S") < first_start(world, "L")
    assert world.core.learning_status()["uses_model"] is False  # type: ignore[index]


# ---- what the rules keep whatever the model says -----------------------------------------
TEAMS = (
    TeamQuota("a", {MODEL: 2}, {MODEL: 5}),
    TeamQuota("b", {MODEL: 2}, {MODEL: 6}),
)


@st.composite
def workloads(draw: st.DrawFn) -> list[JobSpec]:
    jobs: list[JobSpec] = []
    t = 0.0
    for i in range(draw(st.integers(4, 22))):
        t += draw(st.sampled_from((0.0, 30.0, 300.0, 900.0)))
        online = draw(st.integers(0, 4)) == 0
        jobs.append(
            JobSpec(
                f"j{i}",
                gpu_count=1 if online else draw(st.sampled_from((1, 1, 2, 4))),
                team=draw(st.sampled_from(("a", "b"))),
                kind=JobKind.ONLINE
                if online
                else draw(st.sampled_from((JobKind.TRAINING, JobKind.OFFLINE))),
                priority=100 if online else draw(st.sampled_from((0, 0, 50))),
                submit_s=t,
                duration_s=draw(st.sampled_from((300.0, 1800.0, 3600.0, 7200.0))),
                checkpoint_interval_s=draw(st.sampled_from((300.0, 900.0))),
                state_gib_per_gpu=draw(st.sampled_from((0.0, 5.0, 40.0))),
            )
        )
    return jobs


@pytest.mark.slow  # long: started first (tests/conftest.py orders slow modules first)
@settings(max_examples=40, deadline=None)
@given(workloads(), st.booleans(), st.sampled_from((1_800.0, 7_200.0)))
def test_the_rules_hold_with_a_wrong_model_in_charge(
    jobs: list[JobSpec], by_priority: bool, max_wait_s: float
) -> None:
    """Active, unguarded, with the inverse order: quota maxima, online never preempted,
    the per-job preemption budget and the minimum runtime all hold, every job finishes."""
    rules = PreemptionRules(min_runtime_s=600.0, max_per_job=2, by_priority=by_priority)
    learn = learning(mode="active", guarded=False, max_wait_s=max_wait_s)
    world = World(
        core(
            "learned",
            learn,
            TablePredictor(gpu_time(jobs), invert=True),
            cluster(2, 4),
            teams=TEAMS,
            preemption=rules,
        )
    )
    for j in jobs:
        world.submit(j)
    world.go(horizon_s=30 * 86_400.0)
    specs = world.specs
    assert world.finished == set(specs)
    assert world.core.learning_status()["uses_model"] is True  # type: ignore[index]
    for team in TEAMS:
        assert world.peak[team.team] <= team.maximum[MODEL], team.team
    for _t, victim, reason, ran_s, _lost in world.stops:
        assert specs[victim].kind is not JobKind.ONLINE, (victim, reason)
        claimant = CLAIMANT.search(reason)
        assert claimant is not None, reason
        by = specs[claimant.group(1)]
        if by.kind is not JobKind.ONLINE and reason.startswith("preempted"):
            assert outranks(by, specs[victim]) and ran_s >= rules.min_runtime_s - 1e-6
    for job_id in specs:
        assert sum(1 for s in world.stops if s[1] == job_id) <= rules.max_per_job


def test_the_online_reserve_holds_with_a_wrong_model_in_charge() -> None:
    """Two GPUs, a 50% reserve: training fills what it may, an online job arriving later
    starts within a cycle whatever order the model gives the training jobs."""
    jobs = [job(f"t{i}", 0.0, 3_600.0 * (i + 1), priority=0) for i in range(4)]
    jobs.append(
        JobSpec(
            "o", team="a", kind=JobKind.ONLINE, priority=100, submit_s=1_000.0, duration_s=600.0
        )
    )
    learn = learning(mode="active", guarded=False)
    predictor = TablePredictor(gpu_time(jobs), invert=True)
    world = World(core("learned", learn, predictor, cluster(1, 2), online_reserve=0.5))
    for j in jobs:
        world.submit(j)
    world.go(horizon_s=30 * 86_400.0)
    assert first_start(world, "o") - 1_000.0 <= CYCLE_S
    assert not any(s[1] == "o" for s in world.stops)
    assert world.finished == set(world.specs)


def test_no_job_waits_past_the_age_bound_whatever_the_model_says() -> None:
    """One GPU, a model that calls X enormous and a stream of short jobs it prefers:
    without the bound X would wait for the stream to end; with it, X starts at the first
    free GPU after it waited max_wait_s."""
    stream = [job(f"s{i}", 60.0 * i, 900.0) for i in range(40)]
    x = job("X", 30.0, 1_200.0)
    jobs = [x, *stream]

    def run(max_wait_s: float | None) -> World:
        # model_order remaining: the prediction alone ranks X last (the conditional order
        # would shrink a model that has seen no job like X to the rule order)
        learn = learning(
            mode="active", guarded=False, max_wait_s=max_wait_s, model_order="remaining"
        )
        world = World(core("learned", learn, TablePredictor(gpu_time(jobs), override={"X": 1e9})))
        for j in jobs:
            world.submit(j)
        world.go(horizon_s=30 * 86_400.0)
        return world

    bound = 3_600.0
    aged, unbounded = run(bound), run(None)
    starts = sorted((t, j) for j, ts in aged.starts.items() for t in ts)
    due = x.submit_s + bound
    after = [j for t, j in starts if t > due]
    assert after[0] == "X"  # the first start once X waited past the bound is X's
    assert first_start(unbounded, "X") > max(first_start(unbounded, s.job_id) for s in stream)


# ---- configuration ------------------------------------------------------------------------
def test_the_learning_section_parses_with_defaults_and_sentences() -> None:
    cfg = parse_scheduling(
        {
            "policy": "learned",
            "learning": {
                "rule": "gittins",
                "weight": 0.5,
                "max_wait_s": None,
                "guard": {"window_jobs": 50, "cold_start_s": 3600},
                "las_thresholds_gpu_s": [100, 1000],
            },
        },
        "x.yaml",
    )
    lc = cfg.learning
    assert (lc.mode, lc.rule, lc.weight, lc.max_wait_s) == ("shadow", "gittins", 0.5, None)
    assert lc.guard.window_jobs == 50 and lc.guard.min_finished == 200
    assert lc.las.thresholds_gpu_s == (100.0, 1000.0)
    assert parse_scheduling({}, "x.yaml").learning == LearningConfig()
    assert parse_scheduling({"policy": "las"}, "x.yaml").learning.mode == "off"
    bad = [
        ({"policy": "priority-quota", "learning": {"mode": "shadow"}}, "set policy: learned"),
        ({"policy": "learned", "learning": {"mode": "off"}}, "mode shadow"),
        ({"policy": "learned", "learning": {"rule": "sjf"}}, "learning.rule must be one of"),
        ({"policy": "learned", "learning": {"weight": 2}}, "learning.weight must be in 0..1"),
        ({"policy": "learned", "learning": {"colour": 1}}, "colour"),
        ({"policy": "learned", "learning": {"guard": {"window_jobs": 3}}}, "window_jobs"),
        ({"policy": "learned", "learning": {"max_wait_s": -1}}, "max_wait_s"),
        ({"policy": "learned", "learning": {"las_thresholds_gpu_s": [10, 5]}}, "ascending"),
    ]
    for raw, words in bad:
        with pytest.raises(SpecError, match=re.escape(words)) as err:
            parse_scheduling(raw, "x.yaml")
        assert str(err.value).startswith("x.yaml: "), raw


def test_the_core_refuses_a_learning_mode_without_the_learned_policy() -> None:
    with pytest.raises(SpecError, match="set policy: learned"):
        core("priority-quota", LearningConfig(mode="active"))
    with pytest.raises(SpecError, match=r"learning\.mode shadow"):
        core("learned", LearningConfig(mode="off"))
    assert core("priority-quota").learning_status() is None


def test_a_restarted_core_is_seeded_with_finished_jobs() -> None:
    """A restarted service preloads its finished jobs: the default predictor (LightGBM,
    100 rows before a first model) trains on them at the first cycle."""
    sched = core("learned", learning(mode="shadow"))
    outcomes = [
        Outcome(
            JobFacts(f"h{i}", 100.0 * i, 1 + i % 4, "a", MODEL, ("resnet", "bert")[i % 2]),
            100.0 * i + 50,
            600.0 * (1 + i % 4) * (1 + i % 2),
        )
        for i in range(120)
    ]
    assert sched.learning_seed(outcomes) == 120
    status = sched.learning_status()
    assert status is not None
    assert status["finished_seen"] == 120 and status["mode"] == "shadow"
    assert status["agreement"] is None and status["model"] is None  # no cycle yet
    # a job restored or submitted with a submit before the last seeded one is still taken
    sched.submit(job("late", 10.0, 100.0), 13_000.0)
    sched.cycle(13_000.0)
    status = sched.learning_status()
    assert status is not None and status["submits_seen"] == 121
    model = status["model"]
    assert isinstance(model, dict) and model["kind"] == "lightgbm" and model["rows"] == 120


# ---- the scenario simulator ---------------------------------------------------------------
_RUNS: dict[tuple[str, str], ScenarioSim] = {}


def scenario_run(policy: str, mode: str) -> ScenarioSim:
    """scenarios/learned-shadow.yaml under a policy and learning mode, recorded (cached)."""
    if (policy, mode) not in _RUNS:
        cfg = load_scenario(SCENARIO)
        learn = dataclasses.replace(cfg.scheduling.learning, mode=mode)
        scheduling = dataclasses.replace(cfg.scheduling, policy=policy, learning=learn)
        cfg = dataclasses.replace(cfg, scheduling=scheduling)
        wl = build_workload(cfg.workload, cfg.seed, GenContext(cfg.horizon_s, None))
        sim = ScenarioSim(cfg, wl)
        sim.recorded, sim.commands = [], []
        sim.run()
        _RUNS[(policy, mode)] = sim
    return _RUNS[(policy, mode)]


def decisions(sim: ScenarioSim) -> list[tuple[float, str, str]]:
    return [
        (t, type(c).__name__, c.job_id)
        for t, c in sim.commands or []
        if isinstance(c, Launch | Stop)
    ]


def test_the_shadow_scenario_carries_out_what_las_decides() -> None:
    shadow, las = scenario_run("learned", "shadow"), scenario_run("las", "off")
    assert decisions(shadow) == decisions(las)
    assert any(isinstance(r, LearnShadow) for r in shadow.learn_records)
    assert not las.learn_records


@pytest.mark.parametrize("mode", ["shadow", "active"])
def test_the_scenario_and_a_replay_of_its_events_agree(mode: str) -> None:
    sim = scenario_run("learned", mode)
    assert sim.recorded is not None and sim.commands is not None
    kinds = Counter(type(c).__name__ for _, c in sim.commands)
    assert kinds["LearnGuard"] > 0 and kinds["Launch"] > 100
    if mode == "shadow":
        assert kinds["LearnShadow"] > 0 and sim.learn_records
    else:  # the model was trusted for a while: its order decided then
        assert decisions(sim) != decisions(scenario_run("las", "off"))
    fresh = sim.new_core()
    assert replay(fresh, sim.recorded) == sim.commands

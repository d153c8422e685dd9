"""Parity: the simulator's event driver and the live service take identical decisions.

The same events (submissions, completions, a failed GPU) go to the event simulator and to
the live driver (real SQLite store, fake executor, fake fleet, manual clock); the starts,
resumes and preemptions must match one for one, in order and in time.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpupool.domain.model import JobKind, JobSpec
from gpupool.domain.quota import TeamQuota
from gpupool.policies.preemption import PreemptionRules
from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.scheduler import Finished, GpuDown, NodeDown, Submitted
from gpupool.scheduler.config import ElasticConfig
from gpupool.server.loop.config import LIVE_DEFAULTS, LiveConfig, build_cluster
from gpupool.server.loop.driver import LiveService
from gpupool.server.store import NewJob, Store
from gpupool.sim.eventsim import run_events

FLEET = "4xA100-80GB,2xH100"
TEAMS = (
    TeamQuota("serving", {"A100-80GB": 2}, {}),
    TeamQuota("research", {"A100-80GB": 1, "H100": 1}, {}),
)
RULES = PreemptionRules(min_runtime_s=30.0, max_per_job=3)

# (time, job id, team, kind, GPUs, GPU model, priority): ids are the order of submission
JOBS = [
    (0, "1", "research", JobKind.TRAINING, 2, "A100-80GB", 0),
    (0, "2", "research", JobKind.TRAINING, 2, "A100-80GB", 0),
    (5, "3", "research", JobKind.TRAINING, 1, "H100", 0),
    (10, "4", "research", JobKind.BATCH, 1, "H100", 0),
    (60, "5", "serving", JobKind.ONLINE, 1, "A100-80GB", 100),
    (61, "6", "serving", JobKind.ONLINE, 1, "A100-80GB", 100),
    (90, "7", "research", JobKind.OFFLINE, 2, "A100-80GB", 10),
    (120, "8", "research", JobKind.TRAINING, 1, "H100", 5),
]
DONE = [(150, "3"), (200, "5"), (230, "6"), (260, "4"), (280, "7")]
LOSS = (300, 1)  # at 300 s the H100 node's first GPU fails: that GPU alone is out


def _events(node_of_h100: str) -> list[Submitted | Finished | GpuDown]:
    events: list[Submitted | Finished | GpuDown] = [
        Submitted(
            float(t),
            JobSpec(
                job_id,
                gpu_count=gpus,
                gpu_models=frozenset({model}),
                team=team,
                kind=kind,
                priority=prio,
                submit_s=float(t),
            ),
        )
        for t, job_id, team, kind, gpus, model, prio in JOBS
    ]
    events += [Finished(float(t), job_id) for t, job_id in DONE]
    events.append(GpuDown(float(LOSS[0]), node_of_h100, 0))
    return events


def _live(tmp_path: Path) -> list[tuple[float, str, str]]:
    clock = ManualClock(0.0)
    store = Store(f"sqlite:///{tmp_path}/parity.db")
    store.migrate()
    telemetry = FakeTelemetry(FLEET)
    executor = FakeExecutor()
    service = LiveService(
        LiveConfig(
            tmp_path / "state",
            dataclasses.replace(
                LIVE_DEFAULTS, teams=TEAMS, policy="priority-quota", preemption=RULES
            ),
            sample_s=0.0,
            host="h",
        ),
        store,
        executor,
        telemetry,
        clock,
    )
    times = sorted({t for t, *_ in JOBS} | {t for t, _ in DONE} | {LOSS[0]})
    for t in times:
        clock.t = float(t)
        for tj, job_id, team, kind, gpus, model, prio in JOBS:
            if tj == t:
                row, _ = store.jobs.submit(
                    NewJob(
                        name=f"job{job_id}",
                        team=team,
                        kind=kind.value,
                        priority=prio,
                        gpu_count=gpus,
                        command=("true",),
                        gpu_model=model,
                    ),
                    float(t),
                )
                assert str(row.id) == job_id
        for td, job_id in DONE:
            if td == t:
                executor.finish(job_id, 0)
        if t == LOSS[0]:
            h100 = [g.index for g in telemetry.inventory() if g.model == "H100"]
            telemetry.fail_gpu(h100[0], "fell off the bus")
        for _ in range(4):  # exits of preempted jobs come back on the next poll
            service.step()
    return service.record.decisions


def test_live_and_simulated_drivers_decide_alike(tmp_path: Path) -> None:
    cluster, _ = build_cluster(FakeTelemetry(FLEET).inventory(), "h")
    h100_node = next(n.name for n in cluster.nodes if n.gpu_model == "H100")
    simulated = run_events(cluster, _events(h100_node), TEAMS, "priority-quota", RULES)
    live = _live(tmp_path)
    assert live == simulated
    actions = {a for _, a, _ in live}
    # the sequence exercises what parity is about: starts, reclaim by preemption, resume
    assert {"start", "preempt", "resume"} <= actions, live
    # the failed H100 takes its job down alone: it resumes at once on the node's other H100
    assert (float(LOSS[0]), "resume", "8") in live, live


@pytest.mark.parametrize("bad_node", ["nowhere"])
def test_event_driver_refuses_an_unknown_node(bad_node: str) -> None:
    from gpupool.errors import NotFoundError

    cluster, _ = build_cluster(FakeTelemetry(FLEET).inventory(), "h")
    with pytest.raises(NotFoundError):
        run_events(cluster, [NodeDown(1.0, bad_node)])


ELASTIC = ElasticConfig(resize=True, grow_after_s=5.0)
# (time, job id, team, kind, GPUs, fewest GPUs, GPU model): an elastic offline job lends a
# GPU to each of two online jobs and grows back once they ended; job 4 marks a later time
ELASTIC_JOBS = [
    (0, "1", "research", JobKind.OFFLINE, 4, 2, "A100-80GB"),
    (60, "2", "serving", JobKind.ONLINE, 1, None, "A100-80GB"),
    (61, "3", "serving", JobKind.ONLINE, 1, None, "A100-80GB"),
    (300, "4", "research", JobKind.TRAINING, 1, None, "H100"),
]
ELASTIC_DONE = [(200, "2"), (200, "3")]


def _elastic_live(tmp_path: Path) -> list[tuple[float, str, str]]:
    clock = ManualClock(0.0)
    store = Store(f"sqlite:///{tmp_path}/elastic.db")
    store.migrate()
    executor = FakeExecutor()
    config = dataclasses.replace(LIVE_DEFAULTS, teams=TEAMS, preemption=RULES, elastic=ELASTIC)
    service = LiveService(
        LiveConfig(tmp_path / "state", config, sample_s=0.0, host="h"),
        store,
        executor,
        FakeTelemetry(FLEET),
        clock,
    )
    for t in sorted({t for t, *_ in ELASTIC_JOBS} | {t for t, _ in ELASTIC_DONE}):
        clock.t = float(t)
        for tj, job_id, team, kind, gpus, low, model in ELASTIC_JOBS:
            if tj == t:
                row, _ = store.jobs.submit(
                    NewJob(
                        name=f"job{job_id}",
                        team=team,
                        kind=kind.value,
                        priority=0,
                        gpu_count=gpus,
                        gpu_count_min=low,
                        command=("true",),
                        gpu_model=model,
                    ),
                    float(t),
                )
                assert str(row.id) == job_id
        for td, job_id in ELASTIC_DONE:
            if td == t:
                executor.finish(job_id, 0)
        for _ in range(4):  # a resized job's exit comes back on the next poll
            service.step()
    assert store.jobs.get(1).state == "running" and store.jobs.get(1).preemptions == 0
    assert len(store.jobs.get(1).gpus) == 4 and store.jobs.get(1).resize_gpus is None
    return service.record.decisions


def test_live_and_simulated_drivers_resize_elastic_jobs_alike(tmp_path: Path) -> None:
    cluster, _ = build_cluster(FakeTelemetry(FLEET).inventory(), "h")
    events: list[Submitted | Finished | NodeDown] = [
        Submitted(
            float(t),
            JobSpec(
                job_id,
                gpu_count=gpus,
                gpu_count_min=low,
                gpu_models=frozenset({model}),
                team=team,
                kind=kind,
                submit_s=float(t),
            ),
        )
        for t, job_id, team, kind, gpus, low, model in ELASTIC_JOBS
    ]
    events += [Finished(float(t), job_id) for t, job_id in ELASTIC_DONE]
    simulated = run_events(cluster, events, TEAMS, "priority-quota", RULES, ELASTIC)
    live = _elastic_live(tmp_path)
    assert live == simulated
    resized = ["resize", "resume"]
    assert [a for _, a, j in live if j == "1"] == ["start", *resized * 3], live  # 4, 3, 2, 4
    assert "preempt" not in {a for _, a, _ in live}, live


class _NoResizeExecutor(FakeExecutor):
    """An executor that cannot restart a job on other GPUs."""

    can_resize = False


def test_an_executor_that_cannot_resize_keeps_elastic_jobs_whole(tmp_path: Path) -> None:
    from gpupool.server.executors.ray import RayExecutor

    assert RayExecutor.can_resize is True  # both real executors resize; this one cannot
    clock = ManualClock(0.0)
    store = Store(f"sqlite:///{tmp_path}/ray-like.db")
    store.migrate()
    config = dataclasses.replace(LIVE_DEFAULTS, teams=TEAMS, preemption=RULES, elastic=ELASTIC)
    service = LiveService(
        LiveConfig(tmp_path / "state", config, sample_s=0.0, host="h"),
        store,
        _NoResizeExecutor(),
        FakeTelemetry(FLEET),
        clock,
    )
    assert service.scheduler.config.elastic.resize is False
    for t, job_id, team, kind, gpus, low, model in ELASTIC_JOBS[:2]:
        clock.t = float(t)
        store.jobs.submit(
            NewJob(
                name=f"job{job_id}",
                team=team,
                kind=kind.value,
                priority=0,
                gpu_count=gpus,
                gpu_count_min=low,
                command=("true",),
                gpu_model=model,
            ),
            float(t),
        )
        for _ in range(4):
            service.step()
    actions = [(a, j) for _, a, j in service.record.decisions]
    assert ("preempt", "1") in actions and not any(a == "resize" for a, _ in actions), actions


# A 4-GPU node: a 3-GPU job runs 100 s; a 4-GPU job arrives and holds a reservation from
# 100 s; a 1-GPU job of 30 s backfills onto the GPU kept for it (it ends first), a 1-GPU
# job of 500 s waits until the wide job has run.
RESERVED_JOBS = [(0, "1", 3, 100.0), (5, "2", 4, 50.0), (10, "3", 1, 30.0), (15, "4", 1, 500.0)]
RESERVED_DONE = [(40, "3"), (100, "1"), (150, "2"), (650, "4")]


def _both_drivers(
    tmp_path: Path,
    fleet: str,
    jobs: list[tuple[int, str, int, float, str]],
    done: list[tuple[int, str]],
    reservations: bool = False,
) -> tuple[list[tuple[float, str, str]], list[tuple[float, str, str]], Store]:
    """The decisions of the simulator's event driver and of the live service (a store,
    a fake executor, a manual clock) on the same submits (t, id, GPUs, duration, user)
    and ends, with priority-quota; and the live service's store."""
    cluster, _ = build_cluster(FakeTelemetry(fleet).inventory(), "h")
    events: list[Submitted | Finished | GpuDown] = [
        Submitted(
            float(t),
            JobSpec(j, gpu_count=g, team="ml", submit_s=float(t), duration_s=d, user=u),
        )
        for t, j, g, d, u in jobs
    ]
    events += [Finished(float(t), j) for t, j in done]
    simulated = run_events(cluster, events, (), "priority-quota", RULES, reservations=reservations)

    clock = ManualClock(0.0)
    store = Store(f"sqlite:///{tmp_path}/parity.db")
    store.migrate()
    executor = FakeExecutor()
    config = dataclasses.replace(
        LIVE_DEFAULTS, policy="priority-quota", preemption=RULES, reservations=reservations
    )
    service = LiveService(
        LiveConfig(tmp_path / "state", config, sample_s=0.0, host="h"),
        store,
        executor,
        FakeTelemetry(fleet),
        clock,
    )
    for t in sorted({t for t, *_ in jobs} | {t for t, _ in done}):
        clock.t = float(t)
        for tj, j, g, d, u in jobs:
            if tj == t:
                row, _ = store.jobs.submit(
                    NewJob(name=f"job{j}", team="ml", kind="training", priority=0, gpu_count=g,
                           command=("true",), duration_s=d, user=u or None),
                    float(t),
                )  # fmt: skip
                assert str(row.id) == j
        for td, j in done:
            if td == t:
                executor.finish(j, 0)
        for _ in range(4):
            service.step()
    return simulated, service.record.decisions, store


def test_live_and_simulated_drivers_reserve_alike(tmp_path: Path) -> None:
    jobs = [(t, j, g, d, "") for t, j, g, d in RESERVED_JOBS]
    simulated, live, store = _both_drivers(
        tmp_path, "4xA100-80GB", jobs, RESERVED_DONE, reservations=True
    )
    assert live == simulated
    assert [(t, j) for t, a, j in live if a == "start"] == [
        (0.0, "1"), (10.0, "3"), (100.0, "2"), (150.0, "4")
    ]  # fmt: skip
    reasons = [e.message for e in store.events.after(0, limit=1000) if e.job_id == 2]
    assert any(m.startswith("Reserved: 4 A100-80GB GPUs on") for m in reasons), reasons


def test_live_and_simulated_drivers_share_a_team_fairly_alike(tmp_path: Path) -> None:
    """Two GPUs: alice queues four jobs, then bob one; when alice's first two end, the
    freed GPUs go to bob first, then to alice's third, in both drivers (without fair share
    alice's third and fourth would take them)."""
    jobs = [(0, str(k), 1, 100.0, "alice") for k in range(1, 5)] + [(5, "5", 1, 100.0, "bob")]
    done = [(100, "1"), (100, "2"), (200, "3"), (200, "5"), (300, "4")]
    simulated, live, _ = _both_drivers(tmp_path, "2xA100-80GB", jobs, done)
    assert live == simulated
    assert [(t, j) for t, a, j in live if a == "start"] == [
        (0.0, "1"), (0.0, "2"), (100.0, "5"), (100.0, "3"), (200.0, "4")
    ]  # fmt: skip

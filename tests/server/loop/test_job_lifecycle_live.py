"""The live service carries out the core's lifecycle decisions: team limits, time limits,
hold/release/requeue, drains (kept across a restart) and the purge of old jobs (fake
fleet, fake executor, manual clock, a real SQLite store)."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.errors import ConflictError, NotFoundError
from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.scheduler.config import TeamLimits
from gpupool.server.executors.local import LocalExecutor
from gpupool.server.loop.config import LIVE_DEFAULTS, LiveConfig
from gpupool.server.loop.driver import LiveService
from gpupool.server.store import NewJob, Store

DAY = 86_400.0
T0 = 1_000_000.0
NODE = "h/A100-80GB"


@dataclasses.dataclass
class Live:
    service: LiveService
    store: Store
    clock: ManualClock
    executor: FakeExecutor
    reopen: Callable[[], LiveService]

    def submit(self, team: str = "a", gpus: int = 1, **kw: Any) -> int:
        job = NewJob(f"{team}-job", team, kw.pop("kind", "training"), 0, gpus, ("true",), **kw)
        row, _ = self.store.jobs.submit(job, self.clock.now())
        return row.id

    def step(self, dt_s: float = 1.0) -> None:
        self.clock.advance(dt_s)
        self.service.step()

    def state(self, job_id: int) -> str:
        return self.store.jobs.get(job_id).state

    def reason(self, job_id: int) -> str:
        return self.store.jobs.get(job_id).reason


@pytest.fixture
def make_live(tmp_path: Path) -> Iterator[Callable[..., Live]]:
    services: list[LiveService] = []
    stores: list[Store] = []

    def make(fleet: str = "4xA100-80GB", **config: Any) -> Live:
        clock = ManualClock(T0)
        store = Store(f"sqlite:///{tmp_path}/db.sqlite")
        store.migrate()
        stores.append(store)
        executor = FakeExecutor(exit_after_s=config.pop("exit_after_s", 0.0))
        scheduling = dataclasses.replace(LIVE_DEFAULTS, **config.pop("scheduling", {}))

        def reopen() -> LiveService:
            service = LiveService(
                LiveConfig(tmp_path / "state", scheduling, sample_s=0.0, host="h", **config),
                store,
                executor,
                FakeTelemetry(fleet),
                clock,
            )
            services.append(service)
            return service

        return Live(reopen(), store, clock, executor, reopen)

    yield make
    for s in services:
        s.stop()
    for st in stores:
        st.close()


def test_a_team_at_its_running_limit_waits_with_the_reason(make_live: Callable[..., Live]) -> None:
    live = make_live(scheduling={"team_limits": {"a": TeamLimits(2, 1)}})
    gpu = [live.submit() for _ in range(4)]
    cpu = live.submit(gpus=0)
    other = live.submit(team="b")
    live.step()
    mine = [*gpu, cpu]
    assert sum(live.state(j) == "running" for j in mine) == 2
    assert live.state(other) == "running"
    waiting = [j for j in mine if live.state(j) == "pending"]
    assert [live.reason(j) for j in waiting] == [
        "JobLimit: team a at its limit of 2 running jobs"
    ] * 3
    for _ in range(5):
        live.step()
    assert sum(live.state(j) == "running" for j in [*gpu, cpu]) == 2
    first = next(j for j in gpu if live.state(j) == "running")
    live.executor.finish(str(first))
    live.step()
    live.step()
    assert sum(live.state(j) == "running" for j in mine) == 2
    assert live.state(first) == "succeeded"


def test_cpu_only_jobs_stop_at_their_own_limit(make_live: Callable[..., Live]) -> None:
    live = make_live(scheduling={"team_limits": {"a": TeamLimits(max_cpu_jobs=1)}})
    cpu = [live.submit(gpus=0) for _ in range(3)]
    gpu = live.submit()
    live.step()
    assert [live.state(j) for j in cpu].count("running") == 1
    assert live.state(gpu) == "running"
    waiting = [j for j in cpu if live.state(j) == "pending"]
    assert {live.reason(j) for j in waiting} == {
        "CpuJobLimit: team a at its limit of 1 running CPU-only jobs"
    }


def test_a_job_past_its_time_limit_is_stopped_and_fails(make_live: Callable[..., Live]) -> None:
    live = make_live(exit_after_s=5.0, scheduling={"time_limit_s": {"batch": 7200.0}})
    own = live.submit(time_limit_s=4 * 3600.0)
    default = live.submit(kind="batch")
    live.step()
    assert live.state(own) == live.state(default) == "running"
    live.step(7200.0)
    assert live.state(default) == "preempting"
    assert live.reason(default) == "ran past its 2h time limit; stopping"
    assert ("cancel", str(default)) in live.executor.calls
    live.step(5.0)
    row = live.store.jobs.get(default)
    assert (row.state, row.reason) == ("failed", "ran past its 2h time limit")
    # a restart does not give the other job a fresh clock
    live.service.stop()
    live.service = live.reopen()
    assert live.state(own) == "running"
    live.step(4 * 3600.0 - 7206.0)  # a second short of four hours since it started
    assert live.state(own) == "running"
    live.step()
    assert live.state(own) == "preempting"
    assert live.reason(own) == "ran past its 4h time limit; stopping"


def test_hold_release_requeue_round_trip(make_live: Callable[..., Live]) -> None:
    live = make_live(fleet="1xA100-80GB")
    job = live.submit()
    held = live.service.operations.hold(job, "alice")
    assert held.held and held.reason == f"held by alice; `gpupool release {job}` lets it start"
    for _ in range(3):
        live.step()
    assert live.state(job) == "pending"
    live.service.stop()  # the hold outlives a restart
    live.service = live.reopen()
    live.step()
    assert live.state(job) == "pending"
    live.service.operations.release(job, "alice")
    live.step()
    assert live.state(job) == "running"
    with pytest.raises(ConflictError, match=rf"`gpupool requeue {job} --hold` stops it"):
        live.service.operations.hold(job, "alice")
    live.service.operations.requeue(job, "alice", hold=True)
    assert live.state(job) == "preempting"
    assert ("preempt", str(job)) in live.executor.calls
    live.step()
    row = live.store.jobs.get(job)
    assert row.state == "suspended" and row.held
    for _ in range(3):
        live.step()
    assert live.state(job) == "suspended"
    live.service.operations.release(job, "alice")
    live.step()
    row = live.store.jobs.get(job)
    assert (row.state, row.attempts) == ("running", 2)
    with pytest.raises(ConflictError, match="is not on hold"):
        live.service.operations.release(job, "alice")
    waiting = live.submit()
    live.step()
    with pytest.raises(ConflictError, match="waits in the queue already"):
        live.service.operations.requeue(waiting, "alice")


def test_drain_keeps_new_jobs_off_and_survives_a_restart(make_live: Callable[..., Live]) -> None:
    live = make_live(fleet="2xA100-80GB")
    running = live.submit()
    live.step()
    assert live.state(running) == "running"
    out = live.service.operations.drain(NODE, "root")
    assert out == {"node": NODE, "state": "draining", "changed": True}
    assert live.service.operations.drain(NODE, "root")["changed"] is False
    new = live.submit()
    for _ in range(3):
        live.step()
    assert live.state(new) == "pending" and live.state(running) == "running"
    live.executor.finish(str(running))
    live.step()
    assert live.state(running) == "succeeded"
    assert live.service.views.cluster_view()["nodes"][0]["state"] == "drained"
    live.service.stop()
    live.service = live.reopen()
    live.step()
    assert live.state(new) == "pending"  # still drained after the restart
    live.service.operations.drain(NODE, "root", undo=True)
    live.step()
    assert live.state(new) == "running"
    assert live.service.views.cluster_view()["nodes"][0]["state"] == "up"
    with pytest.raises(NotFoundError, match="node nope is not in this cluster"):
        live.service.operations.drain("nope", "root")


def test_old_jobs_and_events_are_purged_recent_ones_kept(make_live: Callable[..., Live]) -> None:
    live = make_live(fleet="8xA100-80GB", retention_s=30 * DAY, purge_batch=2)
    old = [live.submit() for _ in range(5)]
    live.step()
    for j in old:
        live.executor.finish(str(j))
    live.step()
    assert all(live.state(j) == "succeeded" for j in old)
    for j in old:
        assert live.service.config.run_dir(j).is_dir()
    live.store.events.add("note", "an old job-less event", live.clock.now())
    live.clock.advance(20 * DAY)
    recent = live.submit()
    pending = live.submit(gpu_model="H100")  # never runs here: fails as unplaceable
    live.step()
    live.executor.finish(str(recent))
    live.step()
    assert live.state(recent) == "succeeded" and live.state(pending) == "failed"
    live.clock.advance(10 * DAY + 60)
    for _ in range(6):  # two jobs (and two job-less events) a step
        live.step()
    for j in old:
        with pytest.raises(NotFoundError):
            live.store.jobs.get(j)
        assert not live.service.config.run_dir(j).exists()
        assert live.store.events.after(0, job_id=j) == []
    assert live.state(recent) == "succeeded"
    assert live.store.events.after(0, job_id=recent)
    kinds = [e.kind for e in live.store.events.after(0, limit=10_000)]
    assert "note" not in kinds
    # done: the next purge is an hour away; then the recent job goes too, once old enough
    assert live.clock.now() < live.service.state.next_purge <= live.clock.now() + 3600.0
    live.clock.advance(20 * DAY)
    live.step()
    with pytest.raises(NotFoundError):
        live.store.jobs.get(recent)


def test_a_real_process_past_its_time_limit_gets_sigterm_and_fails(tmp_path: Path) -> None:
    """LocalExecutor: the job's process is really signalled and the job really ends."""
    clock = ManualClock(T0)
    store = Store(f"sqlite:///{tmp_path}/db.sqlite")
    store.migrate()
    service = LiveService(
        LiveConfig(tmp_path / "state", LIVE_DEFAULTS, sample_s=0.0, host="h"),
        store,
        LocalExecutor(),
        FakeTelemetry("1xA100-80GB"),
        clock,
    )
    try:
        argv = (sys.executable, "-c", "import time; time.sleep(120)")
        job = NewJob("sleeper", "a", "training", 0, 1, argv, grace_s=30.0, time_limit_s=5.0)
        row, _ = store.jobs.submit(job, T0)
        service.step()
        assert store.jobs.get(row.id).state == "running"
        pid = store.jobs.get(row.id).pid
        assert pid is not None
        clock.advance(5.0)
        service.step()
        assert store.jobs.get(row.id).state == "preempting"
        deadline = time.monotonic() + 20
        while store.jobs.get(row.id).state == "preempting" and time.monotonic() < deadline:
            time.sleep(0.05)
            clock.advance(0.05)
            service.step()
        done = store.jobs.get(row.id)
        assert (done.state, done.reason) == ("failed", "ran past its 5s time limit")
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid)
    finally:
        service.stop()
        store.close()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True

"""The live service carries out what the one core decides: quota windows, the online
reserve, price deferral, power caps and their resets, thermal placement (fake fleet,
fake executor, manual clock, a real SQLite store)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.domain.quota import QuotaWindow, TeamQuota
from gpupool.policies.preemption import PreemptionRules
from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.scheduler.config import EnergyConfig, SchedulerConfig, ThermalConfig
from gpupool.server.loop.config import LIVE_DEFAULTS, LiveConfig
from gpupool.server.loop.driver import LiveService
from gpupool.server.store import NewJob, Store

HOUR = 3600.0


@dataclasses.dataclass
class Live:
    service: LiveService
    store: Store
    clock: ManualClock
    executor: FakeExecutor
    telemetry: FakeTelemetry

    def submit(self, team: str, kind: str = "training", gpus: int = 1, **kw: Any) -> int:
        job = NewJob(f"{team}-{kind}", team, kind, kw.pop("priority", 0), gpus, ("true",), **kw)
        row, _ = self.store.jobs.submit(job, self.clock.now())
        return row.id

    def step(self, dt_s: float = 1.0) -> None:
        self.clock.advance(dt_s)
        self.service.step()

    def state(self, job_id: int) -> str:
        return self.store.jobs.get(job_id).state

    def events(self, kind: str) -> list[str]:
        return [e.message for e in self.store.events.after(0, limit=10_000) if e.kind == kind]


@pytest.fixture
def live(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Live]:
    scheduling, fleet, start, inlet = request.param
    clock = ManualClock(start)
    store = Store(f"sqlite:///{tmp_path}/db.sqlite")
    store.migrate()
    telemetry = FakeTelemetry(fleet, inlet_c=inlet)
    executor = FakeExecutor()
    service = LiveService(
        LiveConfig(tmp_path / "state", scheduling, sample_s=0.0, host="h"),
        store,
        executor,
        telemetry,
        clock,
    )
    yield Live(service, store, clock, executor, telemetry)
    service.stop()


def cfg(**kw: Any) -> SchedulerConfig:
    return dataclasses.replace(LIVE_DEFAULTS, **kw)


TWO_TEAMS = (TeamQuota("day", {"A100-80GB": 4}, {}), TeamQuota("night", {}, {}))
NIGHT = QuotaWindow(0.0, 6 * HOUR, {"day": 0.0, "night": 1.0}, {"day": 0.0, "night": 1.0})
WINDOWED = cfg(teams=TWO_TEAMS, windows=(NIGHT,), preemption=PreemptionRules(0.0, 3))


@pytest.mark.parametrize("live", [(WINDOWED, "4xA100-80GB", 3 * HOUR, None)], indirect=True)
def test_a_night_window_gives_the_night_team_the_gpus(live: Live) -> None:
    """At 03:00 the window gives team night the whole pool and day nothing: day's job waits
    while night's runs; at 06:00 day's guarantee returns and it reclaims the GPUs."""
    day = live.submit("day", gpus=4)
    night = live.submit("night", gpus=4)
    live.step()
    assert (live.state(day), live.state(night)) == ("pending", "running")
    live.clock.t = 6 * HOUR
    for _ in range(3):
        live.step()
    # night's job checkpointed and left on SIGTERM; day's reclaimed the GPUs
    assert live.state(night) == "suspended"
    assert live.state(day) == "running"
    assert any("reclaim" in m for m in live.events("preempting"))


PRICED = cfg(
    teams=(TeamQuota("ml", {}, {}),),
    energy=EnergyConfig(tariff="guangdong-tou", price_aware=True, deferral_slot_s=900.0),
)


@pytest.mark.parametrize("live", [(PRICED, "4xA100-80GB", 22 * HOUR, None)], indirect=True)
def test_a_deadline_job_waits_for_the_cheap_hour_and_starts_before_its_deadline(
    live: Live,
) -> None:
    """At 22:00 (flat price) a 1-hour job due at 04:00 is held for the valley from 00:00."""
    job = live.submit("ml", duration_s=HOUR, deadline_at=28 * HOUR)
    live.step()
    row = live.store.jobs.get(job)
    assert row.state == "pending"
    assert row.reason.startswith("deferred until 00:00") and row.reason.endswith("(price)")
    assert any(m.startswith("deferred until 00:00") for m in live.events("deferred"))
    live.clock.t = 24 * HOUR - 60.0
    live.step()
    assert live.state(job) == "pending"
    for _ in range(3):
        live.step(60.0)
    row = live.store.jobs.get(job)
    assert row.state == "running"
    assert row.started_at is not None and 24 * HOUR <= row.started_at <= 28 * HOUR - HOUR


CAPPED = cfg(teams=(TeamQuota("ml", {}, {}),), energy=EnergyConfig(power_capping=True))


@pytest.mark.parametrize("live", [(CAPPED, "2xA100-80GB,2xH100", 0.0, None)], indirect=True)
def test_a_power_cap_is_applied_on_its_gpu_and_reset_when_the_job_leaves(live: Live) -> None:
    """Offline inference is memory-bound: its GPU's SM clock is locked while it runs and
    unlocked when it ends, on the GPU it ran on (not node 0's)."""
    job = live.submit("ml", "offline-inference", gpu_model="H100")
    live.step()
    row = live.store.jobs.get(job)
    assert row.state == "running" and row.node is not None and "H100" in row.node
    (device,) = [g for _, g in row.gpus]
    tele = live.service.tele_index[live.service.key_of[(row.node, device)]]
    locked = [c for c in live.telemetry.applied if c.gpu == tele]
    assert locked and locked[-1].locked_sm_mhz is not None
    assert all(c.gpu == tele for c in live.telemetry.applied)
    live.executor.finish(str(job))
    live.step()
    live.step()
    last = [c for c in live.telemetry.applied if c.gpu == tele][-1]
    assert last.is_reset, live.telemetry.applied
    messages = live.events("power-cap")
    assert any("locked" in m or "clock" in m for m in messages[:1]), messages
    assert "job left" in messages[-1]


HOT = cfg(
    teams=(TeamQuota("ml", {}, {}),),
    energy=EnergyConfig(thermal=ThermalConfig(aware=True, threshold_c=83.0)),
)


@pytest.mark.parametrize("live", [(HOT, "4xA100-80GB", 0.0, {0: 45.0, 1: 45.0})], indirect=True)
def test_gpus_reported_hot_are_avoided(live: Live) -> None:
    """GPUs 0 and 1 breathe 45 C air: two one-GPU jobs go to GPUs 2 and 3."""
    live.service.step()  # a first sample
    jobs = [live.submit("ml") for _ in range(2)]
    live.step()
    gpus = sorted(g for j in jobs for _, g in live.store.jobs.get(j).gpus)
    assert gpus == [2, 3]


class ExpectingExecutor(FakeExecutor):
    """Counts the loop's calls of expect_launch (LocalExecutor primes its cgroups)."""

    expected = 0

    def expect_launch(self) -> None:
        self.expected += 1


def test_a_woken_loop_tells_the_executor_a_launch_may_follow(tmp_path: Path) -> None:
    """Woken (a submit), the loop has the executor get ready before the step that may
    launch; a cycle that merely timed out does not."""
    store = Store(f"sqlite:///{tmp_path}/db.sqlite")
    store.migrate()
    executor = ExpectingExecutor()
    config = LiveConfig(tmp_path / "state", cfg(cycle_s=30.0), sample_s=0.0, host="h")
    service = LiveService(config, store, executor, FakeTelemetry("1xA100-80GB"), ManualClock(0.0))
    service.start()
    try:
        time.sleep(0.2)
        assert executor.expected == 0
        service.state.wake.set()
        deadline = time.monotonic() + 10
        while executor.expected == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert executor.expected == 1
    finally:
        service.stop()

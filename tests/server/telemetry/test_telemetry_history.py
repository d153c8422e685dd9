"""The live service's telemetry history: per-card bucket means from raw samples, pruned
oldest first by age and by a row cap, and a full disk or a failing write that costs the
bucket being written and never the scheduler loop. On SQLite and PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from gpupool.errors import SpecError
from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.server.loop.config import LiveConfig
from gpupool.server.loop.diskspace import FakeDisk
from gpupool.server.loop.driver import LiveService
from gpupool.server.store import GpuMinute, NewJob, ServiceMinute, Store, database_url
from gpupool.server.store.history import History
from gpupool.server.store.nodes import Nodes
from gpupool.server.telemetry.history import (
    HistoryConfig,
    MinuteMeans,
    TelemetryHistory,
    parse_history,
)
from pgserver import fresh_schema, pg_url  # noqa: F401

T0 = 1_800_000_000.0  # a whole minute


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return database_url(None, tmp_path / "state")
    return fresh_schema(request.getfixturevalue("pg_url"))


def test_minute_means_are_the_means_of_the_raw_samples() -> None:
    means = MinuteMeans(60.0)
    for t in range(150):  # 2.5 minutes of 1 s samples on two cards
        means.add("n/0", T0 + t, 1000.0 + t, float(t % 60), 100.0 + t, 40.0)
        means.add("n/1", T0 + t, 0.0, 0.0)
    assert means.closed(T0 + 59.5) == []
    rows = means.closed(T0 + 120.0)
    assert [(r.gpu_id, r.t_s) for r in rows] == [
        ("n/0", T0),
        ("n/1", T0),
        ("n/0", T0 + 60),
        ("n/1", T0 + 60),
    ]
    first, second = rows[0], rows[2]
    assert first.samples == 60 and first.period_s == 60.0
    assert first.mem_used_mib == pytest.approx(1000 + 29.5)
    assert first.sm_util_pct == pytest.approx(29.5)
    assert first.power_w == pytest.approx(100 + 29.5) and first.temp_c == 40.0
    assert second.mem_used_mib == pytest.approx(1000 + 89.5)
    assert rows[1].power_w is None and rows[1].temp_c is None  # never reported
    assert means.closed(T0 + 120.0) == []  # written once
    assert [k for k in means.open] == [(T0 + 120, "n/0"), (T0 + 120, "n/1")]  # still open


def test_the_row_cap_follows_the_fleet_and_the_retention_below_a_hard_cap() -> None:
    cfg = HistoryConfig()
    assert cfg.row_cap(8) == 8 * (45 * 1440 + 1)
    assert HistoryConfig(max_rows=100_000).row_cap(8) == 100_000
    assert parse_history({"bucket_s": 2, "retention_days": 1}, "f.yaml").row_cap(1) == 43_201
    with pytest.raises(SpecError, match="unknown key"):
        parse_history({"bucket": 60}, "f.yaml")
    with pytest.raises(SpecError, match="positive"):
        parse_history({"bucket_s": 0}, "f.yaml")


def _rows(gpus: int, buckets: int) -> list[GpuMinute]:
    return [
        GpuMinute(f"n/{g}", T0 + 60 * b, 60.0, 60, 100.0 * b, float(g), 300.0, 50.0)
        for b in range(buckets)
        for g in range(gpus)
    ]


def test_history_round_trip_and_pruning_oldest_first(url: str) -> None:
    with Store(url) as store:
        store.migrate()
        for b in range(10):  # one batch per bucket, as the service writes them
            store.history.add(
                [r for r in _rows(2, 10) if r.t_s == T0 + 60 * b],
                [ServiceMinute("chat", T0 + 60 * b, 60.0, 50.0 + b, 10.0, 1)],
            )
        assert store.history.rows() == (20, 10)
        got = store.history.gpu_minutes(T0 + 120, T0 + 240)
        assert [(r.gpu_id, r.t_s) for r in got] == [
            ("n/0", T0 + 120),
            ("n/1", T0 + 120),
            ("n/0", T0 + 180),
            ("n/1", T0 + 180),
        ]
        assert got[0] == _rows(2, 10)[4]
        assert [s.p99_ms for s in store.history.service_minutes(T0 + 540)] == [59.0]
        # retention: what began before T0+180 goes, 3 rows at a time
        p = store.history.prune(T0 + 180, 1000, 1000, batch=3)
        assert (p.gpu_rows, p.service_rows, p.more) == (3, 3, True)
        assert min(r.t_s for r in store.history.gpu_minutes()) == T0 + 60  # n/1 of the first left
        p = store.history.prune(T0 + 180, 1000, 1000, batch=3)
        assert (p.gpu_rows, p.service_rows, p.more) == (3, 0, False)
        assert store.history.rows() == (14, 7)
        assert min(r.t_s for r in store.history.gpu_minutes()) == T0 + 180
        # the row cap: the oldest beyond it go, whatever their age
        p = store.history.prune(T0, 10, 5, batch=100)
        assert (p.gpu_rows, p.service_rows, p.more) == (4, 2, False)
        assert [r.t_s for r in store.history.gpu_minutes()][:2] == [T0 + 300, T0 + 300]
        assert [s.t_s for s in store.history.service_minutes()] == [
            T0 + 60 * b for b in range(5, 10)
        ]


class FailingHistory(History):
    """History whose writes fail while `failing` (a disk I/O error, say)."""

    failing = False

    def add(self, *args: Any, **kwargs: Any) -> None:
        if self.failing:
            raise OperationalError("INSERT", {}, Exception("disk I/O error"))
        super().add(*args, **kwargs)


class FailingStore(Store):
    """A store whose history writes fail while `history.failing`."""

    history: FailingHistory

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.history = FailingHistory(self.db)


def _rig(url: str, tmp_path: Path) -> tuple[FailingStore, LiveService, ManualClock, FakeDisk]:
    store = FailingStore(url)
    store.migrate()
    clock, disk = ManualClock(T0), FakeDisk()
    telemetry = FakeTelemetry("2xA100-80GB")
    live = LiveService(
        LiveConfig(
            state_dir=tmp_path / "live", sample_s=0.0, host="h", history=HistoryConfig(10.0)
        ),
        store,
        FakeExecutor(),
        telemetry,
        clock,
        disk=disk,
    )
    return store, live, clock, disk


def test_a_failing_history_write_costs_its_bucket_and_not_the_loop(
    url: str, tmp_path: Path
) -> None:
    store, live, clock, disk = _rig(url, tmp_path)
    try:
        assert [g.gpu_id for g in store.nodes.fleet()] == ["h/A100-80GB/0", "h/A100-80GB/1"]
        job = NewJob("train", "t", "training", 50, 1, ("python", "train.py"))
        job_id = store.jobs.submit(job, clock.now())[0].id
        cycles = 0

        def run(seconds: int) -> None:
            nonlocal cycles
            for _ in range(seconds):
                clock.advance(1.0)
                live.step()
                cycles += 1

        run(20)  # buckets T0 and T0+10 written
        assert store.jobs.get(job_id).state == "running"
        store.history.failing = True
        run(10)  # the bucket T0+20 fails
        assert live.history.dropped == 1 and "disk I/O error" in (live.history.error or "")
        store.history.failing = False
        disk.free_bytes = 0  # then the disk fills: bucket T0+30 is not even tried
        run(10)
        assert live.history.dropped == 2 and "DiskFull" in (live.history.error or "")
        disk.free_bytes = 100 << 30
        run(20)
        assert live.health.errors == 0  # no stage of the loop failed for it
        assert cycles == 60 and live.history.error is None
        starts = sorted({r.t_s for r in store.history.gpu_minutes()})
        assert starts == [T0, T0 + 10, T0 + 40, T0 + 50]  # only the failed buckets are gone
        busy = [r for r in store.history.gpu_minutes() if r.gpu_id == "h/A100-80GB/0"]
        assert [r.samples for r in busy] == [9, 10, 10, 10]  # the loop began at T0+1
        # started in the cycle of T0+1, after its sample: busy in 8 of the 9
        assert busy[0].sm_util_pct == pytest.approx(800 / 9)
        assert busy[1].sm_util_pct == 100.0 and busy[1].mem_used_mib == 1024.0
        assert store.jobs.get(job_id).state == "running"  # scheduling went on throughout
    finally:
        live.stop()
        store.close()


class FullAtStartNodes(Nodes):
    """Nodes whose first fleet record fails, as on a disk full when the service starts."""

    refused = 0

    def record_fleet(self, *args: Any, **kwargs: Any) -> None:
        if not self.refused:
            self.refused += 1
            raise OperationalError("INSERT", {}, Exception("database or disk is full"))
        super().record_fleet(*args, **kwargs)


class FullAtStart(Store):
    """A store whose first fleet record fails (`nodes.refused` counts it)."""

    nodes: FullAtStartNodes

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.nodes = FullAtStartNodes(self.db)


def test_a_fleet_not_recorded_at_start_is_recorded_with_the_first_bucket(
    url: str, tmp_path: Path
) -> None:
    store = FullAtStart(url)
    store.migrate()
    clock = ManualClock(T0)
    live = LiveService(  # starts all the same
        LiveConfig(state_dir=tmp_path / "live", sample_s=0.0, host="h", history=HistoryConfig(5)),
        store,
        FakeExecutor(),
        FakeTelemetry("1xA100-80GB"),
        clock,
        disk=FakeDisk(),
    )
    try:
        assert store.nodes.refused == 1 and store.nodes.fleet() == []
        for _ in range(6):
            clock.advance(1.0)
            live.step()
        assert [g.gpu_id for g in store.nodes.fleet()] == ["h/A100-80GB/0"]
        assert store.settings.get("review")["bucket_s"] == 5.0
        assert len(store.history.gpu_minutes()) == 1
    finally:
        live.stop()
        store.close()


@pytest.mark.parametrize(("max_rows", "kept"), [(15, 15), (1000, 22)])
def test_the_writer_keeps_the_history_within_its_cap_and_retention(
    url: str, max_rows: int, kept: int
) -> None:
    """1-s buckets of two cards kept 10 s: the retention keeps the buckets that begin at
    most 10 s before the newest (11 buckets, 22 rows: the derived cap), a cap of 15 rows
    the newest 15, whichever is fewer; never more after a write."""
    cfg = HistoryConfig(bucket_s=1.0, retention_days=10 / 86_400, max_rows=max_rows)
    telemetry = FakeTelemetry("2xA100-80GB")
    with Store(url) as store:
        store.migrate()
        history = TelemetryHistory(cfg, store, {0: "n/0", 1: "n/1"})
        for t in range(40):  # bounded: 40 buckets
            history.step(T0 + t, telemetry.sample(T0 + t), {})
            assert store.history.rows()[0] <= min(max_rows, 22)
        assert history.written == 39 and history.dropped == 0
        rows = store.history.gpu_minutes()
        assert len(rows) == kept
        newest = [(T0 + b, f"n/{g}") for b in range(38, 27, -1) for g in (1, 0)][:kept]
        assert sorted((r.t_s, r.gpu_id) for r in rows) == sorted(newest)

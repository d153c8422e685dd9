"""The live service's database as a review source.

A real `gpupool serve` (fake fleet of 6 A100-80GB, loopback only, 2-s history buckets so
that a test's minute is 2 s) runs the planted jobs as real processes, each declaring what
it uses of its card to the fake fleet (GPUPOOL_FAKE_USE): `idle-holder` holds a card and
never touches it, `pair-a` and `pair-b` use 40 % SM and 30 GiB each (together one card),
`over-asker` holds a whole 80 GiB card and peaks at 15 GiB. The service `drifty` is the
example chat replica, driven by the test: requests of 30 ms, then from a known moment on
55 ms; the replica's histogram puts them in the 25-50 ms and 50-75 ms buckets (20 ms of
margin for a loaded host), so its p99 reads 49.75 ms, then 74.75 ms. The server is
stopped and the review is read from the database alone (`review_from_db`), then built
(`build_review`): it reconciles exactly and names the planted jobs and the service.
"""

from __future__ import annotations

import csv
import math
import sqlite3
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from gpupool.errors import GpupoolError
from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.reports.review import build_review
from gpupool.reports.review_data import Allocation, DownInterval, ReviewData
from gpupool.server.loop.config import LiveConfig
from gpupool.server.loop.diskspace import FakeDisk
from gpupool.server.loop.driver import LiveService
from gpupool.server.review_source import review_from_db
from gpupool.server.store import NewJob, Store, database_url
from gpupool.server.telemetry.history import HistoryConfig
from pgserver import fresh_schema, pg_url  # noqa: F401
from service_proc import HTTP, Server, wait_for

CONFIG = """\
teams:
  - {name: ml}
  - {name: web}
online_reserve: 0
energy: {tariff: caiso-2024}
history: {bucket_s: 2}
"""
USE = {  # job -> GPUPOOL_FAKE_USE (SM %, memory MiB of its card)
    "idle-holder": "0,0",
    "pair-a": "40,30720",
    "pair-b": "40,30720",
    "over-asker": "70,15360",
}
REPLICA = ("--slots", "8", "--ms-per-token", "1", "--min-ms", "1", "--max-ms", "1000")
"""The chat replica answering `tokens` ms a request (the test picks them)."""
PHASE_S = 30.0
"""Each latency level lasts this long: 15 buckets of 2 s, more than the review's 6 with room
for the buckets a loaded host writes late or mixes at the edge (at 18 s, 9 buckets, the
drift went unseen once in CI)."""


SPLIT = ("capacity", "allocated", "idle", "down")


def iso(t_s: int) -> str:
    return datetime.fromtimestamp(t_s, UTC).strftime("%Y-%m-%dT%H:%M:%S+00:00")


def table(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


def drive(url: str, tokens: int, until: float) -> int:
    """Requests of `tokens` ms to the replica, one after another, until `until`."""
    sent = 0
    with httpx.Client(timeout=5.0) as http:
        while time.monotonic() < until and sent < 2000:  # bounded in count and time
            http.get(f"{url}/generate", params={"tokens": tokens}).raise_for_status()
            sent += 1
    return sent


@pytest.mark.slow
@pytest.mark.serial  # its latencies are the replica's, not those of a host busy with other tests
def test_a_live_run_reviews_from_its_database(tmp_path: Path) -> None:
    (tmp_path / "service.yaml").write_text(CONFIG, encoding="utf-8")
    state = tmp_path / "state"
    server = Server(
        state,
        "--fake-gpus",
        "6xA100-80GB",
        "--auth",
        "none",
        "--config",
        str(tmp_path / "service.yaml"),
        "--cycle",
        "0.5",
        "--sample",
        "0.25",
        "--scrape",
        "0.5",
    ).start()
    try:
        api = server.url
        made = HTTP.post(
            f"{api}/v1/services",
            json={
                "name": "drifty",
                "team": "web",
                "min_replicas": 1,
                "max_replicas": 1,
                "command": [sys.executable, "-m", "gpupool.examples.chat_replica", *REPLICA],
                "grace_s": 2,
            },
            timeout=10,
        )
        assert made.status_code in (200, 201), made.text
        for name, use in USE.items():
            sent = HTTP.post(
                f"{api}/v1/jobs",
                json={
                    "name": name,
                    "team": "ml",
                    "command": [sys.executable, "-c", "import time; time.sleep(120)"],
                    "env": {"GPUPOOL_FAKE_USE": use},
                    "grace_s": 1,
                },
                timeout=10,
            )
            assert sent.status_code in (200, 201), sent.text
        waits = HTTP.post(  # two cards where one is free: it waits for Resources
            f"{api}/v1/jobs",
            json={"name": "waiter", "team": "ml", "gpus": 2, "command": ["true"]},
            timeout=10,
        )
        assert waits.status_code in (200, 201), waits.text

        def replica_url() -> str | None:
            seen = HTTP.get(f"{api}/v1/services/drifty", timeout=5).json()
            ready = [r["url"] for r in seen["replicas"] if r["ready"]]
            return ready[0] if ready else None

        wait_for(lambda: replica_url() is not None, 30, "drifty's replica to serve")
        wait_for(
            lambda: all(
                j["state"] == "running"
                for j in HTTP.get(f"{api}/v1/jobs", timeout=5).json()["jobs"]
                if j["name"] in USE
            ),
            30,
            "the planted jobs to run",
        )
        replica = replica_url()
        assert replica is not None
        started = time.monotonic()
        sent = drive(replica, 30, started + PHASE_S)
        step_s = time.time()  # from here on the replica answers in 55 ms
        sent += drive(replica, 55, time.monotonic() + PHASE_S)
        assert sent > 300
        time.sleep(3.0)  # the last bucket closes and is written
        ids = [j["id"] for j in HTTP.get(f"{api}/v1/jobs", timeout=5).json()["jobs"]]
        for job_id in sorted(ids, key=lambda i: i != waits.json()["id"]):  # waiting first
            HTTP.post(f"{api}/v1/jobs/{job_id}/cancel", timeout=10)
        HTTP.delete(f"{api}/v1/services/drifty", timeout=10).raise_for_status()
        wait_for(
            lambda: all(
                j["state"] in ("cancelled", "succeeded", "failed")
                for j in HTTP.get(f"{api}/v1/jobs", timeout=5).json()["jobs"]
            ),
            30,
            "every job to end",
        )
    finally:
        server.stop()

    url = database_url(None, state)
    data = review_from_db(url, None, None)
    ReviewData.from_json(data.to_json())  # a record the report can write and read back
    assert len(data.gpus) == 6 and {g.gpu_type for g in data.gpus} == {"A100-80GB"}
    assert {g.mem_total_mib for g in data.gpus} == {80691}  # NVML's, as the fake fleet has it
    assert {t.team for t in data.teams} == {"ml", "web"}
    assert data.tariff is not None and data.tariff.name == "caiso-2024"
    assert data.gpu_price_per_hour["A100-80GB"] > 0

    jobs = {j.job_id: j for j in data.jobs}
    assert set(USE) <= set(jobs)
    replicas = [j for j in data.jobs if j.service == "drifty"]
    assert len(replicas) == 1 and replicas[0].kind == "online-inference"
    cards: dict[str, str] = {}
    for name in [*USE, replicas[0].job_id]:
        mine = [a for a in data.allocations if a.job_id == name]
        assert len(mine) == 1, (name, mine)  # one run, on one whole card
        assert mine[0].share_milli == 1000
        assert mine[0].start_s == pytest.approx(jobs[name].first_start_s)
        assert mine[0].end_s == pytest.approx(jobs[name].end_s)  # cancelled: the card freed
        assert jobs[name].state == "cancelled"
        cards[name] = mine[0].gpu_id
    assert len(set(cards.values())) == 5

    waiter = jobs["waiter"]
    assert waiter.first_start_s is None and waiter.state == "cancelled"  # while waiting
    assert waiter.end_s is not None and not any(a.job_id == "waiter" for a in data.allocations)
    waited = waiter.end_s - waiter.submit_s
    assert waited > 2 * PHASE_S
    assert waiter.wait_s_by_reason["Resources"] > 0.95 * waited
    assert sum(waiter.wait_s_by_reason.values()) == pytest.approx(waited)

    def measured(name: str) -> list[tuple[float, float]]:
        """(SM %, memory MiB) of the buckets wholly inside the job's run."""
        a = next(a for a in data.allocations if a.job_id == name)
        return [
            (u.sm_util_pct, u.mem_used_mib)
            for u in data.usage
            if u.gpu_id == a.gpu_id and u.t_s >= a.start_s and u.t_s + u.period_s <= a.end_s
        ]

    assert len(measured("idle-holder")) >= 15
    assert set(measured("idle-holder")) == {(0.0, 0.0)}
    assert set(measured("pair-a")) == {(40.0, 30720.0)}
    assert set(measured("over-asker")) == {(70.0, 15360.0)}
    assert {u.period_s for u in data.usage} == {2.0}

    p99 = [(s.t_s, s.p99_ms) for s in data.latency if s.service == "drifty"]
    before = [v for t, v in p99 if t + 2.0 <= step_s]
    after = [v for t, v in p99 if t >= step_s + 2.0]
    assert len(before) >= 6 and len(after) >= 6
    # Every request after the step took over 50 ms: each bucket's p99 is >= 74.75 ms (the
    # 50-75 ms bucket, interpolated), and a bucket without a late request reads exactly that.
    assert min(after) == pytest.approx(74.75) and statistics.median(after) >= 74.7
    assert min(before) == pytest.approx(49.75) and statistics.median(before) <= 50.0

    review = build_review(data)
    rec = review.reconciliation
    assert rec.allocated + rec.idle + rec.down == rec.capacity
    assert sum(v for _, v in rec.by_team) == rec.allocated
    assert {t for t, _ in rec.by_team} >= {"ml", "web"}
    kinds: dict[str, set[tuple[str, ...]]] = {}
    for r in review.recommendations:
        kinds.setdefault(r.kind, set()).add(r.subjects)
    assert ("idle-holder",) in kinds["never-used"]
    assert ("pair-a", "pair-b") in kinds["share-a-card"]
    assert ("over-asker",) in kinds["right-size"]
    assert ("drifty",) in kinds["latency-drift"]
    assert (cards["idle-holder"],) in kinds["reclaimable-card"]

    # The same through the command line, on whole seconds: its CSVs reconcile exactly.
    lo, hi = math.floor(data.start_s), math.ceil(data.end_s)
    out = tmp_path / "review"
    done = subprocess.run(
        [sys.executable, "-m", "gpupool", "report", "--db", url, "--from", iso(lo),
         "--to", iso(hi), "--html", str(tmp_path / "review.html"), "--csv", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    gpus = table(out / "reconciliation_gpus.csv")
    split = {k: sum(int(r[f"{k}_mgpu_ms"]) for r in gpus) for k in SPLIT}
    assert split["capacity"] == 6 * (hi - lo) * 1000 * 1000  # milli-GPU x ms
    assert split["allocated"] + split["idle"] + split["down"] == split["capacity"]
    assert sum(int(r["allocated_mgpu_ms"]) for r in table(out / "teams.csv")) == split["allocated"]
    said = {(r["kind"], r["subjects"]) for r in table(out / "recommendations.csv")}
    assert {
        ("never-used", "idle-holder"),
        ("share-a-card", "pair-a pair-b"),
        ("right-size", "over-asker"),
        ("latency-drift", "drifty"),
    } <= said
    html = (tmp_path / "review.html").read_text(encoding="utf-8")
    assert all(name in html for name in (*USE, "drifty"))


def test_a_database_without_the_gpupool_schema_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x INTEGER)")
    with pytest.raises(GpupoolError, match="no gpupool schema"):
        review_from_db(f"sqlite:///{other}", None, None)
    with pytest.raises(GpupoolError, match="no such database file"):
        review_from_db(f"sqlite:///{tmp_path / 'missing.db'}", None, None)


T0 = 1_800_000_000.0


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return database_url(None, tmp_path / "db")
    return fresh_schema(request.getfixturevalue("pg_url"))


def test_runs_down_time_waits_and_lost_work_come_from_the_events(url: str, tmp_path: Path) -> None:
    """In process, on a manual clock: job `a` (checkpoints every 30 s) runs on card 0 from
    T0+1; at T0+46 card 0 fails: that card alone is out, `a` is evicted (reaped at T0+47,
    46 s into its run: 16 s since its last checkpoint lost) and resumes at once on card 1;
    card 0 is repaired at T0+60 and back at T0+61; `b`, which waits for two cards since T0,
    runs from T0+81, when `a` ended. On SQLite and PostgreSQL."""
    store = Store(url)
    store.migrate()
    clock, telemetry, executor = ManualClock(T0), FakeTelemetry("2xA100-80GB"), FakeExecutor()
    live = LiveService(
        LiveConfig(state_dir=tmp_path / "live", sample_s=0.0, host="h", history=HistoryConfig(10)),
        store,
        executor,
        telemetry,
        clock,
        disk=FakeDisk(),
    )
    store.jobs.submit(NewJob("a", "t", "training", 50, 1, ("x",), checkpoint_every_s=30.0), T0)
    store.jobs.submit(NewJob("b", "u", "training", 50, 2, ("x",)), T0)

    def run(seconds: int) -> None:
        for _ in range(seconds):  # bounded: one cycle a second of the manual clock
            clock.advance(1.0)
            live.step()

    try:
        run(45)
        telemetry.fail_gpu(0)
        run(15)
        telemetry.repair(0)
        run(20)
        assert list(executor.handles()) == ["1"]  # on card 1; card 0 idles, back in the pool
        executor.finish("1")
        run(10)
    finally:
        live.stop()
        store.close()
    data = review_from_db(url, T0, T0 + 90)
    card0, card1 = "h/A100-80GB/0", "h/A100-80GB/1"
    assert [g.gpu_id for g in data.gpus] == [card0, card1]
    assert data.allocations == (
        Allocation("a", card0, T0 + 1, T0 + 47),
        Allocation("a", card1, T0 + 47, T0 + 81),
        Allocation("b", card0, T0 + 81, T0 + 90),  # still running: up to the period's end
        Allocation("b", card1, T0 + 81, T0 + 90),
    )
    assert data.down == (DownInterval(card0, T0 + 46, T0 + 61, "unhealthy"),)
    a, b = sorted(data.jobs, key=lambda j: j.job_id)
    assert (a.state, a.end_s, a.lost_gpu_s, a.first_start_s) == ("succeeded", T0 + 81, 16.0, T0 + 1)
    assert a.wait_s_by_reason == {"Queued": 1.0}  # resumed on card 1 as it was reaped
    assert (b.state, b.lost_gpu_s, b.first_start_s) == ("running", 0.0, T0 + 81)
    assert b.wait_s_by_reason == {"Queued": 1.0, "Resources": 80.0}
    assert [u.t_s for u in data.usage if u.gpu_id == card1] == [T0 + 10 * k for k in range(9)]
    rec = build_review(data).reconciliation
    assert rec.allocated + rec.idle + rec.down == rec.capacity == 2 * 90 * 1000 * 1000
    assert (
        dict(rec.by_team).keys() == {"t", "u"} and sum(dict(rec.by_team).values()) == rec.allocated
    )

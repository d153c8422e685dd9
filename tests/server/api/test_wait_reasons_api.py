"""Why a job waits, through the REST API (FastAPI's TestClient on create_app, a real
SQLite store, a fake executor and fleet, a manual clock): every job carries `reason` and
`reason_code`; `gpupool why` prints the code and the sentence."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpupool.cli.render import job_table, why_text
from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.scheduler.cycle.wait_reasons import clock_text
from gpupool.server.api.app import create_app
from gpupool.server.loop.config import LIVE_DEFAULTS, LiveConfig
from gpupool.server.loop.driver import LiveService
from gpupool.server.store import NewJob, Store, database_url
from head_schema import at_head

T0 = 1_000.0


@dataclasses.dataclass
class Api:
    service: LiveService
    clock: ManualClock
    client: TestClient

    def step(self) -> None:
        self.clock.advance(1.0)
        self.service.step()

    def submit(self, **spec: Any) -> int:
        r = self.client.post("/v1/jobs", json={"command": ["python", "x.py"], **spec})
        assert r.status_code == 201, r.text
        return int(r.json()["id"])

    def job(self, job_id: int) -> dict[str, Any]:
        r = self.client.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    yield from serving(tmp_path)


def serving(tmp_path: Path, reservations: bool = False) -> Iterator[Api]:
    """A service over a real SQLite store, a fake fleet of 2 A100-80GB and a manual clock;
    no online reserve."""
    store = Store(at_head(database_url(None, tmp_path / "db")))
    store.migrate()
    clock = ManualClock(T0)
    config = dataclasses.replace(LIVE_DEFAULTS, online_reserve=0.0, reservations=reservations)
    service = LiveService(
        LiveConfig(tmp_path / "state", config, sample_s=0.0, host="h"),
        store,
        FakeExecutor(),
        FakeTelemetry("2xA100-80GB"),
        clock,
    )
    with TestClient(create_app(service, store, auth=False)) as client:
        yield Api(service, clock, client)
    service.stop()
    store.close()


def test_a_waiting_job_has_a_reason_code_and_a_sentence_with_numbers(api: Api) -> None:
    running = api.submit(gpus=1, team="ml")
    api.step()
    big = api.submit(gpus=2, team="ml", priority="high")
    behind = api.submit(gpus=2, team="ml")
    api.step()
    assert api.job(running)["state"] == "running"
    assert api.job(running)["reason_code"] == ""
    assert (
        why_text(api.job(running)) == f"job {running} is running; nothing holds it back (started)"
    )
    job = api.job(big)
    assert job["state"] == "pending" and job["reason_code"] == "Resources"
    assert job["reason"] == (
        "Resources: needs 2 A100-80GB GPUs on one node, largest free block 1 (1 free in the pool)"
    )
    assert why_text(job) == (
        f"job {big} pending: Resources\n"
        "  needs 2 A100-80GB GPUs on one node, largest free block 1 (1 free in the pool)"
    )
    job = api.job(behind)
    assert job["reason_code"] == "Priority"
    assert job["reason"].endswith(f"(first: {big})")
    # ls shows the code, not the whole sentence
    table = job_table([api.job(big), api.job(behind)], T0)
    assert "Resources" in table and "largest free block" not in table


def test_a_held_job_says_held_and_gets_its_reason_back_once_released(api: Api) -> None:
    api.submit(gpus=2, team="ml")
    job = api.submit(gpus=1, team="ml")
    api.step()
    assert api.job(job)["reason_code"] == "Resources"
    assert api.client.post(f"/v1/jobs/{job}/hold").status_code == 200
    api.step()
    held = api.job(job)
    assert held["reason_code"] == "Held" and held["reason"].startswith("held by")
    assert why_text(held).startswith(f"job {job} pending: Held\n  held by")
    assert api.client.post(f"/v1/jobs/{job}/release").status_code == 200
    api.step()
    assert api.job(job)["reason_code"] == "Resources"


def test_a_job_no_pool_can_run_ends_unplaceable(api: Api) -> None:
    # written to the store directly: the API may refuse such a request at submit
    row, _ = api.service.store.jobs.submit(
        NewJob(
            name="x",
            team="ml",
            kind="training",
            priority=0,
            gpu_count=1,
            command=("true",),
            gpu_model="H100-80GB",
        ),
        T0,
    )
    api.step()
    ended = api.job(row.id)
    assert ended["state"] == "failed" and ended["reason_code"] == "Unplaceable"
    assert why_text(ended).startswith(f"job {row.id} failed: Unplaceable\n  cannot run here")


def test_a_blocked_wide_job_holds_a_reservation_that_why_shows(tmp_path: Path) -> None:
    """With `reservations: true`: a 2-GPU job behind a running 1-GPU job of 10 min keeps
    both GPUs from when that job is expected to end; the idle one stays idle for it
    (draining) except for a job that ends before then, which takes it (no longer
    draining: told at once, not after the reasons' refresh)."""
    for api in serving(tmp_path, reservations=True):
        first = api.submit(gpus=1, team="ml", duration_s=600)
        api.step()
        wide = api.submit(gpus=2, team="ml", duration_s=60)
        api.step()
        held = api.job(wide)
        assert held["reason_code"] == "Reserved", held
        ends = T0 + 1.0 + 600  # the first job started at the first step
        # the node's name in the fake fleet is host/model; the idle GPU is kept for it
        kept = f"Reserved: 2 A100-80GB GPUs on h/A100-80GB from {clock_text(ends)}"
        assert held["reason"] == f"{kept}, draining", held
        assert why_text(held).startswith(f"job {wide} pending: Reserved\n  2 A100-80GB GPUs on")
        long_one = api.submit(gpus=1, team="ml", duration_s=3600)
        short_one = api.submit(gpus=1, team="ml", duration_s=120)
        api.step()
        api.step()
        assert api.job(first)["state"] == "running"
        assert api.job(short_one)["state"] == "running"  # it leaves before the wide job
        assert api.job(long_one)["state"] == "pending"
        assert api.job(wide)["reason"] == kept

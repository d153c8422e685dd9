"""Fair share inside a team outlives a restart: the server reads each user's GPU use back
from the runs that ended (a real SQLite store, a fake executor and fleet, a manual clock)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.server.api.app import create_app
from gpupool.server.loop.config import LIVE_DEFAULTS, LiveConfig
from gpupool.server.loop.driver import LiveService
from gpupool.server.store import Store, database_url


def server(tmp_path: Path, store: Store, clock: ManualClock) -> tuple[LiveService, FakeExecutor]:
    executor = FakeExecutor()
    service = LiveService(
        LiveConfig(tmp_path / "state", LIVE_DEFAULTS, sample_s=0.0, host="h"),
        store,
        executor,
        FakeTelemetry("1xA100-80GB"),
        clock,
    )
    return service, executor


def submit(client: TestClient, user: str) -> int:
    body: dict[str, Any] = {"command": ["python", "x.py"], "team": "ml", "user": user}
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def step(service: LiveService, clock: ManualClock, seconds: float = 1.0) -> None:
    clock.advance(seconds)
    service.step()


def test_a_users_past_use_still_counts_after_a_restart(tmp_path: Path) -> None:
    """One GPU. Alice's job runs an hour and ends; the server restarts; alice queues a job,
    then bob: bob's goes first (alice's hour is remembered). Without the store's record a
    restarted server would start both users at zero and alice's older job first."""
    store = Store(database_url(None, tmp_path / "db"))
    store.migrate()
    clock = ManualClock(1_000.0)
    first, executor = server(tmp_path, store, clock)
    with TestClient(create_app(first, store, auth=False)) as client:
        ran = submit(client, "alice")
        step(first, clock)
        assert client.get(f"/v1/jobs/{ran}").json()["state"] == "running"
        step(first, clock, 3600.0)
        executor.finish(str(ran), 0)
        step(first, clock)
        assert client.get(f"/v1/jobs/{ran}").json()["state"] == "succeeded"
    first.stop()

    second, executor = server(tmp_path, store, clock)
    with TestClient(create_app(second, store, auth=False)) as client:
        hold = submit(client, "carol")  # takes the GPU while the other two queue
        step(second, clock)
        alice, bob = submit(client, "alice"), submit(client, "bob")
        step(second, clock)
        assert client.get(f"/v1/jobs/{hold}").json()["state"] == "running"
        executor.finish(str(hold), 0)
        step(second, clock)
        step(second, clock)
        states = {j: client.get(f"/v1/jobs/{j}").json()["state"] for j in (alice, bob)}
        assert states == {alice: "pending", bob: "running"}, states
    second.stop()
    store.close()

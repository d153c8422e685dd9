"""The online reserve that holds once online inference was seen (`online_reserve_on:
online-seen`, the server's default) still holds after the server restarts, when the online
work it saw has ended (a real SQLite store, a fake executor and fleet, a manual clock)."""

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

TRAINING = {"team": "ml", "kind": "training", "gpus": 1, "state_gib_per_gpu": 40}
"""Training that checkpoints 40 GiB a GPU: it cannot leave within a cycle, so it may not
take the GPU the reserve keeps for online work."""


def server(tmp_path: Path, store: Store, clock: ManualClock) -> tuple[LiveService, FakeExecutor]:
    executor = FakeExecutor()
    service = LiveService(
        LiveConfig(tmp_path / "state", LIVE_DEFAULTS, sample_s=0.0, host="h"),
        store,
        executor,
        FakeTelemetry("4xA100-80GB"),
        clock,
    )
    return service, executor


def submit(client: TestClient, **spec: Any) -> int:
    r = client.post("/v1/jobs", json={"command": ["python", "x.py"], **spec})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def run_cycles(service: LiveService, clock: ManualClock, n: int = 3) -> None:
    for _ in range(n):
        clock.advance(1.0)
        service.step()


def test_the_reserve_once_online_work_was_seen_outlives_a_restart(tmp_path: Path) -> None:
    assert LIVE_DEFAULTS.online_reserve_on == "online-seen" and LIVE_DEFAULTS.online_reserve > 0
    store = Store(database_url(None, tmp_path / "db"))
    store.migrate()
    clock = ManualClock(1_000.0)
    first, executor = server(tmp_path, store, clock)
    with TestClient(create_app(first, store, auth=False)) as client:
        online = submit(client, team="web", kind="online-inference", gpus=1)
        run_cycles(first, clock)
        assert client.get(f"/v1/jobs/{online}").json()["state"] == "running"
        executor.finish(str(online), 0)
        run_cycles(first, clock)
        assert client.get(f"/v1/jobs/{online}").json()["state"] == "succeeded"
    first.stop()

    second, _ = server(tmp_path, store, clock)  # restarted: no online job is active now
    with TestClient(create_app(second, store, auth=False)) as client:
        train = [submit(client, **TRAINING) for _ in range(4)]
        run_cycles(second, clock)
        jobs = [client.get(f"/v1/jobs/{j}").json() for j in train]
        assert [j["state"] for j in jobs].count("running") == 3, jobs
        (waiting,) = [j for j in jobs if j["state"] == "pending"]
        assert waiting["reason_code"] == "Reserve", waiting
    second.stop()
    store.close()


def test_without_online_work_ever_seen_there_is_no_reserve(tmp_path: Path) -> None:
    store = Store(database_url(None, tmp_path / "db"))
    store.migrate()
    clock = ManualClock(1_000.0)
    service, _ = server(tmp_path, store, clock)
    with TestClient(create_app(service, store, auth=False)) as client:
        train = [submit(client, **TRAINING) for _ in range(4)]
        run_cycles(service, clock)
        states = [client.get(f"/v1/jobs/{j}").json()["state"] for j in train]
        assert states.count("running") == 4, states
    service.stop()
    store.close()

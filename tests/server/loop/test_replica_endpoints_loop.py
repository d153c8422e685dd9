"""Replicas on another machine's node, through the loop (fake executor whose node is at
192.0.2.10, a manual clock): each replica is told the node's address and a port of the
configured range in turn, the services view gives http://192.0.2.10:PORT, the scraper is
pointed there, a replica's port is free again once its process ended, and a restarted
server finds the same endpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.base import Handle, LaunchSpec
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.server.loop.config import LIVE_DEFAULTS, LiveConfig
from gpupool.server.loop.driver import LiveService
from gpupool.server.loop.endpoints import HOST_ENV, NetworkConfig
from gpupool.server.store import NewService, Store, database_url
from gpupool.server.telemetry.replica_load import Endpoint, LoadWindow, Scraper

REMOTE = "192.0.2.10"
"""TEST-NET-1: never this machine's, so its ports come from the range."""
NODE = "h/A100-80GB"


class Recording(FakeExecutor):
    def __init__(self) -> None:
        super().__init__(addresses={NODE: REMOTE})
        self.envs: list[dict[str, str]] = []

    def launch(self, spec: LaunchSpec, now_s: float) -> Handle:
        self.envs.append(dict(spec.env))
        return super().launch(spec, now_s)


def live(tmp: Path, store: Store, executor: FakeExecutor, clock: ManualClock) -> LiveService:
    fetched: list[Endpoint] = []

    def fetch(at: Endpoint, _timeout_s: float) -> str:
        fetched.append(at)
        raise OSError("no replica process in this test")

    service = LiveService(
        LiveConfig(
            state_dir=tmp / "state",
            scheduling=LIVE_DEFAULTS,
            sample_s=0.0,
            host="h",
            network=NetworkConfig(replica_ports=(20000, 20002)),
        ),
        store,
        executor,
        FakeTelemetry("4xA100-80GB"),
        clock,
        scraper=Scraper(LoadWindow(60.0), clock.now, fetch=fetch, background=False),
    )
    service.fetched = fetched  # type: ignore[attr-defined]
    return service


def step(service: LiveService, clock: ManualClock, n: int) -> None:
    for _ in range(n):
        clock.advance(1.0)
        service.step()


def replicas(service: LiveService) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = service.views.service_view("chat")["replicas"]
    return out


def test_replicas_on_a_remote_node_listen_there_on_ports_of_the_range(tmp_path: Path) -> None:
    store = Store(database_url(None, tmp_path / "db"))
    store.migrate()
    clock = ManualClock(1_000.0)
    executor = Recording()
    service = live(tmp_path, store, executor, clock)
    service.operations.create_service(
        NewService("chat", "web", ("serve",), 2, 2, slo_p99_ms=200.0, replica_rps=15.0)
    )
    step(service, clock, 2)
    assert [(e[HOST_ENV], e["PORT"]) for e in executor.envs] == [
        (REMOTE, "20000"),
        (REMOTE, "20001"),
    ]
    shown = replicas(service)
    assert sorted(r["url"] for r in shown) == [f"http://{REMOTE}:20000", f"http://{REMOTE}:20001"]
    assert {r["address"] for r in shown} == {REMOTE}
    service.scraper.once()
    assert sorted(service.fetched) == [Endpoint(REMOTE, 20000), Endpoint(REMOTE, 20001)]  # type: ignore[attr-defined]

    # the replica on 20000 dies: its port is free again, its replacement takes the next
    first = next(r["job_id"] for r in shown if r["port"] == 20000)
    executor.finish(str(first), exit_code=1)
    step(service, clock, 15)  # past the crash-loop backoff's first 10 s
    assert [e["PORT"] for e in executor.envs[2:]] == ["20002"]
    assert Endpoint(REMOTE, 20000) not in service.state.endpoints.values()
    ports = sorted(r["port"] for r in replicas(service) if r["url"])
    assert ports == [20001, 20002]
    service.stop()

    # a restarted server gives the same URLs (the node's address, the recorded ports)
    again = live(tmp_path, store, executor, clock)
    step(again, clock, 2)
    assert sorted(r["url"] for r in replicas(again) if r["url"]) == [
        f"http://{REMOTE}:20001",
        f"http://{REMOTE}:20002",
    ]
    again.stop()
    again.scraper.close()
    service.scraper.close()

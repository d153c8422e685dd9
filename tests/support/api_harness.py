"""The API on one fake fleet, on SQLite and on PostgreSQL: the `Api` handle and its fixtures
(`db`, `url`, `make_api`, `api`, `secured`), shared by the API and credentials tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.server.api.app import create_app
from gpupool.server.loop.config import LiveConfig
from gpupool.server.loop.driver import LiveService
from gpupool.server.store import Store, database_url
from head_schema import at_head
from pgserver import fresh_schema, pg_url  # noqa: F401

FLEET = "2xA100-80GB"
HOST = "h"
NODE = f"{HOST}/A100-80GB"
T0 = 1_000.0
JSON_CT = {"content-type": "application/json"}


# ---- harness --------------------------------------------------------------------------------
@dataclass
class Api:
    """One app on one database, and handles on everything behind it."""

    db: str
    url: str
    store: Store
    service: LiveService
    executor: FakeExecutor
    telemetry: FakeTelemetry
    clock: ManualClock
    client: TestClient
    admin: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            self.clock.advance(1.0)
            self.service.step()

    def submit(self, headers: dict[str, str] | None = None, **spec: Any) -> httpx.Response:
        body: dict[str, Any] = {"command": ["python", "train.py"], "team": "nlp"}
        body.update(spec)
        body = {k: v for k, v in body.items() if v is not None}
        r: httpx.Response = self.client.post("/v1/jobs", json=body, headers=headers or self.headers)
        return r

    def submitted(self, **spec: Any) -> dict[str, Any]:
        r = self.submit(**spec)
        assert r.status_code == 201, r.text
        return dict(r.json())

    def job(self, job_id: int, headers: dict[str, str] | None = None) -> dict[str, Any]:
        r = self.client.get(f"/v1/jobs/{job_id}", headers=headers or self.headers)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def n_jobs(self) -> int:
        return len(self.store.jobs.list(limit=10_000))

    def n_events(self) -> int:
        return len(self.store.events.after(0, limit=100_000))

    def events(self, job_id: int) -> list[str]:
        return [e.kind for e in self.store.events.after(0, limit=100_000, job_id=job_id)]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def empty_url(db: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new, empty database (for tests of the migrations themselves)."""
    if db == "sqlite":
        return database_url(None, tmp_path / "empty")
    return fresh_schema(request.getfixturevalue("pg_url"))


@pytest.fixture
def url(db: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new database already at the newest schema (head_schema.at_head: make_api's
    migrate() then finds it current)."""
    if db == "sqlite":
        return at_head(database_url(None, tmp_path / "db"))
    return at_head(fresh_schema(request.getfixturevalue("pg_url")))


@pytest.fixture
def make_api(
    db: str, url: str, open_store: Callable[[], Store], tmp_path: Path
) -> Iterator[Callable[..., Api]]:
    clients: list[TestClient] = []

    def make(auth: bool = False, fleet: str = FLEET) -> Api:
        store = open_store()
        store.migrate()
        executor = FakeExecutor()
        telemetry = FakeTelemetry(fleet)
        clock = ManualClock(T0)
        service = LiveService(
            LiveConfig(state_dir=tmp_path / "state", sample_s=0.0, host=HOST),
            store,
            executor,
            telemetry,
            clock,
        )
        client = TestClient(create_app(service, store, auth=auth), raise_server_exceptions=False)
        clients.append(client)
        api = Api(db, url, store, service, executor, telemetry, clock, client)
        if auth:
            api.admin = store.auth.create_token("admin", None, T0)
            api.headers = bearer(api.admin)
        return api

    yield make
    for c in clients:
        c.close()


@pytest.fixture
def api(make_api: Callable[..., Api]) -> Api:
    """Auth off: everyone is the anonymous admin."""
    return make_api(auth=False)


@pytest.fixture
def secured(make_api: Callable[..., Api]) -> Api:
    """Auth on; api.headers carry the admin token."""
    return make_api(auth=True)


def team_token(api: Api, team: str) -> dict[str, str]:
    r = api.client.post(
        "/v1/tokens", json={"name": f"{team}-bot", "team": team}, headers=api.headers
    )
    assert r.status_code == 201, r.text
    assert r.json()["team"] == team
    return bearer(r.json()["token"])

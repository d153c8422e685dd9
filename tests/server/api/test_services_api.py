"""Services through the API, the store and the CLI, in-process: FastAPI's TestClient on
create_app, a real SQLite store, a LiveService with a fake executor, a fake fleet and a
manual clock (the scheduler runs when the test steps it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpupool.cli import main as gpupool_cli
from gpupool.cli import remote as client_cli
from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.server.api.app import create_app
from gpupool.server.loop.config import LIVE_DEFAULTS, LiveConfig
from gpupool.server.loop.driver import LiveService
from gpupool.server.store import NewService, Store, database_url

T0 = 1_000.0
CHAT = {
    "name": "chat",
    "team": "web",
    "command": ["python", "-m", "gpupool.examples.chat_replica"],
    "gpu_mem_mib": 16 * 1024,
    "min_replicas": 2,
    "max_replicas": 4,
    "slo_p99_ms": 200,
    "replica_rps": 10,
}


class Harness:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.store = Store(database_url(None, tmp / "db"))
        self.store.migrate()
        self.clock = ManualClock(T0)
        self.executor = FakeExecutor()
        self.service = self._live()
        self.client = TestClient(
            create_app(self.service, self.store, auth=True), raise_server_exceptions=False
        )
        admin = self.store.auth.create_token("admin", None, T0)
        self.admin = {"Authorization": f"Bearer {admin}"}
        web = self.store.auth.create_token("web-bot", "web", T0)
        self.web = {"Authorization": f"Bearer {web}"}
        other = self.store.auth.create_token("nlp-bot", "nlp", T0)
        self.nlp = {"Authorization": f"Bearer {other}"}

    def _live(self) -> LiveService:
        return LiveService(
            LiveConfig(
                state_dir=self.tmp / "state",
                scheduling=LIVE_DEFAULTS,
                sample_s=0.0,
                host="h",
            ),
            self.store,
            self.executor,
            FakeTelemetry("4xA100-80GB"),
            self.clock,
        )

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            self.clock.advance(1.0)
            self.service.step()

    def show(self, name: str = "chat") -> dict[str, Any]:
        r = self.client.get(f"/v1/services/{name}", headers=self.web)
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out


@pytest.fixture()
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    yield harness
    harness.client.close()
    harness.service.scraper.close()


def test_create_show_scale_delete(h: Harness) -> None:
    r = h.client.post("/v1/services", json=CHAT, headers=h.web)
    assert r.status_code == 201, r.text
    h.step(2)
    s = h.show()
    assert s["target_replicas"] == 2
    replicas = s["replicas"]
    # the fake executor starts no process: running jobs, replicas not yet answering
    assert [x["state"] for x in replicas] == ["starting", "starting"]
    assert [h.store.jobs.get(x["job_id"]).state for x in replicas] == ["running", "running"]
    assert all(x["port"] and x["url"] == f"http://127.0.0.1:{x['port']}" for x in replicas)
    assert len({x["port"] for x in replicas}) == 2
    job = h.store.jobs.get(replicas[0]["job_id"])
    assert job.kind == "online-inference" and job.service == "chat"
    assert any("0 -> 2" in e["message"] for e in s["events"])

    r = h.client.post(
        "/v1/services/chat/scale", json={"min_replicas": 3, "max_replicas": 4}, headers=h.web
    )
    assert r.status_code == 200, r.text
    h.step(2)
    assert h.show()["target_replicas"] == 3

    r = h.client.delete("/v1/services/chat", headers=h.web)
    assert r.status_code == 200, r.text
    h.step(3)
    assert h.client.get("/v1/services/chat", headers=h.web).status_code == 404
    rows = h.store.services.replicas("chat", active_only=False)
    assert len(rows) == 3 and {x.state for x in rows} == {"cancelled"}
    assert {x.reason for x in rows} == {"service deleted"}
    assert [c for c in h.executor.calls if c[0] == "cancel"]


def test_clear_errors(h: Harness) -> None:
    post = h.client.post
    assert post("/v1/services", json=CHAT, headers=h.nlp).status_code == 403
    assert post("/v1/services", json=CHAT, headers=h.web).status_code == 201
    dup = post("/v1/services", json=CHAT, headers=h.web)
    assert dup.status_code == 409 and "exists already" in dup.json()["detail"]
    bad = post("/v1/services", json=CHAT | {"name": "b", "min_replicas": 5}, headers=h.web)
    assert bad.status_code == 422 and "min_replicas 5 > max_replicas 4" in bad.text
    big = post("/v1/services", json=CHAT | {"name": "big", "gpu_mem_mib": 200_000}, headers=h.web)
    assert big.status_code == 422 and "largest card" in big.json()["detail"]
    model = post("/v1/services", json=CHAT | {"name": "m", "gpu_model": "T4"}, headers=h.web)
    assert model.status_code == 422 and "this fleet has A100-80GB" in model.json()["detail"]
    name = post("/v1/services", json=CHAT | {"name": "Chat Bot"}, headers=h.web)
    assert name.status_code == 422
    assert h.client.get("/v1/services/nope", headers=h.web).status_code == 404
    other = h.client.post(
        "/v1/services/chat/scale", json={"min_replicas": 1, "max_replicas": 2}, headers=h.nlp
    )
    assert other.status_code == 403 and "belongs to team web" in other.json()["detail"]
    assert h.client.delete("/v1/services/chat", headers=h.nlp).status_code == 403
    assert h.client.get("/v1/services", headers=h.nlp).status_code == 200


def test_restart_adopts_running_replicas(h: Harness) -> None:
    assert h.client.post("/v1/services", json=CHAT, headers=h.web).status_code == 201
    h.step(2)
    before = [x["job_id"] for x in h.show()["replicas"]]
    launches = sum(c[0] == "launch" for c in h.executor.calls)
    h.service.stop()  # the executor lets go of its processes, which run on
    again = h._live()  # a restarted server on the same database and executor
    for _ in range(3):
        h.clock.advance(1.0)
        again.step()
    assert sorted(again.scheduler.replicas["chat"]) == sorted(str(j) for j in before)
    assert sum(c[0] == "launch" for c in h.executor.calls) == launches
    assert [r.id for r in h.store.services.replicas("chat")] == before
    again.scraper.close()


def test_store_keeps_services_and_frees_a_deleted_name(tmp_path: Path) -> None:
    store = Store(database_url(None, tmp_path / "db"))
    store.migrate()
    svc = NewService("chat", "web", ("python", "serve.py"), 1, 3)
    first = store.services.create(svc, 1.0)
    store.services.scale("chat", 2, 5, 2.0)
    assert (store.services.get("chat").min_replicas, store.services.get("chat").max_replicas) == (
        2,
        5,
    )
    store.services.delete("chat", 3.0)
    assert store.services.list() == []
    second = store.services.create(svc, 4.0)
    assert second.id != first.id and len(store.services.list(include_deleted=True)) == 2
    kinds = [e.kind for e in store.services.events("chat")]
    assert kinds == ["service-created", "service-bounds", "service-deleted", "service-created"]


def test_cli(
    h: Harness, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_cli, "TRANSPORT", h.client._transport)
    monkeypatch.setenv("GPUPOOL_TOKEN", h.web["Authorization"][7:])
    base = ["--url", "http://testserver"]

    def run(*words: str) -> tuple[int, str, str]:
        code = gpupool_cli.main(list(words))
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = run(
        "service",
        "create",
        "chat",
        *base,
        "--team",
        "web",
        "--gpu-mem",
        "16GiB",
        "--replicas",
        "1..8",
        "--slo-p99-ms",
        "200",
        "--",
        "python",
        "-m",
        "gpupool.examples.chat_replica",
        "--slots",
        "2",
    )
    assert code == 0 and "service chat created for team web: replicas 1..8" in out
    assert h.store.services.get("chat").command[-2:] == ("--slots", "2")
    h.step(2)
    code, out, _ = run("service", "ls", *base)
    assert code == 0 and "chat" in out and "0/1" in out
    code, out, _ = run("service", "show", "chat", *base)
    assert code == 0 and "replicas: 0 serving, 1 starting of 1 wanted" in out and "rps:" in out
    assert "p99" in out and "chat-r1" in out
    code, out, _ = run("service", "show", "chat", "--json", *base)
    assert code == 0 and '"replicas": [' in out
    code, out, _ = run("service", "scale", "chat", "2..6", *base)
    assert code == 0 and "replicas 2..6" in out
    code, _, err = run("service", "scale", "chat", "6..2", *base)
    assert code == 2 and "MIN <= MAX" in err
    code, out, _ = run("service", "delete", "chat", *base)
    assert code == 0 and "deleted" in out
    code, _, err = run("service", "create", "x", *base, "--team", "web")
    assert code == 2 and "after --" in err

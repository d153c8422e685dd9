"""Hold, release, requeue, drain, time limits and the submit rate through the REST API
(FastAPI's TestClient on create_app, a real Store on SQLite and on PostgreSQL, a fake
executor and fleet, a manual clock), and the CLI against a real server on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from gpupool.cli import remote as client_cli
from gpupool.cli.main import main
from gpupool.errors import ConflictError
from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.scheduler.config import TeamLimits
from gpupool.server.api.app import create_app
from gpupool.server.loop.config import LIVE_DEFAULTS, LiveConfig
from gpupool.server.loop.driver import LiveService
from gpupool.server.store import NewJob, Store, database_url
from head_schema import at_head
from pgserver import fresh_schema, pg_url  # noqa: F401

T0 = 1_000.0
NODE = "h/A100-80GB"
SCHEDULING = dataclasses.replace(
    LIVE_DEFAULTS,
    team_limits={"nlp": TeamLimits(submit_per_min=3)},
    time_limit_s={"batch": 1800.0},
)


@dataclasses.dataclass
class Api:
    service: LiveService
    store: Store
    executor: FakeExecutor
    clock: ManualClock
    client: TestClient
    admin: dict[str, str]
    nlp: dict[str, str]
    cv: dict[str, str]

    def step(self, dt_s: float = 1.0) -> None:
        self.clock.advance(dt_s)
        self.service.step()

    def submit(self, headers: dict[str, str], **spec: Any) -> httpx.Response:
        body = {"command": ["python", "train.py"], **spec}
        r: httpx.Response = self.client.post("/v1/jobs", json=body, headers=headers)
        return r

    def post(self, path: str, headers: dict[str, str], **kw: Any) -> httpx.Response:
        r: httpx.Response = self.client.post(path, headers=headers, **kw)
        return r


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return database_url(None, tmp_path / "db")
    return fresh_schema(request.getfixturevalue("pg_url"))


@pytest.fixture
def api(url: str, open_store: Callable[[], Store], tmp_path: Path) -> Iterator[Api]:
    at_head(url)  # the migrations' schema without running them (tests/support/head_schema.py)
    store = open_store()
    store.migrate()
    executor = FakeExecutor()
    clock = ManualClock(T0)
    service = LiveService(
        LiveConfig(tmp_path / "state", SCHEDULING, sample_s=0.0, host="h"),
        store,
        executor,
        FakeTelemetry("2xA100-80GB"),
        clock,
    )
    tokens = {
        name: {"Authorization": f"Bearer {store.auth.create_token(name, team, T0)}"}
        for name, team in (("root", None), ("nlp-bot", "nlp"), ("cv-bot", "cv"))
    }
    with TestClient(create_app(service, store, auth=True)) as client:
        yield Api(
            service,
            store,
            executor,
            clock,
            client,
            tokens["root"],
            tokens["nlp-bot"],
            tokens["cv-bot"],
        )
    service.stop()


def test_the_submit_rate_of_a_team_is_a_429_with_retry_after(api: Api) -> None:
    for _ in range(3):
        assert api.submit(api.nlp, gpus=0).status_code == 201
    r = api.submit(api.nlp, gpus=0)
    assert r.status_code == 429
    assert 1 <= int(r.headers["Retry-After"]) <= 20
    assert "team nlp may submit 3 jobs a minute" in r.json()["detail"]
    assert api.submit(api.cv, gpus=0).status_code == 201  # another team is not limited
    batch = {"jobs": [{"command": ["x"], "team": "nlp"}] * 4}
    r = api.post("/v1/jobs/batch", api.admin, json=batch)
    assert r.status_code == 429 and "batches of at most 3" in r.json()["detail"]
    assert len(api.store.jobs.list(team="nlp")) == 3


def test_time_limits_are_stored_with_the_kinds_default(api: Api) -> None:
    own = api.submit(api.cv, time_limit_s=4 * 3600.0).json()
    default = api.submit(api.cv, kind="batch").json()
    none = api.submit(api.cv).json()
    assert (own["time_limit_s"], default["time_limit_s"], none["time_limit_s"]) == (
        14400.0,
        1800.0,
        None,
    )
    assert api.submit(api.cv, time_limit_s=0).status_code == 422
    api.step()
    api.step(1800.0)
    assert api.client.get(f"/v1/jobs/{default['id']}", headers=api.cv).json()["reason"] == (
        "ran past its 30m time limit; stopping"
    )
    api.step()
    job = api.client.get(f"/v1/jobs/{default['id']}", headers=api.cv).json()
    assert (job["state"], job["reason"]) == ("failed", "ran past its 30m time limit")


def test_hold_release_requeue_through_the_api(api: Api) -> None:
    job = api.submit(api.cv, gpus=1).json()["id"]
    assert api.post(f"/v1/jobs/{job}/hold", api.nlp).status_code == 403  # not its team
    held = api.post(f"/v1/jobs/{job}/hold", api.cv)
    assert held.status_code == 200 and held.json()["held"] is True
    assert api.post(f"/v1/jobs/{job}/hold", api.cv).status_code == 409
    api.step()
    assert api.client.get(f"/v1/jobs/{job}", headers=api.cv).json()["state"] == "pending"
    assert api.post(f"/v1/jobs/{job}/release", api.admin).json()["held"] is False
    api.step()
    assert api.client.get(f"/v1/jobs/{job}", headers=api.cv).json()["state"] == "running"
    r = api.post(f"/v1/jobs/{job}/hold", api.cv)
    assert r.status_code == 409 and f"`gpupool requeue {job} --hold`" in r.json()["detail"]
    r = api.post(f"/v1/jobs/{job}/requeue", api.cv)
    assert r.status_code == 200 and r.json()["preempting"] is True
    api.step()  # it left with its checkpoint and, a GPU being free, resumed at once
    row = api.client.get(f"/v1/jobs/{job}", headers=api.cv).json()
    assert (row["state"], row["attempts"], row["preemptions"]) == ("running", 2, 1)
    kinds = [e.kind for e in api.store.events.after(0, job_id=job)]
    assert kinds[-3:] == ["preempting", "suspended", "running"]
    r = api.post(f"/v1/jobs/{job + 1}/requeue", api.cv)
    assert r.status_code == 404


def test_drain_is_admin_only_and_shows_in_the_cluster(api: Api) -> None:
    body = {"node": NODE}
    r = api.post("/v1/drain", api.cv, json=body)
    assert r.status_code == 403
    r = api.post("/v1/drain", api.admin, json=body)
    assert r.status_code == 200 and r.json()["state"] == "drained"
    job = api.submit(api.cv).json()["id"]
    api.step()
    assert api.client.get(f"/v1/jobs/{job}", headers=api.cv).json()["state"] == "pending"
    nodes = api.client.get("/v1/cluster", headers=api.cv).json()["nodes"]
    assert [n["state"] for n in nodes] == ["drained"]
    assert api.post("/v1/drain", api.admin, json={"node": "x"}).status_code == 404
    r = api.post("/v1/drain", api.admin, json={**body, "undo": True})
    assert r.json()["state"] == "up"
    api.step()
    assert api.client.get(f"/v1/jobs/{job}", headers=api.cv).json()["state"] == "running"


# ---- the CLI against a real server --------------------------------------------------------------
@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, LiveService]]:
    import uvicorn

    store = Store(database_url(None, tmp_path / "db"))
    store.migrate()
    service = LiveService(
        LiveConfig(tmp_path / "state", SCHEDULING, sample_s=0.0, host="h"),
        store,
        FakeExecutor(),
        FakeTelemetry("1xA100-80GB"),
        ManualClock(T0),
    )
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(service, store, auth=False), host="127.0.0.1", port=0, log_level="error"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "the server did not start within 10 s"
    port = server.servers[0].sockets[0].getsockname()[1]
    monkeypatch.setattr(client_cli, "TRANSPORT", None)
    for name in ("GPUPOOL_TOKEN", "GPUPOOL_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUPOOL_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    yield f"http://127.0.0.1:{port}", service
    server.should_exit = True
    thread.join(timeout=10)
    service.stop()
    store.close()


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_time_hold_release_requeue_drain(
    served: tuple[str, LiveService], capsys: pytest.CaptureFixture[str]
) -> None:
    _, service = served
    code, out, _ = run(["submit", "--team", "cv", "--time", "4h", "--", "python", "x.py"], capsys)
    assert code == 0 and out.startswith("submitted job 1")
    assert "time limit  4h00m per run" in run(["show", "1"], capsys)[1]
    assert run(["hold", "1"], capsys)[1] == (
        "job 1 is on hold (pending); `gpupool release 1` lets it start\n"
    )
    assert re.search(r"pending \(held\)", run(["ls"], capsys)[1])
    service.step()
    assert run(["release", "1"], capsys)[1] == "job 1 released (pending)\n"
    service.step()
    code, _, err = run(["hold", "1"], capsys)
    assert code == 2 and "`gpupool requeue 1 --hold` stops it" in err
    assert run(["requeue", "1", "--hold"], capsys)[1] == (
        "job 1 is stopping with its checkpoint; held once it has left\n"
    )
    service.step()
    assert "suspended (held)" in run(["ls"], capsys)[1]
    assert run(["drain", NODE], capsys)[1] == f"node {NODE} takes no new jobs: drained\n"
    assert "drained" in run(["nodes"], capsys)[1]
    run(["release", "1"], capsys)
    service.step()
    assert "suspended" in run(["ls"], capsys)[1]  # the only node is drained
    assert run(["drain", NODE, "--undo"], capsys)[1] == f"node {NODE} takes new jobs again: up\n"
    service.step()
    assert "running" in run(["ls"], capsys)[1]
    code, _, err = run(["submit", "--time", "soon", "--", "x"], capsys)
    assert code == 2 and "--time" in err


# ---- the store's lifecycle functions, on both databases -----------------------------------------
def test_store_purge_holds_and_drains(url: str, open_store: Callable[[], Store]) -> None:
    store = open_store()
    store.migrate()
    job = NewJob("j", "cv", "training", 0, 1, ("true",), time_limit_s=60.0)
    ids = [store.jobs.submit(job, T0)[0].id for _ in range(5)]
    for k, job_id in enumerate(ids):
        store.jobs.transition(job_id, "running", T0 + 1)
        if k < 4:
            store.jobs.transition(job_id, "succeeded", T0 + 2 if k < 3 else T0 + 100)
    store.events.add("note", "old", T0)
    store.events.add("note", "new", T0 + 100)
    assert store.jobs.run_started_at(ids[4]) == T0 + 1
    assert store.jobs.get(ids[4]).time_limit_s == 60.0
    first = store.jobs.purge(T0 + 50, batch=2)
    assert first.job_ids == tuple(ids[:2]) and first.more
    second = store.jobs.purge(T0 + 50, batch=2)
    assert second.job_ids == (ids[2],) and not second.more
    assert store.jobs.purge(T0 + 50, batch=2).job_ids == ()
    left = [r.id for r in store.jobs.list()]
    assert left == ids[3:]  # recent and running jobs stay
    messages = [e.message for e in store.events.after(0, limit=1000) if e.kind == "note"]
    assert messages == ["new"]
    assert all(e.job_id in (None, *ids[3:]) for e in store.events.after(0, limit=1000))
    pending = store.jobs.submit(job, T0)[0].id
    assert store.jobs.set_held(pending, True, T0, "held by x").held
    with pytest.raises(ConflictError, match="on hold already"):
        store.jobs.set_held(pending, True, T0, "again")
    with pytest.raises(ConflictError, match="only a waiting"):
        store.jobs.set_held(ids[4], True, T0, "running")
    assert not store.jobs.set_held(pending, False, T0, "released").held
    assert store.nodes.set_drain(NODE, True, T0, "root", "maintenance")
    assert not store.nodes.set_drain(NODE, True, T0, "root", "again")
    assert store.nodes.drains() == {NODE: (T0, "root", "maintenance")}
    assert store.nodes.set_drain(NODE, False, T0, "root", "done")
    assert store.nodes.drains() == {}


def test_a_0003_database_upgrades_in_place_and_back(
    url: str, open_store: Callable[[], Store]
) -> None:
    """Jobs stored before 0005 read back not held and without a time limit; 0005 undone
    keeps them."""
    import sqlalchemy as sa
    from alembic import command
    from alembic.config import Config

    from gpupool.server.store import MIGRATIONS_DIR

    def alembic(conn: sa.Connection) -> Config:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
        config.set_main_option("path_separator", "os")
        config.attributes["connection"] = conn
        return config

    store = open_store()  # not migrated yet
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            command.upgrade(alembic(conn), "0003")
        with engine.begin() as conn:  # a job as 0003 stored it
            conn.execute(
                sa.text(
                    "INSERT INTO jobs (name, team, kind, priority, gpu_count, command, env, "
                    "grace_s, max_retries, state, gpus, submitted_at, updated_at) VALUES "
                    "('old', 'cv', 'training', 0, 1, '[\"x\"]', '{}', 60, 0, 'pending', '[]', "
                    "1, 1)"
                )
            )
        store.migrate()
        [old] = store.jobs.list()
        assert (old.name, old.held, old.time_limit_s) == ("old", False, None)
        assert store.nodes.drains() == {}
        with engine.begin() as conn:
            command.downgrade(alembic(conn), "0003")
        engine.dispose()
        columns = {c["name"] for c in sa.inspect(engine).get_columns("jobs")}
        assert "held" not in columns and "time_limit_s" not in columns
        assert "node_drains" not in sa.inspect(engine).get_table_names()
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT name FROM jobs")).scalars().all() == ["old"]
    finally:
        engine.dispose()

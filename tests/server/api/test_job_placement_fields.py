"""Jobs carry what multi-cluster placement needs: dataset, dataset_gb, deadline_at,
user_region and latency_bound_ms, from `gpupool submit` through the API into the store
and back out of `gpupool show` / `ls`.

Store, migration and API tests run twice: on a SQLite file under tmp_path and on a fresh
schema of a throwaway PostgreSQL server (tests/support/pgserver.py).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from gpupool.cli import remote as client_cli
from gpupool.cli.main import main
from gpupool.cli.parse import parse_deadline
from gpupool.errors import ConflictError, SpecError
from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.server.api.app import create_app
from gpupool.server.loop.config import LiveConfig
from gpupool.server.loop.driver import LiveService
from gpupool.server.store import MIGRATIONS_DIR, Base, NewJob, Store, database_url, schema_head
from head_schema import at_head
from pgserver import fresh_schema, pg_url  # noqa: F401

T0 = 1_700_000_000.0
DEADLINE = 1_700_086_400.0
PLACED: dict[str, Any] = {
    "dataset": "eu-lake/imagenet",
    "dataset_gb": 140.5,
    "deadline_at": DEADLINE,
    "user_region": "eu-west",
    "latency_bound_ms": 50.0,
}
NONE_PLACED: dict[str, Any] = {
    "dataset": None,
    "dataset_gb": 0.0,
    "deadline_at": None,
    "user_region": None,
    "latency_bound_ms": None,
}


def job(**kw: Any) -> NewJob:
    fields: dict[str, Any] = {
        "name": "serve-1",
        "team": "nlp",
        "kind": "online-inference",
        "priority": 50,
        "gpu_count": 1,
        "command": ("python", "serve.py"),
    }
    fields.update(kw)
    return NewJob(**fields)


def placement_of(row: Any) -> dict[str, Any]:
    return {k: getattr(row, k) for k in PLACED}


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return database_url(None, tmp_path / "state")
    return fresh_schema(request.getfixturevalue("pg_url"))


@pytest.fixture
def store(url: str, open_store: Callable[[], Store]) -> Store:
    at_head(url)  # the migrations' schema without running them (tests/support/head_schema.py)
    s = open_store()
    s.migrate()
    return s


# ---- store ------------------------------------------------------------------------------------
def test_store_roundtrip_of_the_placement_fields(store: Store, url: str) -> None:
    spec = job(**PLACED)
    row, created = store.jobs.submit(spec, T0, idempotency_key="k-1")
    assert created
    assert placement_of(row) == PLACED
    assert row.spec() == spec
    again = Store(url)  # another process's view of the committed row
    try:
        read = again.jobs.get(row.id)
        assert read == row
        assert placement_of(read) == PLACED
        assert [placement_of(r) for r in again.jobs.list()] == [PLACED]
        assert [placement_of(r) for r in again.jobs.active()] == [PLACED]
    finally:
        again.close()
    # the other ways in, and a state change, keep them too
    [many] = store.jobs.submit_many([job(name="m", **PLACED)], T0)
    [(grouped, _)] = store.jobs.submit_group([(job(name="g", **PLACED), "k-2")], T0)  # type: ignore[misc]
    moved = store.jobs.transition(grouped.id, "running", T0 + 1)
    for r in (many, grouped, moved, store.jobs.get(many.id), store.jobs.get(moved.id)):
        assert placement_of(r) == PLACED


def test_store_defaults_when_not_given(store: Store) -> None:
    row, _ = store.jobs.submit(job(kind="training"), T0)
    assert placement_of(row) == NONE_PLACED
    assert placement_of(store.jobs.get(row.id)) == NONE_PLACED
    assert isinstance(store.jobs.get(row.id).dataset_gb, float)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"dataset_gb": -1.0}, "dataset_gb"),
        ({"dataset_gb": math.nan}, "dataset_gb"),
        ({"dataset_gb": math.inf}, "dataset_gb"),
        ({"deadline_at": 0.0}, "deadline_at"),
        ({"deadline_at": math.inf}, "deadline_at"),
        ({"latency_bound_ms": 0.0, "user_region": "eu"}, "latency_bound_ms"),
        ({"latency_bound_ms": math.nan, "user_region": "eu"}, "latency_bound_ms"),
        ({"latency_bound_ms": 20.0}, "needs user_region"),
    ],
)
def test_store_refuses_bad_placement_fields(
    store: Store, fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError, match=message):
        store.jobs.submit(job(**fields), T0)
    assert store.jobs.list() == []


def test_resubmission_with_another_dataset_is_a_conflict(store: Store) -> None:
    first, _ = store.jobs.submit(job(**PLACED), T0, idempotency_key="k")
    same, created = store.jobs.submit(job(**PLACED), T0 + 1, idempotency_key="k")
    assert (same, created) == (first, False)
    for change in (
        {"dataset": "us-lake/imagenet"},
        {"dataset_gb": 141.0},
        {"deadline_at": DEADLINE + 1},
        {"user_region": "us-east"},
        {"latency_bound_ms": 51.0},
    ):
        with pytest.raises(ConflictError, match=f"job {first.id} was submitted"):
            store.jobs.submit(job(**{**PLACED, **change}), T0 + 2, idempotency_key="k")
        [err] = store.jobs.submit_group([(job(**{**PLACED, **change}), "k")], T0 + 2)
        assert isinstance(err, ConflictError)
    assert len(store.jobs.list()) == 1


# ---- migration 0001 -> 0002 -----------------------------------------------------------------
def _alembic(conn: sa.Connection) -> Config:
    """The configuration Store.migrate() uses, on a connection of ours."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    config.set_main_option("path_separator", "os")
    config.attributes["connection"] = conn
    return config


# The jobs table as revision 0001 created it (only the columns an insert needs).
JOBS_0001 = sa.table(
    "jobs",
    *(
        sa.column(name, type_)
        for name, type_ in (
            ("name", sa.String()),
            ("team", sa.String()),
            ("kind", sa.String()),
            ("priority", sa.Integer()),
            ("gpu_count", sa.Integer()),
            ("command", sa.JSON()),
            ("env", sa.JSON()),
            ("grace_s", sa.Double()),
            ("max_retries", sa.Integer()),
            ("state", sa.String()),
            ("gpus", sa.JSON()),
            ("submitted_at", sa.Double()),
            ("updated_at", sa.Double()),
            ("idempotency_key", sa.String()),
        )
    ),
)


def _columns(engine: sa.Engine) -> set[str]:
    return {c["name"] for c in sa.inspect(engine).get_columns("jobs")}


def _version(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT version_num FROM alembic_version")).scalars())


def test_a_0001_database_upgrades_in_place(url: str, open_store: Callable[[], Store]) -> None:
    store = open_store()  # not migrated yet; makes the SQLite file's directory
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            command.upgrade(_alembic(conn), "0001")
            conn.execute(
                JOBS_0001.insert(),
                {
                    "name": "old",
                    "team": "vision",
                    "kind": "training",
                    "priority": 5,
                    "gpu_count": 2,
                    "command": ["python", "train.py"],
                    "env": {"SEED": "1"},
                    "grace_s": 60.0,
                    "max_retries": 0,
                    "state": "pending",
                    "gpus": [],
                    "submitted_at": T0,
                    "updated_at": T0,
                    "idempotency_key": "old-key",
                },
            )
        assert _version(engine) == ["0001"]
        assert "dataset" not in _columns(engine)

        store.migrate()
        assert _version(engine) == [schema_head()]  # the head
        assert set(PLACED) <= _columns(engine)
        [old] = store.jobs.list()
        assert (old.name, old.team, old.command, dict(old.env)) == (
            "old",
            "vision",
            ("python", "train.py"),
            {"SEED": "1"},
        )
        assert placement_of(old) == NONE_PLACED
        # its idempotency key still answers a resubmission of the same spec with the old job
        resubmitted, created = store.jobs.submit(old.spec(), T0 + 5, idempotency_key="old-key")
        assert (resubmitted.id, created) == (old.id, False)
        new, _ = store.jobs.submit(job(**PLACED), T0 + 10)
        assert placement_of(store.jobs.get(new.id)) == PLACED

        # the upgraded schema is exactly the models
        from alembic.autogenerate import compare_metadata
        from alembic.runtime.migration import MigrationContext

        with engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []

        # and 0002 can be undone, keeping the jobs
        with engine.begin() as conn:
            command.downgrade(_alembic(conn), "0001")
        engine.dispose()  # SQLite: forget the cached table layout
        assert _version(engine) == ["0001"]
        assert not set(PLACED) & _columns(engine)
        with engine.connect() as conn:
            names = conn.execute(text("SELECT name FROM jobs ORDER BY id")).scalars().all()
        assert names == ["old", "serve-1"]
        store.close()
        again = open_store()
        again.migrate()
        assert placement_of(again.jobs.get(new.id)) == NONE_PLACED
    finally:
        engine.dispose()


# ---- API --------------------------------------------------------------------------------------
@dataclass
class Api:
    store: Store
    client: TestClient

    def submit(self, headers: dict[str, str] | None = None, **spec: Any) -> httpx.Response:
        body: dict[str, Any] = {"command": ["python", "serve.py"], "team": "nlp"}
        body.update(spec)
        r: httpx.Response = self.client.post("/v1/jobs", json=body, headers=headers or {})
        return r


@pytest.fixture
def api(store: Store, tmp_path: Path) -> Iterator[Api]:
    service = LiveService(
        LiveConfig(state_dir=tmp_path / "run", sample_s=0.0, host="h"),
        store,
        FakeExecutor(),
        FakeTelemetry("2xA100-80GB"),
        ManualClock(1_000.0),
    )
    client = TestClient(create_app(service, store, auth=False), raise_server_exceptions=False)
    yield Api(store, client)
    client.close()


def test_api_accepts_and_returns_the_fields(api: Api) -> None:
    r = api.submit(kind="online-inference", **PLACED)
    assert r.status_code == 201, r.text
    created = r.json()
    assert {k: created[k] for k in PLACED} == PLACED
    assert api.client.get(f"/v1/jobs/{created['id']}").json() == created
    [listed] = api.client.get("/v1/jobs").json()["jobs"]
    assert listed == created
    assert placement_of(api.store.jobs.get(created["id"])) == PLACED

    plain = api.submit(kind="training")
    assert plain.status_code == 201, plain.text
    assert {k: plain.json()[k] for k in PLACED} == NONE_PLACED

    # a region alone is fine; so is a bound on a kind that ignores it
    assert api.submit(user_region="eu-west").status_code == 201
    r = api.submit(kind="batch", latency_bound_ms=5, user_region="eu-west")
    assert r.status_code == 201, r.text

    batch = api.client.post(
        "/v1/jobs/batch", json={"jobs": [{"command": ["x"], "team": "nlp", **PLACED}]}
    )
    assert batch.status_code == 201, batch.text
    assert {k: batch.json()["jobs"][0][k] for k in PLACED} == PLACED


def _problems(r: httpx.Response) -> list[tuple[list[Any], str]]:
    assert r.status_code == 422, r.text
    return [(d["loc"], d["msg"]) for d in r.json()["detail"]]


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"dataset_gb": -1}, "dataset_gb", "greater than or equal to 0"),
        ({"dataset_gb": "lots"}, "dataset_gb", "valid number"),
        ({"dataset_gb": 1e300}, "dataset_gb", "less than or equal to"),
        ({"deadline_at": 0}, "deadline_at", "greater than 0"),
        ({"deadline_at": -5.5}, "deadline_at", "greater than 0"),
        ({"latency_bound_ms": 0, "user_region": "eu"}, "latency_bound_ms", "greater than 0"),
        ({"dataset": ""}, "dataset", "at least 1 character"),
        ({"dataset": "a\x00b"}, "dataset", "NUL"),
        ({"user_region": "x" * 129}, "user_region", "at most 128"),
        (
            {"latency_bound_ms": 50},
            "user_region",
            "latency_bound_ms needs user_region (latency from where?)",
        ),
        (
            {"latency_bound_ms": 50, "user_region": None},
            "user_region",
            "latency_bound_ms needs user_region",
        ),
    ],
)
def test_api_rejects_bad_values_with_422(
    api: Api, body: dict[str, Any], field: str, message: str
) -> None:
    problems = _problems(api.submit(**body))
    assert any(loc == ["body", field] and message in msg for loc, msg in problems), problems
    assert api.store.jobs.list() == []


@pytest.mark.parametrize("field", ["dataset_gb", "deadline_at", "latency_bound_ms"])
@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity"])
def test_api_rejects_non_finite_numbers(api: Api, field: str, raw: str) -> None:
    """Python's JSON parser reads NaN and Infinity; the API must still refuse them."""
    body = '{"command": ["x"], "team": "nlp", "user_region": "eu", "' + field + '": ' + raw + "}"
    r = api.client.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
    problems = _problems(r)
    assert any(loc == ["body", field] for loc, _ in problems), problems
    assert api.store.jobs.list() == []


def test_api_resubmission_with_another_dataset_is_a_409(api: Api) -> None:
    key = {"Idempotency-Key": "place-1"}
    first = api.submit(headers=key, **PLACED)
    assert first.status_code == 201, first.text
    again = api.submit(headers=key, **PLACED)
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"]

    other = api.submit(headers=key, **{**PLACED, "dataset": "us-lake/imagenet"})
    assert other.status_code == 409, other.text
    assert "idempotency key reused" in other.json()["detail"]
    assert str(first.json()["id"]) in other.json()["detail"]
    no_deadline = api.submit(headers=key, **{**PLACED, "deadline_at": None})
    assert no_deadline.status_code == 409, no_deadline.text
    assert len(api.store.jobs.list()) == 1


# ---- CLI --------------------------------------------------------------------------------------
NOW = 1_750_000_000.0


@pytest.mark.parametrize(
    ("given", "deadline_at"),
    [
        ("2h", NOW + 7200),
        ("30m", NOW + 1800),
        ("90s", NOW + 90),
        ("1h30m", NOW + 5400),
        ("1d", NOW + 86400),
        (" 2H ", NOW + 7200),
        ("1767225600", 1767225600.0),  # absolute: 2026-01-01T00:00:00Z
        ("1767225600.5", 1767225600.5),
    ],
)
def test_deadline_forms(given: str, deadline_at: float) -> None:
    assert parse_deadline(given, NOW) == deadline_at


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("3600", "a Unix time that has passed; for a time from now give units"),
        ("3600", "--deadline 3600s"),
        ("soon", "--deadline 'soon'"),
        ("0s", "more than zero"),
        ("-2h", "--deadline '-2h'"),
        ("nan", "give a Unix time in seconds or a duration"),
        ("inf", "give a Unix time in seconds or a duration"),
        ("", "--deadline ''"),
    ],
)
def test_bad_deadlines(given: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_deadline(given, NOW)
    assert message in str(info.value)


def test_submit_help_says_how_deadline_is_read(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["submit", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for flag in ("--dataset NAME", "--dataset-gb GB", "--deadline WHEN", "--user-region REGION"):
        assert flag in out
    assert "--latency-bound-ms MS" in out
    assert "a Unix time in seconds" in out
    assert "a duration from now with units" in out


@pytest.fixture
def served(
    api: Api, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[list[dict[str, Any]]]:
    """The CLI wired to the real app (through the TestClient); yields the bodies it sent."""
    sent: list[dict[str, Any]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        if request.content:
            sent.append(json.loads(request.content))
        headers = {
            k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")
        }
        r = api.client.request(
            request.method,
            request.url.path,
            params=request.url.params,
            content=request.content,
            headers=headers,
        )
        return httpx.Response(r.status_code, headers=r.headers, content=r.content)

    monkeypatch.setattr(client_cli, "TRANSPORT", httpx.MockTransport(handle))
    for name in ("GPUPOOL_URL", "GPUPOOL_TOKEN", "GPUPOOL_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    yield sent


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_submit_show_and_ls_carry_the_fields(
    served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    before = time.time()
    code, out, err = run(
        [
            "submit",
            "--kind",
            "online-inference",
            "--team",
            "nlp",
            "--dataset",
            "eu-lake/imagenet",
            "--dataset-gb",
            "140.5",
            "--deadline",
            "2h",
            "--user-region",
            "eu-west",
            "--latency-bound-ms",
            "50",
            "--json",
            "--",
            "python",
            "serve.py",
        ],
        capsys,
    )
    after = time.time()
    assert (code, err) == (0, ""), err
    [body] = served
    assert before + 7200 <= body["deadline_at"] <= after + 7200
    assert {k: body[k] for k in ("dataset", "dataset_gb", "user_region", "latency_bound_ms")} == {
        "dataset": "eu-lake/imagenet",
        "dataset_gb": 140.5,
        "user_region": "eu-west",
        "latency_bound_ms": 50.0,
    }
    job = json.loads(out)
    assert {k: job[k] for k in PLACED} == {**PLACED, "deadline_at": body["deadline_at"]}

    code, out, _ = run(["show", str(job["id"]), "--json"], capsys)
    assert code == 0 and json.loads(out) == job
    code, out, _ = run(["ls", "--json"], capsys)
    assert code == 0 and json.loads(out)["jobs"] == [job]
    code, out, _ = run(["show", str(job["id"])], capsys)
    assert code == 0
    assert "eu-lake/imagenet (140.5 GB)" in out
    assert "eu-west" in out and "within 50 ms" in out
    assert "deadline" in out and ("(in 1h59m)" in out or "(in 2h00m)" in out)

    # an absolute deadline goes as is; without the new flags nothing new is sent
    code, out, err = run(
        ["submit", "--team", "nlp", "--deadline", "4102444800", "--json", "--", "x"], capsys
    )
    assert (code, err) == (0, ""), err
    assert served[-1] == {"command": ["x"], "team": "nlp", "deadline_at": 4102444800.0}
    assert json.loads(out)["deadline_at"] == 4102444800.0
    assert run(["submit", "--team", "nlp", "--", "x"], capsys)[0] == 0
    assert served[-1] == {"command": ["x"], "team": "nlp"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--latency-bound-ms", "50"], "--latency-bound-ms needs --user-region"),
        (["--latency-bound-ms", "0", "--user-region", "eu"], "more than zero"),
        (["--latency-bound-ms", "fast", "--user-region", "eu"], "--latency-bound-ms 'fast'"),
        (["--dataset-gb", "-1"], "--dataset-gb '-1' must be zero or more than zero"),
        (["--dataset-gb", "nan"], "--dataset-gb 'nan': give a number"),
        (["--deadline", "3600"], "--deadline 3600s"),
        (["--deadline", "tomorrow"], "--deadline 'tomorrow'"),
    ],
)
def test_cli_rejects_bad_values_before_sending(
    served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(["submit", *argv, "--", "x"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("gpupool: error: ") and message in err, err
    assert served == []


def test_cli_shows_the_servers_422_for_the_fields(
    served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["submit", "--team", "nlp", "--dataset", "a\x00b", "--", "x"], capsys)
    assert code == 2
    assert "field dataset: Value error, must not contain NUL characters" in err

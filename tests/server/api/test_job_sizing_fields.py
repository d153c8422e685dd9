"""Jobs carry two fields the decision core already uses: state_gib_per_gpu (checkpoint size)
and sizing (a job given by its model: the planner's PlanRequest as a JSON mapping), from
`gpupool submit` through the API into the store, back out of `gpupool show`, and into the
core's JobSpec.

Store, migration and API tests run twice: on a SQLite file under tmp_path and on a fresh
schema of a throwaway PostgreSQL server (tests/support/pgserver.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text

from gpupool.cli import remote as client_cli
from gpupool.cli.main import main
from gpupool.domain.lifecycle import JobState
from gpupool.domain.model import JobKind, JobSpec
from gpupool.errors import ConflictError, SpecError
from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.scheduler.scheduler import Scheduler
from gpupool.server.api.app import create_app
from gpupool.server.api.schemas import MAX_STATE_GIB
from gpupool.server.loop.config import LiveConfig, build_cluster, spec_of
from gpupool.server.loop.driver import LiveService
from gpupool.server.store import MIGRATIONS_DIR, Base, NewJob, Store, database_url, schema_head
from gpupool.sizing import request_json as sf
from gpupool.sizing.catalog import load_catalog
from gpupool.sizing.memory import TRAINING_PRECISIONS
from gpupool.sizing.planner import PlanRequest
from gpupool.sizing.request_json import (
    SizingError,
    plan_request_from,
    plan_request_of,
    sizing_of,
)
from gpupool.sizing.shapes import ModelShape, get_shape, parse_shape, shape_names
from head_schema import at_head
from pgserver import fresh_schema, pg_url  # noqa: F401

T0 = 1_700_000_000.0
LLAMA_8B = sizing_of(PlanRequest(get_shape("llama-3-8b"), context=2048, batch=8, tokens=1e6))
"""The canonical mapping of `--model llama-3-8b --context 2048 --batch 8 --tokens 1e6`."""
SIZED: dict[str, Any] = {"state_gib_per_gpu": 40.0, "sizing": LLAMA_8B}
UNSIZED: dict[str, Any] = {"state_gib_per_gpu": 0.0, "sizing": None}


def job(**kw: Any) -> NewJob:
    fields: dict[str, Any] = {
        "name": "gen-1",
        "team": "nlp",
        "kind": "offline-inference",
        "priority": 50,
        "gpu_count": 1,
        "command": ("python", "generate.py"),
    }
    fields.update(kw)
    return NewJob(**fields)


def sizing_fields(row: Any) -> dict[str, Any]:
    return {k: getattr(row, k) for k in SIZED}


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


# ---- the mapping: PlanRequest -> mapping -> PlanRequest ---------------------------------------
def _requests() -> list[PlanRequest]:
    custom = ModelShape.custom(layers=40, hidden=5120, heads=40, kv_heads=8, name="ours-13b")
    moe = ModelShape.custom(
        layers=32, hidden=4096, heads=32, kv_heads=8, params_b=46.7, active_params_b=12.9
    )
    return [
        PlanRequest(get_shape("llama-3-8b")),
        PlanRequest(get_shape("llama-3-70b"), context=8192, batch=16, kv_precision="fp8"),
        PlanRequest(
            get_shape("llama-3-8b"),
            task="training",
            precision="fp16",
            seq_len=8192,
            batch=2,
            grad_accum=4,
            tokens=1e9,
            deadline_s=12 * 3600.0,
            counts=(8, 4, 2),
            gpus=("H100", "L40S"),
            zero_stage=1,
            recompute="full",
            optimizer="adam8bit",
        ),
        PlanRequest(custom, tokens=5e8),
        PlanRequest(moe, precision="int4", counts=(1,)),
        PlanRequest(parse_shape("params_b=70,layers=80,hidden=8192,heads=64,kv_heads=8")),
    ]


@pytest.mark.parametrize("request_", _requests(), ids=lambda r: f"{r.shape.name}-{r.task}")
def test_a_plan_request_round_trips_through_its_mapping(request_: PlanRequest) -> None:
    mapping = sizing_of(request_)
    assert set(mapping) == set(sf.FIELDS) - {"shape" if "model" in mapping else "model"}
    stored = json.loads(json.dumps(mapping))  # what a JSON column gives back
    assert plan_request_from(stored) == request_
    assert sizing_of(plan_request_from(stored)) == mapping  # canonical: a fixed point


def test_packaged_models_are_kept_by_name_others_by_shape() -> None:
    assert sizing_of(PlanRequest(get_shape("mixtral-8x7b")))["model"] == "mixtral-8x7b"
    custom = sizing_of(PlanRequest(ModelShape.custom(layers=2, hidden=64, heads=4)))
    assert "model" not in custom
    assert custom["shape"]["name"] == "custom" and custom["shape"]["source"] == "custom shape"
    # a shape named like a packaged model but different is a shape, not that model
    fake = dataclasses.replace(get_shape("llama-3-8b"), layers=33)
    assert "shape" in sizing_of(PlanRequest(fake))


def test_a_partial_mapping_takes_the_planners_defaults() -> None:
    assert plan_request_from({"model": "llama-3-8b"}) == PlanRequest(get_shape("llama-3-8b"))
    shape: dict[str, Any] = {"layers": 2, "hidden": 64, "heads": 4}
    assert plan_request_from({"shape": shape}).shape == ModelShape.custom(**shape)
    defaults: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(PlanRequest)}
    for key, value in sf.DEFAULTS.items():
        assert value == (list(defaults[key]) if key == "counts" else defaults[key])
    # every PlanRequest field but perf (the speed model's) has its key; model/shape for shape
    assert set(sf.FIELDS) == set(defaults) - {"perf", "shape"} | {"model", "shape"}


def test_the_simulators_model_jobs_requests_round_trip() -> None:
    """As gpupool.sim.scenario.generators.model_jobs builds them."""
    for task in ("inference", "training"):
        request = PlanRequest(
            shape=get_shape("qwen2.5-7b"),
            task=task,
            precision="bf16",
            context=4096,
            seq_len=4096,
            batch=8,
            grad_accum=1,
            tokens=123456789.25,
        )
        assert plan_request_from(json.loads(json.dumps(sizing_of(request)))) == request


_shapes = st.builds(
    ModelShape.custom,
    layers=st.integers(1, 200),
    hidden=st.sampled_from([64, 512, 4096, 8192]),
    heads=st.sampled_from([8, 32, 64]),
    kv_heads=st.sampled_from([None, 1, 8]),
    params_b=st.none() | st.floats(0.1, 2000),
    name=st.text(min_size=1, max_size=20).filter(lambda s: "\x00" not in s),
)
_requests_st = st.builds(
    PlanRequest,
    shape=st.sampled_from([get_shape(n) for n in shape_names()]) | _shapes,
    task=st.sampled_from(["inference", "training"]),
    precision=st.sampled_from(TRAINING_PRECISIONS),
    kv_precision=st.none() | st.sampled_from(["fp8", "int8"]),
    context=st.integers(1, sf.MAX_SEQ_TOKENS),
    seq_len=st.integers(1, sf.MAX_SEQ_TOKENS),
    batch=st.integers(1, sf.MAX_BATCH),
    grad_accum=st.integers(1, sf.MAX_GRAD_ACCUM),
    tokens=st.floats(1e-3, sf.MAX_TOKENS),
    deadline_s=st.none() | st.floats(1e-3, sf.MAX_DEADLINE_S),
    counts=st.lists(st.integers(1, sf.MAX_COUNT), min_size=1, max_size=sf.MAX_COUNTS).map(tuple),
    gpus=st.none() | st.lists(st.sampled_from(["H100", "A100-80GB", "L4"]), min_size=1).map(tuple),
    zero_stage=st.integers(0, 3),
    recompute=st.sampled_from(["none", "selective", "full"]),
    optimizer=st.sampled_from(["adam", "adam8bit", "sgd"]),
)


@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(request_=_requests_st)
def test_every_valid_request_round_trips(request_: PlanRequest) -> None:
    stored = json.loads(json.dumps(sizing_of(request_)))
    assert plan_request_from(stored) == request_


@pytest.mark.parametrize(
    ("mapping", "loc", "message"),
    [
        ({"model": "llama-9"}, ("model",), "unknown model 'llama-9'; known models: llama-3-8b"),
        ({"model": "Llama-3-8B"}, ("model",), "did you mean 'llama-3-8b'?"),
        ({"model": 7}, ("model",), "unknown model 7"),
        ({}, ("model",), "give a model"),
        ({"model": "llama-3-8b", "shape": {}}, ("shape",), "not both"),
        ({"model": "llama-3-8b", "colour": 1}, ("colour",), "unknown field"),
        ({"model": "llama-3-8b", "task": "serving"}, ("task",), "choose from inference"),
        ({"model": "llama-3-8b", "precision": "fp64"}, ("precision",), "unknown precision"),
        (
            {"model": "llama-3-8b", "task": "training", "precision": "fp8"},
            ("precision",),
            "training in fp8 is not modelled",
        ),
        ({"model": "llama-3-8b", "context": 0}, ("context",), "within 1..10000000"),
        ({"model": "llama-3-8b", "batch": True}, ("batch",), "whole number, not bool"),
        ({"model": "llama-3-8b", "batch": 8.0}, ("batch",), "whole number, not float"),
        ({"model": "llama-3-8b", "batch": 10**30}, ("batch",), "within 1..100000"),
        ({"model": "llama-3-8b", "context": None}, ("context",), "not null"),
        ({"model": "llama-3-8b", "tokens": -1}, ("tokens",), "more than 0"),
        ({"model": "llama-3-8b", "tokens": math.nan}, ("tokens",), "more than 0"),
        ({"model": "llama-3-8b", "tokens": math.inf}, ("tokens",), "more than 0"),
        ({"model": "llama-3-8b", "tokens": "1e6"}, ("tokens",), "must be a number"),
        ({"model": "llama-3-8b", "deadline_s": 60}, ("deadline_s",), "give tokens"),
        ({"model": "llama-3-8b", "counts": []}, ("counts",), "1 to 16 items"),
        ({"model": "llama-3-8b", "counts": [1, 0]}, ("counts", "1"), "within 1..1024"),
        ({"model": "llama-3-8b", "gpus": ["H100", ""]}, ("gpus", "1"), "1 to 64 characters"),
        ({"model": "llama-3-8b", "zero_stage": 4}, ("zero_stage",), "within 0..3"),
        ({"shape": "70b"}, ("shape",), "must be a mapping"),
        ({"shape": {"layers": 2, "hidden": 64}}, ("shape", "heads"), "required"),
        ({"shape": {"layers": 2, "hidden": 64, "heads": 4, "x": 1}}, ("shape", "x"), "unknown"),
        (
            {"shape": {"layers": 2, "hidden": 64, "heads": 3, "kv_heads": 2}},
            ("shape",),
            "heads (3) must be a multiple of kv_heads (2)",
        ),
        (
            {"shape": {"layers": 2, "hidden": 64, "heads": 4, "params_b": math.inf}},
            ("shape", "params_b"),
            "more than 0",
        ),
    ],
)
def test_a_bad_mapping_names_its_field(
    mapping: dict[str, Any], loc: tuple[str, ...], message: str
) -> None:
    with pytest.raises(SizingError) as info:
        plan_request_from(mapping)
    assert info.value.loc == loc
    assert message in str(info.value)
    assert str(info.value).startswith(f"sizing.{'.'.join(loc)}: ")
    assert isinstance(info.value, SpecError)  # so the API answers 422


def test_a_sizing_that_is_not_a_mapping() -> None:
    with pytest.raises(SizingError, match="sizing: must be a mapping"):
        plan_request_from(["llama-3-8b"])  # type: ignore[arg-type]


# ---- store ------------------------------------------------------------------------------------
def test_store_roundtrip_of_the_sizing_fields(store: Store, url: str) -> None:
    spec = job(**SIZED)
    row, created = store.jobs.submit(spec, T0, idempotency_key="k-1")
    assert created
    assert sizing_fields(row) == SIZED
    assert row.spec() == spec
    assert plan_request_of(row) == plan_request_from(LLAMA_8B)
    again = Store(url)  # another process's view of the committed row
    try:
        read = again.jobs.get(row.id)
        assert read == row
        assert plan_request_of(read) == PlanRequest(
            get_shape("llama-3-8b"), context=2048, batch=8, tokens=1e6
        )
        assert [sizing_fields(r) for r in again.jobs.list()] == [SIZED]
        assert [sizing_fields(r) for r in again.jobs.active()] == [SIZED]
    finally:
        again.close()
    [many] = store.jobs.submit_many([job(name="m", **SIZED)], T0)
    [(grouped, _)] = store.jobs.submit_group([(job(name="g", **SIZED), "k-2")], T0)  # type: ignore[misc]
    moved = store.jobs.transition(grouped.id, "running", T0 + 1)
    for r in (many, grouped, moved, store.jobs.get(many.id), store.jobs.get(moved.id)):
        assert sizing_fields(r) == SIZED


def test_store_defaults_when_not_given(store: Store) -> None:
    row, _ = store.jobs.submit(job(), T0)
    assert sizing_fields(row) == UNSIZED
    read = store.jobs.get(row.id)
    assert sizing_fields(read) == UNSIZED
    assert isinstance(read.state_gib_per_gpu, float)
    assert plan_request_of(read) is None


def test_store_keeps_a_sizing_given_with_tuples_as_json_reads_it(store: Store) -> None:
    """A NewJob's sizing is held as a JSON column gives it back (lists), so a resubmission
    with the same key and spec finds the same job rather than a conflict."""
    sizing = {"model": "llama-3-8b", "counts": (1, 2), "gpus": ("H100",)}
    first, _ = store.jobs.submit(job(sizing=sizing), T0, idempotency_key="t")
    assert first.sizing == {"model": "llama-3-8b", "counts": [1, 2], "gpus": ["H100"]}
    again, created = store.jobs.submit(job(sizing=sizing), T0 + 1, idempotency_key="t")
    assert (again, created) == (first, False)
    assert store.jobs.get(first.id) == first


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"state_gib_per_gpu": -1.0}, "state_gib_per_gpu is -1.0"),
        ({"state_gib_per_gpu": math.nan}, "state_gib_per_gpu is nan"),
        ({"state_gib_per_gpu": math.inf}, "state_gib_per_gpu is inf"),
        ({"sizing": {"model": "llama-9"}}, "sizing.model: unknown model"),
        ({"sizing": {"model": "llama-3-8b", "tokens": math.nan}}, "sizing.tokens"),
        ({"sizing": {"model": "llama-3-8b", "batch": 0}}, "sizing.batch"),
        ({"sizing": {"shape": {"layers": 1}}}, "sizing.shape.hidden: required"),
    ],
)
def test_store_refuses_bad_sizing_fields(
    store: Store, fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError, match=message.replace(".", r"\.")):
        store.jobs.submit(job(**fields), T0)
    [err] = store.jobs.submit_group([(job(**fields), None)], T0)
    assert isinstance(err, SpecError)
    with pytest.raises(SpecError):
        store.jobs.submit_many([job(name="fine"), job(**fields)], T0)
    assert store.jobs.list() == []


def test_resubmission_with_another_size_is_a_conflict(store: Store) -> None:
    first, _ = store.jobs.submit(job(**SIZED), T0, idempotency_key="k")
    assert store.jobs.submit(job(**SIZED), T0 + 1, idempotency_key="k") == (first, False)
    for change in (
        {"state_gib_per_gpu": 41.0},
        {"sizing": {**LLAMA_8B, "batch": 16}},
        {"sizing": None},
    ):
        with pytest.raises(ConflictError, match=f"job {first.id} was submitted"):
            store.jobs.submit(job(**{**SIZED, **change}), T0 + 2, idempotency_key="k")
    assert len(store.jobs.list()) == 1


def test_spec_of_gives_the_core_the_checkpoint_size(store: Store) -> None:
    row, _ = store.jobs.submit(job(**SIZED), T0)
    assert spec_of(row).state_gib_per_gpu == 40.0
    plain, _ = store.jobs.submit(job(name="plain"), T0)
    assert spec_of(plain).state_gib_per_gpu == 0.0


# ---- migration 0002 -> 0003 -----------------------------------------------------------------
def _alembic(conn: sa.Connection) -> Config:
    """The configuration Store.migrate() uses, on a connection of ours."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    config.set_main_option("path_separator", "os")
    config.attributes["connection"] = conn
    return config


# The jobs table as revision 0002 left it (only the columns an insert needs).
JOBS_0002 = sa.table(
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
            ("dataset", sa.String()),
            ("dataset_gb", sa.Double()),
        )
    ),
)
OLD_ROW: dict[str, Any] = {
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
    "dataset": "eu-lake/imagenet",
    "dataset_gb": 140.5,
}


def _columns(engine: sa.Engine) -> set[str]:
    return {c["name"] for c in sa.inspect(engine).get_columns("jobs")}


def _version(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT version_num FROM alembic_version")).scalars())


def test_a_0002_database_upgrades_in_place(url: str, open_store: Callable[[], Store]) -> None:
    store = open_store()  # not migrated yet; makes the SQLite file's directory
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            command.upgrade(_alembic(conn), "0002")
            conn.execute(JOBS_0002.insert(), OLD_ROW)
        assert _version(engine) == ["0002"]
        assert not set(SIZED) & _columns(engine)

        store.migrate()
        assert _version(engine) == [schema_head()]
        assert set(SIZED) <= _columns(engine)
        [old] = store.jobs.list()
        assert (old.name, old.team, old.command, dict(old.env), old.gpu_count) == (
            "old",
            "vision",
            ("python", "train.py"),
            {"SEED": "1"},
            2,
        )
        assert (old.dataset, old.dataset_gb) == ("eu-lake/imagenet", 140.5)
        assert sizing_fields(old) == UNSIZED
        assert isinstance(old.state_gib_per_gpu, float)
        assert plan_request_of(old) is None
        assert spec_of(old).state_gib_per_gpu == 0.0
        # its idempotency key still answers a resubmission of the same spec with the old job
        resubmitted, created = store.jobs.submit(old.spec(), T0 + 5, idempotency_key="old-key")
        assert (resubmitted.id, created) == (old.id, False)
        new, _ = store.jobs.submit(job(**SIZED), T0 + 10)
        assert sizing_fields(store.jobs.get(new.id)) == SIZED

        # the upgraded schema is exactly the models
        from alembic.autogenerate import compare_metadata
        from alembic.runtime.migration import MigrationContext

        with engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []

        # and 0003 can be undone, keeping the jobs and what 0002 added
        with engine.begin() as conn:
            command.downgrade(_alembic(conn), "0002")
        engine.dispose()  # SQLite: forget the cached table layout
        assert _version(engine) == ["0002"]
        assert not set(SIZED) & _columns(engine)
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT name, dataset FROM jobs ORDER BY id")).all()
        assert [tuple(r) for r in rows] == [("old", "eu-lake/imagenet"), ("gen-1", None)]
        store.close()
        again = open_store()
        again.migrate()
        assert _version(engine) == [schema_head()]
        assert sizing_fields(again.jobs.get(new.id)) == UNSIZED
    finally:
        engine.dispose()


# ---- API --------------------------------------------------------------------------------------
@dataclass
class Api:
    store: Store
    client: TestClient

    def submit(self, headers: dict[str, str] | None = None, **spec: Any) -> httpx.Response:
        body: dict[str, Any] = {"command": ["python", "generate.py"], "team": "nlp"}
        body.update(spec)
        r: httpx.Response = self.client.post("/v1/jobs", json=body, headers=headers or {})
        return r


FLEET = "16xA100-80GB,8xH100,8xL4"
"""Room for the jobs these tests size; one that fits nowhere here is refused at submit."""


def core_refuses(request: PlanRequest) -> bool:
    """The decision core, on the API's fleet, finds no GPU type that holds the request (an
    oracle apart from the API's admission check)."""
    cluster, _ = build_cluster(FakeTelemetry(FLEET).inventory(), "h")
    core = Scheduler(cluster, catalog=load_catalog())
    job = JobSpec("1", 1, team="nlp", kind=JobKind.OFFLINE, submit_s=0.0)
    return core.submit(job, 0.0, sized=request).state is JobState.UNPLACEABLE


@pytest.fixture
def api(store: Store, tmp_path: Path) -> Iterator[Api]:
    service = LiveService(
        LiveConfig(state_dir=tmp_path / "run", sample_s=0.0, host="h"),
        store,
        FakeExecutor(),
        FakeTelemetry(FLEET),
        ManualClock(1_000.0),
    )
    client = TestClient(create_app(service, store, auth=False), raise_server_exceptions=False)
    yield Api(store, client)
    client.close()


GIVEN = {"model": "llama-3-8b", "context": 2048, "batch": 8, "tokens": 1e6}
"""What a client sends; the API stores it with the planner's defaults filled in (LLAMA_8B)."""


def test_api_accepts_and_returns_the_fields(api: Api) -> None:
    r = api.submit(kind="offline-inference", state_gib_per_gpu=40, sizing=GIVEN)
    assert r.status_code == 201, r.text
    created = r.json()
    assert {k: created[k] for k in SIZED} == SIZED
    assert api.client.get(f"/v1/jobs/{created['id']}").json() == created
    [listed] = api.client.get("/v1/jobs").json()["jobs"]
    assert listed == created
    row = api.store.jobs.get(created["id"])
    assert sizing_fields(row) == SIZED
    assert plan_request_of(row) == plan_request_from(GIVEN)

    plain = api.submit()
    assert plain.status_code == 201, plain.text
    assert {k: plain.json()[k] for k in SIZED} == UNSIZED

    shaped: dict[str, Any] = {
        "layers": 40,
        "hidden": 5120,
        "heads": 40,
        "kv_heads": 8,
        "name": "ours-13b",
    }
    r = api.submit(sizing={"shape": shaped, "task": "training", "tokens": 1e9}, gpus=8)
    assert r.status_code == 201, r.text
    stored = api.store.jobs.get(r.json()["id"])
    assert stored.gpu_count == 8
    assert plan_request_of(stored) == PlanRequest(
        ModelShape.custom(**shaped), task="training", tokens=1e9
    )

    batch = api.client.post(
        "/v1/jobs/batch", json={"jobs": [{"command": ["x"], "team": "nlp", **SIZED}]}
    )
    assert batch.status_code == 201, batch.text
    assert {k: batch.json()["jobs"][0][k] for k in SIZED} == SIZED


@settings(
    max_examples=40,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(request_=_requests_st, gib=st.floats(0, MAX_STATE_GIB))
def test_api_stores_any_valid_request_as_is(api: Api, request_: PlanRequest, gib: float) -> None:
    """Valid requests up to the bounds are accepted, stored and read back unchanged (no 500
    from a JSON column, no float turned into something else), unless no GPU type of the
    fleet holds them: then they are refused at submit, exactly when the core would find
    them unplaceable."""
    mapping = sizing_of(request_)
    r = api.submit(state_gib_per_gpu=gib, sizing=mapping)
    if core_refuses(request_):
        assert r.status_code == 422 and "fits nowhere in this fleet" in r.text, r.text
        return
    assert r.status_code == 201, r.text
    assert (r.json()["state_gib_per_gpu"], r.json()["sizing"]) == (gib, mapping)
    row = api.store.jobs.get(r.json()["id"])
    assert plan_request_of(row) == request_
    assert row.state_gib_per_gpu == gib


def _problems(r: httpx.Response) -> list[tuple[list[Any], str]]:
    assert r.status_code == 422, r.text
    return [(d["loc"], d["msg"]) for d in r.json()["detail"]]


@pytest.mark.parametrize(
    ("body", "loc", "message"),
    [
        ({"state_gib_per_gpu": -1}, ["state_gib_per_gpu"], "greater than or equal to 0"),
        ({"state_gib_per_gpu": "big"}, ["state_gib_per_gpu"], "valid number"),
        ({"state_gib_per_gpu": 1e300}, ["state_gib_per_gpu"], "less than or equal to"),
        ({"sizing": {"model": "llama-9"}}, ["sizing", "model"], "unknown model 'llama-9'"),
        ({"sizing": {"model": "Llama-3-8B"}}, ["sizing", "model"], "did you mean 'llama-3-8b'"),
        ({"sizing": {"model": "llama-3-8b", "colour": 1}}, ["sizing", "colour"], "Extra inputs"),
        ({"sizing": {"model": "llama-3-8b", "task": "x"}}, ["sizing", "task"], "unknown task"),
        ({"sizing": {"model": "llama-3-8b", "batch": 0}}, ["sizing", "batch"], "greater than"),
        ({"sizing": {"model": "llama-3-8b", "batch": True}}, ["sizing", "batch"], "integer"),
        ({"sizing": {"model": "llama-3-8b", "counts": []}}, ["sizing", "counts"], "at least 1"),
        ({"sizing": {"model": "llama-3-8b", "gpus": ["a\x00"]}}, ["sizing", "gpus"], "NUL"),
        ({"sizing": {}}, ["sizing"], "sizing.model: give a model"),
        ({"sizing": {"model": "llama-3-8b", "shape": {}}}, ["sizing", "shape", "layers"], ""),
        (
            {"sizing": {"model": "llama-3-8b", "shape": {"layers": 2, "hidden": 64, "heads": 4}}},
            ["sizing"],
            "sizing.shape: give model or shape, not both",
        ),
        (
            {"sizing": {"model": "llama-3-8b", "task": "training", "precision": "fp8"}},
            ["sizing"],
            "sizing.precision: training in fp8 is not modelled",
        ),
        (
            {"sizing": {"model": "llama-3-8b", "deadline_s": 60}},
            ["sizing"],
            "sizing.deadline_s: a deadline needs the amount of work",
        ),
        (
            {"sizing": {"shape": {"layers": 2, "hidden": 64, "heads": 3, "kv_heads": 2}}},
            ["sizing", "shape"],
            "heads (3) must be a multiple of kv_heads (2)",
        ),
        ({"sizing": "llama-3-8b"}, ["sizing"], "valid dictionary"),
    ],
)
def test_api_rejects_bad_values_with_422_naming_the_field(
    api: Api, body: dict[str, Any], loc: list[str], message: str
) -> None:
    problems = _problems(api.submit(**body))
    assert any(p == ["body", *loc] and message in msg for p, msg in problems), problems
    batch = api.client.post("/v1/jobs/batch", json={"jobs": [{"command": ["x"], **body}]})
    problems = _problems(batch)
    assert any(p == ["body", "jobs", 0, *loc] for p, _ in problems), problems
    assert api.store.jobs.list() == []


@pytest.mark.parametrize(
    "field", ["state_gib_per_gpu", "sizing.tokens", "sizing.deadline_s", "sizing.shape.params_b"]
)
@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity"])
def test_api_rejects_non_finite_numbers(api: Api, field: str, raw: str) -> None:
    """Python's JSON parser reads NaN and Infinity; the API must still refuse them."""
    bodies = {
        "state_gib_per_gpu": '"state_gib_per_gpu": ' + raw,
        "sizing.tokens": '"sizing": {"model": "llama-3-8b", "tokens": ' + raw + "}",
        "sizing.deadline_s": '"sizing": {"model": "llama-3-8b", "tokens": 1, "deadline_s": '
        + raw
        + "}",
        "sizing.shape.params_b": '"sizing": {"shape": {"layers": 2, "hidden": 64, "heads": 4, '
        '"params_b": ' + raw + "}}",
    }
    body = '{"command": ["x"], "team": "nlp", ' + bodies[field] + "}"
    r = api.client.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
    problems = _problems(r)
    assert any(loc == ["body", *field.split(".")] for loc, _ in problems), problems
    assert api.store.jobs.list() == []


def test_api_resubmission_with_another_size_is_a_409(api: Api) -> None:
    key = {"Idempotency-Key": "size-1"}
    first = api.submit(headers=key, state_gib_per_gpu=40, sizing=GIVEN)
    assert first.status_code == 201, first.text
    # the same request, and the same request spelt out in full, are the same job
    for sizing in (GIVEN, LLAMA_8B):
        again = api.submit(headers=key, state_gib_per_gpu=40, sizing=sizing)
        assert again.status_code == 200, again.text
        assert again.json()["id"] == first.json()["id"]
    for change in ({"state_gib_per_gpu": 8}, {"sizing": {**GIVEN, "batch": 16}}, {"sizing": None}):
        other = api.submit(headers=key, **{"state_gib_per_gpu": 40, "sizing": GIVEN, **change})
        assert other.status_code == 409, other.text
        assert "idempotency key reused" in other.json()["detail"]
    assert len(api.store.jobs.list()) == 1


def test_openapi_describes_the_fields(api: Api) -> None:
    schemas = api.client.get("/openapi.json").json()["components"]["schemas"]
    props = schemas["JobIn"]["properties"]
    gib = props["state_gib_per_gpu"]
    assert gib["minimum"] == 0 and gib["default"] == 0 and "preempted" in gib["description"]
    assert "SizingIn" in json.dumps(props["sizing"]) and "model" in props["sizing"]["description"]
    sizing = schemas["SizingIn"]
    assert sizing["additionalProperties"] is False
    assert sizing["dependentRequired"] == {"deadline_s": ["tokens"]}
    fields = sizing["properties"]
    assert set(fields) == set(sf.FIELDS)
    assert fields["model"]["enum"] == [*shape_names(), None]
    assert fields["task"]["enum"] == ["inference", "training"]
    for key, value in sf.DEFAULTS.items():  # the schema says the planner's defaults
        assert fields[key].get("default") == value, key
    assert schemas["ShapeIn"]["required"] == ["layers", "hidden", "heads"]
    for name in ("JobIn", "SizingIn", "ShapeIn"):
        assert schemas[name]["description"], name


# ---- CLI --------------------------------------------------------------------------------------
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


def submit(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, err = run(["submit", "--team", "nlp", *argv, "--json", "--", "x"], capsys)
    assert (code, err) == (0, ""), err
    job: dict[str, Any] = json.loads(out)
    return job


def test_cli_checkpoint_gib_reaches_the_api(
    served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    job = submit(["--checkpoint-gib", "40"], capsys)
    assert served[-1] == {"command": ["x"], "team": "nlp", "state_gib_per_gpu": 40.0}
    assert (job["state_gib_per_gpu"], job["sizing"]) == (40.0, None)
    assert "gpus" not in served[-1]  # --gpus stays optional
    code, out, _ = run(["show", str(job["id"])], capsys)
    assert code == 0
    assert "ckpt size   40 GiB per GPU (written when preempted)" in out
    assert "sized by" not in out
    assert submit(["--checkpoint-gib", "0"], capsys)["state_gib_per_gpu"] == 0.0


def test_cli_model_flags_reach_the_api(
    api: Api, served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", "llama-3-8b", "--task", "inference", "--context", "2048", "--batch", "8"]
    job = submit([*argv, "--tokens", "1e6"], capsys)
    assert served[-1] == {
        "command": ["x"],
        "team": "nlp",
        "kind": "offline-inference",  # as the simulator kinds an inference model job
        "sizing": {
            "model": "llama-3-8b",
            "task": "inference",
            "context": 2048,
            "batch": 8,
            "tokens": 1e6,
        },
    }
    assert job["sizing"] == LLAMA_8B and job["kind"] == "offline-inference"
    assert plan_request_of(api.store.jobs.get(job["id"])) == plan_request_from(GIVEN)
    code, out, _ = run(["show", str(job["id"])], capsys)
    assert code == 0
    assert "sized by    llama-3-8b inference bf16, context 2048, batch 8, 1,000,000 tokens" in out
    assert "ckpt size" not in out
    code, out, _ = run(["show", str(job["id"]), "--json"], capsys)
    assert json.loads(out) == job


def test_cli_training_by_shape_with_every_planner_flag(
    served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    job = submit(
        [
            "--shape",
            "params_b=70,layers=80,hidden=8192,heads=64,kv_heads=8",
            "--task",
            "training",
            "--precision",
            "fp16",
            "--kv-precision",
            "fp8",
            "--seq-len",
            "8192",
            "--batch",
            "2",
            "--grad-accum",
            "4",
            "--zero-stage",
            "1",
            "--recompute",
            "full",
            "--optimizer",
            "sgd",
            "--tokens",
            "2B",
            "--counts",
            "8,16",
            "--gpus",
            "8",
            "--checkpoint-gib",
            "17.5",
        ],
        capsys,
    )
    body = served[-1]
    assert (body["kind"], body["gpus"], body["state_gib_per_gpu"]) == ("training", 8, 17.5)
    shape = parse_shape("params_b=70,layers=80,hidden=8192,heads=64,kv_heads=8")
    expected = PlanRequest(
        shape,
        task="training",
        precision="fp16",
        kv_precision="fp8",
        seq_len=8192,
        batch=2,
        grad_accum=4,
        zero_stage=1,
        recompute="full",
        optimizer="sgd",
        tokens=2e9,
        counts=(8, 16),
    )
    assert plan_request_from(body["sizing"]) == expected
    assert plan_request_from(job["sizing"]) == expected
    assert job["sizing"] == sizing_of(expected)
    code, out, _ = run(["show", str(job["id"])], capsys)
    assert code == 0
    assert "sized by    custom training fp16, seq 8192 x micro-batch 2 x accum 4" in out
    assert "ckpt size   17.5 GiB per GPU" in out


def test_cli_model_names_and_kinds(
    served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    # the planner's spelling-insensitive names go out as the server's exact ones
    assert submit(["--model", "Llama-3-70B"], capsys)["sizing"]["model"] == "llama-3-70b"
    assert served[-1]["sizing"] == {"model": "llama-3-70b"}
    assert served[-1]["kind"] == "offline-inference"
    # a given --kind wins; training follows --task
    assert submit(["--model", "llama-3-8b", "--kind", "batch"], capsys)["kind"] == "batch"
    assert submit(["--model", "llama-3-8b", "--task", "training"], capsys)["kind"] == "training"
    # without --model nothing about sizing is sent, and the kind is the server's default
    submit([], capsys)
    assert served[-1] == {"command": ["x"], "team": "nlp"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--checkpoint-gib", "-1"], "--checkpoint-gib '-1' must be zero or more than zero"),
        (["--checkpoint-gib", "nan"], "--checkpoint-gib 'nan': give a number"),
        (["--context", "2048"], "--context sizes a job by its model: give --model"),
        (["--tokens", "1e6"], "--tokens sizes a job by its model"),
        (["--model", "llama-9"], "unknown model 'llama-9'; known models: llama-3-8b"),
        (["--model", "llama-3-8b", "--tokens", "lots"], "--tokens 'lots'"),
        (["--model", "llama-3-8b", "--counts", "0,1"], "--counts '0,1'"),
        (["--model", "llama-3-8b", "--batch", "0"], "--batch: must be within 1..100000"),
        (
            ["--model", "llama-3-8b", "--task", "training", "--precision", "fp8"],
            "--precision: training in fp8 is not modelled",
        ),
        (["--shape", "layers=2,hidden=64"], "--shape needs heads"),
        (["--shape", "layers=2,hidden=64,heads=3,kv_heads=2"], "multiple of kv_heads"),
    ],
)
def test_cli_rejects_bad_values_before_sending(
    served: list[dict[str, Any]], capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(["submit", *argv, "--", "x"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("gpupool: error: ") and message in err, err
    assert served == []


def test_cli_model_and_shape_are_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["submit", "--model", "llama-3-8b", "--shape", "layers=1", "--", "x"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_submit_help_lists_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["submit", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for flag in ("--checkpoint-gib GIB", "--model MODEL", "--shape K=V,...", "--tokens TOKENS"):
        assert flag in out
    assert "sizing by model" in out and "llama-3-8b" in out

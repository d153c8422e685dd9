"""A job's submit-time fields (gpupool.domain.job_fields.JobFields) reach the store and the
API and come back unchanged: a field added to JobFields but not carried by the jobs table,
the store's copies, JobIn or the job's JSON fails here."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpupool.domain.job_fields import JOB_FIELDS, JobFields
from gpupool.domain.topology import Topology
from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.server.api.app import create_app
from gpupool.server.api.schemas import JOB_IN_NAME, JOB_IN_OMITS, JOB_JSON_OMITS, JobIn, job_json
from gpupool.server.loop.config import LIVE_DEFAULTS, LiveConfig
from gpupool.server.loop.driver import LiveService
from gpupool.server.store import NewJob, Store, database_url
from gpupool.server.store.jobs import COLUMN_OF
from gpupool.server.store.tables import JobModel
from gpupool.sizing.request_json import plan_request_from, sizing_of

OWNER = "ops-bot"
SIZING = sizing_of(plan_request_from({"model": "llama-3-8b", "context": 2048, "batch": 8}))
COMMON: dict[str, Any] = {
    "name": "every-field",
    "team": "nlp",
    "command": ("python", "train.py", "--fast"),
    "env": {"SEED": "1"},
    "cwd": "/work",
    "checkpoint_every_s": 30.0,
    "grace_s": 5.0,
    "max_retries": 2,
    "duration_s": 100.0,
    "owner": OWNER,
    "dataset": "eu-data",
    "dataset_gb": 3.5,
    "deadline_at": 2e9,
    "time_limit_s": 3600.0,
    "priority": 7,
}
SAMPLES: list[dict[str, Any]] = [
    {
        **COMMON,
        "kind": "online-inference",
        "gpu_count": 1,
        "gpu_model": "A100-80GB",
        "gpu_milli": 250,
        "user_region": "eu-west",
        "latency_bound_ms": 50.0,
        "state_gib_per_gpu": 2.0,
    },
    {**COMMON, "kind": "training", "gpu_count": 2, "gpu_count_min": 1, "user": "ada"},
    {**COMMON, "kind": "batch", "gpu_count": 1, "gpu_mem_mib": 20_480},
    {**COMMON, "kind": "training", "gpu_count": 2, "topology": "rack"},
    {**COMMON, "kind": "training", "gpu_count": 2, "topology_preferred": "nvlink"},
    {**COMMON, "kind": "training", "gpu_count": 1, "sizing": SIZING},
]
"""Jobs the API takes: together they give every field but the API's omissions a value
other than its default (one job cannot: an elastic job shares no GPU, for one)."""
REPLICA: dict[str, Any] = {**SAMPLES[0], "service": "chat", "name": "chat-0"}
"""What only the core submits: a service's replica."""


def _defaults() -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(JobFields):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def test_the_samples_set_every_field() -> None:
    defaults = _defaults()
    for name in JOB_FIELDS:
        values = [s[name] for s in [*SAMPLES, REPLICA] if name in s]
        assert any(v != defaults.get(name, object()) for v in values), (
            f"JobFields.{name}: give it a value other than its default in SAMPLES (or "
            "REPLICA, when only the core sets it), then carry it through the store and the API"
        )
        wanted = name in JOB_IN_OMITS
        assert wanted or any(name in s for s in SAMPLES), f"the API sample lacks {name}"


def test_every_field_has_a_column() -> None:
    columns = set(JobModel.__table__.c.keys())
    assert {COLUMN_OF.get(n, n) for n in JOB_FIELDS} <= columns


@pytest.mark.parametrize("sample", [*SAMPLES, REPLICA], ids=lambda s: f"{s['kind']}")
def test_the_store_keeps_every_field(tmp_path: Path, sample: dict[str, Any]) -> None:
    url = database_url(None, tmp_path)
    job = NewJob(**sample)
    with Store(url) as store:
        store.migrate()
        row, _ = store.jobs.submit(job, 1_000.0)
        assert row.spec() == job
    with Store(url) as again:  # read back by another engine: what was committed
        read = again.jobs.get(row.id)
        assert read.spec() == job
        assert read == row
        assert again.jobs.list() == [row]


def _body(sample: dict[str, Any]) -> dict[str, Any]:
    """The JobIn body that submits `sample` (the API's names and units)."""
    body = {JOB_IN_NAME.get(k, k): v for k, v in sample.items() if k not in JOB_IN_OMITS}
    if "gpu_share" in body:
        body["gpu_share"] /= 1000  # a share of one GPU, not thousandths of it
    return json.loads(json.dumps(body))


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[TestClient, Store, dict[str, str]]]:
    store = Store(database_url(None, tmp_path / "db"))
    store.migrate()
    topology = Topology(levels=("nvlink", "rack"))  # the levels a sample asks for
    scheduling = dataclasses.replace(LIVE_DEFAULTS, topology=topology)
    service = LiveService(
        LiveConfig(state_dir=tmp_path / "state", scheduling=scheduling, sample_s=0.0, host="h"),
        store,
        FakeExecutor(),
        FakeTelemetry("2xA100-80GB"),
        ManualClock(1_000.0),
    )
    app = create_app(service, store, auth=True)
    headers = {"authorization": f"Bearer {store.auth.create_token(OWNER, None, 0.0)}"}
    with TestClient(app) as client:
        yield client, store, headers
    service.stop()
    store.close()


def test_jobin_takes_every_field_the_api_does_not_omit() -> None:
    names = {JOB_IN_NAME.get(n, n) for n in JOB_FIELDS if n not in JOB_IN_OMITS}
    assert names <= set(JobIn.model_fields)


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: f"{s['kind']}")
def test_the_api_takes_and_shows_every_field(
    api: tuple[TestClient, Store, dict[str, str]], sample: dict[str, Any]
) -> None:
    client, store, headers = api
    r = client.post("/v1/jobs", json=_body(sample), headers=headers)
    assert r.status_code == 201, r.text
    row = store.jobs.get(r.json()["id"])
    assert row.spec() == NewJob(**sample)
    shown = client.get(f"/v1/jobs/{row.id}", headers=headers).json()
    assert shown == r.json() == json.loads(json.dumps(job_json(row)))
    for name in JOB_FIELDS:
        if name in JOB_JSON_OMITS:
            assert name not in shown
        else:
            assert shown[name] == json.loads(json.dumps(getattr(row, name))), name

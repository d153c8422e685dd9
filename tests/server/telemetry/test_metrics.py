"""The /metrics collector in-process: create_app on a LiveService with a fake executor, a fake
fleet (2 x A100-80GB) and a manual clock, read back through prometheus_client's parser.

HELP and TYPE on every family, label values escaped by the library, the two start
histograms by job kind (a resume counts as a queue wait, not as a submit-to-start), and
each app's registry its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.server.api.app import create_app
from gpupool.server.loop.config import LiveConfig
from gpupool.server.loop.driver import LiveService
from gpupool.server.store import NewJob, Store, database_url
from gpupool.server.telemetry.prometheus import (
    QUEUE_WAIT,
    START_BUCKETS_S,
    SUBMIT_TO_START,
    StartLatency,
)

T0 = 1_000.0

FAMILIES = {
    "DCGM_FI_DEV_FB_USED": "gauge",
    "DCGM_FI_DEV_FB_FREE": "gauge",
    "DCGM_FI_DEV_GPU_UTIL": "gauge",
    "DCGM_FI_DEV_GPU_TEMP": "gauge",
    "DCGM_FI_DEV_POWER_USAGE": "gauge",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": "gauge",
    "DCGM_FI_DEV_SM_CLOCK": "gauge",
    "DCGM_FI_DEV_MEM_CLOCK": "gauge",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "gauge",
    "gpupool_jobs": "gauge",
    "gpupool_gpus_reclaimable": "gauge",
    "gpupool_scale_out": "gauge",
    "gpupool_queue_pending": "gauge",
    "gpupool_nodes_unhealthy": "gauge",
    "gpupool_gpus_out": "gauge",
    "gpupool_node_up": "gauge",
    "gpupool_node_lost": "counter",
    QUEUE_WAIT: "histogram",
    SUBMIT_TO_START: "histogram",
}
"""Every family /metrics yields (docs/metrics.md lists the same), besides the library's
`_created` gauges of the histograms."""


@dataclass
class App:
    store: Store
    service: LiveService
    clock: ManualClock
    executor: FakeExecutor
    client: TestClient

    def step(self, n: int = 1, dt_s: float = 1.0) -> None:
        for _ in range(n):
            self.clock.advance(dt_s)
            self.service.step()

    def submit(self, **spec: object) -> int:
        body = {"command": ["python", "train.py"], "team": "nlp", **spec}
        r = self.client.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        return int(r.json()["id"])

    def scrape(self) -> str:
        r = self.client.get("/metrics")
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == CONTENT_TYPE_LATEST
        text: str = r.text
        return text


@pytest.fixture
def make_app(tmp_path: Path) -> Iterator[Callable[..., App]]:
    made: list[App] = []

    def make(name: str = "a") -> App:
        store = Store(database_url(None, tmp_path / f"{name}.db"))
        store.migrate()
        clock = ManualClock(T0)
        executor = FakeExecutor()
        service = LiveService(
            LiveConfig(state_dir=tmp_path / f"state-{name}", sample_s=0.0, host="h"),
            store,
            executor,
            FakeTelemetry("2xA100-80GB"),
            clock,
        )
        client = TestClient(create_app(service, store, auth=False))
        made.append(App(store, service, clock, executor, client))
        return made[-1]

    yield make
    for app in made:
        app.client.close()
        app.store.close()


@pytest.fixture
def app(make_app: Callable[..., App]) -> App:
    return make_app()


def samples(text: str, name: str) -> list[Sample]:
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def value(text: str, name: str, **labels: str) -> float:
    found = [s.value for s in samples(text, name) if s.labels == labels]
    assert len(found) == 1, (name, labels, samples(text, name))
    return found[0]


def test_every_family_has_help_and_type(app: App) -> None:
    app.submit(kind="training")
    app.step()
    text = app.scrape()
    lines = text.splitlines()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    ours = {n: f for n, f in families.items() if not n.endswith("_created")}
    assert {n: f.type for n, f in ours.items()} == FAMILIES
    for f in families.values():
        exposed = f"{f.name}_total" if f.type == "counter" else f.name
        assert f"# TYPE {exposed} {f.type}" in lines, f.name
        help_lines = [x for x in lines if x.startswith(f"# HELP {exposed} ")]
        assert len(help_lines) == 1 and len(f.documentation) > 10, f.name
    # every sample line belongs to a family announced above it
    announced: set[str] = set()
    for line in lines:
        if line.startswith("# TYPE "):
            announced.add(line.split()[2])
        elif line and not line.startswith("#"):
            name = line.split("{")[0].split(" ")[0]
            base = name.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
            assert name in announced or base in announced, line


def test_gauges_read_the_live_views(app: App) -> None:
    app.submit(team="nlp")
    app.submit(team="cv", gpus=2)  # waits: only one GPU is left
    app.step()
    text = app.scrape()
    assert value(text, "gpupool_jobs", team="nlp", kind="training", state="running") == 1
    assert value(text, "gpupool_jobs", team="cv", kind="training", state="pending") == 1
    assert value(text, "gpupool_queue_pending") == 1
    assert value(text, "gpupool_node_up", node="h/A100-80GB", site="h", state="up") == 1
    assert value(text, "gpupool_node_lost_total", node="h/A100-80GB") == 0
    used = samples(text, "DCGM_FI_DEV_FB_USED")
    free = samples(text, "DCGM_FI_DEV_FB_FREE")
    assert sorted(s.labels["gpu"] for s in used) == ["0", "1"]
    assert {s.labels["modelName"] for s in used} == {"A100-80GB"}
    by_gpu = {s.labels["gpu"]: s.value for s in used}
    for s in free:  # used + free is the card's memory
        assert 80_000 < by_gpu[s.labels["gpu"]] + s.value < 82_000


def test_label_values_are_escaped(app: App) -> None:
    """A team name the API would refuse, written straight into the database: the
    exposition escapes it and the parser gets it back whole."""
    team = 'ops "blue"\\night\nshift'
    job = NewJob("odd", team, "batch", 0, 1, ("true",))
    app.store.jobs.submit(job, T0)
    text = app.scrape()
    assert r'team="ops \"blue\"\\night\nshift"' in text
    assert value(text, "gpupool_jobs", team=team, kind="batch", state="pending") == 1


def test_start_histograms_by_kind(app: App) -> None:
    train = app.submit(kind="training")
    app.submit(kind="batch")
    app.step(dt_s=3.0)  # both start 3 s after their submission
    text = app.scrape()
    for name in (QUEUE_WAIT, SUBMIT_TO_START):
        for kind in ("training", "batch"):
            assert value(text, f"{name}_count", kind=kind) == 1
            assert value(text, f"{name}_sum", kind=kind) == pytest.approx(3.0)
            assert value(text, f"{name}_bucket", kind=kind, le="2.5") == 0
            assert value(text, f"{name}_bucket", kind=kind, le="5.0") == 1
            assert value(text, f"{name}_bucket", kind=kind, le="+Inf") == 1
        les = [
            s.labels["le"] for s in samples(text, f"{name}_bucket") if s.labels["kind"] == "batch"
        ]
        assert les == [*(repr(b) for b in START_BUCKETS_S), "+Inf"]
    # Requeued: it stops, waits and resumes. The resume is a queue wait, not a first start.
    app.service.operations.requeue(train, "admin")
    app.step()  # its exit is reaped: back in the queue
    for _ in range(5):
        app.step(dt_s=2.0)
        if app.client.get(f"/v1/jobs/{train}").json()["state"] == "running":
            break
    assert app.client.get(f"/v1/jobs/{train}").json()["state"] == "running"
    text = app.scrape()
    assert value(text, f"{QUEUE_WAIT}_count", kind="training") == 2
    assert value(text, f"{SUBMIT_TO_START}_count", kind="training") == 1
    assert value(text, f"{QUEUE_WAIT}_count", kind="batch") == 1


def test_start_latency_observes_a_resume_as_a_wait_only() -> None:
    latency = StartLatency()
    latency.started("online-inference", 0.02, 0.02)
    latency.started("online-inference", 7200.0, None)
    latency.started("online-inference", -1.0, None)  # a clock step back counts as no wait
    got = {s.name: s for m in latency.collect() for s in m.samples if s.name.endswith("_count")}
    assert got[f"{QUEUE_WAIT}_count"].value == 3
    assert got[f"{SUBMIT_TO_START}_count"].value == 1
    buckets = {
        s.labels["le"]: s.value
        for m in latency.collect()
        for s in m.samples
        if s.name == f"{QUEUE_WAIT}_bucket"
    }
    assert buckets["0.05"] == 2 and buckets["3600.0"] == 2 and buckets["7200.0"] == 3


def test_each_app_has_its_own_registry(make_app: Callable[..., App]) -> None:
    """Two services in one process: each /metrics counts its own jobs only (the global
    registry would mix them or refuse the second collector)."""
    one, two = make_app("one"), make_app("two")
    one.submit(team="nlp")
    one.step()
    two.submit(team="cv", kind="batch")
    two.submit(team="cv", kind="batch")
    two.step()
    a, b = one.scrape(), two.scrape()
    assert [s.labels["team"] for s in samples(a, "gpupool_jobs")] == ["nlp"]
    assert value(b, "gpupool_jobs", team="cv", kind="batch", state="running") == 2
    assert [s.labels["kind"] for s in samples(a, f"{QUEUE_WAIT}_count")] == ["training"]
    assert [s.labels["kind"] for s in samples(b, f"{QUEUE_WAIT}_count")] == ["batch"]


def test_a_scrape_while_the_loop_holds_its_state_is_a_503(app: App) -> None:
    """The collector reads the same bounded view as /v1/cluster: a stuck loop gives a
    prompt 503 that says why, not a hung scrape."""
    app.service.views.VIEW_WAIT_S = 0.2
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with app.service.state.lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert held.wait(5)
        r = app.client.get("/metrics")
    finally:
        release.set()
        t.join(10)
    assert r.status_code == 503, r.text
    assert "scheduler loop has held its state" in r.text
    assert app.client.get("/metrics").status_code == 200

"""Refusals at submit, and sizing at submit: a job the fleet can never run is refused with
a 422 that says what the fleet has; a job given by its model runs on a type that holds it.

Unit tests call the admission function on fleets built from nodes; the live tests run a
real `gpupool serve` on fake fleets and use the CLI as a user would.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gpupool.domain.model import Node
from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.server.api.admission import Fleet, Refused, admit
from gpupool.server.api.app import create_app
from gpupool.server.fleet.sites import read_sites
from gpupool.server.loop.config import LiveConfig
from gpupool.server.loop.driver import LiveService
from gpupool.server.store import Store
from gpupool.sizing.catalog import load_catalog
from service_proc import HTTP, Server, cli, wait_for
from sites_config import CLOUD, FAST, Runner, sites

CATALOG = load_catalog()
LLAMA_70B = {"model": "llama-3-70b", "task": "inference", "context": 8192, "batch": 16}


def fleet(*nodes: tuple[str, str, int]) -> Fleet:
    return Fleet.of(Node(name, model, n, 1_000_000, 1 << 30) for name, model, n in nodes)


TWO_TYPES = fleet(("a1", "A100-80GB", 2), ("a2", "A100-80GB", 4), ("h1", "H100", 2))


def test_an_unknown_gpu_model_is_refused_with_the_fleets_models() -> None:
    with pytest.raises(Refused) as err:
        admit(TWO_TYPES, CATALOG, gpus=1, gpu_model="NOPE", sizing=None)
    text = str(err.value)
    assert "'NOPE'" in text and "A100-80GB, H100" in text and "6 x A100-80GB, 2 x H100" in text


def test_a_differently_spelt_model_is_refused_with_the_name_the_fleet_uses() -> None:
    with pytest.raises(Refused, match="did you mean 'H100'"):
        admit(TWO_TYPES, CATALOG, gpus=1, gpu_model="h100-sxm5", sizing=None)


def test_more_gpus_than_any_node_has_is_refused_with_the_largest_node() -> None:
    with pytest.raises(Refused, match=r"asks for 5 GPUs on one node; the largest node has 4 \(a2"):
        admit(TWO_TYPES, CATALOG, gpus=5, gpu_model=None, sizing=None)
    with pytest.raises(Refused, match=r"the largest H100 node has 2 \(h1"):
        admit(TWO_TYPES, CATALOG, gpus=3, gpu_model="H100", sizing=None)
    admit(TWO_TYPES, CATALOG, gpus=4, gpu_model=None, sizing=None)  # fits on a2
    admit(TWO_TYPES, CATALOG, gpus=4, gpu_model="A100-80GB", sizing=None)
    admit(TWO_TYPES, CATALOG, gpus=0, gpu_model=None, sizing=None)  # a CPU job


def test_a_job_wider_than_a_node_is_admitted_where_the_executor_runs_gangs() -> None:
    """Under Ray a job runs across nodes, so a model's GPUs in all bound it; the local
    executor's refusal says how to run it (serve on Ray) rather than only what is small."""
    admit(TWO_TYPES, CATALOG, gpus=6, gpu_model="A100-80GB", sizing=None, gangs=True)
    with pytest.raises(Refused, match=r"asks for 7 GPUs; the fleet has .* at most 6 x A100"):
        admit(TWO_TYPES, CATALOG, gpus=7, gpu_model="A100-80GB", sizing=None, gangs=True)
    with pytest.raises(Refused, match=r"gpupool serve --ray ADDRESS`\) to run it across nodes"):
        admit(TWO_TYPES, CATALOG, gpus=6, gpu_model="A100-80GB", sizing=None)
    with pytest.raises(Refused) as err:  # more than the whole fleet: no Ray advice
        admit(TWO_TYPES, CATALOG, gpus=9, gpu_model=None, sizing=None)
    assert "--ray" not in str(err.value)


def test_a_model_that_fits_nowhere_is_refused_with_the_nearest_option_per_type() -> None:
    small = fleet(("a", "A100-80GB", 2), ("r", "RTX-4090", 8))
    with pytest.raises(Refused) as err:
        admit(small, CATALOG, gpus=1, gpu_model=None, sizing=LLAMA_70B)
    text = str(err.value)
    assert "llama-3-70b fits nowhere" in text
    assert "needs 4 x A100-80GB, the largest A100-80GB node has 2" in text
    assert "needs 16 x RTX-4090, the largest RTX-4090 node has 8" in text
    admit(
        fleet(("a", "A100-80GB", 4), ("r", "RTX-4090", 8)),
        CATALOG,
        gpus=1,
        gpu_model=None,
        sizing=LLAMA_70B,
    )


def test_the_api_counts_a_cloud_node_a_burst_would_start(tmp_path: Path) -> None:
    """The fleet the API checks against is the service's, cloud nodes included while they
    are down: a job only the cloud's H100s can take is accepted, one for a model nowhere
    in the fleet is refused."""
    store = Store(f"sqlite:///{tmp_path}/db.sqlite")
    store.migrate()
    service = LiveService(
        LiveConfig(
            tmp_path / "state",
            sample_s=0.0,
            host="fed",
            nodes=(("e1", "A100-80GB", 4), ("w1", "A100-80GB", 4)),
            sites=read_sites(sites(cloud=CLOUD, burst=FAST), "sites.yaml"),
        ),
        store,
        FakeExecutor(),
        FakeTelemetry("4xA100-80GB,4xA100-80GB,4xH100"),
        ManualClock(1000.0),
        probe=lambda: {"e1": "id-e1", "w1": "id-w1"},
        cloud_runner=Runner(),
    )
    client = TestClient(create_app(service, store, auth=False))
    body = {"command": ["true"], "team": "a", "gpu_model": "H100", "gpus": 4}
    assert client.post("/v1/jobs", json=body).status_code == 201
    refused = client.post("/v1/jobs", json={**body, "gpu_model": "H200"})
    assert refused.status_code == 422
    assert "A100-80GB, H100" in refused.json()["detail"]
    too_many = client.post("/v1/jobs", json={**body, "gpus": 5})
    assert too_many.status_code == 422 and "the largest H100 node has 4 (c1" in too_many.text


@pytest.mark.parametrize("gangs", [True, False])
def test_the_api_admits_a_job_across_nodes_only_where_the_executor_runs_gangs(
    tmp_path: Path, gangs: bool
) -> None:
    store = Store(f"sqlite:///{tmp_path}/db.sqlite")
    store.migrate()
    service = LiveService(
        LiveConfig(
            tmp_path / "state",
            sample_s=0.0,
            host="two",
            nodes=(("e1", "A100-80GB", 4), ("w1", "A100-80GB", 4)),
        ),
        store,
        FakeExecutor(runs_gangs=gangs),
        FakeTelemetry("4xA100-80GB,4xA100-80GB"),
        ManualClock(1000.0),
        probe=lambda: {"e1": "id-e1", "w1": "id-w1"},
    )
    client = TestClient(create_app(service, store, auth=False))
    wide = client.post("/v1/jobs", json={"command": ["true"], "team": "a", "gpus": 8})
    if gangs:
        assert wide.status_code == 201, wide.text
    else:
        assert wide.status_code == 422
        assert "gpupool serve --ray ADDRESS" in wide.json()["detail"]
    nine = client.post("/v1/jobs", json={"command": ["true"], "team": "a", "gpus": 9})
    assert nine.status_code == 422


# ---- live: a real `gpupool serve` -----------------------------------------------------------
def _serve(tmp_path: Path, gpus: str) -> Server:
    return Server(
        tmp_path / "state", "--fake-gpus", gpus, "--auth", "none", "--cycle", "0.2"
    ).start()


def _show(url: str, job_id: int) -> dict[str, object]:
    """The job as the API returns it (what `gpupool show --json` prints)."""
    shown: dict[str, object] = HTTP.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()
    return shown


def test_live_refusals_and_a_model_sized_at_submit(tmp_path: Path) -> None:
    srv = _serve(tmp_path, "4xA100-80GB,8xRTX-4090")
    try:
        url = srv.url
        out = cli(url, "submit", "--team", "a", "--gpu-model", "NOPE", "--", "sleep", "1")
        assert out.returncode != 0
        assert "A100-80GB" in out.stderr and "RTX-4090" in out.stderr and "NOPE" in out.stderr
        out = cli(url, "submit", "--team", "a", "--gpus", "9", "--", "sleep", "1")
        assert out.returncode != 0 and "the largest node has 8" in out.stderr
        assert HTTP.get(f"{url}/v1/jobs", timeout=10).json()["jobs"] == []  # nothing stored
        out = cli(
            url, "submit", "--team", "a", "--model", "llama-3-70b", "--task", "inference",
            "--precision", "bf16", "--context", "8192", "--batch", "16", "--json",
            "--", "sleep", "300",
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        job_id = json.loads(out.stdout)["id"]
        wait_for(lambda: _show(url, job_id)["state"] == "running", 30, "the sized job to run")
        gpus = _show(url, job_id)["gpus"]
        assert isinstance(gpus, list)
        on_a100 = sum("A100-80GB" in str(g["node"]) for g in gpus)
        on_4090 = sum("RTX-4090" in str(g["node"]) for g in gpus)
        assert on_a100 >= 2 or on_4090 >= 6
        text = cli(url, "show", str(job_id)).stdout
        assert "plan        4 x A100-80GB (chosen), RTX-4090: does not fit" in text
        assert "GPUs        4 on " in text  # the count the core sized it to, not the 1 sent
        HTTP.post(f"{url}/v1/jobs/{job_id}/cancel", timeout=10)
    finally:
        srv.stop()


def test_live_a_model_the_fleet_cannot_hold_is_refused_at_submit(tmp_path: Path) -> None:
    srv = _serve(tmp_path, "2xA100-80GB,8xRTX-4090")
    try:
        out = cli(
            srv.url, "submit", "--team", "a", "--model", "llama-3-70b", "--task", "inference",
            "--context", "8192", "--batch", "16", "--", "sleep", "1",
        )  # fmt: skip
        assert out.returncode != 0
        assert "needs 4 x A100-80GB, the largest A100-80GB node has 2" in out.stderr
    finally:
        srv.stop()

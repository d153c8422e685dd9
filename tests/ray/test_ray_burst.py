"""Cloud burst and reclaim on a real Ray cluster: with the on-prem pool saturated, the
service runs the sites file's start command, which adds a Ray worker node ("c1", the
cloud) to the cluster; pending work starts there; once that node stays idle the service
runs the stop command and the node leaves. Every step is in the event log with its
reason. The cluster is conftest.py's (a1, a2 A100-80GB; h1 H100-80GB; 4 GPUs each)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpupool.ports.clock.base import SystemClock
from gpupool.server.api.app import create_app
from gpupool.server.executors.ray import RayExecutor
from gpupool.server.executors.ray_nodes import ray_nodes
from gpupool.server.fleet.sites import read_sites
from gpupool.server.loop.config import LiveConfig
from gpupool.server.loop.driver import LiveService, ray_service
from gpupool.server.store import Store, database_url

PY = sys.executable
JOB = (
    'echo "where $GPUPOOL_NODE $CUDA_VISIBLE_DEVICES"; '
    'while [ ! -f "$DONE_DIR/done-$GPUPOOL_JOB_ID" ]; do sleep 0.2; done'
)


def sites_yaml(address: str, state_dir: Path) -> dict[str, Any]:
    cloud = [PY, "-m", "gpupool.server.fleet.cloud_node"]
    return {
        "federation": {
            "sites": [
                {"name": "east", "region": "us-east"},
                {
                    "name": "cloud",
                    "region": "us-east",
                    "kind": "cloud",
                    "price_usd_per_gpu_hour": {"H100-80GB": 6.98},
                },
            ]
        },
        "nodes": {"a1": "east", "a2": "east", "h1": "east"},
        "burst": {
            "util_threshold": 0.9,
            "sustain_s": 2,
            "pending_gpus": 1,
            "pending_sustain_s": 2,
            "reclaim_util": 0.3,
            "reclaim_sustain_s": 3,
            "check_s": 0.5,
            "join_timeout_s": 240,  # a `ray start` on a loaded 2-core CI host has taken over 90 s
        },
        "cloud": {
            "start": [
                *cloud,
                "start",
                "--address",
                address,
                "--node",
                "{node}",
                "--model",
                "{model}",
                "--gpus",
                "{gpus}",
                "--site",
                "{site}",
                "--state-dir",
                "{state_dir}",
            ],
            "stop": [*cloud, "stop", "--node", "{node}", "--state-dir", "{state_dir}"],
            "nodes": [{"name": "c1", "site": "cloud", "model": "H100-80GB", "gpus": 4}],
        },
    }


@pytest.fixture(scope="module")
def burst(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    tmp = tmp_path_factory.mktemp("burst")
    state = tmp / "state"
    store = Store(database_url(None, tmp / "db"))
    store.migrate()
    sites = read_sites(sites_yaml(ray_cluster.cluster.address, state), "test-sites")
    config = LiveConfig(state_dir=state, sample_s=0.5, host="ray", sites=sites)
    service = ray_service(config, store, SystemClock(), executor=RayExecutor(ray_cluster.ids))
    client = TestClient(create_app(service, store, auth=False))
    try:
        yield service, client, store, tmp
    finally:
        client.close()
        for f in range(1, 40):
            (tmp / f"done-{f}").touch()
        subprocess.run(
            [
                PY,
                "-m",
                "gpupool.server.fleet.cloud_node",
                "stop",
                "--node",
                "c1",
                "--state-dir",
                str(state),
            ],
            check=False,
            timeout=120,
        )


def drive(service: LiveService, done: Callable[[], bool], timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > end:
            events = service.store.events.after(0, limit=10_000)
            cloud = [f"{e.kind}: {e.message}" for e in events if e.kind.startswith("cloud")]
            logs = sorted((service.config.state_dir / "cloud").glob("*.log"))
            tails = "\n".join(
                f"--- {p.name}:\n{p.read_text(errors='replace')[-3000:]}" for p in logs
            )
            raise AssertionError(
                f"timed out waiting for {what}; the cloud's events: {cloud}; the last "
                f"events: {events[-5:]}\n{tails}"
            )
        service.step()
        time.sleep(0.1)


def test_burst_adds_a_cloud_node_and_reclaim_removes_it(burst: Any) -> None:
    service, client, store, tmp = burst

    def submit(name: str) -> int:
        r = client.post(
            "/v1/jobs",
            json={
                "name": name,
                "team": "ml",
                "kind": "training",
                "gpus": 1,
                "command": ["sh", "-c", JOB],
                "env": {"DONE_DIR": str(tmp)},
                "duration_s": 600,
                "grace_s": 5,
            },
        )
        assert r.status_code == 201, r.text
        return int(r.json()["id"])

    def state(job: int) -> str:
        return str(client.get(f"/v1/jobs/{job}").json()["state"])

    def kinds() -> list[str]:
        return [e.kind for e in store.events.after(0, limit=10_000)]

    # Twelve on-prem GPUs, twelve jobs: full. Two more wait.
    onprem = [submit(f"fill-{k}") for k in range(12)]
    drive(service, lambda: all(state(j) == "running" for j in onprem), 60, "the pool to fill")
    assert "c1" not in {n.name for n in ray_nodes()}
    extra = [submit(f"extra-{k}") for k in range(2)]

    drive(service, lambda: "cloud-node-up" in kinds(), 270, "the cloud node to join")
    assert "c1" in {n.name for n in ray_nodes()}
    drive(service, lambda: all(state(j) == "running" for j in extra), 60, "work on the cloud")
    for j in extra:
        body = client.get(f"/v1/jobs/{j}").json()
        assert {g["node"] for g in body["gpus"]} == {"c1"}, body
        drive(
            service,
            lambda j=j: "where c1" in client.get(f"/v1/jobs/{j}/logs").text,
            30,
            f"job {j} to report its node",
        )
    for j in onprem:  # nothing on-prem moved
        gpus = client.get(f"/v1/jobs/{j}").json()["gpus"]
        assert {g["node"] for g in gpus} <= {"a1", "a2", "h1"}

    for j in extra:  # the cloud work ends: the node stands idle and is handed back
        (tmp / f"done-{j}").touch()
    drive(service, lambda: all(state(j) == "succeeded" for j in extra), 60, "cloud jobs to end")
    drive(service, lambda: "cloud-node-down" in kinds(), 90, "the cloud node to be reclaimed")
    # the stop command has ended c1's raylet; Ray's GCS lists it dead once its health
    # checks miss (a second or three here)
    drive(service, lambda: "c1" not in {n.name for n in ray_nodes()}, 30, "c1 out of Ray")

    events = {e.kind: e.message for e in store.events.after(0, limit=10_000)}
    assert "start c1:" in events["cloud-burst"]
    assert "pending" in events["cloud-burst"] or "utilisation" in events["cloud-burst"]
    assert "stop c1: cloud utilisation 0% < 30%" in events["cloud-reclaim"], events
    assert "reclaimed" in events["cloud-node-down"]
    assert "node-lost" not in events  # a reclaim is not a failure
    # and the on-prem work is untouched
    assert all(state(j) == "running" for j in onprem)
    for j in onprem:
        (tmp / f"done-{j}").touch()
    drive(service, lambda: all(state(j) == "succeeded" for j in onprem), 60, "on-prem jobs")

"""The live service driving RayExecutor, end to end through the API, on the real 3-node
Ray cluster of conftest.py (a1, a2: A100-80GB; h1: H100-80GB; 4 fake GPUs each).

The scheduler is stepped by the test (no background thread); jobs are real processes
started by Ray actors on the node the core chose. The tests share one service and run
in order: the last one kills a node.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpupool.domain.quota import TeamQuota
from gpupool.examples.ckpt_counter import expected_result
from gpupool.policies.preemption import PreemptionRules
from gpupool.ports.clock.base import SystemClock
from gpupool.server.api.app import create_app
from gpupool.server.executors.ray import RayExecutor
from gpupool.server.executors.ray_nodes import ray_nodes
from gpupool.server.loop.config import LIVE_DEFAULTS, LiveConfig
from gpupool.server.loop.driver import LiveService, ray_service
from gpupool.server.store import Store, database_url

PY = sys.executable
PROBE = (
    "import os, time; print('where', os.environ['GPUPOOL_NODE'], "
    "os.environ['GPUPOOL_RAY_NODE_ID'], os.environ['CUDA_VISIBLE_DEVICES'], flush=True); "
    "time.sleep(1)"
)


@dataclass
class Live:
    service: LiveService
    client: TestClient
    store: Store
    cluster: Any

    def drive(self, done: Callable[[], bool], timeout_s: float, what: str) -> None:
        end = time.monotonic() + timeout_s
        while not done():
            assert time.monotonic() < end, f"timed out waiting for {what}: {self.events()[-12:]}"
            self.service.step()
            time.sleep(0.1)

    def submit(self, **body: Any) -> int:
        r = self.client.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        return int(r.json()["id"])

    def job(self, job_id: int) -> dict[str, Any]:
        r = self.client.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return dict(r.json())

    def state(self, job_id: int) -> str:
        return str(self.job(job_id)["state"])

    def logs(self, job_id: int) -> str:
        r = self.client.get(f"/v1/jobs/{job_id}/logs")
        assert r.status_code == 200, r.text
        return r.text

    def events(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        after = 0
        while True:
            page = self.client.get("/v1/events", params={"after": after}).json()
            if not page["events"]:
                return out
            out += page["events"]
            after = page["next"]

    def track(self, job_id: int) -> None:
        """Kill the job's process group at teardown whatever happens."""
        row = self.store.jobs.get(job_id)
        if row.pgid is not None:
            self.cluster.pgids.append(row.pgid)


@pytest.fixture(scope="module")
def live(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("live")
    store = Store(database_url(None, tmp / "db"))
    store.migrate()
    config = LiveConfig(
        state_dir=tmp / "state",
        scheduling=dataclasses.replace(
            LIVE_DEFAULTS,
            teams=(
                TeamQuota("serving", {"H100-80GB": 1}, {}),
                TeamQuota("research", {}, {}),
            ),
            preemption=PreemptionRules(0.0, 3),
        ),
        sample_s=0.5,
        host="ray",
    )
    service = ray_service(config, store, SystemClock(), executor=RayExecutor(ray_cluster.ids))
    client = TestClient(create_app(service, store, auth=False), raise_server_exceptions=True)
    try:
        yield Live(service, client, store, ray_cluster)
    finally:
        client.close()
        service.stop()
        store.close()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _where(log: str) -> tuple[str, str, str]:
    line = next(x for x in log.splitlines() if x.startswith("where "))
    _, node, ray_id, visible = line.split()
    return node, ray_id, visible


def test_fleet_is_the_ray_nodes(live: Live, ray_cluster: Any) -> None:
    nodes = live.client.get("/v1/cluster").json()["nodes"]
    got = {n["name"]: (n["gpu_model"], [g["index"] for g in n["gpus"]]) for n in nodes}
    assert got == {
        name: (model, list(range(count))) for name, (model, count) in ray_cluster.layout.items()
    }


def test_mixed_jobs_run_where_the_core_placed_them(live: Live, ray_cluster: Any) -> None:
    argv = [PY, "-c", PROBE]
    ids = [
        live.submit(command=argv, team="research", kind="training", gpus=2),
        live.submit(command=argv, team="research", kind="offline-inference", gpus=1),
        live.submit(command=argv, team="serving", kind="online-inference", gpus=3),
    ]
    live.drive(lambda: all(live.state(i) != "pending" for i in ids), 30, "the jobs to start")
    for i in ids:
        live.track(i)
    live.drive(lambda: all(live.state(i) == "succeeded" for i in ids), 30, "the jobs to end")
    for i in ids:
        job = live.job(i)
        chosen = {(g["node"], g["index"]) for g in job["gpus"]}
        (node,) = {n for n, _ in chosen}
        ran_on, ray_id, visible = _where(live.logs(i))
        assert ran_on == node and ray_id == ray_cluster.ids[node]
        assert sorted(int(x) for x in visible.split(",")) == sorted(g for _, g in chosen)


def test_guaranteed_team_reclaims_and_training_resumes(live: Live) -> None:
    steps = 120
    counter = ["-m", "gpupool.examples.ckpt_counter", "--steps", str(steps)]
    train = live.submit(
        command=[PY, *counter, "--step-s", "0.05", "--every", "5"],
        team="research",
        kind="training",
        priority="low",
        gpus=4,
        gpu_model="H100-80GB",
        checkpoint_every_s=1.0,
        grace_s=20.0,
    )
    live.drive(lambda: live.state(train) == "running", 30, "the training job to run")
    live.track(train)
    first = live.job(train)
    assert {g["node"] for g in first["gpus"]} == {"h1"}
    executor = live.service.executor
    read_on_node = executor.read_log  # type: ignore[attr-defined]
    reads: list[str] = []

    def spy(job_id: str, name: str = "stdout.log", offset: int = 0) -> bytes:
        reads.append(job_id)
        data: bytes = read_on_node(job_id, name, offset)
        return data

    executor.read_log = spy  # type: ignore[attr-defined]
    try:
        live.drive(lambda: "step=10" in live.logs(train), 30, "training progress")
    finally:
        executor.read_log = read_on_node  # type: ignore[attr-defined]
    assert str(train) in reads  # a running job's log is read on its node, by its actor
    online = live.submit(
        command=[PY, "-c", "import time; time.sleep(1.5); print('served')"],
        team="serving",
        kind="online-inference",
        priority="high",
        gpus=1,
        gpu_model="H100-80GB",
    )
    live.drive(lambda: live.state(train) == "suspended", 30, "the preemption")
    live.drive(lambda: live.state(online) != "pending", 30, "the online job to start")
    live.track(online)
    live.drive(lambda: live.state(online) == "succeeded", 30, "the online job")
    live.drive(lambda: live.state(train) == "running", 30, "the resumed training")
    live.track(train)
    live.drive(lambda: live.state(train) == "succeeded", 60, "the training to finish")
    job = live.job(train)
    assert job["preemptions"] == 1 and job["attempts"] == 2, job
    log = live.logs(train)
    assert "SIGTERM: checkpoint saved" in log
    last = [x for x in log.splitlines() if x.startswith("result=")][-1]
    fields = dict(kv.split("=") for kv in last.split())
    assert int(fields["result"]) == expected_result(steps)
    assert int(fields["resumed_from"]) > 0
    assert {g["node"] for g in job["gpus"]} == {"h1"}  # the only H100 node


def test_node_death_requeues_and_nothing_is_lost(live: Live, ray_cluster: Any) -> None:
    steps = 300
    counter = [PY, "-m", "gpupool.examples.ckpt_counter", "--steps", str(steps)]
    victim = live.submit(
        command=[*counter, "--step-s", "0.03", "--every", "5"],
        team="research",
        kind="training",
        gpus=3,
        gpu_model="A100-80GB",
        checkpoint_every_s=1.0,
    )
    others = [
        live.submit(command=[PY, "-c", PROBE], team="research", kind="offline-inference", gpus=1)
        for _ in range(2)
    ]
    live.drive(lambda: live.state(victim) == "running", 30, "the victim to run")
    live.track(victim)
    (node,) = {g["node"] for g in live.job(victim)["gpus"]}
    assert node in ("a1", "a2")
    ck = live.service.config.run_dir(victim) / "checkpoint" / "counter.json"
    live.drive(ck.exists, 30, "a periodic checkpoint")
    pgid = live.store.jobs.get(victim).pgid
    assert pgid is not None
    # A real node takes its processes with it. Here the raylet runs on this machine and
    # the job is in its own session, so it would live on as an orphan; the shim fences it:
    # when its launcher (the actor's worker) dies, it kills the job's process group.
    ray_cluster.cluster.remove_node(ray_cluster.nodes[node], allow_graceful=False)
    # One step may requeue it and start it again at once: watch the attempts, then the
    # event stream for the suspension.
    live.drive(lambda: live.job(victim)["attempts"] >= 2, 30, "the requeue and restart")
    live.track(victim)
    live.drive(lambda: not _group_alive(pgid), 15, "the orphaned first attempt to be fenced")
    suspended = [e for e in live.events() if e["job_id"] == victim and e["kind"] == "suspended"]
    assert len(suspended) == 1 and node in suspended[0]["message"], suspended
    live.drive(lambda: node not in {n.name for n in ray_nodes()}, 30, "the node to leave")
    job = live.job(victim)
    assert {g["node"] for g in job["gpus"]} != {node}
    live.drive(lambda: all(live.state(i) == "succeeded" for i in others), 30, "the others")
    live.drive(lambda: live.state(victim) == "succeeded", 60, "the victim to finish")
    last = [x for x in live.logs(victim).splitlines() if x.startswith("result=")][-1]
    fields = dict(kv.split("=") for kv in last.split())
    assert int(fields["result"]) == expected_result(steps)
    assert int(fields["resumed_from"]) > 0
    view = {n["name"]: n["healthy"] for n in live.client.get("/v1/cluster").json()["nodes"]}
    assert view[node] is False
    jobs = live.client.get("/v1/jobs", params={"limit": 1000}).json()
    rows = jobs["jobs"] if isinstance(jobs, dict) else jobs
    assert rows and all(j["state"] == "succeeded" for j in rows), rows

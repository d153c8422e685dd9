"""A training job wider than one node, through `gpupool serve --ray`, as a gang.

Its own Ray cluster: three gpupool nodes of 2 GPUs each, so the core places a 4-GPU job on
two of them and, once one is killed, can place it again on the two that are left. The job
is the socket all-reduce example (gpupool.examples.allreduce); each member says its rank,
world size and node; rank 1's node is killed; no process of the old gang survives; the job
resumes from rank 0's checkpoint with a new gang and ends with the exact result."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gpupool.examples.allreduce import expected_result
from gpupool.service.executor import read_start_ticks
from gpupool.service.ray_executor import node_resources
from service_proc import Server, cli, wait_for

PY = sys.executable
GANG_NODES = {"g1": ("A100-80GB", 2), "g2": ("A100-80GB", 2), "g3": ("A100-80GB", 2)}
FAST_HEALTH = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}
MEMBER = re.compile(
    r"member rank=(\d+) world=(\d+) node=(\S+) local_world=(\S+) visible=(\S*) pid=(\d+)"
)


@pytest.fixture(scope="module")
def gang_cluster() -> Iterator[Any]:
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    from ray.cluster_utils import Cluster

    import ray

    small = {"object_store_memory": 80 * 1024 * 1024, "include_dashboard": False}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "num_gpus": 0, "_system_config": FAST_HEALTH, **small},
    )
    nodes = {
        name: cluster.add_node(
            num_cpus=1, num_gpus=0, resources=node_resources(name, model, gpus), **small
        )
        for name, (model, gpus) in GANG_NODES.items()
    }
    ray.init(address=cluster.address, namespace="gpupool-gang-test", log_to_driver=False)
    cluster.wait_for_nodes()
    try:
        yield cluster, nodes
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def server(gang_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    cluster, _ = gang_cluster
    state = tmp_path_factory.mktemp("serve")
    teams = state / "teams.yaml"
    teams.write_text("teams:\n  - {name: ml}\npreemption: {min_runtime_s: 0}\n")
    srv = Server(
        state,
        "--config", str(teams), "--ray", cluster.address, "--ray-namespace", "gpupool-gang",
        "--auth", "none", "--cycle", "0.2", "--sample", "0.5",
    ).start(timeout_s=120)  # fmt: skip
    try:
        yield srv
    finally:
        srv.stop()
        for handle in state.glob("jobs/*/handle-*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                os.killpg(int(json.loads(handle.read_text())["pgid"]), signal.SIGKILL)


def show(url: str, job_id: int) -> dict[str, Any]:
    out = cli(url, "show", str(job_id), "--json")
    assert out.returncode == 0, out.stderr
    job: dict[str, Any] = json.loads(out.stdout)
    return job


def members(text: str) -> dict[int, tuple[int, str, str, str, int]]:
    """rank -> (world, node, local world, visible GPUs, pid) of the last attempt's lines."""
    found = {}
    for m in MEMBER.finditer(text):
        found[int(m[1])] = (int(m[2]), m[3], m[4], m[5], int(m[6]))
    return found


def alive(pid: int) -> bool:
    return read_start_ticks(pid) is not None


def test_a_gang_job_survives_the_loss_of_a_members_node(server: Server, gang_cluster: Any) -> None:
    _, ray_nodes = gang_cluster
    url, steps = server.url, 300
    out = cli(
        url, "submit", "--team", "ml", "--kind", "training", "--gpus", "4", "--grace", "10s",
        "--checkpoint-every", "1s", "--json", "--",
        PY, "-m", "gpupool.examples.allreduce", "--steps", str(steps), "--step-s", "0.1",
        "--every", "5", "--timeout-s", "10",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    job_id = int(json.loads(out.stdout)["id"])
    run_dir = server.state_dir / "jobs" / str(job_id)
    wait_for(lambda: show(url, job_id)["state"] == "running", 60, "the gang to start")
    wait_for(lambda: "step=10 checkpoint" in cli(url, "logs", str(job_id)).stdout, 60, "steps")
    placed = show(url, job_id)["gpus"]
    nodes = sorted({g["node"] for g in placed})
    assert len(nodes) == 2 and len(placed) == 4
    rank1_log = run_dir / "rank-1" / "stdout.log"
    wait_for(lambda: 1 in members(rank1_log.read_text()), 30, "rank 1's first line")
    gang = members(cli(url, "logs", str(job_id)).stdout) | members(rank1_log.read_text())
    assert sorted(gang) == [0, 1]
    assert {gang[r][1] for r in gang} == set(nodes)
    for world, node, local_world, visible, _ in gang.values():
        assert world == 2 and local_world == "2"
        mine = sorted(g["index"] for g in placed if g["node"] == node)
        assert sorted(int(x) for x in visible.split(",")) == mine
    assert "rank 1" not in cli(url, "logs", str(job_id)).stdout  # rank 1 has its own log
    rank1_text = cli(url, "logs", str(job_id), "--rank", "1").stdout
    assert f"member rank=1 world=2 node={gang[1][1]}" in rank1_text

    victim = gang[1][1]
    old_pids = [gang[r][4] for r in gang]
    gang_cluster[0].remove_node(ray_nodes[victim], allow_graceful=False)

    wait_for(lambda: show(url, job_id)["attempts"] >= 2, 90, "the gang to be started again")
    wait_for(lambda: not any(alive(p) for p in old_pids), 30, "every old member to be gone")
    wait_for(lambda: show(url, job_id)["state"] == "succeeded", 180, "the job to finish")
    job = show(url, job_id)
    again = sorted({g["node"] for g in job["gpus"]})
    assert victim not in again and len(again) == 2 and len(job["gpus"]) == 4
    log = cli(url, "logs", str(job_id)).stdout
    last = [x for x in log.splitlines() if x.startswith("result=")][-1]
    fields = dict(kv.split("=") for kv in last.split())
    assert int(fields["result"]) == expected_result(steps)
    assert int(fields["resumed_from"]) >= 10 and fields["world"] == "2"
    events = httpx.get(f"{url}/v1/events", params={"after": 0, "job_id": job_id}).json()
    suspended = [e["message"] for e in events["events"] if e["kind"] == "suspended"]
    assert suspended and any(victim in m for m in suspended), suspended

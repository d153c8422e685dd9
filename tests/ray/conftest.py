"""A real 4-node Ray cluster (head + 3 gpupool nodes) on this machine, one per module.

Ray must not reach beyond loopback, so these tests run only inside a network namespace
that has nothing but `lo`:

    RAY_USAGE_STATS_ENABLED=0 unshare -n sh -c 'ip link set lo up && exec "$@"' sh \
        .venv/bin/pytest tests/ray

Elsewhere they skip; with GPUPOOL_REQUIRE_RAY=1 (as `make test` sets) they fail instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from gpupool.server.executors.ray_nodes import node_resources

# Fast node-death detection: the GCS pings each raylet every second and declares it dead
# after 3 missed answers, so a killed node is seen within ~3-4 s instead of ~30 s.
FAST_HEALTH = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}
# name -> (model, gpus)
NODES = {"a1": ("A100-80GB", 4), "a2": ("A100-80GB", 4), "h1": ("H100-80GB", 4)}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test here needs a Ray cluster (marked `ray_cluster`, as the `ray` runs of
    tests/e2e/test_pool_e2e.py are); tests/conftest.py skips them outside a loopback-only
    network namespace."""
    here = os.path.dirname(__file__) + os.sep
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.ray_cluster)


@dataclass
class RayCluster:
    cluster: Any
    nodes: dict[str, Any]  # gpupool name -> ray.cluster_utils node handle
    ids: dict[str, str]  # gpupool name -> Ray node id
    pgids: list[int]  # process groups of jobs started, killed at teardown
    layout: dict[str, tuple[str, int]]  # gpupool name -> (GPU model, GPU count)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
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
        for name, (model, gpus) in NODES.items()
    }
    ray.init(address=cluster.address, namespace="gpupool-test", log_to_driver=False)
    cluster.wait_for_nodes()
    ids = {name: node.node_id for name, node in nodes.items()}
    rc = RayCluster(cluster, nodes, ids, [], dict(NODES))
    try:
        yield rc
    finally:
        for pgid in rc.pgids:
            with contextlib.suppress(OSError):
                os.killpg(pgid, signal.SIGKILL)
        ray.shutdown()
        cluster.shutdown()

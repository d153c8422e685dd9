"""RayTelemetry on a real multi-node Ray cluster: one actor per node, global GPU indices,
routing of loads, faults and power commands, and a killed actor that comes back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpupool.energy.powercap import SetPowerCap
from gpupool.ports.telemetry.base import GpuSample
from gpupool.server.telemetry.ray import ACTOR_PREFIX, RayTelemetry
from gpupool.sizing.catalog import load_catalog

NAMESPACE = "gpupool-tele-test"


@pytest.fixture(scope="module")
def tele(ray_cluster: Any) -> Iterator[RayTelemetry]:
    fleet = [(name, model, n) for name, (model, n) in ray_cluster.layout.items()]
    # miss_limit=1: a killed actor reads unhealthy at its first missed answer (the limit's
    # counting is tests/server/telemetry/test_telemetry_misses.py's)
    t = RayTelemetry(fleet, ray_cluster.ids, namespace=NAMESPACE, retry_s=0.5, miss_limit=1)
    try:
        yield t
    finally:
        t.close()


def _by_index(samples: list[GpuSample]) -> dict[int, GpuSample]:
    return {s.index: s for s in samples}


def test_inventory_in_fleet_order_on_each_node(ray_cluster: Any, tele: RayTelemetry) -> None:
    import ray

    inv = tele.inventory()
    assert [g.index for g in inv] == list(range(12))
    # The catalogue's names for the declared models, as a local fake fleet shows them.
    cat = load_catalog()
    assert [g.model for g in inv] == [cat["A100-80GB"].name] * 8 + [cat["H100-80GB"].name] * 4
    assert inv[8].model == "H100"
    assert len({g.uuid for g in inv}) == 12
    assert tele.sources() == {"a1": "fake", "a2": "fake", "h1": "fake"}
    for name, ray_id in ray_cluster.ids.items():
        actor = ray.get_actor(ACTOR_PREFIX + name, namespace=NAMESPACE)
        assert ray.get(actor.node_id.remote(), timeout=30) == ray_id
    samples = tele.sample(time.time())
    assert [s.index for s in samples] == list(range(12))
    assert all(s.healthy for s in samples), [s.problem for s in samples if not s.healthy]


def test_set_load_and_fail_gpu_reach_one_global_index(tele: RayTelemetry) -> None:
    tele.set_load(5, 80.0, 2048)
    by = _by_index(tele.sample(time.time()))
    assert by[5].util_pct == 80.0 and by[5].mem_used_mib == 2048
    assert all(s.util_pct == 0.0 for i, s in by.items() if i != 5)
    tele.set_load(5, 0.0, 0)

    tele.fail_gpu(9, "fell off the bus (test)")
    by = _by_index(tele.sample(time.time()))
    assert not by[9].healthy and by[9].problem == "node h1: fell off the bus (test)"
    assert all(s.healthy for i, s in by.items() if i != 9)


def test_apply_goes_to_the_owning_node(tele: RayTelemetry) -> None:
    result = tele.apply(SetPowerCap(0, 6, 250.0, None, "test"))
    assert result.ok and result.message.startswith("node a2: "), result
    by = _by_index(tele.sample(time.time()))
    assert by[6].power_limit_w == 250.0
    assert [i for i, s in by.items() if s.power_limit_w == 250.0] == [6]
    assert not tele.apply(SetPowerCap(0, 12, 250.0, None, "test")).ok


def test_killed_actor_reads_unhealthy_then_comes_back(ray_cluster: Any, tele: RayTelemetry) -> None:
    import ray

    ray.kill(tele.actor("a2"))
    end = time.monotonic() + 30
    while True:
        by = _by_index(tele.sample(time.time()))
        if not by[4].healthy:
            break
        assert time.monotonic() < end, "a killed actor still reads healthy"
        time.sleep(0.2)
    down = [i for i, s in by.items() if not s.healthy]
    assert down == [4, 5, 6, 7, 9]  # 9: failed by the test above
    assert "\n" not in by[4].problem and "ray.kill" in by[4].problem, by[4].problem
    assert by[4].problem.startswith("node a2: telemetry actor"), by[4].problem
    tele.set_load(4, 50.0, 10)  # an unreachable node is skipped, not an error

    end = time.monotonic() + 90
    while not all(s.healthy for i, s in by.items() if i != 9):
        assert time.monotonic() < end, by[4].problem
        time.sleep(0.5)
        by = _by_index(tele.sample(time.time()))
    actor = ray.get_actor(ACTOR_PREFIX + "a2", namespace=NAMESPACE)
    assert ray.get(actor.node_id.remote(), timeout=30) == ray_cluster.ids["a2"]
    assert tele.sources()["a2"] == "fake"
    assert [g.index for g in tele.inventory()] == list(range(12))


def test_second_telemetry_shares_actors_and_close_keeps_them(
    ray_cluster: Any, tele: RayTelemetry
) -> None:
    fleet = [("h1", "H100-80GB", 4)]
    other = RayTelemetry(fleet, namespace=NAMESPACE)  # ids found through ray_nodes()
    assert [g.index for g in other.inventory()] == [0, 1, 2, 3]
    assert not _by_index(other.sample(time.time()))[1].healthy  # GPU 9 failed above
    other.close()
    assert all(s.healthy for i, s in _by_index(tele.sample(time.time())).items() if i != 9)

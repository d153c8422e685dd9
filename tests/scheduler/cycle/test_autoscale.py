"""The autoscaler packs online replicas onto shared GPUs only where the model says it pays."""

from __future__ import annotations

from gpupool.scheduler import Scheduler, ServiceDemand
from gpupool.sim.scenario.config import parse_scenario
from gpupool.sim.scenario.workload import LoadCurve, ServiceSpec, Workload
from gpupool.sim.scenario.world import ScenarioSim

FLAT = LoadCurve((0.0,), (30.0,))


def core(*services: ServiceSpec) -> Scheduler:
    return sim(*services).core


def sim(*services: ServiceSpec) -> ScenarioSim:
    cfg = parse_scenario(
        {
            "name": "t",
            "horizon_h": 1,
            "cluster": [{"gpu_type": "H200", "nodes": 1, "gpus_per_node": 8}],
            "teams": [{"name": "web", "guaranteed": {"H200": 8}}],
            "workload": [],
            "share_cap": 2,
        }
    )
    return ScenarioSim(cfg, Workload(services=services))


def test_no_sharing_when_the_neighbour_breaks_the_slo() -> None:
    # 120 ms alone, about 240 ms next to one more replica: over the 200 ms SLO
    svc = ServiceSpec("a", "web", FLAT, replica_rps=40.0, replica_gpu_milli=500, min_replicas=4)
    assert not core(svc).autoscale.sharing_pays("a", 30.0)


def test_no_sharing_when_time_slicing_costs_more_gpus_than_it_saves() -> None:
    # 300 rps needs ceil(330/40) = 9 whole GPUs; shared replicas run at 0.73/2 of a GPU, so
    # ceil(330/14.6) = 23 half-GPU replicas = 11.5 GPUs: sharing loses
    svc = ServiceSpec("b", "web", FLAT, replica_rps=40.0, replica_gpu_milli=500, base_p99_ms=40.0)
    assert not core(svc).autoscale.sharing_pays("b", 300.0)


def test_sharing_when_a_replica_floor_would_idle_whole_gpus() -> None:
    # 30 rps: 4 whole GPUs (the floor) against 4 half-GPU replicas on 2 GPUs, p99 80 ms
    svc = ServiceSpec(
        "c", "web", FLAT, replica_rps=40.0, replica_gpu_milli=500, base_p99_ms=40.0, min_replicas=4
    )
    s = core(svc)
    assert s.autoscale.sharing_pays("c", 30.0)
    s.observe(ServiceDemand(0.0, "c", 30.0))
    s.cycle(0.0)
    replicas = list(s.replicas["c"].values())
    assert len(replicas) == 4 and all(r.spec.gpu_milli == 500 for r in replicas)

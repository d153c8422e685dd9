"""The autoscaler packs online replicas onto shared GPUs only where the model says it pays."""

from __future__ import annotations

from gpupool.scheduler import Scheduler, ServiceDemand
from gpupool.sim.scenario.config import parse_scenario
from gpupool.sim.scenario.workload import LoadCurve, ServiceSpec, Workload
from gpupool.sim.scenario.world import ScenarioSim

FLAT = LoadCurve((0.0,), (30.0,))


def core(*services: ServiceSpec) -> Scheduler:
    return sim(*services).core


def sim(*services: ServiceSpec, **extra: object) -> ScenarioSim:
    cfg = parse_scenario(
        {
            "name": "t",
            "horizon_h": 1,
            "cluster": [{"gpu_type": "H200", "nodes": 1, "gpus_per_node": 8}],
            "teams": [{"name": "web", "guaranteed": {"H200": 8}}],
            "workload": [],
            "share_cap": 2,
            **extra,
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


def test_a_crash_looping_service_backs_off_instead_of_a_replica_a_cycle() -> None:
    """A replica that fails at once is replaced 10 s after, then 20, 40, ... up to 300 s
    (each at the first cycle after): over ten minutes of one-second cycles, 6 replicas, not
    600."""
    from gpupool.domain.lifecycle import JobState
    from gpupool.scheduler import Finished, Launch

    svc = ServiceSpec("crashy", "web", FLAT, replica_rps=40.0, min_replicas=1)
    s = sim(svc, cycle_s=1).core
    s.observe(ServiceDemand(0.0, "crashy", 1.0))
    made: list[tuple[float, str]] = []
    for t in range(600):
        for command in s.cycle(float(t)):
            if isinstance(command, Launch):
                made.append((float(t), command.job_id))
                s.observe(Finished(t + 0.5, command.job_id, JobState.FAILED, "exit 1"))
    starts = [t for t, _ in made]
    assert starts == [0.0, 11.0, 32.0, 73.0, 154.0, 315.0]  # failed at t+0.5 each
    backoff = s.autoscale.backoff["crashy"]
    assert backoff.failures == 6 and backoff.retry_at_s == 315.5 + 300.0  # the cap
    assert backoff.last_reason == "exit 1"


def test_a_replica_that_ran_a_while_before_failing_is_replaced_soon() -> None:
    from gpupool.domain.lifecycle import JobState
    from gpupool.scheduler import Finished, Launch

    svc = ServiceSpec("steady", "web", FLAT, replica_rps=40.0, min_replicas=1)
    s = sim(svc, cycle_s=1).core
    s.observe(ServiceDemand(0.0, "steady", 1.0))
    [first] = [c.job_id for c in s.cycle(0.0) if isinstance(c, Launch)]
    s.observe(Finished(5.0, first, JobState.FAILED, "exit 1"))  # quick: 10 s before the next
    assert not [c for c in s.cycle(14.0) if isinstance(c, Launch)]
    [second] = [c.job_id for c in s.cycle(15.0) if isinstance(c, Launch)]
    s.observe(Finished(2_000.0, second, JobState.FAILED, "exit 1"))  # after a long run
    assert s.autoscale.backoff["steady"].failures == 1  # the count starts again
    assert not [c for c in s.cycle(2_009.0) if isinstance(c, Launch)]
    assert [c for c in s.cycle(2_010.0) if isinstance(c, Launch)]
    s.cycle(2_309.0)
    assert s.service_backoff("steady") is not None
    s.cycle(2_310.0)  # its replica has run 300 s: the failures are past
    assert s.service_backoff("steady") is None

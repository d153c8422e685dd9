"""The autoscaler's rules in the core: demand (look-ahead peak), the SLO rule on measured
load, scale-down after a stabilisation window in the set order, never below min, and a
Scale notice with its reason for every change."""

from __future__ import annotations

import dataclasses

import pytest

from gpupool.domain.lifecycle import JobState
from gpupool.domain.model import Cluster, Node
from gpupool.errors import NotFoundError
from gpupool.scheduler import (
    Cancel,
    Command,
    Launch,
    Scale,
    Scheduler,
    SchedulerConfig,
    ServiceDemand,
    ServiceLoad,
    ServiceTemplate,
)

CLUSTER = Cluster("c", (Node("n0", "H200", 8, 1_000_000, 1 << 30, cluster="c"),))
CHAT = ServiceTemplate("chat", "web", replica_rps=10.0, slo_p99_ms=200.0, max_replicas=8)


def core(stable_s: float = 0.0, window_s: float = 10.0, **svc: object) -> Scheduler:
    cfg = SchedulerConfig(
        cycle_s=1.0,
        online_reserve=0.0,
        autoscale_down_stable_s=stable_s,
        autoscale_load_window_s=window_s,
    )
    return Scheduler(CLUSTER, cfg, services=[dataclasses.replace(CHAT, **svc)])  # type: ignore[arg-type]


def scales(commands: list[Command]) -> list[Scale]:
    return [c for c in commands if isinstance(c, Scale)]


def replicas(s: Scheduler) -> int:
    return len(s.replicas["chat"])


def test_demand_rule_scales_to_the_expected_peak_with_its_reason() -> None:
    s = core()
    s.observe(ServiceDemand(0.0, "chat", 25.0))
    out = s.cycle(0.0)
    (scale,) = scales(out)
    # ceil(25 * 1.1 / 10) = 3
    assert (scale.from_replicas, scale.to_replicas) == (0, 3)
    assert scale.text == "expected peak 25 rps at 10 rps/replica: 0 -> 3"
    assert sum(isinstance(c, Launch) for c in out) == 3
    assert scales(s.cycle(1.0)) == []


def test_p99_over_the_slo_adds_one_replica() -> None:
    s = core()
    s.observe(ServiceDemand(0.0, "chat", 15.0))
    s.cycle(0.0)  # 2 replicas, both running
    assert replicas(s) == 2
    s.observe(ServiceLoad(20.0, "chat", 18.0, 241.0, 2))
    (scale,) = scales(s.cycle(20.0))
    assert scale.text == "p99 241 ms > 200 ms at 9 rps/replica: 2 -> 3"
    assert replicas(s) == 3


def test_load_per_replica_over_its_bound_adds_enough_replicas() -> None:
    s = core()
    s.observe(ServiceDemand(0.0, "chat", 5.0))
    s.cycle(0.0)
    s.observe(ServiceLoad(20.0, "chat", 35.0, 90.0, 1))
    (scale,) = scales(s.cycle(20.0))
    # 35 rps on one replica rated 10: ceil(35 * 1.1 / 10) = 4
    assert (scale.from_replicas, scale.to_replicas) == (1, 4)
    assert scale.reason == "35 rps/replica > 10 rps/replica at 35 rps"


def test_slo_rule_waits_for_a_fresh_measurement_after_a_change() -> None:
    s = core(window_s=10.0)
    s.observe(ServiceDemand(0.0, "chat", 5.0))
    s.cycle(0.0)
    s.observe(ServiceLoad(3.0, "chat", 8.0, 300.0, 1))
    assert scales(s.cycle(3.0)) == []  # within a window of the change at 0 s
    s.observe(ServiceLoad(12.0, "chat", 8.0, 300.0, 1))
    assert [c.to_replicas for c in scales(s.cycle(12.0))] == [2]
    s.observe(ServiceLoad(13.0, "chat", 8.0, 300.0, 1))  # only one of 2 reports yet
    assert scales(s.cycle(13.0)) == []
    assert scales(s.cycle(40.0)) == []  # that load is stale now (older than the window)


def test_scale_down_waits_for_the_stabilisation_window_never_below_min() -> None:
    s = core(stable_s=30.0, min_replicas=2)
    s.observe(ServiceDemand(0.0, "chat", 50.0))
    s.cycle(0.0)
    assert replicas(s) == 6
    s.observe(ServiceDemand(1.0, "chat", 0.0))
    for t in range(1, 31):
        assert scales(s.cycle(float(t))) == []
    out = s.cycle(31.0)
    (scale,) = scales(out)
    assert (scale.from_replicas, scale.to_replicas) == (6, 2)
    assert scale.reason.endswith("at least 2 (the minimum), low for 30 s")
    cancels = [c for c in out if isinstance(c, Cancel)]
    assert len(cancels) == 4 and all(c.reason == "scaled down" for c in cancels)
    assert replicas(s) == 2


def test_a_demand_that_comes_back_resets_the_window() -> None:
    s = core(stable_s=10.0)
    s.observe(ServiceDemand(0.0, "chat", 30.0))
    s.cycle(0.0)
    s.observe(ServiceDemand(1.0, "chat", 5.0))
    s.cycle(1.0)
    s.observe(ServiceDemand(8.0, "chat", 30.0))
    s.cycle(8.0)
    s.observe(ServiceDemand(9.0, "chat", 5.0))
    s.cycle(9.0)
    assert scales(s.cycle(15.0)) == []  # low since 9 s only
    assert [c.to_replicas for c in scales(s.cycle(19.0))] == [1]


def test_waiting_replicas_go_first_and_are_named_dropped() -> None:
    small = Cluster("c", (Node("n0", "H200", 2, 1_000_000, 1 << 30, cluster="c"),))
    cfg = SchedulerConfig(cycle_s=1.0, online_reserve=0.0)
    s = Scheduler(small, cfg, services=[CHAT])
    s.observe(ServiceDemand(0.0, "chat", 30.0))
    s.cycle(0.0)  # 4 wanted, 2 run, 2 wait
    waiting = {r.job_id for r in s.replicas["chat"].values() if r.state is JobState.PENDING}
    assert len(waiting) == 2
    s.observe(ServiceDemand(1.0, "chat", 15.0))
    out = s.cycle(1.0)
    (scale,) = scales(out)
    assert set(scale.dropped) == waiting
    assert not any(isinstance(c, Cancel) for c in out)


def test_remove_service_cancels_running_and_drops_waiting_replicas() -> None:
    s = core()
    s.observe(ServiceDemand(0.0, "chat", 15.0))
    s.cycle(0.0)
    out = s.remove_service("chat", 5.0)
    assert isinstance(out[0], Scale) and out[0].to_replicas == 0
    assert sorted(c.job_id for c in out if isinstance(c, Cancel)) == ["chat-r1", "chat-r2"]
    assert "chat" not in s.services
    with pytest.raises(NotFoundError):
        s.observe(ServiceLoad(6.0, "chat", 1.0, 1.0, 1))


def test_restored_replicas_count_for_their_service() -> None:
    s = core()
    s.observe(ServiceDemand(0.0, "chat", 15.0))
    s.cycle(0.0)
    placements = {j: s.placements()[j] for j in s.replicas["chat"]}
    specs = {j: r.spec for j, r in s.replicas["chat"].items()}
    fresh = core()
    for job_id, spec in specs.items():
        fresh.restore(spec, JobState.RUNNING, placements[job_id], 10.0, service="chat")
    fresh.observe(ServiceDemand(10.0, "chat", 15.0))
    assert scales(fresh.cycle(10.0)) == []  # adopted, not doubled
    assert replicas(fresh) == 2

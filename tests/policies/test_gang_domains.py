"""Gangs inside their network domains (domain/topology.py, policies/placement/domains.py):
a gang that requires a rack lands in one or waits with the reason; the smallest rack that
fits is taken so the big ones stay whole; narrow jobs pack into racks already in use;
spanning racks costs what the step-time model says."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.domain.model import Cluster, JobSpec, Node, NodeShare, Placement
from gpupool.domain.state import ClusterState
from gpupool.domain.topology import StepModel, Topology, spanned_level
from gpupool.errors import SpecError
from gpupool.policies.placement.best_fit import BestFitPolicy as BestFit
from gpupool.scheduler.config_schema import parse_scheduling
from gpupool.sim.scenario.config import parse_scenario
from gpupool.sim.scenario.runner import run_scenario
from gpupool.sim.scenario.workload import Workload

H = 3600.0
RACKS = Topology(levels=("rack",), busbw_gb_s=(215.0, 90.0))


def _state(racks: tuple[int, ...], topology: Topology = RACKS) -> ClusterState:
    """8-GPU nodes, `racks[k]` of them in rack k."""
    nodes = [
        Node(f"r{k}n{i}", "A100-80GB", 8, 1_000_000, 1 << 30, labels=(("rack", f"r{k}"),))
        for k, count in enumerate(racks)
        for i in range(count)
    ]
    state = ClusterState(Cluster("c", tuple(nodes)))
    state.set_topology(topology)
    return state


def _fill(state: ClusterState, nodes: list[int]) -> None:
    for n in nodes:
        job = JobSpec(f"busy{n}", gpu_count=8)
        state.allocate(job, Placement((NodeShare(n, tuple(range(8)), 1000),)))


def _racks(state: ClusterState, placement: Placement | None) -> set[str]:
    assert placement is not None
    return {state.cluster.nodes[n].label("rack") or "" for n in placement.nodes}


def test_a_gang_that_requires_a_rack_waits_rather_than_spread() -> None:
    """Two racks of four nodes, two idle in each: a 32-GPU gang fits the pool (four idle
    nodes) but no rack. Required: no placement; preferred or nothing asked: it spreads."""
    state = _state((4, 4))
    _fill(state, [0, 1, 4, 5])
    rng = np.random.default_rng(0)
    policy = BestFit()
    assert policy.place(state, JobSpec("g", gpu_count=32, topology="rack"), rng) is None
    for job in (JobSpec("p", gpu_count=32, topology_preferred="rack"), JobSpec("n", gpu_count=32)):
        assert _racks(state, policy.place(state, job, rng)) == {"r0", "r1"}
    blind = _state((4, 4), Topology(levels=("rack",), aware=False))
    _fill(blind, [0, 1, 4, 5])
    assert (
        len(_racks(blind, policy.place(blind, JobSpec("g", gpu_count=32, topology="rack"), rng)))
        == 2
    )


def test_a_gang_takes_the_smallest_rack_that_fits_and_leaves_the_big_one_whole() -> None:
    """Rack r0 has four idle nodes, r1 two: a 16-GPU gang goes to r1, so a 32-GPU gang
    still finds r0 whole. Topology-blind placement takes the first idle nodes (r0)."""
    state = _state((4, 4))
    _fill(state, [4, 5])
    rng = np.random.default_rng(0)
    policy = BestFit()
    small = policy.place(state, JobSpec("s", gpu_count=16), rng)
    assert _racks(state, small) == {"r1"}
    assert small is not None
    state.allocate(JobSpec("s", gpu_count=16), small)
    big = policy.place(state, JobSpec("b", gpu_count=32, topology="rack"), rng)
    assert _racks(state, big) == {"r0"}
    blind = _state((4, 4), Topology(levels=("rack",), aware=False))
    _fill(blind, [4, 5])
    assert _racks(blind, policy.place(blind, JobSpec("s", gpu_count=16), rng)) == {"r0"}


def test_narrow_jobs_fill_a_rack_in_use_before_opening_an_idle_one() -> None:
    """One node of r1 is busy; an 8-GPU job goes to r1's next node, not into idle r0
    (without topology the tie goes to the first node, in r0)."""
    state = _state((2, 2))
    _fill(state, [2])
    rng = np.random.default_rng(0)
    assert _racks(state, BestFit().place(state, JobSpec("j", gpu_count=8), rng)) == {"r1"}
    plain = _state((2, 2), Topology())
    _fill(plain, [2])
    assert _racks(plain, BestFit().place(plain, JobSpec("j", gpu_count=8), rng)) == {"r0"}


def test_the_step_model_charges_a_gang_that_leaves_its_nvlink_domain() -> None:
    """facts.md section 5: t = t_c + max(0, 2(N-1)/N G/busbw - o t_bwd). With the defaults
    (26 GB, 0.5 s, overlap 0.8) a 32-GPU ring is hidden at 215 GB/s and not at 90 GB/s."""
    step = StepModel()
    assert step.step_s(32, 215.0) == pytest.approx(0.5)
    exposed = 2 * 31 / 32 * 26 / 90 - 0.8 * (2 / 3) * 0.5
    assert step.step_s(32, 90.0) == pytest.approx(0.5 + exposed)
    assert RACKS.speed(32, 1) == pytest.approx(0.5 / (0.5 + exposed))
    assert RACKS.speed(32, 0) == 1.0
    state = _state((2, 2))
    assert spanned_level(state.level_ids, (0, 1)) == 0
    assert spanned_level(state.level_ids, (1, 2)) == 1


def test_topology_settings_are_checked() -> None:
    cfg = parse_scheduling(
        {"topology": {"levels": ["rack", "block"], "links": ["nvlink", "infiniband", 45]}}, "t"
    )
    assert cfg.topology.busbw_gb_s == (215.0, 90.0, 45.0)
    assert cfg.topology.placing
    with pytest.raises(SpecError, match="a bandwidth for each level"):
        parse_scheduling({"topology": {"levels": ["rack"], "links": ["nvlink"]}}, "t")
    with pytest.raises(SpecError, match="not a link"):
        parse_scheduling(
            {"topology": {"levels": ["rack"], "links": ["nvlink", "carrier-pigeon"]}}, "t"
        )
    with pytest.raises(SpecError, match="choose aware or blind"):
        parse_scheduling({"topology": {"levels": ["rack"], "placement": "sometimes"}}, "t")
    with pytest.raises(SpecError, match="labels must be sorted"):
        Node("n", "A100-80GB", 8, 1, 1, labels=(("rack", "a"), ("block", "b")))


def _run(policy: str, reservations: bool, placement: str) -> tuple[float, set[int]]:
    """Two racks of two 8-GPU nodes. Three 8-GPU jobs fill three nodes; the 15-minute one
    (on the first rack) ends before a 16-GPU gang that requires a rack arrives at 0.5 h, so
    one node of each rack is idle. Returns the gang's start time and its racks."""
    cfg = parse_scenario(
        {
            "name": "racks",
            "horizon_h": 40,
            "cycle_s": 60,
            "policy": policy,
            "reservations": reservations,
            "online_reserve": 0.0,
            "topology": {
                "levels": ["rack"],
                "placement": placement,
                "links": ["nvlink", "infiniband"],
            },
            "cluster": [
                {"gpu_type": "A100-80GB", "nodes": 4, "gpus_per_node": 8, "domains": {"rack": 2}}
            ],
            "teams": [{"name": "t", "guaranteed": {"A100-80GB": 32}, "max": {"A100-80GB": 32}}],
            "workload": [],
        }
    )
    narrow = tuple(
        JobSpec(f"n{k}", gpu_count=8, team="t", submit_s=k * 10.0, duration_s=hours * H)
        for k, hours in enumerate((3.0, 0.25, 5.0))
    )
    gang = JobSpec(
        "gang", gpu_count=16, team="t", submit_s=0.5 * H, duration_s=4 * H, topology="rack"
    )
    result = run_scenario(cfg, workload=Workload(jobs=(*narrow, gang)))
    starts = [d for d in result.log.decisions if d.action == "start" and d.job_id == "gang"]
    assert len(starts) == 1 and starts[0].placement is not None
    names = [result.node_names[n] for n in starts[0].placement.nodes]
    return starts[0].time_s, {int(name.split("-")[-1]) // 2 for name in names}


@pytest.mark.parametrize("policy", ["priority-quota", "fifo", "backfill", "las"])
@pytest.mark.parametrize("reservations", [False, True])
def test_every_policy_starts_a_rack_gang_inside_one_rack(policy: str, reservations: bool) -> None:
    """Aware: the gang waits for the first rack to empty (the 3-h job's end) and starts
    inside it, under every cycle policy, with or without reservations. Blind: it starts
    at once over the two racks' idle nodes."""
    at_s, racks = _run(policy, reservations, "aware")
    assert len(racks) == 1 and 3 * H <= at_s <= 3 * H + 120, (at_s / H, racks)
    at_s, racks = _run(policy, reservations, "blind")
    assert len(racks) == 2 and at_s <= 0.5 * H + 60, (at_s / H, racks)

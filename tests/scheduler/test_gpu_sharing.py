"""GPU shares in the decision core: the co-location rule, sizing by memory per GPU type,
measured state (SM utilisation over a window, free memory), and the placement policy."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gpupool.domain.model import Cluster, JobKind, JobSpec, Node, NodeShare, Placement
from gpupool.domain.state import ClusterState
from gpupool.errors import PlanRejected, SpecError
from gpupool.policies.placement.best_fit import BestFitPolicy
from gpupool.policies.placement.consolidate import ConsolidatePolicy
from gpupool.policies.placement.fgd import LearnedFgdPolicy
from gpupool.scheduler import GpuUsage, Launch, Scheduler, Submitted
from gpupool.scheduler.config import PlacementConfig, SchedulerConfig, SharingConfig
from gpupool.scheduler.config_schema import parse_scheduling
from gpupool.server.loop.config import LIVE_DEFAULTS
from gpupool.sizing.catalog import load_catalog

CATALOG = load_catalog()
A100_MIB = round(CATALOG["A100-80GB"].memory_gib * 1024)


def fleet(*nodes: tuple[str, int]) -> Cluster:
    return Cluster(
        "c", tuple(Node(f"n{i}", m, n, 1_000_000, 1 << 30) for i, (m, n) in enumerate(nodes))
    )


def core(cluster: Cluster, config: SchedulerConfig = LIVE_DEFAULTS) -> Scheduler:
    return Scheduler(cluster, config, catalog=CATALOG)


def launches(s: Scheduler, t: float) -> list[Launch]:
    return [c for c in s.cycle(t) if isinstance(c, Launch)]


def online(job_id: str, **kw: object) -> JobSpec:
    return JobSpec(job_id, kind=JobKind.ONLINE, **kw)  # type: ignore[arg-type]


# ---- sizing a share by GPU memory ----------------------------------------------------------------
def test_gpu_memory_becomes_the_share_of_the_card_it_lands_on() -> None:
    s = core(fleet(("A100-80GB", 1)))
    s.observe(Submitted(0.0, online("a", gpu_mem_mib=18 * 1024)))
    (launch,) = launches(s, 0.0)
    assert launch.placement.shares[0].gpu_milli == -(-18 * 1024 * 1000 // A100_MIB)  # 229
    assert s.records["a"].spec.gpu_milli == 229


def test_memory_larger_than_every_card_is_unplaceable_naming_the_largest() -> None:
    s = core(fleet(("A100-80GB", 1), ("RTX-4090", 2)))
    s.observe(Submitted(0.0, online("big", gpu_mem_mib=100 * 1024)))
    r = s.records["big"]
    assert r.state.value == "unplaceable"
    assert "A100-80GB" in r.end_reason and str(A100_MIB) in r.end_reason


def test_a_share_fraction_and_memory_are_part_of_one_gpu_only() -> None:
    with pytest.raises(SpecError, match="part of one GPU"):
        JobSpec("x", gpu_count=2, gpu_mem_mib=1024)


# ---- the co-location rule ------------------------------------------------------------------------
def test_without_share_cap_four_18gib_online_jobs_share_an_a100_and_a_fifth_waits() -> None:
    s = core(fleet(("A100-80GB", 1)))
    for i in range(5):
        s.observe(Submitted(0.0, online(f"o{i}", gpu_mem_mib=18 * 1024)))
    started = launches(s, 0.0)
    assert sorted(c.job_id for c in started) == ["o0", "o1", "o2", "o3"]
    assert {c.placement.shares[0].gpus for c in started} == {(0,)}
    assert launches(s, 1.0) == []
    assert s.records["o4"].state.value == "pending"


def test_share_cap_bounds_online_replicas_per_card() -> None:
    s = core(fleet(("A100-80GB", 1)), dataclasses.replace(LIVE_DEFAULTS, share_cap=2))
    for i in range(4):
        s.observe(Submitted(0.0, online(f"o{i}", gpu_milli=200)))
    assert sorted(c.job_id for c in launches(s, 0.0)) == ["o0", "o1"]


def test_training_never_shares_a_card_with_online_inference() -> None:
    s = core(fleet(("A100-80GB", 2)))
    s.observe(Submitted(0.0, online("o", gpu_milli=250)))
    s.observe(Submitted(0.0, JobSpec("t", gpu_milli=250)))
    s.observe(Submitted(0.0, JobSpec("t2", gpu_milli=250)))
    started = {c.job_id: c.placement.shares[0].gpus for c in launches(s, 0.0)}
    assert started["o"] != started["t"]
    assert started["t"] == started["t2"]  # training shares with training


def test_the_core_refuses_a_plan_that_breaks_the_co_location_rule() -> None:
    state = ClusterState(fleet(("A100-80GB", 1)))
    state.colocate = True
    o = online("o", gpu_milli=250)
    state.allocate(o, Placement((NodeShare(0, (0,), 250),)))
    t = JobSpec("t", gpu_milli=250)
    with pytest.raises(PlanRejected, match="may not share a GPU with online inference"):
        state.validate(t, Placement((NodeShare(0, (0,), 250),)))


def test_one_team_per_card_refuses_another_teams_share_until_the_card_empties() -> None:
    state = ClusterState(fleet(("A100-80GB", 1)))
    state.colocate = True
    state.one_team_per_card = True
    card = Placement((NodeShare(0, (0,), 250),))
    state.allocate(online("ml-1", gpu_milli=250, team="ml"), card)
    state.validate(online("ml-2", gpu_milli=250, team="ml"), card)  # its own team: fine
    cv = online("cv-1", gpu_milli=250, team="cv")
    assert not state.usable_gpus(cv)[0, 0]
    with pytest.raises(PlanRejected, match="another team's job shares it"):
        state.validate(cv, card)
    state.release("ml-1")
    assert state.usable_gpus(cv)[0, 0]
    state.validate(cv, card)


def test_one_team_per_card_holds_in_a_replay_that_sets_it() -> None:
    """The same rule in the simulator's core: a scenario may set it like the service."""
    cfg = parse_scheduling({"sharing": {"one_team_per_card": True}}, "test", LIVE_DEFAULTS)
    s = core(fleet(("A100-80GB", 2)), cfg)
    for job_id, team in (("a", "ml"), ("b", "cv"), ("c", "ml"), ("d", "cv")):
        s.observe(Submitted(0.0, online(job_id, gpu_milli=250, team=team)))
    cards = {c.job_id: c.placement.shares[0].gpus for c in launches(s, 0.0)}
    assert cards["a"] == cards["c"] and cards["b"] == cards["d"] and cards["a"] != cards["b"]
    with pytest.raises(SpecError, match="one_team_per_card"):
        parse_scheduling({"sharing": {"one_team_per_card": "yes"}}, "test", LIVE_DEFAULTS)


# ---- measured state ------------------------------------------------------------------------------
def usage(t: float, util: float, used_mib: int) -> GpuUsage:
    return GpuUsage(
        t,
        np.array([[util]]),
        np.array([[used_mib]], dtype=np.int64),
        np.array([[A100_MIB]], dtype=np.int64),
    )


def test_a_card_busy_over_the_window_takes_no_new_sharer_until_its_average_drops() -> None:
    config = dataclasses.replace(LIVE_DEFAULTS, sharing=SharingConfig(80.0, 10.0))
    s = core(fleet(("A100-80GB", 1)), config)
    s.observe(Submitted(0.0, online("a", gpu_milli=250)))
    assert [c.job_id for c in launches(s, 0.0)] == ["a"]
    for t in range(1, 21):  # the card runs hot: 95% SM, memory mostly free
        s.observe(usage(float(t), 95.0, 4096))
    s.observe(Submitted(20.0, online("b", gpu_milli=250)))
    assert launches(s, 20.0) == []
    # It cools to 10%: the latest reading is low at once, but the 10 s average (samples
    # 11..21: 87%) is still above 80% at t=21; at t=22 (12..22: 79.5%) it is below.
    s.observe(usage(21.0, 10.0, 4096))
    assert launches(s, 21.0) == []
    s.observe(usage(22.0, 10.0, 4096))
    assert [c.job_id for c in launches(s, 22.0)] == ["b"]


def test_a_card_whose_measured_free_memory_is_short_takes_no_share() -> None:
    s = core(fleet(("A100-80GB", 1)))
    s.observe(usage(0.0, 5.0, A100_MIB - 10 * 1024))  # something outside gpupool holds it
    s.observe(Submitted(0.0, online("a", gpu_mem_mib=18 * 1024)))
    assert launches(s, 0.0) == []
    s.observe(usage(1.0, 5.0, 1024))
    assert [c.job_id for c in launches(s, 1.0)] == ["a"]


def test_whole_gpu_jobs_ignore_measured_sharing_bounds() -> None:
    s = core(fleet(("A100-80GB", 1)))
    s.observe(usage(0.0, 99.0, 512))  # idle card with the driver's context
    s.observe(Submitted(0.0, JobSpec("w")))
    assert [c.job_id for c in launches(s, 0.0)] == ["w"]


# ---- the placement policy ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "kind"),
    [("consolidate", ConsolidatePolicy), ("best-fit", BestFitPolicy), ("fgd", LearnedFgdPolicy)],
)
def test_placement_policy_comes_from_the_scheduling_section(name: str, kind: type) -> None:
    config = parse_scheduling({"placement": {"policy": name}}, "cfg.yaml", LIVE_DEFAULTS)
    assert config.placement.policy == name
    assert type(core(fleet(("A100-80GB", 2)), config).placement) is kind


def test_an_unknown_placement_policy_is_refused_naming_the_choices() -> None:
    with pytest.raises(SpecError, match="consolidate, best-fit, fgd"):
        parse_scheduling({"placement": {"policy": "spread"}}, "cfg.yaml")


def test_share_cap_null_means_no_cap_and_the_scenario_default_stays_two() -> None:
    assert parse_scheduling({"share_cap": None}, "cfg.yaml").share_cap is None
    assert parse_scheduling({}, "cfg.yaml").share_cap == 2
    assert LIVE_DEFAULTS.share_cap is None
    assert SchedulerConfig().placement == PlacementConfig()


def test_learned_fgd_measures_fragmentation_against_the_shapes_submitted() -> None:
    config = dataclasses.replace(LIVE_DEFAULTS, placement=PlacementConfig(policy="fgd"))
    s = core(fleet(("A100-80GB", 2)), config)
    fgd = s.placement
    assert isinstance(fgd, LearnedFgdPolicy)
    assert fgd.meter.tasks == ()
    for i in range(3):
        s.observe(Submitted(0.0, JobSpec(f"w{i}", gpu_count=2)))
    s.observe(Submitted(0.0, online("s0", gpu_mem_mib=40 * 1024)))  # 4 jobs seen: relearned
    shapes = {(t.shape.gpu_count, t.shape.gpu_milli): t.popularity for t in fgd.meter.tasks}
    assert shapes == {(2, 1000): 0.75, (1, 508): 0.25}
    # a card with a 0.508 share used strands what no typical task can use
    assert fgd.meter.node("A100-80GB", 0, (492, 1000)) > fgd.meter.node("A100-80GB", 0, (0, 1000))


# ---- the client's flags ------------------------------------------------------------------------
def test_submit_flags_for_part_of_one_gpu() -> None:
    from gpupool.cli.parse import gpu_request, parse_mem_mib

    assert gpu_request("2", None) == {"gpus": 2}
    assert gpu_request("0.25", None) == {"gpus": 1, "gpu_share": 0.25}
    assert gpu_request(None, "18GiB") == {"gpus": 1, "gpu_mem_mib": 18 * 1024}
    assert parse_mem_mib("512MiB") == 512 and parse_mem_mib("1.5G") == 1536
    for bad in (("1.5", None), ("0.25", "8GiB"), ("2", "8GiB")):
        with pytest.raises(SpecError):
            gpu_request(*bad)
    with pytest.raises(SpecError, match="binary unit"):
        parse_mem_mib("20GB")

"""Focused unit tests for pool choice, power caps, coolest-first placement, cloud burst,
the model-jobs/job/backlog generators and scenario determinism.

Expected values are worked out by hand in the comments next to each assertion.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpupool.domain.lifecycle import JobState
from gpupool.domain.model import Cluster, JobKind, JobSpec, Node, NodeShare, Placement
from gpupool.domain.state import ClusterState
from gpupool.energy.power import Load
from gpupool.energy.powercap import SetPowerCap, best_cap
from gpupool.errors import SpecError
from gpupool.federation.burst import BurstRules
from gpupool.federation.topology import DataLocation, Link, Site, Topology
from gpupool.policies.placement.consolidate import ConsolidatePolicy
from gpupool.policies.placement.coolest_first import CoolestFirstPolicy
from gpupool.policies.pool_choice import (
    PoolLoad,
    PoolOption,
    choose_across_sites,
    choose_blind,
    choose_cost_aware,
    choose_first,
    wait_s,
)
from gpupool.policies.power_caps import (
    DEFAULT_MAX_SM_MHZ,
    CapJob,
    CapRules,
    cap_fraction,
    plan_power_caps,
)
from gpupool.scheduler import Burst, NodeDown, NodeUp, Reclaim, Scheduler, SchedulerConfig
from gpupool.scheduler.fleet import DOWN, STARTING, STOPPING, UP
from gpupool.sim.scenario.config import load_scenario
from gpupool.sim.scenario.generators import GenContext, build_workload
from gpupool.sim.scenario.runner import run_scenario
from gpupool.sizing.shapes import get_shape

HOUR = 3600.0
REPO = Path(__file__).resolve().parents[2]


def opt(
    pool: str,
    count: int,
    duration_s: float | None,
    price: float,
    site: str = "home",
    gpu_type: str | None = None,
) -> PoolOption:
    return PoolOption(pool, gpu_type or pool, site, count, duration_s, price)


# =============================================================================================
# 1. policies/pool_choice.py


def test_cost_usd_is_gpus_times_hours_times_price() -> None:
    # 4 GPUs x 2 h x $2.50 = $20.00
    assert opt("a", 4, 7200.0, 2.5).cost_usd() == pytest.approx(20.0)
    # 3 GPUs x 0.5 h x $1.20 = $1.80
    assert opt("b", 3, 1800.0, 1.2).cost_usd() == pytest.approx(1.8)
    # unknown duration counts as no work: $0
    assert opt("c", 8, None, 9.0).cost_usd() == 0.0


def test_wait_s_is_zero_when_the_job_fits_else_the_drain_time() -> None:
    o = opt("a", 4, 100.0, 1.0)
    assert wait_s(o, PoolLoad(free_gpus=4, drain_s=500.0)) == 0.0  # 4 <= 4: starts now
    assert wait_s(o, PoolLoad(free_gpus=9, drain_s=500.0)) == 0.0
    assert wait_s(o, PoolLoad(free_gpus=3, drain_s=500.0)) == 500.0  # 4 > 3: waits the drain


def test_choose_first_takes_the_first_option() -> None:
    options = [opt("b", 1, 10.0, 5.0), opt("a", 1, 10.0, 1.0)]
    assert choose_first(options).option.pool == "b"


def test_choose_blind_most_free_gpus_among_those_that_fit() -> None:
    options = [opt("a", 2, 10.0, 1.0), opt("b", 8, 10.0, 1.0), opt("c", 2, 10.0, 1.0)]
    # a: 2 <= 4 fits (4 free); b: 8 > 6 does not fit although it has the most free;
    # c: 2 <= 5 fits with 5 free -> c
    loads = {
        "a": PoolLoad(4, 100.0),
        "b": PoolLoad(6, 100.0),
        "c": PoolLoad(5, 100.0),
    }
    choice = choose_blind(options, loads)
    assert choice.option.pool == "c"
    assert "5" in choice.reason


def test_choose_blind_ties_go_to_option_order() -> None:
    loads = {"a": PoolLoad(6, 100.0), "b": PoolLoad(6, 100.0)}
    ab = [opt("a", 1, 10.0, 1.0), opt("b", 1, 10.0, 1.0)]
    # equal free GPUs (6 and 6): the first listed wins, whichever it is
    assert choose_blind(ab, loads).option.pool == "a"
    assert choose_blind(ab[::-1], loads).option.pool == "b"


def test_choose_blind_none_fits_takes_the_pool_that_drains_first() -> None:
    options = [opt("a", 4, 10.0, 1.0), opt("b", 4, 10.0, 1.0), opt("c", 4, 10.0, 1.0)]
    # nobody has 4 free; drains 500, 300, 300 -> b (300, listed before c)
    loads = {"a": PoolLoad(3, 500.0), "b": PoolLoad(0, 300.0), "c": PoolLoad(2, 300.0)}
    choice = choose_blind(options, loads)
    assert choice.option.pool == "b"
    assert "drains first" in choice.reason


# cheap: 1 GPU x 2 h x $1 = $2; pricey: 4 GPUs x 1 h x $1 = $4; dear: 4 GPUs x 1 h x $2 = $8
CHEAP = opt("cheap", 1, 7200.0, 1.0)
PRICEY = opt("pricey", 4, 3600.0, 1.0)
DEAR = opt("dear", 4, 3600.0, 2.0)
NOW = 5000.0


def _job(deadline_in_s: float | None, kind: JobKind = JobKind.TRAINING) -> JobSpec:
    return JobSpec(
        "j",
        submit_s=NOW,
        kind=kind,
        deadline_s=None if deadline_in_s is None else NOW + deadline_in_s,
    )


def test_cost_aware_takes_the_cheapest_option_that_meets_the_deadline() -> None:
    loads = {"cheap": PoolLoad(8, 0.0), "pricey": PoolLoad(8, 0.0), "dear": PoolLoad(8, 0.0)}
    # all free; finishes 7200, 3600, 3600 s from now, all <= 10000 -> cheapest: cheap ($2)
    choice = choose_cost_aware(_job(10_000.0), [PRICEY, DEAR, CHEAP], loads, NOW, 0.0)
    assert choice.option.pool == "cheap"
    assert "$2.00" in choice.reason


def test_cost_aware_still_waits_for_a_full_cheaper_pool_when_the_deadline_holds() -> None:
    loads = {"cheap": PoolLoad(0, 2800.0), "pricey": PoolLoad(8, 0.0)}
    # cheap is full: finish = 2800 wait + 7200 run = 10000 <= 10000 (exactly on time) -> cheap
    choice = choose_cost_aware(_job(10_000.0), [PRICEY, CHEAP], loads, NOW, 0.0)
    assert choice.option.pool == "cheap"


def test_cost_aware_moves_to_the_cheapest_on_time_pool_when_waiting_would_miss() -> None:
    loads = {"cheap": PoolLoad(0, 2801.0), "pricey": PoolLoad(8, 0.0), "dear": PoolLoad(8, 0.0)}
    # cheap: 2801 + 7200 = 10001 > 10000, late; pricey ($4) and dear ($8) finish at 3600
    # -> the cheaper of the on-time ones: pricey
    choice = choose_cost_aware(_job(10_000.0), [DEAR, CHEAP, PRICEY], loads, NOW, 0.0)
    assert choice.option.pool == "pricey"
    assert "meeting the deadline" in choice.reason


def test_cost_aware_with_no_option_on_time_takes_the_earliest_finish() -> None:
    quick = opt("quick", 8, 3000.0, 10.0)  # 8 x (3000/3600) h x $10 = $66.67, dearest
    loads = {"cheap": PoolLoad(8, 0.0), "pricey": PoolLoad(8, 0.0), "quick": PoolLoad(8, 0.0)}
    # deadline in 2000 s; finishes 7200, 3600, 3000 -> none on time; earliest: quick
    choice = choose_cost_aware(_job(2000.0), [CHEAP, PRICEY, quick], loads, NOW, 0.0)
    assert choice.option.pool == "quick"
    assert "finishes first" in choice.reason


def test_cost_aware_without_deadline_value_of_time_trades_cost_for_speed() -> None:
    slow = opt("slow", 1, 36_000.0, 1.0)  # 1 GPU x 10 h x $1 = $10
    fast = opt("fast", 8, 3600.0, 2.0)  # 8 GPUs x 1 h x $2 = $16
    loads = {"slow": PoolLoad(8, 0.0), "fast": PoolLoad(8, 0.0)}
    options = [fast, slow]
    # vot 0: $10 < $16 -> slow
    assert choose_cost_aware(_job(None), options, loads, NOW, 0.0).option.pool == "slow"
    # vot 10 $/h: slow 10 + 10 x 10 h = 110; fast 16 + 10 x 1 h = 26 -> fast
    assert choose_cost_aware(_job(None), options, loads, NOW, 10.0).option.pool == "fast"
    # break-even at vot = 6/9 $/h: 10 + 10v = 16 + v; at 0.6 slow still wins (16 < 16.6)
    assert choose_cost_aware(_job(None), options, loads, NOW, 0.6).option.pool == "slow"


def test_cost_aware_value_of_time_counts_queueing_delay() -> None:
    a = opt("a", 1, 3600.0, 1.0)  # $1, but its pool is full for 10 h
    b = opt("b", 1, 3600.0, 1.5)  # $1.50, free now
    loads = {"a": PoolLoad(0, 36_000.0), "b": PoolLoad(4, 0.0)}
    # vot 0: $1 < $1.50 -> a; vot 1: a 1 + 11 h = 12, b 1.5 + 1 h = 2.5 -> b
    assert choose_cost_aware(_job(None), [a, b], loads, 0.0, 0.0).option.pool == "a"
    assert choose_cost_aware(_job(None), [a, b], loads, 0.0, 1.0).option.pool == "b"


# ---- across sites -------------------------------------------------------------------------
# Region A holds the dataset and site-a; region B holds site-b; one 1 Gbps, 20 ms link.
# Moving 100 GB to site-b: 100 x 8 / 1 = 800 s + 0.02 s latency = 800.02 s.


def _topo() -> Topology:
    return Topology(
        [Site("site-a", "A"), Site("site-b", "B")],
        [DataLocation("ds", "A")],
        [Link("A", "B", 1.0, 20.0)],
    )


SITE_A = opt("a-h100", 1, 3600.0, 2.0, site="site-a", gpu_type="H100")
SITE_B = opt("b-h100", 1, 3600.0, 2.0, site="site-b", gpu_type="H100")


def _data_job() -> JobSpec:
    return JobSpec("d", submit_s=0.0, dataset="ds", dataset_gb=100.0)


def test_topology_transfer_is_what_the_site_tests_assume() -> None:
    assert _topo().transfer_s("ds", "site-b", 100.0) == pytest.approx(800.02)
    assert _topo().transfer_s("ds", "site-a", 100.0) == 0.0


def test_across_sites_aware_stays_home_when_the_local_queue_is_shorter_than_the_move() -> None:
    # site-a full for 600 s < 800.02 s transfer: site-b refused for transfer, the job
    # queues at site-a -> rejected_remote True
    loads = {"a-h100": PoolLoad(0, 600.0), "b-h100": PoolLoad(8, 0.0)}
    choice, decision = choose_across_sites(
        _data_job(), [SITE_A, SITE_B], loads, _topo(), 0.0, aware=True
    )
    assert choice is not None
    assert choice.option.pool == "a-h100"
    assert choice.rejected_remote is True
    assert [site for site, _ in decision.rejected] == ["site-b"]
    assert "transfer" in decision.rejected[0][1]


def test_across_sites_aware_moves_the_data_when_the_local_queue_is_longer() -> None:
    # site-a full for 7200 s > 800.02 s: site-b allowed; completion a 7200 + 3600 = 10800,
    # b 800.02 + 3600 = 4400.02 -> site-b, nothing refused -> rejected_remote False
    loads = {"a-h100": PoolLoad(0, 7200.0), "b-h100": PoolLoad(8, 0.0)}
    choice, decision = choose_across_sites(
        _data_job(), [SITE_A, SITE_B], loads, _topo(), 0.0, aware=True
    )
    assert choice is not None
    assert choice.option.pool == "b-h100"
    assert choice.rejected_remote is False
    assert decision.completion_s == pytest.approx(4400.02)


def test_across_sites_refusal_without_queueing_is_not_counted_as_rejected_remote() -> None:
    # site-a has room (wait 0 s): site-b is refused for transfer, but the job does not
    # queue where it goes -> rejected_remote False
    loads = {"a-h100": PoolLoad(1, 600.0), "b-h100": PoolLoad(8, 0.0)}
    choice, decision = choose_across_sites(
        _data_job(), [SITE_A, SITE_B], loads, _topo(), 0.0, aware=True
    )
    assert choice is not None
    assert choice.option.pool == "a-h100"
    assert any("transfer" in why for _, why in decision.rejected)
    assert choice.rejected_remote is False


def test_across_sites_blind_follows_free_gpus_and_never_flags_rejected_remote() -> None:
    # same loads as the stay-home case: blind takes site-b (8 free > 0 free) and pays
    # the 800.02 s move; it refuses nothing
    loads = {"a-h100": PoolLoad(0, 600.0), "b-h100": PoolLoad(8, 0.0)}
    choice, decision = choose_across_sites(
        _data_job(), [SITE_A, SITE_B], loads, _topo(), 0.0, aware=False
    )
    assert choice is not None
    assert choice.option.pool == "b-h100"
    assert choice.rejected_remote is False
    assert decision.transfer_s == pytest.approx(800.02)


def test_across_sites_online_job_outside_its_latency_bound_gets_none() -> None:
    online = JobSpec("svc", kind=JobKind.ONLINE)
    loads = {"a-h100": PoolLoad(8, 0.0), "b-h100": PoolLoad(8, 0.0)}
    # users in A: site-a is 1 ms away (intra-region), site-b 20 ms; bound 0.5 ms -> none
    choice, decision = choose_across_sites(
        online,
        [SITE_A, SITE_B],
        loads,
        _topo(),
        0.0,
        aware=True,
        user_region="A",
        latency_bound_ms=0.5,
    )
    assert choice is None
    assert decision.option is None
    assert sorted(site for site, _ in decision.rejected) == ["site-a", "site-b"]
    # bound 5 ms: site-a (1 ms) qualifies, site-b (20 ms) does not, even though both are free
    choice, _ = choose_across_sites(
        online,
        [SITE_B, SITE_A],
        loads,
        _topo(),
        0.0,
        aware=True,
        user_region="A",
        latency_bound_ms=5.0,
    )
    assert choice is not None
    assert choice.option.pool == "a-h100"


# =============================================================================================
# 2. policies/power_caps.py

TDP = 700.0
COMPUTE = best_cap(Load.COMPUTE_BOUND, 0.08)  # 2/3 TDP, speed 1/1.072 on the Zeus trace
MEMORY = best_cap(Load.MEMORY_BOUND, 0.05)  # SM clock locked at 0.5 of max


def test_cap_points_are_the_ones_the_hand_computations_assume() -> None:
    assert COMPUTE.cap_frac == pytest.approx(2.0 / 3.0)
    assert COMPUTE.speed == pytest.approx(1.0 / 1.072)
    assert MEMORY.locked_sm_frac == 0.5


def _train(
    job_id: str = "t",
    deadline_s: float | None = 1e9,
    remaining_s: float = 36_000.0,
    gpus: tuple[tuple[int, int], ...] = ((0, 0),),
) -> CapJob:
    return CapJob(job_id, JobKind.TRAINING, gpus, TDP, deadline_s, remaining_s)


DEAR_NOW = {0: (0.30, 0.20)}  # price now above the mean


def test_online_inference_is_never_capped_even_when_hot() -> None:
    job = CapJob("svc", JobKind.ONLINE, ((0, 0), (0, 1)), TDP, None, 100.0)
    out = plan_power_caps([job], 0.0, DEAR_NOW, hot={(0, 0): 300.0})
    assert len(out) == 2
    assert all(c.is_reset for c in out)


def test_offline_inference_gets_a_locked_clock_when_price_capping() -> None:
    job = CapJob("off", JobKind.OFFLINE, ((0, 0), (0, 1)), TDP, None, 100.0)
    out = plan_power_caps([job], 0.0, {}, hot={})
    # 0.5 x 1980 MHz = 990 MHz on both GPUs, no power limit (price data not needed)
    assert [(c.gpu, c.locked_sm_mhz, c.power_limit_w) for c in out] == [
        (0, 990, None),
        (1, 990, None),
    ]
    # the node's own maximum clock: 0.5 x 1800 = 900 MHz
    out = plan_power_caps([job], 0.0, {}, hot={}, max_sm_mhz={0: 1800})
    assert {c.locked_sm_mhz for c in out} == {900}
    # no price capping: reset
    out = plan_power_caps([job], 0.0, {}, hot={}, price_capping=False)
    assert all(c.is_reset for c in out)


def test_training_is_capped_exactly_while_the_deadline_holds_at_the_capped_speed() -> None:
    now = 1000.0
    # finish at 2/3 TDP = now + 36000 x 1.072 + 3600 margin = 1000 + 38592 + 3600 = 43192
    slow_finish = now + 36_000.0 / COMPUTE.speed + CapRules().deadline_margin_s
    assert slow_finish == pytest.approx(43_192.0)
    on_time = plan_power_caps([_train(deadline_s=slow_finish)], now, DEAR_NOW, hot={})
    # limit = 2/3 x 700 W = 466.67 W
    assert on_time[0].power_limit_w == pytest.approx(TDP * 2.0 / 3.0)
    assert on_time[0].locked_sm_mhz is None
    late = plan_power_caps([_train(deadline_s=slow_finish - 1.0)], now, DEAR_NOW, hot={})
    assert late[0].is_reset


@pytest.mark.parametrize(
    ("price", "deadline_s"),
    [
        ({0: (0.20, 0.20)}, 1e9),  # price equal to the mean: not dearer
        ({0: (0.10, 0.20)}, 1e9),  # cheaper than the mean
        ({0: None}, 1e9),  # the node's power has no price
        ({}, 1e9),  # no price data at all
        (DEAR_NOW, None),  # no deadline: no price cap
    ],
)
def test_training_without_a_dear_price_and_deadline_is_not_capped(
    price: Mapping[int, tuple[float, float] | None], deadline_s: float | None
) -> None:
    out = plan_power_caps([_train(deadline_s=deadline_s)], 0.0, price, hot={})
    assert out[0].is_reset


def test_training_price_cap_off_when_price_capping_is_disabled() -> None:
    out = plan_power_caps([_train()], 0.0, DEAR_NOW, hot={}, price_capping=False)
    assert out[0].is_reset


def test_hot_gpus_get_the_lower_of_the_price_and_thermal_limits() -> None:
    job = _train(gpus=((0, 0), (0, 1), (0, 2)))
    hot = {(0, 0): 400.0, (0, 1): 500.0}
    out = plan_power_caps([job], 0.0, DEAR_NOW, hot=hot)
    # price limit 466.67 W: GPU 0 hot at 400 -> 400; GPU 1 hot at 500 -> 466.67; GPU 2 -> 466.67
    assert [c.power_limit_w for c in out] == pytest.approx([400.0, 466.6667, 466.6667], rel=1e-5)
    assert out[0].reason == "running hot"
    # no price cap (cheap power): hot GPUs still get their thermal limit, others reset
    out = plan_power_caps([job], 0.0, {0: (0.1, 0.2)}, hot=hot)
    assert [c.power_limit_w for c in out] == [400.0, 500.0, None]
    # offline inference keeps its clock lock and adds the thermal limit
    off = CapJob("off", JobKind.OFFLINE, ((0, 0),), TDP, None, 100.0)
    (cmd,) = plan_power_caps([off], 0.0, {}, hot={(0, 0): 350.0})
    assert (cmd.power_limit_w, cmd.locked_sm_mhz) == (350.0, 990)


def test_a_card_too_hot_to_cool_by_capping_gets_a_positive_limit_not_a_crash() -> None:
    # inlet at or over the threshold: no power keeps the card cool; the plan should set
    # the lowest positive limit it can (at most TDP), not raise
    (cmd,) = plan_power_caps([_train(deadline_s=None)], 0.0, {}, hot={(0, 0): 0.0})
    # the card's floor: 200 W of 700 (the H200's lowest settable limit), a fraction of TDP
    assert cmd.power_limit_w == pytest.approx(200.0 * TDP / 700.0)


def test_one_command_per_gpu_sorted_by_job_id() -> None:
    jobs = [
        _train("b", gpus=((1, 0), (1, 1))),
        CapJob("c", JobKind.ONLINE, ((2, 3),), TDP, None, 1.0),
        _train("a", gpus=((0, 2), (0, 0), (0, 1))),
    ]
    out = plan_power_caps(jobs, 0.0, {}, hot={})
    # a's three GPUs (in the job's own order), then b's two, then c's one
    assert [(c.node, c.gpu) for c in out] == [(0, 2), (0, 0), (0, 1), (1, 0), (1, 1), (2, 3)]


def test_cap_fraction_of_power_limits_clock_locks_and_resets() -> None:
    # 466.67 W / 700 W = 2/3
    limit = SetPowerCap(0, 0, TDP * 2.0 / 3.0, None, "")
    assert cap_fraction(limit, Load.COMPUTE_BOUND, TDP) == pytest.approx(2.0 / 3.0)
    # a limit above TDP is clipped to 1.0
    assert cap_fraction(SetPowerCap(0, 0, 800.0, None, ""), Load.COMPUTE_BOUND, TDP) == 1.0
    # 990 MHz of 1980 = 0.5 locked -> the memory-bound point locked at 0.5 (cap_frac 0.4263)
    lock = SetPowerCap(0, 0, None, 990, "")
    assert cap_fraction(lock, Load.MEMORY_BOUND, TDP) == pytest.approx(MEMORY.cap_frac)
    assert MEMORY.cap_frac == pytest.approx(0.4263, abs=1e-4)
    # 700 MHz of 1980 = 0.354 locked: nearest curve point is the 0.3 one (cap_frac 0.3533)
    low = SetPowerCap(0, 0, None, 700, "")
    assert cap_fraction(low, Load.MEMORY_BOUND, TDP) == pytest.approx(0.3533, abs=1e-4)
    # 990 MHz of an 1100 MHz card = 0.9 locked -> nearest is the 0.5 point again
    assert cap_fraction(lock, Load.MEMORY_BOUND, TDP, max_sm_mhz=1100) == pytest.approx(
        MEMORY.cap_frac
    )
    # both: min(200/700 = 0.2857, 0.4263) = 0.2857
    both = SetPowerCap(0, 0, 200.0, 990, "")
    assert cap_fraction(both, Load.MEMORY_BOUND, TDP) == pytest.approx(200.0 / 700.0)
    # a reset carries no cap
    assert cap_fraction(SetPowerCap(0, 0, None, None, ""), Load.COMPUTE_BOUND, TDP) is None


def test_planned_clock_lock_maps_back_to_the_planned_point() -> None:
    off = CapJob("off", JobKind.OFFLINE, ((0, 0),), TDP, None, 100.0)
    (cmd,) = plan_power_caps([off], 0.0, {}, hot={})
    frac = cap_fraction(cmd, Load.MEMORY_BOUND, TDP, DEFAULT_MAX_SM_MHZ)
    assert frac == pytest.approx(MEMORY.cap_frac)


# =============================================================================================
# 3. policies/placement/coolest_first.py CoolestFirstPolicy


def _state() -> ClusterState:
    """3 nodes x 4 GPUs; node 1 has GPUs 0, 1 busy (2 free), node 2 GPU 0 busy (3 free)."""
    nodes = tuple(Node(f"n{i}", "H100", 4, 64_000, 512_000) for i in range(3))
    state = ClusterState(Cluster("c", nodes))
    state.allocate(JobSpec("busy1", gpu_count=2), Placement((NodeShare(1, (0, 1), 1000),)))
    state.allocate(JobSpec("busy2", gpu_count=1), Placement((NodeShare(2, (0,), 1000),)))
    return state


RNG = np.random.default_rng(0)


def test_coolest_first_without_temperatures_is_consolidate() -> None:
    state = _state()
    policy = CoolestFirstPolicy(None)
    for gpus, node, picked in ((1, 1, (2,)), (2, 1, (2, 3)), (3, 2, (1, 2, 3)), (4, 0, None)):
        job = JobSpec(f"j{gpus}", gpu_count=gpus)
        placement = policy.place(state, job, RNG)
        expected = ConsolidatePolicy().place(state, job, RNG)
        assert placement is not None and expected is not None
        # fewest free that fit: 1 or 2 GPUs -> node 1 (2 free); 3 -> node 2; 4 -> node 0
        assert placement.nodes == (node,)
        assert placement == expected
        if picked is not None:
            assert placement.shares[0].gpus == picked


def test_coolest_first_prefers_the_node_whose_hottest_free_gpu_is_coolest() -> None:
    state = _state()
    temps = np.array(
        [
            [43.0, 40.0, 42.0, 41.0],  # all free: hottest free 43
            [90.0, 90.0, 50.0, 55.0],  # free 2, 3: hottest free 55
            [30.0, 60.0, 35.0, 36.0],  # free 1, 2, 3: hottest free 60
        ]
    )
    placement = CoolestFirstPolicy(temps).place(state, JobSpec("j", gpu_count=2), RNG)
    assert placement is not None
    # node 0 (43 < 55 < 60); its coolest two free GPUs are 1 (40) and 3 (41)
    assert placement.nodes == (0,)
    assert placement.shares[0].gpus == (1, 3)


def test_coolest_first_ignores_busy_gpus_when_scoring_a_node() -> None:
    state = _state()
    temps = np.array(
        [
            [43.0, 40.0, 42.0, 41.0],  # hottest free 43
            [90.0, 90.0, 38.0, 35.0],  # busy GPUs at 90 do not count: hottest free 38
            [30.0, 60.0, 35.0, 36.0],  # hottest free 60
        ]
    )
    placement = CoolestFirstPolicy(temps).place(state, JobSpec("j", gpu_count=1), RNG)
    assert placement is not None
    # node 1 (38), and inside it the coolest free GPU, 3 (35 C), not the lowest index 2
    assert placement.nodes == (1,)
    assert placement.shares[0].gpus == (3,)


def test_coolest_first_between_equally_cool_nodes_takes_the_fuller_one() -> None:
    state = _state()
    temps = np.array(
        [
            [40.0, 40.0, 40.0, 40.0],  # hottest free 40, 4 free
            [90.0, 90.0, 70.0, 70.0],  # hottest free 70
            [99.0, 40.0, 40.0, 40.0],  # hottest free 40, 3 free -> fuller
        ]
    )
    placement = CoolestFirstPolicy(temps).place(state, JobSpec("j", gpu_count=1), RNG)
    assert placement is not None
    assert placement.nodes == (2,)


@pytest.mark.parametrize("with_temps", [False, True])
def test_coolest_first_places_a_cpu_only_job(with_temps: bool) -> None:
    state = _state()
    temps = np.full((3, 4), 50.0) if with_temps else None
    job = JobSpec("cpu", gpu_count=0, cpu_milli=2000, mem_mib=1024)
    placement = CoolestFirstPolicy(temps).place(state, job, RNG)
    assert placement is not None
    # no GPUs taken; scored like consolidate: node 1 has the fewest free GPUs (2)
    assert placement.shares[0].gpus == ()
    assert placement.nodes == (1,)
    state.validate(job, placement)


# =============================================================================================
# 4. cloud burst and reclaim, decided by the core with a real BurstController


def _cloud_core() -> Scheduler:
    """Node n0 on-prem, n1 and n2 cloud (4 H100 each)."""
    nodes = tuple(Node(f"n{i}", "H100", 4, 64_000, 512_000) for i in range(3))
    rules = BurstRules(
        util_threshold=0.9,
        sustain_s=900.0,
        pending_gpu_threshold=1,
        pending_sustain_s=120.0,
        reclaim_util=0.3,
        reclaim_sustain_s=120.0,
        nodes_per_burst=2,
        max_cloud_nodes=2,
    )
    config = SchedulerConfig(policy="fifo", online_reserve=0.0, burst=rules)
    return Scheduler(
        Cluster("c", nodes),
        config,
        node_pool=["onprem", "cloud", "cloud"],
        cloud_nodes=["n1", "n2"],
    )


def test_cloud_nodes_start_down_and_masked_out() -> None:
    core = _cloud_core()
    assert set(core.fleet.cloud_status.values()) == {DOWN}
    assert core.fleet.pool_nodes["cloud"].tolist() == [False, False, False]
    assert core.fleet.pool_nodes["onprem"].tolist() == [True, False, False]


def test_cloud_burst_join_and_reclaim_timeline() -> None:
    core = _cloud_core()
    core.submit(JobSpec("a", gpu_count=4, gpu_models=frozenset({"H100"})), 0.0)
    core.submit(JobSpec("b", gpu_count=4, gpu_models=frozenset({"H100"})), 0.0)

    def tick(t: float) -> list[tuple[str, tuple[str, ...]]]:
        return [
            (type(c).__name__, c.nodes) for c in core.cycle(t) if isinstance(c, Burst | Reclaim)
        ]

    # t=0, 60: 4 GPUs pending, the window open since 0 but < 120 s: nothing happens
    assert tick(0.0) == [] and tick(60.0) == []
    # t=120: pending for 120 s -> burst 2 nodes; out of the pool until they join
    assert tick(120.0) == [("Burst", ("n1", "n2"))]
    assert set(core.fleet.cloud_status.values()) == {STARTING}
    assert not core.fleet.pool_nodes["cloud"].any()
    for t in (180.0, 240.0, 300.0, 360.0):  # no second burst while they start
        assert tick(t) == []
    core.observe(NodeUp(420.0, "n1"))
    core.observe(NodeUp(420.0, "n2"))
    assert set(core.fleet.cloud_status.values()) == {UP}
    assert core.fleet.pool_nodes["cloud"].tolist() == [False, True, True]
    core.finished("b", 420.0, JobState.CANCELLED, "not needed")
    assert tick(420.0) == [] and tick(480.0) == []  # cold since 420: 60 s < 120 s
    # t=540: cold for 120 s, both idle -> reclaimed; stopping (out of the pool) until gone
    assert tick(540.0) == [("Reclaim", ("n1", "n2"))]
    assert set(core.fleet.cloud_status.values()) == {STOPPING}
    assert not core.fleet.pool_nodes["cloud"].any()
    core.observe(NodeDown(560.0, "n1"))
    assert core.fleet.cloud_status[1] == DOWN and core.fleet.cloud_status[2] == STOPPING


# =============================================================================================
# 5. sim/scenario/generators.py


def _build(*entries: Mapping[str, Any], seed: int = 3, horizon_h: float = 200.0) -> Any:
    return build_workload(
        list(entries), seed, GenContext(horizon_s=horizon_h * HOUR, traces_dir=None)
    )


MODEL_JOBS: dict[str, Any] = {
    "generator": "model-jobs",
    "name": "mj",
    "team": "ml",
    "count": 40,
    "submit_h": 2.0,
    "spread_h": 10.0,
    "model": "llama-3-8b",
    "task": "inference",
    "context": 2048,
    "batch": 8,
    "tokens_min": 1e6,
    "tokens_max": 1e7,
}


def test_model_jobs_carry_a_plan_request_not_a_size() -> None:
    w = _build({**MODEL_JOBS, "deadline_h": [24, 48]})
    assert [j.job_id for j in w.jobs] == [f"mj-{i}" for i in range(40)]
    assert set(w.sized) == {j.job_id for j in w.jobs}
    shape = get_shape("llama-3-8b")
    submits = [j.submit_s for j in w.jobs]
    assert submits == sorted(submits)
    for job in w.jobs:
        # no size of their own: no work duration, and the JobSpec default of one GPU until sized
        assert job.duration_s is None
        assert job.gpu_count == JobSpec("x").gpu_count
        assert job.kind is JobKind.OFFLINE  # task inference -> offline inference
        # submitted in [2 h, 12 h)
        assert 2 * HOUR <= job.submit_s < 12 * HOUR
        # deadline 24..48 h after submission
        assert job.deadline_s is not None
        assert 24 * HOUR <= job.deadline_s - job.submit_s <= 48 * HOUR
        req = w.sized[job.job_id]
        assert req.shape == shape
        assert req.task == "inference"
        assert (req.context, req.batch, req.precision) == (2048, 8, "bf16")
        assert req.tokens is not None and 1e6 <= req.tokens <= 1e7
    tokens = [w.sized[j.job_id].tokens for j in w.jobs]
    assert len(set(tokens)) == 40  # drawn per job, not one value for all


def test_model_jobs_training_kind_and_no_deadline_without_deadline_h() -> None:
    w = _build({**MODEL_JOBS, "task": "training", "tokens_min": 1e8, "tokens_max": 1e9})
    assert {j.kind for j in w.jobs} == {JobKind.TRAINING}
    assert {j.deadline_s for j in w.jobs} == {None}
    assert {w.sized[j.job_id].task for j in w.jobs} == {"training"}
    assert all(1e8 <= (w.sized[j.job_id].tokens or 0) <= 1e9 for j in w.jobs)


@pytest.mark.parametrize(
    "bad",
    [
        {"deadline_h": [24]},
        {"deadline_h": [24, 36, 48]},
        {"tokens_min": 1e7, "tokens_max": 1e6},
        {"task": "serving"},
    ],
)
def test_model_jobs_bad_parameters(bad: dict[str, Any]) -> None:
    with pytest.raises(SpecError):
        _build({**MODEL_JOBS, **bad})


def test_job_generator_gives_one_job_with_deadline_and_dataset() -> None:
    w = _build(
        {
            "generator": "job",
            "name": "far-data",
            "team": "ml",
            "gpus": 2,
            "submit_h": 2.0,
            "work_min": 30.0,
            "kind": "offline-inference",
            "deadline_h": 5.0,
            "dataset": "ds",
            "dataset_gb": 40.0,
        }
    )
    (job,) = w.jobs
    assert job.job_id == "far-data"
    assert job.submit_s == 7200.0  # 2 h
    assert job.duration_s == 1800.0  # 30 min
    assert job.deadline_s == 7200.0 + 5 * HOUR  # submit + 5 h = 25200 s
    assert (job.dataset, job.dataset_gb) == ("ds", 40.0)
    assert job.gpu_count == 2
    assert (job.cpu_milli, job.mem_mib) == (16_000, 131_072)  # 2 x default per-GPU
    assert job.kind is JobKind.OFFLINE


def test_job_generator_defaults_have_no_deadline_or_dataset() -> None:
    (job,) = _build({"generator": "job", "name": "j", "team": "ml", "work_min": 10}).jobs
    assert (job.deadline_s, job.dataset, job.dataset_gb) == (None, None, 0.0)
    assert job.kind is JobKind.TRAINING


BACKLOG: dict[str, Any] = {
    "generator": "backlog",
    "name": "bl",
    "team": "ml",
    "count": 200,
    "spread_h": 5.0,
    "gpu_choices": [1, 2],
    "gpu_weights": [1, 1],
    "work_h_min": 2.0,
    "work_h_max": 24.0,
}


def test_backlog_deadline_is_submit_plus_max_of_slack_work_and_minimum() -> None:
    w = _build({**BACKLOG, "deadline_slack": [1.5, 2.0], "min_deadline_h": 10.0})
    floor = 10 * HOUR
    at_floor = above = 0
    for job in w.jobs:
        assert job.duration_s is not None and job.deadline_s is not None
        span = job.deadline_s - job.submit_s
        if math.isclose(span, floor):
            # work x factor <= 10 h: with factor >= 1.5 the work is at most 6.67 h
            at_floor += 1
            assert job.duration_s * 1.5 <= floor + 1e-6
        else:
            above += 1
            assert span > floor
            assert 1.5 - 1e-9 <= span / job.duration_s <= 2.0 + 1e-9
    # work is log-uniform in 2..24 h: below 5 h always floored, above 6.67 h never
    assert at_floor > 20 and above > 20
    factors = [
        (j.deadline_s - j.submit_s) / j.duration_s
        for j in w.jobs
        if j.deadline_s is not None and j.duration_s and j.deadline_s - j.submit_s > floor * 1.001
    ]
    assert min(factors) < 1.6 and max(factors) > 1.9  # the factor spans the range


def test_backlog_without_deadline_slack_has_no_deadlines_and_other_draws_unchanged() -> None:
    plain = _build(BACKLOG)
    with_floor_only = _build({**BACKLOG, "min_deadline_h": 10.0})
    assert {j.deadline_s for j in plain.jobs} == {None}
    assert with_floor_only.jobs == plain.jobs
    slack = _build({**BACKLOG, "deadline_slack": [1.5, 2.0]})
    # placement parameters draw after the jobs' own: same submits, GPUs and work
    assert [(j.submit_s, j.gpu_count, j.duration_s) for j in slack.jobs] == [
        (j.submit_s, j.gpu_count, j.duration_s) for j in plain.jobs
    ]


def test_backlog_datasets_follow_their_weights_and_size_range() -> None:
    w = _build(
        {
            **BACKLOG,
            "datasets": ["d1", "d2"],
            "dataset_weights": [3, 1],
            "dataset_gb_min": 10.0,
            "dataset_gb_max": 100.0,
        }
    )
    share_d1 = sum(j.dataset == "d1" for j in w.jobs) / len(w.jobs)
    assert {j.dataset for j in w.jobs} == {"d1", "d2"}
    assert share_d1 == pytest.approx(0.75, abs=0.1)  # 3 / (3 + 1)
    assert all(10.0 <= j.dataset_gb <= 100.0 for j in w.jobs)
    only_d2 = _build({**BACKLOG, "datasets": ["d1", "d2"], "dataset_weights": [0, 1]})
    assert {j.dataset for j in only_d2.jobs} == {"d2"}
    # no sizes given: min = max = 0 GB
    assert {j.dataset_gb for j in only_d2.jobs} == {0.0}
    # no weights: uniform over the datasets, both appear
    even = _build({**BACKLOG, "datasets": ["d1", "d2"]})
    assert {j.dataset for j in even.jobs} == {"d1", "d2"}


@pytest.mark.parametrize(
    "bad",
    [
        {"deadline_slack": [1.5, 2.0, 3.0]},  # [min, max] only
        {"deadline_slack": [2.0]},
        {"deadline_slack": [0.5, 2.0]},  # a factor below 1 would be due before its work
        {"min_deadline_h": -1.0},
        {"datasets": ["d1", "d2"], "dataset_weights": [1.0]},  # one weight for two datasets
        {"datasets": ["d1", "d2"], "dataset_weights": [1.0, 1.0, 1.0]},
        {"datasets": ["d1", "d2"], "dataset_weights": [0.0, 0.0]},
        {"datasets": ["d1"], "dataset_gb_min": 50.0, "dataset_gb_max": 10.0},
        {"datasets": "d1"},
    ],
)
def test_backlog_bad_placement_parameters_raise_spec_error(bad: dict[str, Any]) -> None:
    with pytest.raises(SpecError):
        _build({**BACKLOG, **bad})


# =============================================================================================
# 6. Determinism


def test_hetero_aware_scenario_is_deterministic() -> None:
    path = REPO / "scenarios" / "hetero-aware.yaml"
    first = run_scenario(load_scenario(path))
    second = run_scenario(load_scenario(path))

    def strip(summary: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in summary.items() if k != "wall_s"}

    assert first.summary["jobs_submitted"] > 0
    assert "wall_s" in first.summary
    assert strip(first.summary) == strip(second.summary)
    log = first.log.render(first.node_names)
    assert log  # a real run decides something
    assert log == second.log.render(second.node_names)
    assert first.jobs == second.jobs

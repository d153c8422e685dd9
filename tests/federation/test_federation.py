"""Federation: topology distances, site choice rules and the cloud burst controller."""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.errors import NotFoundError, SpecError
from gpupool.federation import (
    BurstController,
    BurstEvent,
    BurstRules,
    DataLocation,
    FedJob,
    Link,
    Site,
    SiteOption,
    Topology,
    blind_choice,
    choose_site,
    parse_topology,
)

H = 3600.0
MIN = 60.0


# ---- topology -------------------------------------------------------------------------------
def two_regions(bandwidth_gbps: float = 1.0, latency_ms: float = 70.0) -> Topology:
    return Topology(
        [Site("east", "us-east"), Site("west", "us-west")],
        [DataLocation("corpus-east", "us-east")],
        [Link("us-east", "us-west", bandwidth_gbps, latency_ms)],
    )


def test_transfer_oracle_by_hand() -> None:
    # 1.35 TB = 1350 GB = 10,800 Gbit; over 1 Gbit/s that is 10,800 s = 3 h, plus 70 ms.
    topo = two_regions(bandwidth_gbps=1.0, latency_ms=70.0)
    assert topo.transfer_s("corpus-east", "west", 1350.0) == pytest.approx(3 * H + 0.070)
    # Ten times the bandwidth, a tenth of the time.
    assert two_regions(10.0, 0.0).transfer_s("corpus-east", "west", 1350.0) == pytest.approx(1080.0)


def test_transfer_is_free_inside_the_region() -> None:
    topo = two_regions()
    assert topo.transfer_s("corpus-east", "east", 1e6) == 0.0
    assert topo.is_local("corpus-east", "east")
    assert not topo.is_local("corpus-east", "west")


def test_transfer_takes_the_widest_path_not_the_shortest() -> None:
    # a–b direct: 1 Gbps, 10 ms. a–c–b: 10 Gbps each, 20 ms each.
    topo = Topology(
        [Site("sa", "a"), Site("sb", "b"), Site("sc", "c")],
        [DataLocation("d", "a")],
        [Link("a", "b", 1.0, 10.0), Link("a", "c", 10.0, 20.0), Link("c", "b", 10.0, 20.0)],
    )
    # 100 GB: direct 800.01 s; via c 80 + 0.040 s.
    assert topo.transfer_s("d", "sb", 100.0) == pytest.approx(80.040)
    # With nothing to move only latency is left, and the short path wins it.
    assert topo.transfer_s("d", "sb", 0.0) == pytest.approx(0.010)


def test_equally_wide_paths_take_the_lower_latency() -> None:
    topo = Topology(
        [Site("sa", "a"), Site("sb", "b"), Site("sc", "c"), Site("sd", "d")],
        [DataLocation("ds", "a")],
        [
            Link("a", "c", 5.0, 50.0),
            Link("c", "b", 5.0, 50.0),
            Link("a", "d", 5.0, 5.0),
            Link("d", "b", 5.0, 5.0),
        ],
    )
    assert topo.transfer_s("ds", "sb", 10.0) == pytest.approx(16.0 + 0.010)


def test_a_data_location_may_have_its_own_link() -> None:
    topo = Topology(
        [Site("east", "us-east"), Site("west", "us-west")],
        [DataLocation("bucket", "us-east")],
        [Link("us-east", "us-west", 1.0, 70.0), Link("bucket", "us-west", 100.0, 60.0)],
    )
    assert topo.transfer_s("bucket", "west", 1000.0) == pytest.approx(80.0 + 0.060)


def test_storage_does_not_route_other_traffic() -> None:
    # The only way from us-east to us-west is through another bucket's link: no path.
    topo = Topology(
        [Site("east", "us-east"), Site("west", "us-west")],
        [DataLocation("d", "us-east"), DataLocation("relay", "eu")],
        [Link("us-east", "relay", 10.0, 1.0), Link("relay", "us-west", 10.0, 1.0)],
    )
    assert math.isinf(topo.transfer_s("d", "west", 1.0))
    assert math.isinf(topo.latency_ms("us-east", "west"))


def test_no_path_is_infinite() -> None:
    topo = Topology(
        [Site("east", "us-east"), Site("island", "far")], [DataLocation("d", "us-east")], []
    )
    assert math.isinf(topo.transfer_s("d", "island", 1.0))
    assert math.isinf(topo.latency_ms("us-east", "island"))


def test_latency_intra_region_default_configurable_and_lowest_sum() -> None:
    links = [Link("a", "b", 1.0, 100.0), Link("a", "c", 1.0, 30.0), Link("c", "b", 1.0, 40.0)]
    sites = [Site("sa", "a"), Site("sb", "b"), Site("sc", "c")]
    topo = Topology(sites, [], links)
    assert topo.latency_ms("a", "sa") == 1.0
    assert topo.latency_ms("a", "sb") == pytest.approx(70.0)
    assert topo.latency_ms("b", "sa") == pytest.approx(70.0)  # symmetric
    assert Topology(sites, [], links, intra_region_latency_ms=0.2).latency_ms("c", "sc") == 0.2


def test_users_may_sit_in_a_region_without_a_site() -> None:
    topo = Topology(
        [Site("east", "us-east")], [], [Link("eu", "us-east", 1.0, 90.0)], regions=["eu"]
    )
    assert topo.latency_ms("eu", "east") == pytest.approx(90.0)
    assert topo.regions == ("eu", "us-east")


@pytest.mark.parametrize(
    ("call", "listed"),
    [
        (lambda t: t.site("north"), "east, west"),
        (lambda t: t.transfer_s("nope", "east", 1.0), "corpus-east"),
        (lambda t: t.transfer_s("corpus-east", "nope", 1.0), "east, west"),
        (lambda t: t.latency_ms("mars", "east"), "us-east, us-west"),
        (lambda t: t.latency_ms("us-east", "nope"), "east, west"),
    ],
)
def test_unknown_names_list_the_known_ones(call: Any, listed: str) -> None:
    with pytest.raises(NotFoundError, match=listed):
        call(two_regions())


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Topology([Site("x", "r"), Site("x", "q")]), r"sites\[1\]\.name: duplicate"),
        (lambda: Topology([]), "at least one site"),
        (lambda: Link("a", "b", 0.0, 1.0), "bandwidth_gbps must be > 0"),
        (lambda: Link("a", "b", -2.0, 1.0), "bandwidth_gbps must be > 0"),
        (lambda: Link("a", "b", 1.0, -1.0), "latency_ms must be >= 0"),
        (lambda: Link("a", "a", 1.0, 1.0), "two different endpoints"),
        (
            lambda: Topology([Site("x", "r")], [], [Link("r", "mars", 1.0, 1.0)]),
            r"links\[0\]\.b: unknown endpoint 'mars'",
        ),
        (
            lambda: Topology([Site("x", "r"), Site("y", "q")], [], [Link("r", "q", 1, 1)] * 2),
            r"links\[1\]: a second link",
        ),
        (
            lambda: Topology([Site("x", "r")], [DataLocation("d", "r"), DataLocation("d", "r")]),
            r"data\[1\]\.name: duplicate",
        ),
        (
            lambda: Topology([Site("x", "r")], [DataLocation("r", "r")]),
            "also a region name",
        ),
        (lambda: Site("c", "r", kind="space"), "kind must be one of onprem, cloud"),
        (lambda: Site("c", "r", max_nodes=3), "only a cloud site starts nodes"),
        (lambda: Site("c", "r", "cloud", {"H100": -1.0}), "price for H100 must be >= 0"),
    ],
)
def test_topology_validation(build: Any, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        build()


def test_site_price_falls_back_to_the_catalogue_and_is_a_copy() -> None:
    prices = {"H100": 6.98}
    cloud = Site("cloud", "us-west", "cloud", prices, spinup_s=300.0, max_nodes=8)
    prices["H100"] = 0.0
    assert cloud.price_usd("H100", 2.0) == 6.98
    assert cloud.price_usd("A100", 2.0) == 2.0
    assert cloud.is_cloud
    assert cloud == Site("cloud", "us-west", "cloud", {"H100": 6.98}, 300.0, 8)
    assert len({cloud, Site("cloud", "us-west", "cloud", {"H100": 6.98}, 300.0, 8)}) == 1


EXAMPLE = """
sites:
  - {name: east, region: us-east, kind: onprem}
  - {name: west, region: us-west, kind: onprem}
  - {name: cloud, region: us-west, kind: cloud, spinup_s: 300, max_nodes: 8,
     price_usd_per_gpu_hour: {H100: 6.98}}
data: [{name: corpus-east, region: us-east}]
links:
  - {a: us-east, b: us-west, bandwidth_gbps: 10, latency_ms: 70}
"""


def test_parse_the_documented_example() -> None:
    topo = parse_topology(yaml.safe_load(EXAMPLE), "fed.yaml")
    assert [s.name for s in topo.sites] == ["east", "west", "cloud"]
    assert topo.regions == ("us-east", "us-west")
    cloud = topo.site("cloud")
    assert (cloud.kind, cloud.spinup_s, cloud.max_nodes) == ("cloud", 300.0, 8)
    assert cloud.price_usd("H100", 1.0) == 6.98
    assert topo.site("east").kind == "onprem"
    assert topo.transfer_s("corpus-east", "cloud", 1350.0) == pytest.approx(1080.070)
    assert topo.latency_ms("us-east", "west") == 70.0


def _example_with(path: list[Any], value: Any) -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load(EXAMPLE)
    node: Any = raw
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return raw


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (["sites", 1, "region"], _DELETE, "fed.yaml: sites[1].region: missing"),
        (["sites", 0, "name"], _DELETE, "fed.yaml: sites[0].name: missing"),
        (["sites", 2, "kind"], "orbit", "fed.yaml: sites[2].kind: expected one of"),
        (["sites", 2, "spinup_s"], -5, "fed.yaml: sites[2].spinup_s: -5 is out of range"),
        (["sites", 2, "max_nodes"], 2.5, "fed.yaml: sites[2].max_nodes: expected a whole"),
        (["sites", 0, "max_nodes"], 4, "fed.yaml: sites[0]: spinup_s and max_nodes are for"),
        (["sites", 2, "price_usd_per_gpu_hour", "H100"], "cheap", "price_usd_per_gpu_hour.H100"),
        (["sites", 0, "zone"], "a", "fed.yaml: sites[0]: unknown key(s) zone"),
        (["sites", 1, "name"], "east", "fed.yaml: sites[1].name: duplicate site 'east'"),
        (["links", 0, "bandwidth_gbps"], 0, "fed.yaml: links[0].bandwidth_gbps: 0 is out of"),
        (["links", 0, "latency_ms"], _DELETE, "fed.yaml: links[0].latency_ms: missing"),
        (["links", 0, "b"], "eu-west", "fed.yaml: links[0].b: unknown endpoint 'eu-west'"),
        (["data", 0, "region"], _DELETE, "fed.yaml: data[0].region: missing"),
        (["sites"], _DELETE, "fed.yaml: sites: missing"),
        (["sites"], "east", "fed.yaml: sites: expected a list"),
        (["regions"], [3], "fed.yaml: regions[0]: expected a region name"),
        (["tunnels"], [], "fed.yaml: federation: unknown key(s) tunnels"),
    ],
)
def test_parse_errors_name_the_file_and_key(path: list[Any], value: Any, message: str) -> None:
    raw = _example_with(path, value)
    with pytest.raises(SpecError, match=re.escape(message)):
        parse_topology(raw, "fed.yaml")


def test_parse_extra_regions_and_intra_region_latency() -> None:
    raw = _example_with(["regions"], ["eu-west"])
    raw["links"].append({"a": "eu-west", "b": "us-east", "bandwidth_gbps": 5, "latency_ms": 80})
    raw["intra_region_latency_ms"] = 0.5
    topo = parse_topology(raw, "fed.yaml")
    assert topo.latency_ms("eu-west", "west") == pytest.approx(150.0)
    assert topo.latency_ms("us-west", "west") == 0.5


# ---- placement ------------------------------------------------------------------------------
def opt(
    site: str,
    wait_s: float = 0.0,
    run_s: float = 20 * MIN,
    *,
    gpu: str = "H100",
    gpus: int = 8,
    price: float = 2.0,
    free: int = 8,
) -> SiteOption:
    return SiteOption(site, gpu, run_s, gpus, price, wait_s, free)


def data_job(gb: float = 1350.0, **kw: Any) -> FedJob:
    fields: dict[str, Any] = {
        "job_id": "j1",
        "kind": "training",
        "dataset": "corpus-east",
        "dataset_gb": gb,
        "home_site": "east",
        "user_region": None,
        "latency_bound_ms": None,
    }
    fields.update(kw)
    return FedJob(**fields)


def test_three_hours_of_transfer_for_twenty_minutes_of_compute_is_refused() -> None:
    topo = two_regions(bandwidth_gbps=1.0, latency_ms=70.0)  # 1.35 TB: 3 h to move
    # Local queue 2.9 h; the remote site is idle and its GPUs are four times faster, so by
    # completion time alone (3 h + 5 min < 2.9 h + 20 min) the remote site would win.
    local = opt("east", wait_s=2.9 * H, run_s=20 * MIN)
    remote = opt("west", wait_s=0.0, run_s=5 * MIN, free=64)
    d = choose_site(data_job(), [local, remote], topo, now_s=0.0)
    assert d.option == local
    assert d.transfer_s == 0.0
    (site, why), *_ = d.rejected
    assert site == "west"
    assert "transfer 3.0 h" in why
    assert "local queueing 2.9 h" in why


def test_a_remote_site_is_taken_when_local_queueing_is_longer_than_the_transfer() -> None:
    topo = two_regions(bandwidth_gbps=1.0, latency_ms=70.0)
    local = opt("east", wait_s=5 * H)
    remote = opt("west", wait_s=10 * MIN)
    d = choose_site(data_job(), [local, remote], topo, now_s=0.0)
    assert d.option == remote
    assert d.transfer_s == pytest.approx(3 * H + 0.070)
    assert d.score_s == pytest.approx(10 * MIN + 3 * H + 0.070 + 20 * MIN)
    assert d.completion_s == pytest.approx(d.score_s)
    assert d.rejected == ()
    assert d.cost_usd == pytest.approx(8 * 2.0 * 20 / 60)


def test_remote_is_allowed_when_no_site_in_the_data_region_offers_the_job() -> None:
    topo = two_regions()
    d = choose_site(data_job(), [opt("west", wait_s=0.0)], topo, now_s=0.0)
    assert d.option is not None and d.option.site == "west"
    assert d.transfer_s == pytest.approx(3 * H + 0.070)


def test_locality_compares_with_the_best_local_queue() -> None:
    topo = two_regions()
    # Two local GPU types: the short queue (1 h) is the one a remote transfer must beat.
    local_a = opt("east", wait_s=10 * H, run_s=10 * MIN, gpu="A100")
    local_b = opt("east", wait_s=1 * H, run_s=8 * H, gpu="H100")
    remote = opt("west", wait_s=0.0)
    d = choose_site(data_job(), [local_a, local_b, remote], topo, now_s=0.0)
    assert ("west" in dict(d.rejected)) and "local queueing 1.0 h" in dict(d.rejected)["west"]


def test_no_path_to_the_dataset_is_refused_with_that_reason() -> None:
    topo = Topology(
        [Site("east", "us-east"), Site("island", "far")], [DataLocation("corpus-east", "us-east")]
    )
    d = choose_site(data_job(), [opt("island")], topo, now_s=0.0)
    assert d.option is None
    assert "no path to dataset corpus-east" in d.rejected[0][1]


def online_job(bound_ms: float | None = 50.0, kind: str = "online-inference") -> FedJob:
    return FedJob("svc", kind, None, 0.0, None, "us-east", bound_ms)


def test_online_placement_refused_when_every_site_breaks_the_latency_bound() -> None:
    topo = two_regions(latency_ms=70.0)
    d = choose_site(online_job(50.0), [opt("west", free=64)], topo, now_s=0.0)
    assert d.option is None
    assert "refused" in d.reason and "50 ms" in d.reason
    assert d.rejected == (("west", "latency 70 ms to us-east exceeds bound 50 ms"),)


def test_online_placement_goes_to_the_site_that_meets_the_bound() -> None:
    topo = two_regions(latency_ms=70.0)
    # West is idle, east has a queue: completion time alone would pick west.
    d = choose_site(online_job(50.0), [opt("west"), opt("east", wait_s=1 * H)], topo, now_s=0.0)
    assert d.option is not None and d.option.site == "east"
    assert [s for s, _ in d.rejected] == ["west"]


def test_latency_bound_applies_to_online_inference_only() -> None:
    topo = two_regions(latency_ms=70.0)
    for kind in ("batch", "training", "offline-inference"):
        d = choose_site(online_job(50.0, kind), [opt("west"), opt("east", 1 * H)], topo, 0.0)
        assert d.option is not None and d.option.site == "west", kind
    loose = choose_site(online_job(80.0), [opt("west"), opt("east", 1 * H)], topo, 0.0)
    assert loose.option is not None and loose.option.site == "west"


def test_deadline_dominates_cost() -> None:
    topo = two_regions()
    job = FedJob("j", "batch", None, 0.0, None, None, None, deadline_s=1000.0 + 2 * H)
    fast_dear = opt("east", run_s=1 * H, price=10.0)  # done at now + 1 h, $80
    slow_cheap = opt("west", run_s=3 * H, price=0.5)  # done at now + 3 h, $12
    # An hour of delay is worth $10: the cheap one scores 3 h + 1.2 h < 1 h + 8 h.
    no_deadline = dataclasses.replace(job, deadline_s=None)
    free = choose_site(no_deadline, [fast_dear, slow_cheap], topo, 1000.0, 10.0)
    assert free.option == slow_cheap
    d = choose_site(job, [fast_dear, slow_cheap], topo, now_s=1000.0, usd_per_hour_of_delay=10.0)
    assert d.option == fast_dear
    assert d.rejected[0][0] == "west" and "deadline" in d.rejected[0][1]


def test_when_no_option_meets_the_deadline_the_earliest_finish_wins() -> None:
    topo = two_regions()
    job = FedJob("j", "batch", None, 0.0, None, None, None, deadline_s=30 * MIN)
    d = choose_site(job, [opt("west", run_s=2 * H), opt("east", run_s=1 * H)], topo, 0.0)
    assert d.option is not None and d.option.site == "east"
    assert "no site meets the deadline" in d.reason
    assert d.rejected == ()


def test_cost_counts_as_delay_at_the_given_rate() -> None:
    topo = two_regions()
    job = FedJob("j", "batch", None, 0.0, None, None, None)
    fast_dear = opt("east", run_s=1 * H, price=10.0)  # $80
    slow_cheap = opt("west", run_s=2 * H, price=1.0)  # $16
    assert choose_site(job, [fast_dear, slow_cheap], topo, 0.0).option == fast_dear
    d = choose_site(job, [fast_dear, slow_cheap], topo, 0.0, usd_per_hour_of_delay=32.0)
    assert d.option == slow_cheap
    assert d.score_s == pytest.approx(2 * H + 0.5 * H)
    rich = choose_site(job, [fast_dear, slow_cheap], topo, 0.0, usd_per_hour_of_delay=1000.0)
    assert rich.option == fast_dear
    with pytest.raises(SpecError):
        choose_site(job, [fast_dear], topo, 0.0, usd_per_hour_of_delay=-1.0)


def test_ties_go_to_cost_then_home_site_then_name() -> None:
    topo = Topology([Site("a", "r"), Site("b", "r"), Site("c", "r")])
    job = FedJob("j", "batch", None, 0.0, "c", None, None)
    cheap = opt("b", price=1.0)
    assert choose_site(job, [opt("a"), cheap, opt("c")], topo, 0.0).option == cheap
    assert choose_site(job, [opt("a"), opt("b"), opt("c")], topo, 0.0).option == opt("c")
    homeless = FedJob("j", "batch", None, 0.0, None, None, None)
    assert choose_site(homeless, [opt("c"), opt("b"), opt("a")], topo, 0.0).option == opt("a")


def test_choice_does_not_depend_on_option_order() -> None:
    topo = Topology(
        [Site("e1", "us-east"), Site("e2", "us-east"), Site("w", "us-west")],
        [DataLocation("corpus-east", "us-east")],
        [Link("us-east", "us-west", 10.0, 70.0)],
    )
    options = [
        opt("e1", wait_s=2 * H),
        opt("e2", wait_s=2 * H, gpu="H100"),
        opt("e2", wait_s=2 * H, gpu="A100"),
        opt("w", wait_s=2 * H - 1000.0),  # transfer 1080 s: 80 s later than the local ones
        opt("w", wait_s=0.0, run_s=3 * H, gpu="A100"),
        opt("w", wait_s=0.0, run_s=10 * MIN, gpu="B200"),  # 18 min transfer + 10 min: best
    ]
    job = data_job(home_site="e2")
    decisions = {
        (d.option, d.transfer_s, d.score_s, d.reason, d.rejected)
        for perm in itertools.permutations(options)
        for d in [choose_site(job, perm, topo, now_s=0.0)]
    }
    assert len(decisions) == 1
    ((chosen, *_),) = decisions
    assert chosen == opt("w", wait_s=0.0, run_s=10 * MIN, gpu="B200")
    without_fast = [o for o in options if o.gpu_type != "B200"]
    tied = {
        (d.option, d.reason)
        for perm in itertools.permutations(without_fast)
        for d in [choose_site(job, perm, topo, now_s=0.0)]
    }
    # e1, e2/A100 and e2/H100 tie on time and cost: the home site, then the GPU type name.
    ((home, _),) = tied
    assert home == opt("e2", wait_s=2 * H, gpu="A100")


def test_empty_options_and_unknown_sites() -> None:
    topo = two_regions()
    d = choose_site(data_job(), [], topo, 0.0)
    assert d.option is None and "no site offers" in d.reason and math.isinf(d.score_s)
    with pytest.raises(NotFoundError, match="east, west"):
        choose_site(data_job(), [opt("mars")], topo, 0.0)
    with pytest.raises(NotFoundError):
        choose_site(FedJob("j", "batch", None, 0.0, None, None, None), [opt("mars")], topo, 0.0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kind": "serving"}, "kind must be one of"),
        ({"dataset_gb": -1.0}, "dataset_gb"),
        ({"latency_bound_ms": 10.0}, "needs user_region"),
        ({"latency_bound_ms": -1.0, "user_region": "us-east"}, "latency_bound_ms"),
    ],
)
def test_fedjob_validation(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        data_job(**fields)


def test_siteoption_validation() -> None:
    with pytest.raises(SpecError, match="est_wait_s"):
        opt("east", wait_s=-1.0)
    with pytest.raises(SpecError, match="GPU counts"):
        opt("east", free=-1)


def test_blind_choice_ignores_locality_but_reports_the_transfer() -> None:
    topo = two_regions(bandwidth_gbps=1.0, latency_ms=70.0)
    local = opt("east", wait_s=0.0, free=8)
    remote = opt("west", wait_s=0.0, free=16)
    smart = choose_site(data_job(), [local, remote], topo, 0.0)
    assert smart.option == local
    d = blind_choice(data_job(), [local, remote], topo)
    assert d.option == remote
    assert d.transfer_s == pytest.approx(3 * H + 0.070)
    assert d.score_s == pytest.approx(3 * H + 0.070 + 20 * MIN)
    assert "most free GPUs (16)" in d.reason
    # Latency bounds do not bind it either.
    assert blind_choice(online_job(50.0), [local, remote], topo).option == remote
    # Ties by name.
    assert blind_choice(data_job(), [opt("west"), opt("east")], topo).option == opt("east")


def test_blind_choice_skips_only_unreachable_sites() -> None:
    topo = Topology(
        [Site("east", "us-east"), Site("island", "far")], [DataLocation("corpus-east", "us-east")]
    )
    d = blind_choice(data_job(), [opt("island", free=99), opt("east", free=1)], topo)
    assert d.option == opt("east", free=1)
    assert d.rejected == (("island", "no path to dataset corpus-east"),)
    assert blind_choice(data_job(), [], topo).option is None


# ---- burst and reclaim ----------------------------------------------------------------------
def quiet(t: float, **kw: Any) -> dict[str, Any]:
    obs: dict[str, Any] = {
        "now_s": t,
        "onprem_util": 0.5,
        "pending_gpus": 0,
        "cloud_nodes_up": 0,
        "cloud_nodes_starting": 0,
        "cloud_util": 0.0,
        "idle_cloud_nodes": 0,
    }
    obs.update(kw)
    return obs


def test_burst_fires_after_fifteen_minutes_over_ninety_percent_not_fourteen() -> None:
    c = BurstController(BurstRules(max_cloud_nodes=4))
    for minute in range(15):
        assert c.observe(**quiet(minute * MIN, onprem_util=0.93)) == [], minute
    (event,) = c.observe(**quiet(15 * MIN, onprem_util=0.93))
    assert (event.t_s, event.action, event.nodes) == (15 * MIN, "burst", 1)
    assert event.reason == "on-prem utilisation 93% > 90% for 15 min"
    assert c.events == (event,)


def test_a_dip_restarts_the_burst_window() -> None:
    c = BurstController(BurstRules(max_cloud_nodes=4))
    for minute in range(30):
        util = 0.85 if minute == 10 else 0.95
        events = c.observe(**quiet(minute * MIN, onprem_util=util))
        assert events == [] or minute == 26, minute
    assert [e.t_s for e in c.events] == [26 * MIN]


def test_exactly_at_the_threshold_is_not_over_it() -> None:
    c = BurstController(BurstRules(max_cloud_nodes=4))
    for minute in range(40):
        assert c.observe(**quiet(minute * MIN, onprem_util=0.9)) == []


def test_pending_work_that_fits_nowhere_on_prem_bursts_after_five_minutes() -> None:
    c = BurstController(BurstRules(max_cloud_nodes=4, nodes_per_burst=3))
    for minute in range(5):
        assert c.observe(**quiet(minute * MIN, pending_gpus=24)) == []
    (event,) = c.observe(**quiet(5 * MIN, pending_gpus=24))
    assert (event.action, event.nodes) == ("burst", 3)
    assert event.reason == "24 GPUs pending that no on-prem node can take for 5 min"


def test_reclaim_after_fifteen_minutes_under_thirty_percent_idle_nodes_only() -> None:
    c = BurstController(BurstRules(max_cloud_nodes=8))
    cold = {"cloud_nodes_up": 5, "cloud_util": 0.12, "idle_cloud_nodes": 2}
    for minute in range(15):
        assert c.observe(**quiet(minute * MIN, **cold)) == []
    (event,) = c.observe(**quiet(15 * MIN, **cold))
    assert (event.action, event.nodes) == ("reclaim", 2)
    assert event.reason.startswith("cloud utilisation 12% < 30% for 15 min")


def test_no_reclaim_without_idle_nodes() -> None:
    c = BurstController(BurstRules(max_cloud_nodes=8))
    for minute in range(60):
        obs = quiet(minute * MIN, cloud_nodes_up=2, cloud_util=0.2, idle_cloud_nodes=0)
        assert c.observe(**obs) == []


class FakeCloud:
    """Carries out the controller's events: nodes start, come up after spin-up, stop."""

    def __init__(self, spinup_s: float) -> None:
        self.spinup_s = spinup_s
        self.up = 0
        self.ready_at: list[float] = []

    def tick(self, now_s: float) -> None:
        ready = [t for t in self.ready_at if t <= now_s]
        self.up += len(ready)
        self.ready_at = [t for t in self.ready_at if t > now_s]

    def apply(self, events: list[BurstEvent], idle: int) -> None:
        for e in events:
            if e.action == "burst":
                self.ready_at += [e.t_s + self.spinup_s] * e.nodes
            else:
                assert e.nodes <= idle
                self.up -= e.nodes


def drive(c: BurstController, cloud: FakeCloud, minutes: range, **kw: Any) -> list[BurstEvent]:
    out = []
    for minute in minutes:
        t = minute * MIN
        cloud.tick(t)
        obs = quiet(t, cloud_nodes_up=cloud.up, cloud_nodes_starting=len(cloud.ready_at))
        obs.update(kw)
        events = c.observe(**obs)
        cloud.apply(events, obs["idle_cloud_nodes"])
        out += events
    return out


def test_hysteresis_waits_for_spin_up_plus_one_window() -> None:
    c = BurstController(BurstRules(max_cloud_nodes=8))
    cloud = FakeCloud(spinup_s=5 * MIN)
    events = drive(c, cloud, range(60), onprem_util=0.95, cloud_util=0.9)
    # 15 min hot: burst. Up at 20 min. Hot for 15 more: 35 min. Up at 40, again at 55.
    assert [e.t_s / MIN for e in events] == [15, 35, 55]
    assert all(e.action == "burst" for e in events)


def test_never_more_than_max_cloud_nodes() -> None:
    c = BurstController(BurstRules(max_cloud_nodes=6, nodes_per_burst=4))
    cloud = FakeCloud(spinup_s=MIN)
    events = drive(c, cloud, range(200), onprem_util=1.0, cloud_util=1.0)
    assert [e.nodes for e in events] == [4, 2]
    assert "capped at 6 cloud nodes" in events[1].reason
    assert cloud.up == 6


def test_max_zero_never_bursts_and_idle_cloud_blocks_bursts() -> None:
    c = BurstController(BurstRules())
    assert drive(c, FakeCloud(0.0), range(100), onprem_util=1.0, pending_gpus=8) == []
    c = BurstController(BurstRules(max_cloud_nodes=8, reclaim_util=0.0))
    obs = {"cloud_nodes_up": 2, "idle_cloud_nodes": 1, "cloud_util": 0.5}
    for minute in range(100):
        assert c.observe(**quiet(minute * MIN, onprem_util=1.0, **obs)) == []


def test_never_reclaims_during_a_bursts_spin_up() -> None:
    c = BurstController(BurstRules(max_cloud_nodes=8, pending_sustain_s=0.0))
    # Pending work bursts at once; one old cloud node sits idle while the new one starts.
    (burst,) = c.observe(**quiet(0.0, pending_gpus=8, cloud_nodes_up=1, cloud_util=0.9))
    assert burst.action == "burst"
    for minute in range(1, 40):
        obs = quiet(
            minute * MIN,
            cloud_nodes_up=1,
            cloud_nodes_starting=1,
            cloud_util=0.0,
            idle_cloud_nodes=1,
        )
        assert c.observe(**obs) == [], minute
    # Once the node is up the reclaim window starts afresh.
    up = {"cloud_nodes_up": 2, "cloud_util": 0.0, "idle_cloud_nodes": 2}
    assert [c.observe(**quiet(t * MIN, **up)) for t in range(40, 55)] == [[]] * 15
    (reclaim,) = c.observe(**quiet(55 * MIN, **up))
    assert (reclaim.action, reclaim.nodes) == ("reclaim", 2)


def test_observations_are_checked() -> None:
    c = BurstController(BurstRules(max_cloud_nodes=1))
    c.observe(**quiet(100.0))
    with pytest.raises(SpecError, match="before the last one"):
        c.observe(**quiet(50.0))
    with pytest.raises(SpecError, match="idle cloud nodes"):
        c.observe(**quiet(200.0, cloud_nodes_up=1, idle_cloud_nodes=2))
    with pytest.raises(SpecError, match="onprem_util"):
        c.observe(**quiet(200.0, onprem_util=1.5))
    with pytest.raises(SpecError, match="nodes_per_burst"):
        BurstRules(nodes_per_burst=0)
    with pytest.raises(SpecError, match="util_threshold"):
        BurstRules(util_threshold=90.0)


@settings(max_examples=150, deadline=None)
@given(
    rules=st.builds(
        BurstRules,
        util_threshold=st.sampled_from([0.5, 0.9]),
        sustain_s=st.sampled_from([0.0, 60.0, 900.0]),
        pending_gpu_threshold=st.integers(1, 16),
        pending_sustain_s=st.sampled_from([0.0, 300.0]),
        reclaim_util=st.sampled_from([0.3, 0.8]),
        reclaim_sustain_s=st.sampled_from([0.0, 120.0, 900.0]),
        nodes_per_burst=st.integers(1, 5),
        max_cloud_nodes=st.integers(0, 9),
    ),
    spinup_s=st.sampled_from([0.0, 60.0, 300.0]),
    steps=st.lists(
        st.tuples(
            st.sampled_from([0.0, 30.0, 60.0, 600.0]),
            st.floats(0.0, 1.0),
            st.integers(0, 32),
            st.floats(0.0, 1.0),
            st.floats(0.0, 1.0),
        ),
        max_size=80,
    ),
)
def test_controller_never_exceeds_max_nodes_nor_reclaims_busy_nodes(
    rules: BurstRules, spinup_s: float, steps: list[tuple[float, float, int, float, float]]
) -> None:
    c = BurstController(rules)
    cloud = FakeCloud(spinup_s)
    t = 0.0
    returned: list[BurstEvent] = []
    for dt, onprem, pending, cloud_util, idle_share in steps:
        t += dt
        cloud.tick(t)
        idle = int(cloud.up * idle_share)
        starting = len(cloud.ready_at)
        events = c.observe(t, onprem, pending, cloud.up, starting, cloud_util, idle)
        assert len(events) <= 1
        for e in events:
            assert e.reason and e.nodes > 0 and e.t_s == t
            if e.action == "reclaim":
                assert e.nodes <= idle
                assert starting == 0
            else:
                assert e.action == "burst"
        cloud.apply(events, idle)
        assert cloud.up + len(cloud.ready_at) <= rules.max_cloud_nodes
        returned += events
    assert c.events == tuple(returned)

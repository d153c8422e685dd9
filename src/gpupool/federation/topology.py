"""Sites, regions, datasets and the links between them: where a byte or a request can go.

A federation is several clusters (sites) in named regions, plus clouds that can start
nodes on demand. Datasets live at data locations, each in a region. Links join regions
(or a data location directly to a region) and are symmetric. The topology answers two
questions the placement rules need: how long moving a dataset to a site takes, and how
far (in milliseconds) a site is from a user's region.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpupool.errors import NotFoundError, SpecError
from gpupool.specfile import SpecReader

SITE_KINDS = ("onprem", "cloud")
DEFAULT_INTRA_REGION_LATENCY_MS = 1.0
"""Inside one region a request still crosses a few switches; not free, but close."""


@dataclass(frozen=True)
class Site:
    """One cluster. A cloud site starts up to `max_nodes` nodes, each after `spinup_s`."""

    name: str
    region: str
    kind: str = "onprem"
    price_usd_per_gpu_hour: Mapping[str, float] = field(default_factory=dict, hash=False)
    """Per GPU type; a type missing here costs the catalogue price."""
    spinup_s: float = 0.0
    max_nodes: int = 0

    def __post_init__(self) -> None:
        if not self.name or not self.region:
            raise SpecError(f"site {self.name!r}: name and region must not be empty")
        if self.kind not in SITE_KINDS:
            raise SpecError(
                f"site {self.name!r}: kind must be one of {', '.join(SITE_KINDS)}, "
                f"got {self.kind!r}"
            )
        if self.spinup_s < 0 or self.max_nodes < 0:
            raise SpecError(f"site {self.name!r}: spinup_s and max_nodes must be >= 0")
        if self.kind == "onprem" and (self.max_nodes or self.spinup_s):
            raise SpecError(
                f"site {self.name!r}: only a cloud site starts nodes "
                "(spinup_s and max_nodes are for kind: cloud)"
            )
        for gpu_type, price in self.price_usd_per_gpu_hour.items():
            if not price >= 0:
                raise SpecError(
                    f"site {self.name!r}: price for {gpu_type} must be >= 0, got {price}"
                )
        # A read-only copy: the caller's dict may change, the site must not.
        object.__setattr__(
            self, "price_usd_per_gpu_hour", MappingProxyType(dict(self.price_usd_per_gpu_hour))
        )

    @property
    def is_cloud(self) -> bool:
        return self.kind == "cloud"

    def price_usd(self, gpu_type: str, catalogue_usd_per_gpu_hour: float) -> float:
        """This site's price for one GPU-hour of `gpu_type`, else the catalogue's."""
        return self.price_usd_per_gpu_hour.get(gpu_type, catalogue_usd_per_gpu_hour)


@dataclass(frozen=True)
class Link:
    """A symmetric network link between two regions, or a data location and a region."""

    a: str
    b: str
    bandwidth_gbps: float
    latency_ms: float

    def __post_init__(self) -> None:
        if self.a == self.b:
            raise SpecError(f"link {self.a}–{self.b}: a link needs two different endpoints")
        if not (self.bandwidth_gbps > 0 and math.isfinite(self.bandwidth_gbps)):
            raise SpecError(
                f"link {self.a}–{self.b}: bandwidth_gbps must be > 0, got {self.bandwidth_gbps}"
            )
        if not (self.latency_ms >= 0 and math.isfinite(self.latency_ms)):
            raise SpecError(
                f"link {self.a}–{self.b}: latency_ms must be >= 0, got {self.latency_ms}"
            )


@dataclass(frozen=True)
class DataLocation:
    """Where a dataset is stored: jobs reading it elsewhere pay the transfer."""

    name: str
    region: str

    def __post_init__(self) -> None:
        if not self.name or not self.region:
            raise SpecError(f"data location {self.name!r}: name and region must not be empty")


@dataclass(frozen=True)
class _Edge:
    to: str
    bandwidth_gbps: float
    latency_ms: float


def _known(kind: str, name: str, names: Iterable[str]) -> NotFoundError:
    return NotFoundError(f"unknown {kind} {name!r}; known: {', '.join(sorted(names)) or 'none'}")


class Topology:
    """The federation's map: sites, regions, data locations and links.

    Regions are those of the sites and data locations plus any listed in `regions` (a
    region with users but no cluster, or a transit hop). Answers are memoised: the map
    never changes after construction.
    """

    def __init__(
        self,
        sites: Iterable[Site],
        data: Iterable[DataLocation] = (),
        links: Iterable[Link] = (),
        *,
        regions: Iterable[str] = (),
        intra_region_latency_ms: float = DEFAULT_INTRA_REGION_LATENCY_MS,
    ) -> None:
        self._sites: dict[str, Site] = {}
        for k, s in enumerate(sites):
            if s.name in self._sites:
                raise SpecError(f"sites[{k}].name: duplicate site {s.name!r}")
            self._sites[s.name] = s
        if not self._sites:
            raise SpecError("sites: a federation needs at least one site")
        self._data: dict[str, DataLocation] = {}
        for k, d in enumerate(data):
            if d.name in self._data:
                raise SpecError(f"data[{k}].name: duplicate data location {d.name!r}")
            self._data[d.name] = d
        region_set = {s.region for s in self._sites.values()}
        region_set |= {d.region for d in self._data.values()}
        region_set |= set(regions)
        self._regions = tuple(sorted(region_set))
        for k, d in enumerate(self._data.values()):
            if d.name in region_set:
                raise SpecError(
                    f"data[{k}].name: {d.name!r} is also a region name; "
                    "a link endpoint must mean one thing"
                )
        if not (intra_region_latency_ms >= 0 and math.isfinite(intra_region_latency_ms)):
            raise SpecError(f"intra_region_latency_ms must be >= 0, got {intra_region_latency_ms}")
        self.intra_region_latency_ms = float(intra_region_latency_ms)
        self._links: tuple[Link, ...] = tuple(links)
        self._adj: dict[str, list[_Edge]] = {n: [] for n in (*self._regions, *self._data)}
        seen: set[frozenset[str]] = set()
        for k, link in enumerate(self._links):
            for end, name in (("a", link.a), ("b", link.b)):
                if name not in self._adj:
                    raise SpecError(
                        f"links[{k}].{end}: unknown endpoint {name!r}; known regions: "
                        f"{', '.join(self._regions)}; data locations: "
                        f"{', '.join(sorted(self._data)) or 'none'}"
                    )
            pair = frozenset((link.a, link.b))
            if pair in seen:
                raise SpecError(f"links[{k}]: a second link between {link.a} and {link.b}")
            seen.add(pair)
            self._adj[link.a].append(_Edge(link.b, link.bandwidth_gbps, link.latency_ms))
            self._adj[link.b].append(_Edge(link.a, link.bandwidth_gbps, link.latency_ms))
        self._routes: dict[tuple[str, str], tuple[tuple[float, float], ...]] = {}
        self._region_latency: dict[tuple[str, str], float] = {}

    # ---- lookups ----------------------------------------------------------------------------
    @property
    def sites(self) -> tuple[Site, ...]:
        return tuple(self._sites.values())

    @property
    def regions(self) -> tuple[str, ...]:
        return self._regions

    @property
    def data(self) -> tuple[DataLocation, ...]:
        return tuple(self._data.values())

    @property
    def links(self) -> tuple[Link, ...]:
        return self._links

    def site(self, name: str) -> Site:
        try:
            return self._sites[name]
        except KeyError:
            raise _known("site", name, self._sites) from None

    def data_location(self, name: str) -> DataLocation:
        try:
            return self._data[name]
        except KeyError:
            raise _known("data location", name, self._data) from None

    def _region(self, name: str) -> str:
        if name not in self._regions:
            raise _known("region", name, self._regions)
        return name

    def is_local(self, dataset: str, site: str) -> bool:
        """Whether the dataset is stored in the site's region (reading it costs nothing)."""
        return self.data_location(dataset).region == self.site(site).region

    # ---- distances --------------------------------------------------------------------------
    def transfer_s(self, dataset: str, site: str, size_gb: float) -> float:
        """Seconds to move `size_gb` of `dataset` to `site`: 0 inside one region.

        Elsewhere: size_gb × 8 / bottleneck bandwidth + the path's latency, over the path
        that minimises that sum. For any dataset of real size this is the widest-bottleneck
        path (lowest latency among equally wide ones); for a tiny one a narrower but much
        shorter path may win, which is what moving it would really cost. No path: inf.
        """
        if not (size_gb >= 0 and math.isfinite(size_gb)):
            raise SpecError(f"dataset {dataset!r}: size_gb must be >= 0, got {size_gb}")
        loc = self.data_location(dataset)
        target = self.site(site).region
        if loc.region == target:
            return 0.0
        best = math.inf
        for bottleneck_gbps, latency_ms in self._route_options(loc.name, target):
            best = min(best, size_gb * 8.0 / bottleneck_gbps + latency_ms / 1000.0)
        return best

    def latency_ms(self, region: str, site: str) -> float:
        """Round-trip-free one-way latency from users in `region` to `site`, in ms.

        Inside the site's region: `intra_region_latency_ms`. Elsewhere: the lowest sum of
        link latencies over region-to-region links (data locations carry no requests).
        No path: inf.
        """
        self._region(region)
        target = self.site(site).region
        if region == target:
            return self.intra_region_latency_ms
        key = (region, target) if region < target else (target, region)
        if key not in self._region_latency:
            self._region_latency[key] = self._min_latency(region, target, 0.0, via_data=None)
        return self._region_latency[key]

    def _neighbours(self, node: str, via_data: str | None) -> Iterable[_Edge]:
        """Edges out of `node` that a path may take: through regions only, except that a
        transfer starts at its own data location (storage does not route others' traffic)."""
        for e in self._adj[node]:
            if e.to in self._data and e.to != via_data:
                continue
            yield e
        if node == via_data:
            yield _Edge(self._data[node].region, math.inf, 0.0)

    def _min_latency(
        self, source: str, target: str, min_bandwidth_gbps: float, via_data: str | None
    ) -> float:
        """Dijkstra on latency over edges at least `min_bandwidth_gbps` wide."""
        dist: dict[str, float] = {source: 0.0}
        heap: list[tuple[float, str]] = [(0.0, source)]
        while heap:
            d, node = heapq.heappop(heap)
            if node == target:
                return d
            if d > dist.get(node, math.inf):
                continue
            for e in self._neighbours(node, via_data):
                if e.bandwidth_gbps < min_bandwidth_gbps:
                    continue
                nd = d + e.latency_ms
                if nd < dist.get(e.to, math.inf):
                    dist[e.to] = nd
                    heapq.heappush(heap, (nd, e.to))
        return math.inf

    def _route_options(self, dataset: str, target: str) -> tuple[tuple[float, float], ...]:
        """(bottleneck Gbps, latency ms) pairs, one per distinct link bandwidth: the
        lowest-latency path using only links at least that wide. The best transfer for any
        size is among them, so sizes differ only in the arithmetic."""
        key = (dataset, target)
        if key not in self._routes:
            widths = sorted({link.bandwidth_gbps for link in self._links}, reverse=True)
            options = []
            for w in widths:
                lat = self._min_latency(dataset, target, w, via_data=dataset)
                if math.isfinite(lat):
                    options.append((w, lat))
            self._routes[key] = tuple(options)
        return self._routes[key]

    def __repr__(self) -> str:
        return (
            f"Topology(sites={list(self._sites)}, regions={list(self._regions)}, "
            f"data={list(self._data)}, links={len(self._links)})"
        )


# ---- YAML -----------------------------------------------------------------------------------
TOPOLOGY_KEYS = frozenset({"sites", "data", "links", "regions", "intra_region_latency_ms"})
"""The keys a federation section may have (a caller pre-checking the YAML uses these)."""
SITE_KEYS = frozenset({"name", "region", "kind", "price_usd_per_gpu_hour", "spinup_s", "max_nodes"})
DATA_KEYS = frozenset({"name", "region"})
LINK_KEYS = frozenset({"a", "b", "bandwidth_gbps", "latency_ms"})


class _Reader(SpecReader):
    """Reads one topology section; every complaint names the file and the key."""

    def items(self, value: Any, where: str) -> Sequence[Any]:
        if value is None:
            return ()
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise self.fail(where, "expected a list")
        return value

    def name(self, m: Mapping[str, Any], key: str, where: str) -> str:
        if key not in m or m[key] is None:
            raise self.fail(f"{where}.{key}", "missing")
        value = m[key]
        if not isinstance(value, str) or not value:
            raise self.fail(f"{where}.{key}", f"expected a non-empty name, got {value!r}")
        return value

    def number(self, value: Any, where: str, positive: bool = False) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(where, f"expected a number, got {value!r}")
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            raise self.fail(
                where, f"{value} is out of range (must be {'>' if positive else '>='} 0)"
            )
        return float(value)

    def integer(self, value: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, f"expected a whole number, got {value!r}")
        if value < 0:
            raise self.fail(where, f"{value} must be >= 0")
        return value


def parse_topology(raw: Mapping[str, Any], path: str = "<topology>") -> Topology:
    """Build a Topology from its YAML section (schema in docs/federation.md).

    Every problem is a SpecError of the form "FILE: sites[1].region: missing".
    """
    r = _Reader(path)
    top = r.mapping(raw, "federation", TOPOLOGY_KEYS)
    if "sites" not in top:
        raise r.fail("sites", "missing (a federation needs at least one site)")
    sites = []
    for k, item in enumerate(r.items(top["sites"], "sites")):
        where = f"sites[{k}]"
        m = r.mapping(item, where, SITE_KEYS)
        name = r.name(m, "name", where)
        region = r.name(m, "region", where)
        kind = m.get("kind", "onprem")
        if kind not in SITE_KINDS:
            raise r.fail(f"{where}.kind", f"expected one of {', '.join(SITE_KINDS)}, got {kind!r}")
        prices_raw = m.get("price_usd_per_gpu_hour") or {}
        if not isinstance(prices_raw, Mapping):
            raise r.fail(f"{where}.price_usd_per_gpu_hour", "expected {GPU type: USD per hour}")
        prices = {
            str(g): r.number(p, f"{where}.price_usd_per_gpu_hour.{g}")
            for g, p in prices_raw.items()
        }
        spinup_s = r.number(m.get("spinup_s", 0.0), f"{where}.spinup_s")
        max_nodes = r.integer(m.get("max_nodes", 0), f"{where}.max_nodes")
        if kind == "onprem" and (spinup_s or max_nodes):
            raise r.fail(where, "spinup_s and max_nodes are for kind: cloud only")
        sites.append(Site(name, region, kind, prices, spinup_s, max_nodes))
    data = []
    for k, item in enumerate(r.items(top.get("data"), "data")):
        m = r.mapping(item, f"data[{k}]", DATA_KEYS)
        data.append(
            DataLocation(r.name(m, "name", f"data[{k}]"), r.name(m, "region", f"data[{k}]"))
        )
    links = []
    for k, item in enumerate(r.items(top.get("links"), "links")):
        where = f"links[{k}]"
        m = r.mapping(item, where, LINK_KEYS)
        for key in ("bandwidth_gbps", "latency_ms"):
            if key not in m:
                raise r.fail(f"{where}.{key}", "missing")
        a = r.name(m, "a", where)
        b = r.name(m, "b", where)
        if a == b:
            raise r.fail(where, f"both ends are {a!r}; a link joins two different places")
        links.append(
            Link(
                a,
                b,
                r.number(m["bandwidth_gbps"], f"{where}.bandwidth_gbps", positive=True),
                r.number(m["latency_ms"], f"{where}.latency_ms"),
            )
        )
    regions = []
    for k, value in enumerate(r.items(top.get("regions"), "regions")):
        if not isinstance(value, str) or not value:
            raise r.fail(f"regions[{k}]", f"expected a region name, got {value!r}")
        regions.append(value)
    intra = r.number(
        top.get("intra_region_latency_ms", DEFAULT_INTRA_REGION_LATENCY_MS),
        "intra_region_latency_ms",
    )
    try:
        return Topology(sites, data, links, regions=regions, intra_region_latency_ms=intra)
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None

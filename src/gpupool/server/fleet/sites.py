"""Live multi-cluster: which site each node is in, and the cloud nodes' commands.

One YAML file describes the federation the service runs over. Its `federation:` section
is the scenario files' topology (sites with region, kind and prices; data locations;
links), so the core places live jobs by the same rules as in a simulated scenario
(`policies.pool_choice.choose_across_sites`). Nodes name their site there (`nodes:`) or
declare it themselves (a Ray node's `gpupool_site_<site>` resource). Cloud nodes are
declared up front and stay out of the pool until their start command has made them join;
the core decides when to start and stop them (Burst, Reclaim) and CloudNodes runs the
commands; every decision is written to the event log with its reason.
"""

from __future__ import annotations

import math
import shlex
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpupool.errors import SpecError
from gpupool.federation.burst import BurstRules
from gpupool.federation.topology import TOPOLOGY_KEYS, Topology, parse_topology
from gpupool.ports.cloud.base import CloudNode, CommandRunner
from gpupool.sizing.catalog import load_catalog
from gpupool.specfile import SpecReader

SITES_KEYS = frozenset(
    {"federation", "nodes", "placement", "value_of_time_usd_per_h", "burst", "cloud"}
)
BURST_KEYS = frozenset(
    {
        "util_threshold",
        "sustain_s",
        "pending_gpus",
        "pending_sustain_s",
        "reclaim_util",
        "reclaim_sustain_s",
        "nodes_per_burst",
        "check_s",
        "join_timeout_s",
    }
)
CLOUD_KEYS = frozenset({"start", "stop", "nodes"})
CLOUD_NODE_KEYS = frozenset({"name", "site", "model", "gpus"})
PLACEMENTS = ("locality-aware", "blind")


@dataclass(frozen=True)
class SitesConfig:
    topology: Topology
    node_site: Mapping[str, str] = field(default_factory=dict)
    placement: str = "locality-aware"
    value_of_time_usd_per_h: float = 0.0
    burst: BurstRules = field(default_factory=BurstRules)
    cloud_nodes: tuple[CloudNode, ...] = ()
    start_command: tuple[str, ...] = ()
    """argv template; {node} {site} {model} {gpus} {state_dir} are filled in."""
    stop_command: tuple[str, ...] = ()
    check_s: float = 5.0
    """How often the start and stop commands' exits and the join timeouts are checked."""
    join_timeout_s: float = 600.0
    """A started cloud node that has not joined by then is given up (and stopped)."""

    def site_of(self, node: str, declared: str | None = None) -> str | None:
        for c in self.cloud_nodes:
            if c.name == node:
                return c.site
        return self.node_site.get(node, declared)


def with_cloud_nodes(
    fleet: Sequence[tuple[str, str, int]], sites: SitesConfig | None
) -> list[tuple[str, str, int]]:
    """The fleet and, after it, the cloud nodes it does not list yet (down until started)."""
    out = list(fleet)
    if sites is not None:
        listed = {name for name, _, _ in out}
        out += [(c.name, c.model, c.gpus) for c in sites.cloud_nodes if c.name not in listed]
    return out


def read_sites(raw: Any, path: str = "<sites>") -> SitesConfig:
    r = SpecReader(path)
    top = r.mapping(raw, "sites file", SITES_KEYS)
    if "federation" not in top:
        raise r.fail("federation", "missing (the sites, data locations and links)")
    fed = r.mapping(top["federation"], "federation", TOPOLOGY_KEYS)
    topology = parse_topology(fed, path)
    sites = {s.name: s for s in topology.sites}

    def site(name: Any, where: str) -> str:
        if not isinstance(name, str) or name not in sites:
            raise r.fail(where, f"unknown site {name!r}; the federation has {', '.join(sites)}")
        return name

    nodes_raw = top.get("nodes") or {}
    if not isinstance(nodes_raw, Mapping):
        raise r.fail("nodes", "expected {node name: site}")
    node_site = {str(n): site(s, f"nodes.{n}") for n, s in nodes_raw.items()}
    placement = top.get("placement", "locality-aware")
    if placement not in PLACEMENTS:
        raise r.fail("placement", f"expected one of {', '.join(PLACEMENTS)}, got {placement!r}")
    vot = _number(r, top.get("value_of_time_usd_per_h", 0.0), "value_of_time_usd_per_h")
    b = r.mapping(top.get("burst") or {}, "burst", BURST_KEYS)
    d = BurstRules()
    cloud = r.mapping(top.get("cloud") or {}, "cloud", CLOUD_KEYS)
    cloud_nodes = []
    for k, item in enumerate(cloud.get("nodes") or []):
        where = f"cloud.nodes[{k}]"
        m = r.mapping(item, where, CLOUD_NODE_KEYS)
        for key in CLOUD_NODE_KEYS:
            if key not in m:
                raise r.fail(f"{where}.{key}", "missing")
        s = site(m["site"], f"{where}.site")
        if not sites[s].is_cloud:
            raise r.fail(f"{where}.site", f"{s} is not a cloud site (kind: cloud)")
        gpus = m["gpus"]
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise r.fail(f"{where}.gpus", f"expected a whole number >= 1, got {gpus!r}")
        cloud_nodes.append(CloudNode(str(m["name"]), s, str(m["model"]), gpus))
    names = [c.name for c in cloud_nodes]
    if len(set(names)) != len(names):
        raise r.fail("cloud.nodes", "a node name is listed twice")
    clash = set(names) & set(node_site)
    if clash:
        raise r.fail("cloud.nodes", f"{sorted(clash)} also listed under nodes:")
    start = _argv(r, cloud.get("start"), "cloud.start")
    stop = _argv(r, cloud.get("stop"), "cloud.stop")
    if cloud_nodes and not (start and stop):
        raise r.fail("cloud", "cloud nodes need both a start and a stop command")
    try:
        rules = BurstRules(
            util_threshold=_number(
                r, b.get("util_threshold", d.util_threshold), "burst.util_threshold"
            ),
            sustain_s=_number(r, b.get("sustain_s", d.sustain_s), "burst.sustain_s"),
            pending_gpu_threshold=int(b.get("pending_gpus", d.pending_gpu_threshold)),
            pending_sustain_s=_number(
                r, b.get("pending_sustain_s", d.pending_sustain_s), "burst.pending_sustain_s"
            ),
            reclaim_util=_number(r, b.get("reclaim_util", d.reclaim_util), "burst.reclaim_util"),
            reclaim_sustain_s=_number(
                r, b.get("reclaim_sustain_s", d.reclaim_sustain_s), "burst.reclaim_sustain_s"
            ),
            nodes_per_burst=int(b.get("nodes_per_burst", d.nodes_per_burst)),
            max_cloud_nodes=len(cloud_nodes),
        )
    except (SpecError, TypeError, ValueError) as err:
        raise r.fail("burst", str(err)) from None
    return SitesConfig(
        topology=topology,
        node_site=node_site,
        placement=placement,
        value_of_time_usd_per_h=vot,
        burst=rules,
        cloud_nodes=tuple(cloud_nodes),
        start_command=start,
        stop_command=stop,
        check_s=_number(r, b.get("check_s", 5.0), "burst.check_s"),
        join_timeout_s=_number(r, b.get("join_timeout_s", 600.0), "burst.join_timeout_s"),
    )


def load_sites(path: Path) -> SitesConfig:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise SpecError(f"{path}: cannot read the sites file: {err}") from None
    return read_sites(raw, str(path))


def _number(r: SpecReader, value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise r.fail(where, f"expected a number, got {value!r}")
    if value < 0:
        raise r.fail(where, f"{value} must be >= 0")
    return float(value)


def _argv(r: SpecReader, value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(shlex.split(value))
    if isinstance(value, Sequence) and all(isinstance(x, str | int | float) for x in value):
        return tuple(str(x) for x in value)
    raise r.fail(where, "expected a command: a string or a list of arguments")


def pool_prices(cfg: SitesConfig, pools: Mapping[str, tuple[str, str]]) -> dict[str, float]:
    """$/GPU-hour of each pool (site, model): the site's price, else the catalogue's."""
    catalog = load_catalog()
    out = {}
    for key, (site, model) in pools.items():
        listed = catalog[model].price_usd_per_hour if model in catalog else 0.0
        out[key] = cfg.topology.site(site).price_usd(model, listed)
    return out


# ---- cloud nodes ------------------------------------------------------------------------------
class ProcessRunner:
    """The `CommandRunner` of the live server: each command a process of its own."""

    def start(self, argv: Sequence[str], log: Path) -> Callable[[], int | None]:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            proc = subprocess.Popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
        return proc.poll


DOWN, STARTING, UP, STOPPING = "down", "starting", "up", "stopping"


@dataclass
class CloudStatus:
    node: CloudNode
    state: str = DOWN
    since_s: float = 0.0
    command: Callable[[], int | None] | None = None
    command_name: str = ""


class CloudNodes:
    """Starts and stops cloud nodes as the core decides (Burst, Reclaim), and tracks them.

    A node is down, starting (its start command ran; waiting for it to join), up (the
    cluster lists it) or stopping (its stop command ran; waiting for it to leave). The
    caller reports which cloud nodes the cluster lists, and gets back what happened, in
    words, for the event log."""

    def __init__(
        self, cfg: SitesConfig, state_dir: Path, runner: CommandRunner | None = None
    ) -> None:
        self.cfg = cfg
        self.state_dir = state_dir
        self.runner = runner or ProcessRunner()
        self.status = {c.name: CloudStatus(c) for c in cfg.cloud_nodes}
        self.last_check_s = -math.inf

    def due(self, now_s: float) -> bool:
        """Whether the next look is due: the caller measures only then."""
        return now_s - self.last_check_s >= self.cfg.check_s

    def names(self) -> set[str]:
        return set(self.status)

    def state(self, node: str) -> str:
        return self.status[node].state

    def _run(self, st: CloudStatus, which: str, now_s: float) -> str:
        template = self.cfg.start_command if which == "start" else self.cfg.stop_command
        c = st.node
        values = {
            "node": c.name,
            "site": c.site,
            "model": c.model,
            "gpus": str(c.gpus),
            "state_dir": str(self.state_dir),
        }
        argv = [part.format(**values) for part in template]
        log = self.state_dir / "cloud" / f"{c.name}.log"
        st.command = self.runner.start(argv, log)
        st.command_name = which
        st.since_s = now_s
        return shlex.join(argv)

    def joined(self, node: str, now_s: float) -> str:
        """The cluster lists the node now."""
        st = self.status[node]
        was, asked_at = st.state, st.since_s
        st.state, st.since_s = UP, now_s
        if was == STARTING:
            return f"cloud node {node} joined {now_s - asked_at:.0f} s after its start"
        return f"cloud node {node} joined"

    def left(self, node: str, now_s: float) -> str:
        st = self.status[node]
        was = st.state
        st.state, st.since_s = DOWN, now_s
        if was == STOPPING:
            return f"cloud node {node} stopped (reclaimed)"
        return f"cloud node {node} left the cluster unasked"

    def start(self, node: str, reason: str, now_s: float) -> str:
        """The core decided a burst: run the node's start command (it joins later)."""
        st = self.status[node]
        cmd = self._run(st, "start", now_s)
        st.state = STARTING
        return f"start {node}: {reason}; ran {cmd}"

    def stop(self, node: str, reason: str, now_s: float) -> str:
        """The core reclaimed the node: run its stop command (it leaves later)."""
        st = self.status[node]
        cmd = self._run(st, "stop", now_s)
        st.state = STOPPING
        return f"stop {node}: {reason}; ran {cmd}"

    def check(self, now_s: float) -> list[tuple[str, str, tuple[str, ...]]]:
        """Every check_s (earlier calls return nothing): commands that ended badly, and
        started nodes that did not join in time (stopped; the third item names them)."""
        out: list[tuple[str, str, tuple[str, ...]]] = []
        if not self.due(now_s):
            return out
        self.last_check_s = now_s
        for st in self.status.values():
            if st.command is not None:
                code = st.command()
                if code is not None:
                    if code != 0:
                        out.append(
                            (
                                "cloud-error",
                                f"cloud node {st.node.name}: {st.command_name} command "
                                f"exited with {code} (see {self.state_dir}/cloud/"
                                f"{st.node.name}.log)",
                                (),
                            )
                        )
                    st.command = None
            if st.state == STARTING and now_s - st.since_s > self.cfg.join_timeout_s:
                cmd = self._run(st, "stop", now_s)
                st.state = STOPPING
                out.append(
                    (
                        "cloud-error",
                        f"cloud node {st.node.name} did not join within "
                        f"{self.cfg.join_timeout_s:.0f} s; stopping it: {cmd}",
                        (st.node.name,),
                    )
                )
        return out

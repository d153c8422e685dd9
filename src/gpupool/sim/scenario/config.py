"""Scenario files: a cluster, teams and quotas, a policy and a workload, in YAML.

Every key is checked; an unknown or malformed one is a SpecError naming the file and key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpupool.errors import NotFoundError, SpecError
from gpupool.federation import TOPOLOGY_KEYS
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.config_schema import (
    SCHEDULING_KEYS,
    ConfigReader,
    check_fleet,
    parse_scheduling,
)

__all__ = ["PoolSpec", "ScenarioConfig", "load_scenario", "parse_scenario"]


@dataclass(frozen=True)
class PoolSpec:
    gpu_type: str
    nodes: int
    gpus_per_node: int
    cpu_milli: int = 256_000
    mem_mib: int = 2_097_152
    site: str = ""
    """The cluster (federation site) the nodes belong to; empty: the scenario's only one."""
    price_usd_per_gpu_hour: float | None = None
    """What a GPU-hour here costs; None: the catalogue price of the GPU type."""
    domains: tuple[tuple[str, int], ...] = ()
    """(topology level, nodes per domain): consecutive nodes share a label value
    (`domains: {rack: 8}` labels nodes 0-7 rack=rack1, 8-15 rack=rack2, ...)."""

    @property
    def key(self) -> str:
        """The pool's name in queues and quotas: the GPU type, or site/type with sites."""
        return f"{self.site}/{self.gpu_type}" if self.site else self.gpu_type


@dataclass(frozen=True)
class ScenarioConfig:
    """A scenario: its fleet, its workload and the scheduling section the core reads.

    The scheduling keys of the file fill `scheduling`, the same `SchedulerConfig` the
    live service runs, so its defaults are written once (gpupool.scheduler.config)."""

    name: str
    seed: int
    horizon_s: float
    pools: tuple[PoolSpec, ...]
    workload: tuple[Mapping[str, Any], ...]
    scheduling: SchedulerConfig = field(default_factory=SchedulerConfig)
    description: str = ""
    catalog: str | None = None
    """An operator's GPU catalogue file overriding or extending the shipped one."""
    federation: Mapping[str, Any] | None = None
    """Sites, data locations and links (gpupool.federation.parse_topology)."""
    path: str = ""

    def pool(self, key: str) -> PoolSpec:
        for p in self.pools:
            if p.key == key:
                return p
        raise SpecError(f"{self.path}: no pool {key!r}")


SCENARIO_KEYS = frozenset(
    {"name", "description", "seed", "horizon_h", "cluster", "workload", "catalog", "federation"}
)
"""The keys a scenario has around the scheduling section (gpupool.scheduler.config_schema)."""

TOP_KEYS = SCENARIO_KEYS | SCHEDULING_KEYS


def load_scenario(path: str | Path) -> ScenarioConfig:
    p = Path(path)
    if not p.is_file():
        raise NotFoundError(f"scenario file {p} does not exist; see scenarios/README.md")
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise SpecError(f"{p}: not valid YAML: {exc}") from None
    return parse_scenario(raw, str(p))


def parse_scenario(raw: Any, path: str = "<scenario>") -> ScenarioConfig:
    r = ConfigReader(path)
    top = r.mapping(raw, "top level", TOP_KEYS)
    for key in ("name", "cluster", "teams", "workload", "horizon_h"):
        if key not in top:
            raise r.fail("top level", f"missing required key {key!r}")
    pools = []
    if not isinstance(top["cluster"], Sequence) or not top["cluster"]:
        raise r.fail("cluster", "expected a list of pools")
    for k, item in enumerate(top["cluster"]):
        m = r.mapping(
            item,
            f"cluster[{k}]",
            {
                "gpu_type",
                "nodes",
                "gpus_per_node",
                "cpu_milli",
                "mem_mib",
                "site",
                "price_usd_per_gpu_hour",
                "domains",
            },
        )
        if "gpu_type" not in m:
            raise r.fail(f"cluster[{k}]", "missing gpu_type")
        price = m.get("price_usd_per_gpu_hour")
        pools.append(
            PoolSpec(
                str(m["gpu_type"]),
                r.integer(m.get("nodes", 1), f"cluster[{k}].nodes", 1),
                r.integer(m.get("gpus_per_node", 8), f"cluster[{k}].gpus_per_node", 1),
                r.integer(m.get("cpu_milli", 256_000), f"cluster[{k}].cpu_milli"),
                r.integer(m.get("mem_mib", 2_097_152), f"cluster[{k}].mem_mib"),
                str(m.get("site", "")),
                None
                if price is None
                else r.number(price, f"cluster[{k}].price_usd_per_gpu_hour", positive=True),
                tuple(
                    (str(level), r.integer(per, f"cluster[{k}].domains.{level}", 1))
                    for level, per in r.section(
                        m.get("domains"), f"cluster[{k}].domains", set(m.get("domains") or ())
                    ).items()
                ),
            )
        )
    if len({pl.key for pl in pools}) != len(pools):
        raise r.fail("cluster", "each GPU type may appear once per site")
    sched = parse_scheduling(top, path)
    check_fleet(sched, {pl.key: pl.nodes * pl.gpus_per_node for pl in pools}, path)
    federation = top.get("federation")
    if federation is not None:
        r.mapping(federation, "federation", set(TOPOLOGY_KEYS))
    if any(p.site for p in pools) and federation is None:
        raise r.fail("cluster", "pools name sites; describe them under federation: sites:")
    workload = top["workload"]
    if not isinstance(workload, Sequence) or not all(isinstance(w, Mapping) for w in workload):
        raise r.fail("workload", "expected a list of generator entries")
    return ScenarioConfig(
        name=str(top["name"]),
        description=str(top.get("description", "")),
        seed=r.integer(top.get("seed", 0), "seed"),
        horizon_s=r.number(top["horizon_h"], "horizon_h", positive=True) * 3600.0,
        pools=tuple(pools),
        workload=tuple(workload),
        scheduling=sched,
        catalog=None if top.get("catalog") is None else str(top["catalog"]),
        federation=federation,
        path=path,
    )

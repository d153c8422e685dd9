"""Scenario files: a cluster, teams and quotas, a policy and a workload, in YAML.

Every key is checked; an unknown or malformed one is a SpecError naming the file and key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpupool.domain.calibration import CheckpointModel, ColocationModel
from gpupool.domain.quota import QuotaWindow, TeamQuota
from gpupool.errors import NotFoundError, SpecError
from gpupool.federation import TOPOLOGY_KEYS
from gpupool.federation.burst import BurstRules
from gpupool.learning.config import LearningConfig
from gpupool.policies.preemption import PreemptionRules
from gpupool.scheduler.config import (
    ElasticConfig,
    EnergyConfig,
    PlacementConfig,
    SchedulerConfig,
    SharingConfig,
    TeamLimits,
    ThermalConfig,
)
from gpupool.scheduler.config_schema import (
    SCHEDULING_KEYS,
    ConfigReader,
    check_fleet,
    parse_scheduling,
)

__all__ = [
    "EnergyConfig",
    "PlacementConfig",
    "PoolSpec",
    "ScenarioConfig",
    "ThermalConfig",
    "load_scenario",
    "parse_scenario",
]


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

    @property
    def key(self) -> str:
        """The pool's name in queues and quotas: the GPU type, or site/type with sites."""
        return f"{self.site}/{self.gpu_type}" if self.site else self.gpu_type


@dataclass(frozen=True)
class ScenarioConfig:
    name: str
    seed: int
    horizon_s: float
    cycle_s: float
    pools: tuple[PoolSpec, ...]
    teams: tuple[TeamQuota, ...]
    workload: tuple[Mapping[str, Any], ...]
    mode: str = "pool"
    policy: str = "priority-quota"
    description: str = ""
    windows: tuple[QuotaWindow, ...] = ()
    online_reserve: float = 0.2
    online_reserve_on: str = "always"
    share_cap: int | None = 2
    sharing: SharingConfig = field(default_factory=SharingConfig)
    queue_depth: int = 32
    """The policy sees the first this-many waiting jobs of each team per cycle."""
    autoscale_lookahead_s: float = 600.0
    autoscale_headroom: float = 1.1
    autoscale_down_stable_s: float = 0.0
    autoscale_load_window_s: float = 120.0
    preemption: PreemptionRules = field(default_factory=PreemptionRules)
    checkpoint: CheckpointModel = field(default_factory=CheckpointModel.calibrated)
    colocation: ColocationModel = field(default_factory=ColocationModel.calibrated)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    energy: EnergyConfig = field(default_factory=EnergyConfig)
    catalog: str | None = None
    """An operator's GPU catalogue file overriding or extending the shipped one."""
    federation: Mapping[str, Any] | None = None
    """Sites, data locations and links (gpupool.federation.parse_topology)."""
    burst: Mapping[str, Any] | BurstRules | None = None
    """The `burst:` section as written (minutes; gpupool.scheduler.config_schema checks it)."""
    team_limits: Mapping[str, TeamLimits] = field(default_factory=dict)
    time_limit_s: Mapping[str, float] = field(default_factory=dict)
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    path: str = ""
    learning: LearningConfig = field(default_factory=LearningConfig)

    def scheduler_config(self) -> SchedulerConfig:
        """The scheduling section: what the decision core reads."""
        return SchedulerConfig(
            policy=self.policy,
            teams=self.teams,
            windows=self.windows,
            mode=self.mode,
            cycle_s=self.cycle_s,
            online_reserve=self.online_reserve,
            online_reserve_on=self.online_reserve_on,
            share_cap=self.share_cap,
            sharing=self.sharing,
            queue_depth=self.queue_depth,
            autoscale_lookahead_s=self.autoscale_lookahead_s,
            autoscale_headroom=self.autoscale_headroom,
            autoscale_down_stable_s=self.autoscale_down_stable_s,
            autoscale_load_window_s=self.autoscale_load_window_s,
            preemption=self.preemption,
            checkpoint=self.checkpoint,
            colocation=self.colocation,
            placement=self.placement,
            energy=self.energy,
            burst=self.burst,
            team_limits=self.team_limits,
            time_limit_s=self.time_limit_s,
            elastic=self.elastic,
            learning=self.learning,
        )

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
        cycle_s=sched.cycle_s,
        pools=tuple(pools),
        teams=sched.teams,
        workload=tuple(workload),
        mode=sched.mode,
        policy=sched.policy,
        windows=sched.windows,
        online_reserve=sched.online_reserve,
        online_reserve_on=sched.online_reserve_on,
        share_cap=sched.share_cap,
        sharing=sched.sharing,
        queue_depth=sched.queue_depth,
        autoscale_lookahead_s=sched.autoscale_lookahead_s,
        autoscale_headroom=sched.autoscale_headroom,
        autoscale_down_stable_s=sched.autoscale_down_stable_s,
        autoscale_load_window_s=sched.autoscale_load_window_s,
        preemption=sched.preemption,
        checkpoint=sched.checkpoint,
        colocation=sched.colocation,
        placement=sched.placement,
        energy=sched.energy,
        catalog=None if top.get("catalog") is None else str(top["catalog"]),
        federation=federation,
        burst=sched.burst,
        team_limits=sched.team_limits,
        time_limit_s=sched.time_limit_s,
        elastic=sched.elastic,
        path=path,
        learning=sched.learning,
    )

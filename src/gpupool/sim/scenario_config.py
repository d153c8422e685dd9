"""Scenario files: a cluster, teams and quotas, a policy and a workload, in YAML.

Every key is checked; an unknown or malformed one is a SpecError naming the file and key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpupool.core.calibration import CheckpointModel, ColocationModel
from gpupool.core.quota import QuotaWindow, TeamQuota, clock_s
from gpupool.errors import NotFoundError, SpecError
from gpupool.federation import TOPOLOGY_KEYS
from gpupool.policies.cycle import CYCLE_POLICIES, PreemptionRules
from gpupool.scheduler.config import (
    MODES,
    SITE_CHOICES,
    TYPE_CHOICES,
    EnergyConfig,
    PlacementConfig,
    SchedulerConfig,
    ThermalConfig,
)
from gpupool.specfile import SpecReader

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
    share_cap: int = 2
    queue_depth: int = 32
    """The policy sees the first this-many waiting jobs of each team per cycle."""
    autoscale_lookahead_s: float = 600.0
    autoscale_headroom: float = 1.1
    preemption: PreemptionRules = field(default_factory=PreemptionRules)
    checkpoint: CheckpointModel = field(default_factory=CheckpointModel.calibrated)
    colocation: ColocationModel = field(default_factory=ColocationModel.calibrated)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    energy: EnergyConfig = field(default_factory=EnergyConfig)
    catalog: str | None = None
    """An operator's GPU catalogue file overriding or extending the shipped one."""
    federation: Mapping[str, Any] | None = None
    """Sites, data locations and links (gpupool.federation.parse_topology)."""
    burst: Mapping[str, Any] | None = None
    path: str = ""

    def scheduler_config(self) -> SchedulerConfig:
        """The scheduling section: what the decision core reads."""
        return SchedulerConfig(
            policy=self.policy,
            teams=self.teams,
            windows=self.windows,
            mode=self.mode,
            cycle_s=self.cycle_s,
            online_reserve=self.online_reserve,
            share_cap=self.share_cap,
            queue_depth=self.queue_depth,
            autoscale_lookahead_s=self.autoscale_lookahead_s,
            autoscale_headroom=self.autoscale_headroom,
            preemption=self.preemption,
            checkpoint=self.checkpoint,
            colocation=self.colocation,
            placement=self.placement,
            energy=self.energy,
            burst=self.burst,
        )

    def pool(self, key: str) -> PoolSpec:
        for p in self.pools:
            if p.key == key:
                return p
        raise SpecError(f"{self.path}: no pool {key!r}")


TOP_KEYS = {
    "name",
    "description",
    "seed",
    "horizon_h",
    "cycle_s",
    "mode",
    "policy",
    "cluster",
    "teams",
    "windows",
    "workload",
    "online_reserve",
    "share_cap",
    "autoscale",
    "preemption",
    "queue_depth",
    "checkpoint",
    "placement",
    "energy",
    "catalog",
    "federation",
    "burst",
}


class _Reader(SpecReader):
    def number(self, value: Any, where: str, low: float = 0.0, positive: bool = False) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(where, f"expected a number, got {value!r}")
        if value < low or (positive and value <= 0):
            raise self.fail(
                where, f"{value} is out of range (must be {'>' if positive else '>='} {low})"
            )
        return float(value)

    def integer(self, value: Any, where: str, low: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, f"expected a whole number, got {value!r}")
        if value < low:
            raise self.fail(where, f"{value} must be >= {low}")
        return value

    def gpu_counts(self, value: Any, where: str) -> dict[str, int]:
        if not isinstance(value, Mapping):
            raise self.fail(where, "expected {GPU type: count}")
        return {str(k): self.integer(v, f"{where}.{k}") for k, v in value.items()}


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
    r = _Reader(path)
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
    teams = []
    for k, item in enumerate(top["teams"] or []):
        m = r.mapping(item, f"teams[{k}]", {"name", "guaranteed", "max"})
        if "name" not in m:
            raise r.fail(f"teams[{k}]", "missing name")
        guaranteed = r.gpu_counts(m.get("guaranteed", {}), f"teams[{k}].guaranteed")
        maximum = r.gpu_counts(m.get("max", {}), f"teams[{k}].max")
        teams.append(TeamQuota(str(m["name"]), guaranteed, maximum))
    windows = []
    for k, item in enumerate(top.get("windows") or []):
        m = r.mapping(item, f"windows[{k}]", {"from", "to", "teams"})
        shares = r.mapping(m.get("teams", {}), f"windows[{k}].teams", {t.team for t in teams})
        g: dict[str, float] = {}
        mx: dict[str, float] = {}
        for team, spec in shares.items():
            s = r.mapping(spec, f"windows[{k}].teams.{team}", {"guaranteed", "max"})
            if "guaranteed" in s:
                g[team] = r.number(s["guaranteed"], f"windows[{k}].teams.{team}.guaranteed")
            if "max" in s:
                mx[team] = r.number(s["max"], f"windows[{k}].teams.{team}.max")
        windows.append(
            QuotaWindow(
                clock_s(str(m.get("from", "00:00"))), clock_s(str(m.get("to", "24:00"))), g, mx
            )
        )
    mode = str(top.get("mode", "pool"))
    if mode not in MODES:
        raise r.fail("mode", f"{mode!r}; choose {' or '.join(MODES)}")
    policy = str(top.get("policy", "priority-quota"))
    if policy not in CYCLE_POLICIES:
        raise r.fail("policy", f"{policy!r}; choose one of {', '.join(CYCLE_POLICIES)}")
    pre = r.mapping(top.get("preemption", {}), "preemption", {"min_runtime_s", "max_per_job"})
    ck = r.mapping(
        top.get("checkpoint", {}), "checkpoint", {"write_gbps", "restore_gbps", "process_start_s"}
    )
    base = CheckpointModel.calibrated()
    auto = r.mapping(top.get("autoscale", {}), "autoscale", {"lookahead_s", "headroom"})
    placement = _placement(r, top.get("placement", {}))
    energy = _energy(r, top.get("energy", {}))
    federation = top.get("federation")
    if federation is not None:
        r.mapping(federation, "federation", set(TOPOLOGY_KEYS))
    if any(p.site for p in pools) and federation is None:
        raise r.fail("cluster", "pools name sites; describe them under federation: sites:")
    burst = top.get("burst")
    if burst is not None:
        r.mapping(
            burst,
            "burst",
            {
                "util_threshold",
                "sustain_min",
                "pending_gpus",
                "pending_sustain_min",
                "reclaim_util",
                "reclaim_sustain_min",
                "nodes_per_burst",
            },
        )
    workload = top["workload"]
    if not isinstance(workload, Sequence) or not all(isinstance(w, Mapping) for w in workload):
        raise r.fail("workload", "expected a list of generator entries")
    return ScenarioConfig(
        name=str(top["name"]),
        description=str(top.get("description", "")),
        seed=r.integer(top.get("seed", 0), "seed"),
        horizon_s=r.number(top["horizon_h"], "horizon_h", positive=True) * 3600.0,
        cycle_s=r.number(top.get("cycle_s", 60), "cycle_s", positive=True),
        pools=tuple(pools),
        teams=tuple(teams),
        workload=tuple(workload),
        mode=mode,
        policy=policy,
        windows=tuple(windows),
        online_reserve=r.number(top.get("online_reserve", 0.2), "online_reserve"),
        share_cap=r.integer(top.get("share_cap", 2), "share_cap", 1),
        queue_depth=r.integer(top.get("queue_depth", 32), "queue_depth", 1),
        autoscale_lookahead_s=r.number(auto.get("lookahead_s", 600), "autoscale.lookahead_s"),
        autoscale_headroom=r.number(auto.get("headroom", 1.1), "autoscale.headroom", positive=True),
        preemption=PreemptionRules(
            r.number(pre.get("min_runtime_s", 900), "preemption.min_runtime_s"),
            r.integer(pre.get("max_per_job", 3), "preemption.max_per_job"),
        ),
        checkpoint=CheckpointModel(
            r.number(ck.get("write_gbps", base.write_gbps), "checkpoint.write_gbps", positive=True),
            r.number(
                ck.get("restore_gbps", base.restore_gbps), "checkpoint.restore_gbps", positive=True
            ),
            r.number(ck.get("process_start_s", base.process_start_s), "checkpoint.process_start_s"),
        ),
        placement=placement,
        energy=energy,
        catalog=None if top.get("catalog") is None else str(top["catalog"]),
        federation=federation,
        burst=burst,
        path=path,
    )


def _flag(r: _Reader, value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise r.fail(where, f"expected true or false, got {value!r}")
    return value


def _placement(r: _Reader, raw: Any) -> PlacementConfig:
    m = r.mapping(raw or {}, "placement", {"gpu_type", "site", "value_of_time_usd_per_h"})
    gpu_type = str(m.get("gpu_type", "first"))
    if gpu_type not in TYPE_CHOICES:
        raise r.fail("placement.gpu_type", f"{gpu_type!r}; choose one of {', '.join(TYPE_CHOICES)}")
    site = str(m.get("site", "blind"))
    if site not in SITE_CHOICES:
        raise r.fail("placement.site", f"{site!r}; choose one of {', '.join(SITE_CHOICES)}")
    vot = r.number(m.get("value_of_time_usd_per_h", 0.0), "placement.value_of_time_usd_per_h")
    return PlacementConfig(gpu_type, site, vot)


def _energy(r: _Reader, raw: Any) -> EnergyConfig:
    m = r.mapping(
        raw or {},
        "energy",
        {
            "tariff",
            "site_tariffs",
            "pue",
            "price_aware",
            "power_capping",
            "deferral_slot_min",
            "deferral_margin_h",
            "thermal",
        },
    )
    sites = r.mapping(
        m.get("site_tariffs", {}), "energy.site_tariffs", set(m.get("site_tariffs") or {})
    )
    t = r.mapping(
        m.get("thermal", {}),
        "energy.thermal",
        {"aware", "threshold_c", "inlet_c", "hot_nodes", "hot_inlet_c"},
    )
    thermal = ThermalConfig(
        _flag(r, t.get("aware", False), "energy.thermal.aware"),
        r.number(t.get("threshold_c", 83.0), "energy.thermal.threshold_c", positive=True),
        r.number(t.get("inlet_c", 30.0), "energy.thermal.inlet_c", low=-50.0),
        r.integer(t.get("hot_nodes", 0), "energy.thermal.hot_nodes"),
        r.number(t.get("hot_inlet_c", 40.0), "energy.thermal.hot_inlet_c", low=-50.0),
    )
    pue = r.number(m.get("pue", 1.5), "energy.pue", positive=True)
    if pue < 1.0:
        raise r.fail("energy.pue", f"{pue} is below 1; PUE is facility power over IT power")
    return EnergyConfig(
        tariff=None if m.get("tariff") is None else str(m["tariff"]),
        site_tariffs={str(k): str(v) for k, v in sites.items()},
        pue=pue,
        price_aware=_flag(r, m.get("price_aware", False), "energy.price_aware"),
        power_capping=_flag(r, m.get("power_capping", False), "energy.power_capping"),
        deferral_slot_s=60.0
        * r.number(m.get("deferral_slot_min", 15), "energy.deferral_slot_min", positive=True),
        deferral_margin_s=3600.0
        * r.number(m.get("deferral_margin_h", 1.0), "energy.deferral_margin_h"),
        thermal=thermal,
    )

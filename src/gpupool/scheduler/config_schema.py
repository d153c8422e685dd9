"""The scheduling section: one schema, one parser, one set of messages for every driver.

A scenario file and the live service's `gpupool serve --config FILE` both carry the same
keys (`SCHEDULING_KEYS`): teams and their quotas, time windows, mode, policy, cycle,
online reserve, sharing, queue depth, autoscaling, preemption, checkpoint speeds,
placement, energy and burst rules. `parse_scheduling` turns them into the
`SchedulerConfig` the core reads, taking what a file leaves out from the driver's
defaults (a scenario's `SchedulerConfig()`, the service's `LIVE_DEFAULTS`).
`check_fleet` checks the quotas against the pools once the fleet is known.

Pure: no file I/O, the callers load the YAML and name the file for the messages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence, Set
from typing import Any

from gpupool.domain.calibration import CheckpointModel
from gpupool.domain.model import JobKind
from gpupool.domain.quota import QuotaWindow, TeamQuota, clock_s
from gpupool.domain.topology import StepModel, Topology
from gpupool.errors import SpecError
from gpupool.learning.config import LearningConfig
from gpupool.learning.demand import DEMAND_SOURCES, FORECAST_KEYS, DemandForecastConfig
from gpupool.learning.guard import GuardConfig
from gpupool.learning.ordering import LasQueues
from gpupool.policies.preemption import PreemptionRules
from gpupool.policies.registry import cycle_names
from gpupool.policies.serving_clocks import OnlineClocks
from gpupool.scheduler.config import (
    MODES,
    PLACEMENT_POLICIES,
    RESERVE_TRIGGERS,
    SITE_CHOICES,
    TYPE_CHOICES,
    ElasticConfig,
    EnergyConfig,
    FairShareConfig,
    PlacementConfig,
    SchedulerConfig,
    SharingConfig,
    TeamLimits,
    ThermalConfig,
)
from gpupool.scheduler.config_admission import parse_admission
from gpupool.sizing.interconnect import link_busbw_gb_s
from gpupool.specfile import SpecReader

__all__ = [
    "BURST_KEYS",
    "SCENARIO_DEFAULTS",
    "SCHEDULING_KEYS",
    "ConfigReader",
    "check_fleet",
    "parse_scheduling",
]

SCHEDULING_KEYS: frozenset[str] = frozenset(
    {
        "teams",
        "windows",
        "mode",
        "policy",
        "cycle_s",
        "start_on_submit",
        "reservations",
        "online_reserve",
        "online_reserve_on",
        "share_cap",
        "sharing",
        "queue_depth",
        "autoscale",
        "preemption",
        "checkpoint",
        "placement",
        "energy",
        "burst",
        "default_time_limit_h",
        "elastic",
        "learning",
        "fair_share",
        "priority_aging_h",
        "topology",
    }
)
"""The top-level keys of the scheduling section (a scenario file has more around them)."""

BURST_KEYS: frozenset[str] = frozenset(
    {
        "util_threshold",
        "sustain_min",
        "pending_gpus",
        "pending_sustain_min",
        "reclaim_util",
        "reclaim_sustain_min",
        "nodes_per_burst",
    }
)
"""Cloud burst and reclaim rules, durations in minutes (federation.burst.BurstRules)."""

PREEMPTION_KEYS: frozenset[str] = frozenset(
    {"min_runtime_s", "max_per_job", "max_lost_work_s", "by_priority", "reserve_vacate_s"}
)
"""The `preemption:` section (PreemptionRules); null for a bound means none."""

SCENARIO_DEFAULTS = SchedulerConfig()
"""A scenario's defaults: `SchedulerConfig()` (the service passes its LIVE_DEFAULTS)."""

LEARNING_KEYS: frozenset[str] = frozenset(
    {
        "mode",
        "rule",
        "weight",
        "max_spread",
        "model_order",
        "retrain_every_s",
        "predictor",
        "guarded",
        "seed",
        "max_wait_s",
        "guard",
        "las_thresholds_gpu_s",
    }
)
"""The `learning:` section (gpupool.learning.config.LearningConfig)."""

GUARD_KEYS: frozenset[str] = frozenset(
    {"window_jobs", "min_within_2x", "min_rank_corr", "recover_margin", "cold_start_s"}
    | {"min_finished", "judge", "min_advantage", "advantage_margin", "pairs_per_job"}
)
"""`learning.guard:` (gpupool.learning.guard.GuardConfig)."""

_SHARES = ("util_threshold", "reclaim_util")
_MINUTES = ("sustain_min", "pending_sustain_min", "reclaim_sustain_min")
_COUNTS = ("pending_gpus", "nodes_per_burst")


class ConfigReader(SpecReader):
    """A SpecReader with the number, count and flag checks a configuration needs."""

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
        out: dict[str, int] = {}
        for k, v in value.items():
            if isinstance(v, bool) or not isinstance(v, int):
                raise self.fail(f"{where}.{k}", f"expected a whole number of GPUs, got {v!r}")
            if v < 0:
                raise self.fail(f"{where}.{k}", f"{v} must be >= 0 (a whole number of GPUs)")
            out[str(k)] = v
        return out

    def flag(self, value: Any, where: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(where, f"expected true or false, got {value!r}")
        return value

    def section(self, value: Any, where: str, allowed: Set[str]) -> Mapping[str, Any]:
        """A nested mapping; absent or empty (`key:` with nothing) reads as {}."""
        return self.mapping({} if value is None else value, where, allowed)

    def entries(self, value: Any, where: str, what: str) -> Sequence[Any]:
        """A list; absent or empty reads as []."""
        if value is None:
            return ()
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise self.fail(where, f"expected a list of {what}")
        return value


def parse_scheduling(
    raw: Mapping[str, Any], path: str, defaults: SchedulerConfig = SCENARIO_DEFAULTS
) -> SchedulerConfig:
    """The scheduling keys of `raw` (others are the caller's to check) over `defaults`.

    Every value is checked; a bad one is a SpecError naming `path`, the key and the fix.
    A key the file leaves out keeps its value in `defaults`, and so does each field of a
    nested section (`preemption: {min_runtime_s: 0}` keeps the default max_per_job).
    """
    r = ConfigReader(path)
    teams, limits = (
        _teams(r, raw["teams"]) if "teams" in raw else (defaults.teams, defaults.team_limits)
    )
    windows = (
        _windows(r, raw["windows"], {t.team for t in teams})
        if "windows" in raw
        else defaults.windows
    )
    mode = str(raw.get("mode", defaults.mode))
    if mode not in MODES:
        raise r.fail("mode", f"{mode!r}; choose {' or '.join(MODES)}")
    policy = str(raw.get("policy", defaults.policy))
    if policy not in cycle_names():
        raise r.fail("policy", f"{policy!r}; choose one of {', '.join(cycle_names())}")
    auto = r.section(
        raw.get("autoscale"),
        "autoscale",
        {
            "lookahead_s",
            "headroom",
            "down_stable_s",
            "load_window_s",
            "restart_backoff_s",
            "restart_backoff_max_s",
            "demand",
            "forecast",
        },
    )
    demand = str(auto.get("demand", defaults.autoscale_demand))
    if demand not in DEMAND_SOURCES:
        raise r.fail("autoscale.demand", f"{demand!r}; choose one of {', '.join(DEMAND_SOURCES)}")
    el = r.section(raw.get("elastic"), "elastic", {"resize", "grow_after_s"})
    resize = el.get("resize", defaults.elastic.resize)
    if not isinstance(resize, bool):
        raise r.fail("elastic.resize", f"{resize!r}; expected true or false")
    pre = r.section(raw.get("preemption"), "preemption", PREEMPTION_KEYS)
    reserve_on = str(
        raw.get(
            "online_reserve_on",
            # a reserve the file sets holds from the start unless the file says otherwise
            "always" if "online_reserve" in raw else defaults.online_reserve_on,
        )
    )
    if reserve_on not in RESERVE_TRIGGERS:
        raise r.fail("online_reserve_on", f"{reserve_on!r}; choose {' or '.join(RESERVE_TRIGGERS)}")
    dp = defaults.preemption
    lost = pre.get("max_lost_work_s", dp.max_lost_work_s)
    vacate = pre.get("reserve_vacate_s", dp.reserve_vacate_s)
    by_priority = pre.get("by_priority", dp.by_priority)
    if not isinstance(by_priority, bool):
        raise r.fail("preemption.by_priority", f"{by_priority!r}; expected true or false")
    ck = r.section(
        raw.get("checkpoint"), "checkpoint", {"write_gbps", "restore_gbps", "process_start_s"}
    )
    base = defaults.checkpoint
    burst = defaults.burst
    if "burst" in raw:
        burst = _burst(r, raw["burst"])
    learning = _learning(r, raw.get("learning"), defaults.learning, policy, "learning" in raw)
    return dataclasses.replace(
        defaults,
        policy=policy,
        teams=teams,
        windows=windows,
        mode=mode,
        cycle_s=r.number(raw.get("cycle_s", defaults.cycle_s), "cycle_s", positive=True),
        start_on_submit=r.flag(
            raw.get("start_on_submit", defaults.start_on_submit), "start_on_submit"
        ),
        reservations=r.flag(raw.get("reservations", defaults.reservations), "reservations"),
        online_reserve=r.number(
            raw.get("online_reserve", defaults.online_reserve), "online_reserve"
        ),
        share_cap=_share_cap(r, raw, defaults.share_cap),
        sharing=_sharing(r, raw["sharing"], defaults.sharing)
        if "sharing" in raw
        else defaults.sharing,
        queue_depth=r.integer(raw.get("queue_depth", defaults.queue_depth), "queue_depth", 1),
        autoscale_lookahead_s=r.number(
            auto.get("lookahead_s", defaults.autoscale_lookahead_s), "autoscale.lookahead_s"
        ),
        autoscale_headroom=r.number(
            auto.get("headroom", defaults.autoscale_headroom), "autoscale.headroom", positive=True
        ),
        autoscale_down_stable_s=r.number(
            auto.get("down_stable_s", defaults.autoscale_down_stable_s), "autoscale.down_stable_s"
        ),
        autoscale_load_window_s=r.number(
            auto.get("load_window_s", defaults.autoscale_load_window_s),
            "autoscale.load_window_s",
            positive=True,
        ),
        autoscale_restart_backoff_s=r.number(
            auto.get("restart_backoff_s", defaults.autoscale_restart_backoff_s),
            "autoscale.restart_backoff_s",
        ),
        autoscale_restart_backoff_max_s=r.number(
            auto.get("restart_backoff_max_s", defaults.autoscale_restart_backoff_max_s),
            "autoscale.restart_backoff_max_s",
        ),
        autoscale_demand=demand,
        autoscale_forecast=DemandForecastConfig.from_mapping(
            r.section(auto.get("forecast"), "autoscale.forecast", FORECAST_KEYS)
        )
        if "forecast" in auto
        else defaults.autoscale_forecast,
        online_reserve_on=reserve_on,
        preemption=PreemptionRules(
            r.number(pre.get("min_runtime_s", dp.min_runtime_s), "preemption.min_runtime_s"),
            r.integer(pre.get("max_per_job", dp.max_per_job), "preemption.max_per_job"),
            max_lost_work_s=None
            if lost is None
            else r.number(lost, "preemption.max_lost_work_s", positive=True),
            by_priority=by_priority,
            reserve_vacate_s=None
            if vacate is None
            else r.number(vacate, "preemption.reserve_vacate_s"),
        ),
        checkpoint=CheckpointModel(
            r.number(ck.get("write_gbps", base.write_gbps), "checkpoint.write_gbps", positive=True),
            r.number(
                ck.get("restore_gbps", base.restore_gbps), "checkpoint.restore_gbps", positive=True
            ),
            r.number(ck.get("process_start_s", base.process_start_s), "checkpoint.process_start_s"),
        ),
        placement=_placement(r, raw["placement"], defaults.placement)
        if "placement" in raw
        else defaults.placement,
        energy=_energy(r, raw["energy"], defaults.energy) if "energy" in raw else defaults.energy,
        burst=burst,
        elastic=ElasticConfig(
            resize,
            r.number(el.get("grow_after_s", defaults.elastic.grow_after_s), "elastic.grow_after_s"),
        ),
        team_limits=limits,
        time_limit_s=_time_limits(r, raw["default_time_limit_h"])
        if "default_time_limit_h" in raw
        else defaults.time_limit_s,
        learning=learning,
        fair_share=_fair_share(r, raw["fair_share"], defaults.fair_share)
        if "fair_share" in raw
        else defaults.fair_share,
        priority_aging_h=None
        if raw.get("priority_aging_h") is None
        else r.number(raw["priority_aging_h"], "priority_aging_h", positive=True),
        topology=_topology(r, raw["topology"], defaults.topology)
        if "topology" in raw
        else defaults.topology,
    )


def _topology(r: ConfigReader, raw: Any, d: Topology) -> Topology:
    """`topology: {levels: [rack, block], placement: aware, links: [nvlink, infiniband,
    infiniband], step: {...}}`: levels narrowest first; a link per level and one for a gang
    spanning the widest (names of data/interconnect_links.csv, or GB/s)."""
    m = r.section(raw, "topology", {"levels", "placement", "links", "step"})
    levels = tuple(
        str(v) for v in r.entries(m.get("levels", d.levels), "topology.levels", "labels")
    )
    for level in levels:
        if not level or not all(c.isalnum() or c == "-" for c in level):
            raise r.fail("topology.levels", f"{level!r}: a label key has letters, digits and -")
    placement = m.get("placement", "aware" if d.aware else "blind")
    if placement not in ("aware", "blind"):
        raise r.fail("topology.placement", f"{placement!r}: choose aware or blind")
    links = r.entries(m.get("links", d.busbw_gb_s), "topology.links", "links")
    busbw = tuple(link_busbw_gb_s(v, f"{r.path}: topology.links[{k}]") for k, v in enumerate(links))
    st = r.section(m.get("step"), "topology.step", {"grad_gb", "compute_s", "overlap"})
    step = StepModel(
        r.number(st.get("grad_gb", d.step.grad_gb), "topology.step.grad_gb", positive=True),
        r.number(st.get("compute_s", d.step.compute_s), "topology.step.compute_s", positive=True),
        r.number(st.get("overlap", d.step.overlap), "topology.step.overlap"),
    )
    if step.overlap > 1:
        raise r.fail("topology.step.overlap", "the share of backward overlapped is at most 1")
    try:
        return Topology(levels, placement == "aware", busbw, step)
    except SpecError as err:
        raise r.fail("topology", str(err)) from None


def _fair_share(r: ConfigReader, raw: Any, d: FairShareConfig) -> FairShareConfig:
    m = r.section(raw, "fair_share", {"users", "half_life_h"})
    return FairShareConfig(
        r.flag(m.get("users", d.users), "fair_share.users"),
        r.number(m.get("half_life_h", d.half_life_h), "fair_share.half_life_h", positive=True),
    )


def _learning(
    r: ConfigReader, raw: Any, d: LearningConfig, policy: str, given: bool
) -> LearningConfig:
    """The `learning:` section over `d`; `policy: learned` defaults its mode to shadow,
    and a mode other than off needs `policy: learned`."""
    m = r.section(raw, "learning", LEARNING_KEYS)
    if not given and policy != "learned" and d.mode == "off":
        return d
    mode = m.get("mode", d.mode if d.mode != "off" or policy != "learned" else "shadow")
    if policy == "learned" and mode not in ("shadow", "active"):
        raise r.fail(
            "learning.mode",
            f"{mode!r}; policy learned runs in mode shadow (the rules decide and the learned "
            "plan is recorded, the default) or active (the learned order decides, guarded)",
        )
    if policy != "learned" and mode != "off":
        raise r.fail(
            "learning.mode",
            f"{mode!r} runs the learned policy; set policy: learned (policy is {policy})",
        )
    for key in ("rule", "predictor"):
        if key in m and not isinstance(m[key], str):
            raise r.fail(f"learning.{key}", f"expected a name, got {m[key]!r}")
    g = r.section(m.get("guard"), "learning.guard", GUARD_KEYS)
    dg = d.guard
    las = d.las
    if "las_thresholds_gpu_s" in m:
        t = r.entries(m["las_thresholds_gpu_s"], "learning.las_thresholds_gpu_s", "GPU-seconds")
        thresholds = tuple(
            r.number(x, f"learning.las_thresholds_gpu_s[{k}]", positive=True)
            for k, x in enumerate(t)
        )
        try:
            las = LasQueues(thresholds)
        except SpecError as err:
            raise r.fail("learning.las_thresholds_gpu_s", str(err)) from None
    wait = m.get("max_wait_s", d.max_wait_s)
    try:
        guard = GuardConfig(
            window_jobs=r.integer(
                g.get("window_jobs", dg.window_jobs), "learning.guard.window_jobs", 10
            ),
            min_within_2x=r.number(
                g.get("min_within_2x", dg.min_within_2x), "learning.guard.min_within_2x"
            ),
            min_rank_corr=r.number(
                g.get("min_rank_corr", dg.min_rank_corr), "learning.guard.min_rank_corr", low=-1.0
            ),
            recover_margin=r.number(
                g.get("recover_margin", dg.recover_margin), "learning.guard.recover_margin"
            ),
            cold_start_s=r.number(
                g.get("cold_start_s", dg.cold_start_s), "learning.guard.cold_start_s"
            ),
            min_finished=r.integer(
                g.get("min_finished", dg.min_finished), "learning.guard.min_finished"
            ),
            judge=str(g.get("judge", dg.judge)),
            min_advantage=r.number(
                g.get("min_advantage", dg.min_advantage), "learning.guard.min_advantage", low=-1.0
            ),
            advantage_margin=r.number(
                g.get("advantage_margin", dg.advantage_margin), "learning.guard.advantage_margin"
            ),
            pairs_per_job=r.integer(
                g.get("pairs_per_job", dg.pairs_per_job), "learning.guard.pairs_per_job", 1
            ),
        )
    except SpecError as err:
        raise r.fail("learning.guard", str(err)) from None
    try:
        return LearningConfig(
            mode=str(mode),
            rule=str(m.get("rule", d.rule)),
            weight=r.number(m.get("weight", d.weight), "learning.weight"),
            max_spread=r.number(m.get("max_spread", d.max_spread), "learning.max_spread"),
            model_order=str(m.get("model_order", d.model_order)),
            retrain_every_s=r.number(
                m.get("retrain_every_s", d.retrain_every_s),
                "learning.retrain_every_s",
                positive=True,
            ),
            predictor=str(m.get("predictor", d.predictor)),
            guarded=r.flag(m.get("guarded", d.guarded), "learning.guarded"),
            seed=r.integer(m.get("seed", d.seed), "learning.seed"),
            guard=guard,
            las=las,
            max_wait_s=None
            if wait is None
            else r.number(wait, "learning.max_wait_s", positive=True),
        )
    except SpecError as err:
        raise r.fail("learning", str(err)) from None


def check_fleet(config: SchedulerConfig, pools: Mapping[str, int], path: str) -> None:
    """The quotas against the fleet: `pools` maps each pool key (the GPU model, or
    site/model when the fleet spans sites, as the core names pools) to its GPU count.

    A team's guaranteed or max entry naming a pool the fleet lacks, a guarantee above its
    pool, or guarantees adding up to more than a pool are SpecErrors naming the key."""
    r = ConfigReader(path)
    have = ", ".join(sorted(pools)) or "none"
    promised: dict[str, list[tuple[str, int]]] = {}
    for k, team in enumerate(config.teams):
        for kind, counts in (("guaranteed", team.guaranteed), ("max", team.maximum)):
            for key, n in counts.items():
                where = f"teams[{k}].{kind}.{key}"
                if key not in pools:
                    hint = ""
                    if "/" not in key and any(p.endswith(f"/{key}") for p in pools):
                        hint = "; pools here are named site/GPU model"
                    raise r.fail(
                        where,
                        f"this fleet has no {key} GPUs (it has {have}){hint}; "
                        "fix the GPU model or drop the entry",
                    )
                if kind == "guaranteed":
                    if n > pools[key]:
                        raise r.fail(
                            where,
                            f"{n} GPUs guaranteed but the fleet has {pools[key]} {key} GPUs; "
                            "lower the guarantee",
                        )
                    promised.setdefault(key, []).append((team.team, n))
    for key, shares in promised.items():
        total = sum(n for _, n in shares)
        if total > pools[key]:
            who = ", ".join(f"{t} {n}" for t, n in shares if n)
            raise r.fail(
                f"teams[*].guaranteed.{key}",
                f"guarantees add up to {total} GPUs ({who}) but the fleet has {pools[key]} "
                f"{key} GPUs; lower them",
            )


TEAM_KEYS: frozenset[str] = frozenset(
    {"name", "guaranteed", "max", "max_running_jobs", "max_cpu_jobs", "submit_per_min"}
)
"""A team's entry: its GPU quota and its job-count limits (TeamLimits)."""


def _teams(r: ConfigReader, raw: Any) -> tuple[tuple[TeamQuota, ...], dict[str, TeamLimits]]:
    teams = []
    limits: dict[str, TeamLimits] = {}
    for k, item in enumerate(r.entries(raw, "teams", "teams ({name, guaranteed, max})")):
        m = r.mapping(item, f"teams[{k}]", TEAM_KEYS)
        if "name" not in m:
            raise r.fail(f"teams[{k}]", "missing name")
        guaranteed = r.gpu_counts(m.get("guaranteed") or {}, f"teams[{k}].guaranteed")
        maximum = r.gpu_counts(m.get("max") or {}, f"teams[{k}].max")
        try:
            teams.append(TeamQuota(str(m["name"]), guaranteed, maximum))
        except SpecError as err:
            raise r.fail(f"teams[{k}]", str(err)) from None
        counts = {
            key: r.integer(m[key], f"teams[{k}].{key}", 1)
            for key in ("max_running_jobs", "max_cpu_jobs")
            if m.get(key) is not None
        }
        rate = m.get("submit_per_min")
        if counts or rate is not None:
            limits[str(m["name"])] = TeamLimits(
                counts.get("max_running_jobs"),
                counts.get("max_cpu_jobs"),
                None
                if rate is None
                else r.number(rate, f"teams[{k}].submit_per_min", positive=True),
            )
    return tuple(teams), limits


def _time_limits(r: ConfigReader, raw: Any) -> dict[str, float]:
    """`default_time_limit_h: {kind: hours}`: a run of a job of that kind that gives no
    limit of its own is stopped after this long."""
    kinds = {k.value for k in JobKind}
    m = r.section(raw, "default_time_limit_h", kinds)
    return {
        str(kind): 3600.0 * r.number(h, f"default_time_limit_h.{kind}", positive=True)
        for kind, h in m.items()
    }


def _windows(r: ConfigReader, raw: Any, names: set[str]) -> tuple[QuotaWindow, ...]:
    windows = []
    for k, item in enumerate(r.entries(raw, "windows", "time windows ({from, to, teams})")):
        m = r.mapping(item, f"windows[{k}]", {"from", "to", "teams"})
        shares = r.section(m.get("teams"), f"windows[{k}].teams", names)
        g: dict[str, float] = {}
        mx: dict[str, float] = {}
        for team, spec in shares.items():
            s = r.mapping(spec, f"windows[{k}].teams.{team}", {"guaranteed", "max"})
            if "guaranteed" in s:
                g[team] = r.number(s["guaranteed"], f"windows[{k}].teams.{team}.guaranteed")
            if "max" in s:
                mx[team] = r.number(s["max"], f"windows[{k}].teams.{team}.max")
        ends = []
        for end, default in (("from", "00:00"), ("to", "24:00")):
            try:
                ends.append(clock_s(str(m.get(end, default))))
            except SpecError as err:
                raise r.fail(f"windows[{k}].{end}", str(err)) from None
        windows.append(QuotaWindow(ends[0], ends[1], g, mx))
    return tuple(windows)


def _placement(r: ConfigReader, raw: Any, d: PlacementConfig) -> PlacementConfig:
    keys = {"gpu_type", "site", "value_of_time_usd_per_h"}
    keys |= {"prefer"}  # by-class: GPU types each job kind prefers
    keys |= {"policy"}  # the placement policy inside a pool
    m = r.section(raw, "placement", keys)
    gpu_type = str(m.get("gpu_type", d.gpu_type))
    if gpu_type not in TYPE_CHOICES:
        raise r.fail("placement.gpu_type", f"{gpu_type!r}; choose one of {', '.join(TYPE_CHOICES)}")
    site = str(m.get("site", d.site))
    if site not in SITE_CHOICES:
        raise r.fail("placement.site", f"{site!r}; choose one of {', '.join(SITE_CHOICES)}")
    vot = r.number(
        m.get("value_of_time_usd_per_h", d.value_of_time_usd_per_h),
        "placement.value_of_time_usd_per_h",
    )
    prefer = _prefer(r, m.get("prefer"), d.prefer)
    policy = str(m.get("policy", d.policy))
    if policy not in PLACEMENT_POLICIES:
        raise r.fail(
            "placement.policy", f"{policy!r}; choose one of {', '.join(PLACEMENT_POLICIES)}"
        )
    return PlacementConfig(gpu_type, site, vot, prefer=prefer, policy=policy)


def _prefer(
    r: ConfigReader, raw: Any, d: Mapping[str, tuple[str, ...]]
) -> Mapping[str, tuple[str, ...]]:
    """placement.prefer: {kind: [GPU type, ...]}, the types a kind prefers first."""
    if raw is None:
        return d
    kinds = {k.value for k in JobKind}
    m = r.section(raw, "placement.prefer", kinds)
    out: dict[str, tuple[str, ...]] = {}
    for kind, types in m.items():
        where = f"placement.prefer.{kind}"
        if not isinstance(types, list) or not all(isinstance(t, str) and t for t in types):
            raise r.fail(where, "a list of GPU type names, e.g. [H100, A100-80GB]")
        out[kind] = tuple(types)
    return out


def _sharing(r: ConfigReader, raw: Any, d: SharingConfig) -> SharingConfig:
    allowed = {"max_sm_util_pct", "util_window_s", "one_team_per_card", "admission"}
    m = r.section(raw, "sharing", allowed)
    bound = m.get("max_sm_util_pct", d.max_sm_util_pct)
    if bound is not None:
        bound = r.number(bound, "sharing.max_sm_util_pct")
        if bound > 100:
            raise r.fail("sharing.max_sm_util_pct", f"{bound:g}; give a percentage 0..100")
    window = r.number(
        m.get("util_window_s", d.util_window_s), "sharing.util_window_s", positive=True
    )
    one_team = m.get("one_team_per_card", d.one_team_per_card)
    if one_team is not None:
        one_team = r.flag(one_team, "sharing.one_team_per_card")
    return SharingConfig(
        bound, window, one_team, parse_admission(r, m.get("admission"), d.admission)
    )


def _share_cap(r: ConfigReader, raw: Mapping[str, Any], d: int | None) -> int | None:
    if "share_cap" not in raw:
        return d
    if raw["share_cap"] is None:
        return None  # no cap: as many online replicas as their shares fit
    return r.integer(raw["share_cap"], "share_cap", 1)


def _energy(r: ConfigReader, raw: Any, d: EnergyConfig) -> EnergyConfig:
    m = r.section(
        raw,
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
            "value_of_time",
            "online_clocks",
        },
    )
    sites = d.site_tariffs
    if "site_tariffs" in m:
        given = m["site_tariffs"]
        sites = r.section(
            given, "energy.site_tariffs", set(given) if isinstance(given, Mapping) else set()
        )
    dt = d.thermal
    t = r.section(
        m.get("thermal"),
        "energy.thermal",
        {"aware", "threshold_c", "inlet_c", "hot_nodes", "hot_inlet_c"},
    )
    thermal = ThermalConfig(
        r.flag(t.get("aware", dt.aware), "energy.thermal.aware"),
        r.number(t.get("threshold_c", dt.threshold_c), "energy.thermal.threshold_c", positive=True),
        r.number(t.get("inlet_c", dt.inlet_c), "energy.thermal.inlet_c", low=-50.0),
        r.integer(t.get("hot_nodes", dt.hot_nodes), "energy.thermal.hot_nodes"),
        r.number(t.get("hot_inlet_c", dt.hot_inlet_c), "energy.thermal.hot_inlet_c", low=-50.0),
    )
    pue = r.number(m.get("pue", d.pue), "energy.pue", positive=True)
    if pue < 1.0:
        raise r.fail("energy.pue", f"{pue} is below 1; PUE is facility power over IT power")
    tariff = m.get("tariff", d.tariff)
    slot_s = d.deferral_slot_s
    if "deferral_slot_min" in m:
        slot_s = 60.0 * r.number(m["deferral_slot_min"], "energy.deferral_slot_min", positive=True)
    margin_s = d.deferral_margin_s
    if "deferral_margin_h" in m:
        margin_s = 3600.0 * r.number(m["deferral_margin_h"], "energy.deferral_margin_h")
    value, by_team, by_kind = (
        d.value_of_time,
        dict(d.team_value_of_time),
        dict(d.kind_value_of_time),
    )
    if "value_of_time" in m:
        value, by_team, by_kind = _value_of_time(r, m["value_of_time"])
    return EnergyConfig(
        tariff=None if tariff is None else str(tariff),
        site_tariffs={str(k): str(v) for k, v in sites.items()},
        pue=pue,
        price_aware=r.flag(m.get("price_aware", d.price_aware), "energy.price_aware"),
        power_capping=r.flag(m.get("power_capping", d.power_capping), "energy.power_capping"),
        deferral_slot_s=slot_s,
        deferral_margin_s=margin_s,
        thermal=thermal,
        value_of_time=value,
        team_value_of_time=by_team,
        kind_value_of_time=by_kind,
        online_clocks=_online_clocks(r, m.get("online_clocks"), d.online_clocks),
    )


def _online_clocks(r: ConfigReader, raw: Any, d: OnlineClocks) -> OnlineClocks:
    """energy.online_clocks: true, false, or {lower_below, raise_above, hold_min}."""
    where = "energy.online_clocks"
    if raw is None:
        return d
    if isinstance(raw, bool):
        return dataclasses.replace(d, enabled=raw)
    m = r.section(raw, where, {"lower_below", "raise_above", "hold_min"})
    low = r.number(m.get("lower_below", d.lower_below), f"{where}.lower_below", positive=True)
    high = r.number(m.get("raise_above", d.raise_above), f"{where}.raise_above", positive=True)
    if not low < high <= 1.0:
        raise r.fail(
            where,
            f"need lower_below < raise_above <= 1 (pressure 1 is the SLO), got {low} and {high}",
        )
    hold_s = d.hold_s
    if "hold_min" in m:
        hold_s = 60.0 * r.number(m["hold_min"], f"{where}.hold_min")
    return OnlineClocks(True, low, high, hold_s)


def _value_of_time(
    r: ConfigReader, raw: Any
) -> tuple[float | None, dict[str, float], dict[str, float]]:
    """energy.value_of_time: a number (the tariff's currency per GPU-hour of delay), null,
    or {default: N, teams: {TEAM: N}, kinds: {KIND: N}}."""
    where = "energy.value_of_time"
    if raw is None or (isinstance(raw, int | float) and not isinstance(raw, bool)):
        return (None if raw is None else r.number(raw, where)), {}, {}
    m = r.section(raw, where, {"default", "teams", "kinds"})
    default = m.get("default")
    given = m.get("teams") or {}
    teams = r.section(given, f"{where}.teams", set(given) if isinstance(given, Mapping) else set())
    kinds = r.section(
        m.get("kinds") or {},
        f"{where}.kinds",
        {k.value for k in JobKind if k is not JobKind.ONLINE},
    )
    return (
        None if default is None else r.number(default, f"{where}.default"),
        {str(t): r.number(v, f"{where}.teams.{t}") for t, v in teams.items()},
        {str(k): r.number(v, f"{where}.kinds.{k}") for k, v in kinds.items()},
    )


def _burst(r: ConfigReader, raw: Any) -> Mapping[str, Any] | None:
    """The burst rules, checked and kept as written (minutes; federation.burst reads them)."""
    if raw is None:
        return None
    m = r.mapping(raw, "burst", BURST_KEYS)
    for key in _SHARES:
        if key in m:
            share = r.number(m[key], f"burst.{key}")
            if share > 1.0:
                raise r.fail(f"burst.{key}", f"{m[key]} is a utilisation: give it in 0..1")
    for key in _MINUTES:
        if key in m:
            r.number(m[key], f"burst.{key}")
    for key in _COUNTS:
        if key in m:
            r.integer(m[key], f"burst.{key}", 1)
    return m

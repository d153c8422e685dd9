"""Scenario simulator: teams on a shared pool, services that autoscale, preemption with
checkpoints, quotas and co-location, driven one scheduling cycle at a time.

Each cycle: arrivals join the queue, services resize to their look-ahead load, the cycle
policy returns a plan, and every command is validated before it is applied. Between
cycles, jobs progress at their co-location speed; preempted jobs write their checkpoint
and leave, and a job waiting on them (a Claim) starts the moment they are gone.

Preemption model (calibrated, shared/calibration): jobs snapshot their state to host
memory every `checkpoint_interval_s` of running time, for free. Preempting a job flushes
its last snapshot to disk (state / 0.45 GB/s, GPUs held meanwhile) and loses the work
since that snapshot. Resuming reads it back (state / 1.2 GB/s) and restarts the process
(5 s), on any GPUs that fit.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from gpupool.core.engine import DecisionLog, Engine
from gpupool.core.lifecycle import TERMINAL, JobState, check_transition
from gpupool.core.model import MILLI_PER_GPU, Cluster, JobKind, JobSpec, Node, Placement
from gpupool.core.quota import QuotaBook
from gpupool.core.state import BoolArray, ClusterState
from gpupool.energy.deferral import DeferrableJob, plan_starts
from gpupool.energy.power import Load, load_of
from gpupool.energy.powercap import SetPowerCap, speed_at
from gpupool.energy.tariff import Tariff, load_tariff
from gpupool.energy.thermal import ThermalModel
from gpupool.errors import PlanRejected, SpecError
from gpupool.federation.burst import BurstController, BurstRules
from gpupool.federation.topology import Topology, parse_topology
from gpupool.policies.consolidate import ConsolidatePolicy
from gpupool.policies.cycle import (
    CYCLE_POLICIES,
    Claim,
    CycleView,
    PendingView,
    Preempt,
    RunningView,
    Start,
)
from gpupool.policies.pool_choice import (
    PoolLoad,
    PoolOption,
    charge,
    choose_across_sites,
    choose_blind,
    choose_cost_aware,
    choose_first,
    pool_loads,
)
from gpupool.policies.power import CapJob, cap_fraction, plan_power_caps
from gpupool.policies.thermal import CoolestFirstPolicy
from gpupool.sim.cloud import CloudFleet
from gpupool.sim.energy_meter import EnergyMeter, HeatMap
from gpupool.sim.generators import GenContext, build_workload, find_traces_dir
from gpupool.sim.scenario_config import ScenarioConfig
from gpupool.sim.workload import ServiceSpec, Workload
from gpupool.sizing.catalog import load_catalog
from gpupool.sizing.planner import sized_options

Progress = Callable[[int, int], None]


@dataclass
class Run:
    spec: JobSpec
    gpu_type: str
    ready_s: float
    state: JobState = JobState.PENDING
    done_s: float = 0.0
    saved_s: float = 0.0
    since_snapshot_s: float = 0.0
    overhead_s: float = 0.0
    run_started_s: float = 0.0
    first_start_s: float | None = None
    end_s: float | None = None
    end_reason: str = ""
    preemptions: int = 0
    lost_work_s: float = 0.0
    run_time_s: float = 0.0
    held_s: float = 0.0
    gpu_s: float = 0.0
    vacate_at: float | None = None
    service: str | None = None
    speed: float = 1.0
    """Work done per second: co-location slowdown times the power cap's."""
    options: tuple[PoolOption, ...] = ()
    """Pools the job could run on (one, unless it may choose a GPU type or site)."""
    cap_frac: float | None = None
    """Power cap as a fraction of TDP while it runs; None: uncapped."""
    cap_speed: float = 1.0
    transfer_s: float = 0.0
    """Time spent moving its dataset to the site it ran at."""


@dataclass
class ServiceStats:
    requests: float = 0.0
    ok: float = 0.0


@dataclass
class ScenarioResult:
    name: str
    summary: dict[str, Any]
    log: DecisionLog
    node_names: tuple[str, ...]
    wall_s: float
    utilization_by_hour: list[float] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)


def _cluster(cfg: ScenarioConfig) -> tuple[Cluster, dict[str, BoolArray], list[str]]:
    nodes: list[Node] = []
    node_pool: list[str] = []
    for pool in cfg.pools:
        prefix = f"{pool.site}-" if pool.site else ""
        for k in range(pool.nodes):
            nodes.append(
                Node(
                    f"{prefix}{pool.gpu_type}-{k:03d}",
                    pool.gpu_type,
                    pool.gpus_per_node,
                    pool.cpu_milli,
                    pool.mem_mib,
                    cluster=pool.site or cfg.name,
                )
            )
            node_pool.append(pool.key)
    masks = {
        pool.key: np.array([key == pool.key for key in node_pool], dtype=np.bool_)
        for pool in cfg.pools
    }
    return Cluster(cfg.name, tuple(nodes)), masks, node_pool


def _islands(cfg: ScenarioConfig, cluster: Cluster) -> dict[str, BoolArray]:
    """Static partitions: each team owns whole nodes covering its guarantee."""
    owned = {t.team: np.zeros(len(cluster.nodes), dtype=np.bool_) for t in cfg.teams}
    for pool in cfg.pools:
        idx = [
            i
            for i, n in enumerate(cluster.nodes)
            if n.cluster in (pool.site, cfg.name) and n.gpu_model == pool.gpu_type
        ]
        cursor = 0
        for team in cfg.teams:
            gpus = team.guaranteed.get(pool.key, 0)
            if gpus % pool.gpus_per_node:
                raise SpecError(
                    f"{cfg.path}: static mode gives teams whole nodes; team {team.team}'s "
                    f"guarantee of {gpus} {pool.gpu_type} is not a multiple of {pool.gpus_per_node}"
                )
            count = gpus // pool.gpus_per_node
            owned[team.team][idx[cursor : cursor + count]] = True
            cursor += count
    return owned


class ScenarioSim:
    def __init__(self, cfg: ScenarioConfig, workload: Workload) -> None:
        self.cfg = cfg
        self.cluster, self.pool_nodes, self.node_pool = _cluster(cfg)
        self.state = ClusterState(self.cluster)
        self.state.share_cap = cfg.share_cap
        self.rng = np.random.default_rng(cfg.seed)
        self.placement: ConsolidatePolicy | CoolestFirstPolicy = ConsolidatePolicy()
        """Where a claimant goes when its victims leave (policies plan the rest)."""
        self.engine = Engine(self.state, self.placement, self.rng)
        self.policy = CYCLE_POLICIES[cfg.policy]()
        pool_gpus = {p.key: p.nodes * p.gpus_per_node for p in cfg.pools}
        self.pool_gpus = pool_gpus
        self.quotas = QuotaBook(cfg.teams, pool_gpus, cfg.windows)
        self.team_nodes = _islands(cfg, self.cluster) if cfg.mode == "static" else None
        self.reserve = {t: math.ceil(cfg.online_reserve * n) for t, n in pool_gpus.items()}
        self.known_teams = {t.team for t in cfg.teams}
        self.runs: dict[str, Run] = {}
        self.active: dict[str, Run] = {}
        self.running: dict[str, Run] = {}
        """Runs holding GPUs: running, or preempted and still writing their checkpoint."""
        self.replicas: dict[str, dict[str, Run]] = defaultdict(dict)
        """Runs not yet in a terminal state: what each cycle looks at."""
        self.queues: dict[str, list[tuple[tuple[object, ...], str]]] = defaultdict(list)
        """Each team's waiting jobs in the policy's order (kept sorted as jobs come and go)."""
        self.queue_depth = cfg.queue_depth
        self.held: dict[tuple[str, str], int] = defaultdict(int)
        """GPUs each (team, GPU type) holds in running jobs; vacating ones excluded."""
        self.arrivals = sorted(workload.jobs, key=lambda j: (j.submit_s, j.job_id))
        self.services = {s.name: s for s in workload.services}
        self.service_stats = {s.name: ServiceStats() for s in workload.services}
        self.replica_seq: dict[str, int] = defaultdict(int)
        self.claims: dict[str, set[str]] = {}
        self.claim_grace: dict[str, float] = {}
        self.claim_nodes: dict[str, tuple[int, ...]] = {}
        self.room_since: dict[tuple[str, str], float] = {}
        """When each (team, GPU type) last got room under its guarantee (a job left)."""
        self.owed_since: dict[str, float] = {}
        self.dirty = True
        """Something the policy looks at changed since its last (empty) plan. Planning is
        pure, so an unchanged view gives the same empty plan: skip it."""
        self.window_since = 0.0
        """When the current quota window began: new guarantees make room too."""
        self._window: object = None
        self.vacates: list[tuple[float, str]] = []
        self.violation_s: dict[str, float] = defaultdict(float)
        self.hour_gpu_s: list[float] = []
        for team in {j.team for j in workload.jobs} | {s.team for s in workload.services}:
            if team not in self.known_teams:
                raise SpecError(f"{cfg.path}: the workload uses team {team!r}, not under teams:")
        self.sized = workload.sized
        self._setup_sites()
        self._setup_energy()

    # ---- sites, prices, energy ----------------------------------------------------------------
    def _setup_sites(self) -> None:
        cfg = self.cfg
        base = Path(cfg.path).parent if cfg.path else Path.cwd()
        override = None if cfg.catalog is None else base / cfg.catalog
        self.catalog = load_catalog(override)
        self.topology: Topology | None = (
            None if cfg.federation is None else parse_topology(cfg.federation, cfg.path)
        )
        self.pool_price: dict[str, float] = {}
        cloud_pools: set[str] = set()
        for pool in cfg.pools:
            price = pool.price_usd_per_gpu_hour
            if price is None and self.topology is not None:
                site = self.topology.site(pool.site)
                price = site.price_usd_per_gpu_hour.get(pool.gpu_type)
                if site.kind == "cloud":
                    cloud_pools.add(pool.key)
            if price is None and pool.gpu_type in self.catalog:
                price = self.catalog[pool.gpu_type].price_usd_per_hour
            self.pool_price[pool.key] = price or 0.0
        self.node_site = tuple(n.cluster for n in self.cluster.nodes)
        self.rejected_remote: set[str] = set()
        self.cloud: CloudFleet | None = None
        if cloud_pools and self.topology is not None:
            nodes = tuple(i for i, key in enumerate(self.node_pool) if key in cloud_pools)
            sites = {cfg.pool(self.node_pool[i]).site for i in nodes}
            spinup = max(self.topology.site(s).spinup_s for s in sites)
            self.cloud = CloudFleet(
                BurstController(self._burst_rules(len(nodes))),
                nodes,
                {i: self.node_pool[i] for i in nodes},
                spinup,
                {i: self.pool_price[self.node_pool[i]] for i in nodes},
            )
            self.cloud.mask_out(self.pool_nodes)

    def _burst_rules(self, max_nodes: int) -> BurstRules:
        raw = dict(self.cfg.burst or {})
        d = BurstRules(max_cloud_nodes=max_nodes)
        return BurstRules(
            util_threshold=float(raw.get("util_threshold", d.util_threshold)),
            sustain_s=60.0 * float(raw.get("sustain_min", d.sustain_s / 60.0)),
            pending_gpu_threshold=int(raw.get("pending_gpus", d.pending_gpu_threshold)),
            pending_sustain_s=60.0
            * float(raw.get("pending_sustain_min", d.pending_sustain_s / 60.0)),
            reclaim_util=float(raw.get("reclaim_util", d.reclaim_util)),
            reclaim_sustain_s=60.0
            * float(raw.get("reclaim_sustain_min", d.reclaim_sustain_s / 60.0)),
            nodes_per_burst=int(raw.get("nodes_per_burst", d.nodes_per_burst)),
            max_cloud_nodes=max_nodes,
        )

    def _setup_energy(self) -> None:
        cfg = self.cfg
        e = cfg.energy
        tdp = np.array(
            [
                self.catalog[n.gpu_model].tdp_w if n.gpu_model in self.catalog else 0.0
                for n in self.cluster.nodes
            ]
        )
        base = Path(cfg.path).parent if cfg.path else Path.cwd()

        def tariff(name: str | None) -> Tariff | None:
            if name is None:
                return None
            local = base / name
            return load_tariff(str(local) if local.suffix in (".yaml", ".yml") else name)

        default = tariff(e.tariff)
        sites = sorted(set(self.node_site))
        tariffs = {s: tariff(e.site_tariffs[s]) if s in e.site_tariffs else default for s in sites}
        cloud_sites = frozenset(
            s
            for s in sites
            if self.topology is not None
            and s in {x.name for x in self.topology.sites}
            and self.topology.site(s).kind == "cloud"
        )
        self.meter = EnergyMeter(self.state, tdp, self.node_site, tariffs, e.pue, cloud_sites)
        self.tariff_of = tariffs
        self.heat: HeatMap | None = None
        th = e.thermal
        if th.aware or th.hot_nodes or e.tariff is not None:
            inlet = np.full(self.state.node_count, th.inlet_c)
            for mask in self.pool_nodes.values():  # hot aisle: the last nodes of each pool
                idx = np.flatnonzero(mask)
                if th.hot_nodes:
                    inlet[idx[-th.hot_nodes :]] = th.hot_inlet_c
            model = ThermalModel.calibrated()
            temps = np.repeat(inlet[:, None], self.state.gpu_left.shape[1], axis=1).astype(float)
            self.heat = HeatMap(model, inlet, th.threshold_c, temps)
            if th.aware:
                self.placement = CoolestFirstPolicy(self.heat.temps_c)
                self.engine.policy = self.placement
        self.deferred: set[str] = set()
        self._deferral_known: set[str] = set()
        self.deferral_due = 0.0
        self.caps: dict[tuple[int, int], SetPowerCap] = {}
        """The power command each card carries out now (absent: the card's defaults)."""
        self.cap_commands = 0

    # ---- helpers ------------------------------------------------------------------------
    def options_for(
        self, job: JobSpec, service: ServiceSpec | None = None
    ) -> tuple[PoolOption, ...]:
        """Every pool the job may run on, with its GPU count and run time there."""
        request = self.sized.get(job.job_id)
        sized: dict[str, tuple[int, float | None]] = {}
        if request is not None:
            types = sorted({p.gpu_type for p in self.cfg.pools if p.gpu_type in self.catalog})
            for name, opt in sized_options(request, self.catalog, types).items():
                if opt.fits and opt.run_s is not None:
                    sized[name] = (opt.count, opt.run_s)
        out = []
        for pool in self.cfg.pools:
            if request is not None:
                if pool.gpu_type not in sized:
                    continue
                count, duration = sized[pool.gpu_type]
            elif job.allows_model(pool.gpu_type):
                count, duration = job.gpu_count, job.duration_s
            else:
                continue
            if count > pool.nodes * pool.gpus_per_node:
                continue
            out.append(
                PoolOption(
                    pool.key, pool.gpu_type, pool.site, count, duration, self.pool_price[pool.key]
                )
            )
        if self.cfg.placement.gpu_type == "first" and request is None and self.topology is None:
            return tuple(out[:1])
        return tuple(out)

    def pool_loads(self) -> dict[str, PoolLoad]:
        """Free GPUs and drain time of every pool, from one pass over the jobs."""
        work: dict[str, float] = defaultdict(float)
        for r in self.running.values():
            if r.spec.duration_s is not None:
                work[r.gpu_type] += r.spec.gpu_count * max(0.0, r.spec.duration_s - r.done_s)
        for q in self.queues.values():
            for _, job_id in q:
                r = self.runs[job_id]
                if r.spec.duration_s is not None:
                    work[r.gpu_type] += r.spec.gpu_count * (r.spec.duration_s - r.done_s)
        return pool_loads(self.state, self.pool_nodes, work)

    def choose(self, run: Run, loads: dict[str, PoolLoad], now: float) -> PoolOption | None:
        options = run.options
        svc = self.services.get(run.service) if run.service is not None else None
        if self.topology is not None:
            choice, decision = choose_across_sites(
                run.spec,
                options,
                loads,
                self.topology,
                now,
                self.cfg.placement.site == "locality-aware",
                svc.user_region if svc is not None else None,
                svc.latency_bound_ms if svc is not None else None,
                self.cfg.placement.value_of_time_usd_per_h,
            )
            if (
                choice is not None
                and choice.rejected_remote
                and run.spec.job_id not in self.rejected_remote
            ):
                self.rejected_remote.add(run.spec.job_id)
                refused = "; ".join(f"{site}: {why}" for site, why in decision.rejected)
                self.engine.note(run.spec.job_id, now, f"remote refused ({refused})")
            if choice is None:
                return None
            return choice.option
        if len(options) == 1 or self.cfg.placement.gpu_type == "first":
            return choose_first(options).option
        if self.cfg.placement.gpu_type == "blind":
            return choose_blind(options, loads).option
        return choose_cost_aware(
            run.spec, options, loads, now, self.cfg.placement.value_of_time_usd_per_h
        ).option

    def retarget(self, run: Run, option: PoolOption) -> None:
        """Point a waiting job at a pool: its GPU count and work become that pool's."""
        if run.gpu_type == option.pool and run.spec.gpu_count == option.gpu_count:
            return
        queued = run.state in (JobState.PENDING, JobState.SUSPENDED) and run.gpu_type
        if queued:
            self.dequeue(run)
        run.spec = replace(
            run.spec,
            gpu_count=option.gpu_count,
            duration_s=option.duration_s,
            gpu_models=frozenset({option.gpu_type}),
        )
        run.gpu_type = option.pool
        self.dirty = True
        if queued:
            self.enqueue(run)

    def rechoose(self, now: float) -> None:
        """Each cycle, waiting jobs that never ran follow capacity to their best pool."""
        movable = [
            r
            for r in self.active.values()
            if len(r.options) > 1 and r.state is JobState.PENDING and r.first_start_s is None
        ]
        if not movable:
            return
        loads = self.pool_loads()
        movable.sort(key=lambda r: (r.ready_s, r.spec.job_id))
        for r in movable[: self.queue_depth * 8]:
            option = self.choose(r, loads, now)
            if option is None:
                continue
            self.retarget(r, option)
            charge(loads, option, self.state, self.pool_nodes)

    def write_s(self, job: JobSpec) -> float:
        return self.cfg.checkpoint.write_s(job.state_gib_per_gpu)

    def submit(self, job: JobSpec, now: float, service: str | None = None) -> None:
        run = Run(job, "", ready_s=job.submit_s if service is None else now, service=service)
        self.runs[job.job_id] = run
        self.active[job.job_id] = run
        self.dirty = True
        if service is not None:
            self.replicas[service][job.job_id] = run
        run.options = self.options_for(job)
        option = None
        if run.options:
            option = (
                self.choose(run, self.pool_loads(), now) if len(run.options) > 1 else run.options[0]
            )
        room = 0
        if option is not None:
            self.retarget(run, option)
            room = self.pool_gpus[option.pool]
            if self.team_nodes is not None:
                island = self.team_nodes[job.team] & self.pool_nodes[option.pool]
                room = int(self.state.gpu_count[island].sum())
        if option is None or run.spec.gpu_count > room:
            why = (
                f"needs {run.spec.gpu_count} GPUs, at most {room} usable"
                if option is not None
                else self._unplaceable_reason(job, run)
            )
            run.state = check_transition(job.job_id, run.state, JobState.UNPLACEABLE)
            run.end_s, run.end_reason = now, why
            self.engine.note(job.job_id, now, "unplaceable")
            del self.active[job.job_id]
            if service is not None:
                self.replicas[service].pop(job.job_id, None)
            return
        self.enqueue(run)

    def _unplaceable_reason(self, job: JobSpec, run: Run) -> str:
        if job.job_id in self.sized:
            return "its model fits no GPU type of this cluster within the GPU counts tried"
        if not run.options:
            return f"allows {sorted(job.gpu_models)}; no such pool"
        return "no site meets its latency bound"

    def enqueue(self, run: Run) -> None:
        bisect.insort(
            self.queues[run.spec.team],
            (self.policy.queue_key(run.spec, run.ready_s), run.spec.job_id),
        )

    def dequeue(self, run: Run) -> None:
        queue = self.queues[run.spec.team]
        entry = (self.policy.queue_key(run.spec, run.ready_s), run.spec.job_id)
        k = bisect.bisect_left(queue, entry)
        if k < len(queue) and queue[k] == entry:
            queue.pop(k)

    def start(
        self, run: Run, plan_start: Start | None, now: float, nodes: tuple[int, ...] = ()
    ) -> bool:
        job = run.spec
        if plan_start is None:
            allowed = self.pool_nodes[run.gpu_type].copy()
            if self.team_nodes is not None:
                allowed &= self.team_nodes[job.team]
            placement = None
            if nodes:
                held = np.zeros_like(allowed)
                held[list(nodes)] = True
                placement = self.placement.place(self.state, job, self.rng, allowed & held)
            if placement is None:
                placement = self.placement.place(self.state, job, self.rng, allowed)
            if placement is None:
                return False
        else:
            placement = plan_start.placement
        usage = self.usage(job.team, run.gpu_type)
        if usage + job.gpu_count > self.quotas.maximum(job.team, run.gpu_type, now):
            raise PlanRejected(f"job {job.job_id}: team {job.team} would exceed its maximum")
        resumed = run.state is JobState.SUSPENDED
        self.engine.apply(job, placement, now, "resume" if resumed else "start")
        self.dequeue(run)
        self.owed_since.pop(job.job_id, None)
        run.state = check_transition(job.job_id, run.state, JobState.RUNNING)
        self.held[(job.team, run.gpu_type)] += job.gpu_count
        self.running[job.job_id] = run
        self.dirty = True
        run.speed = self.speed_of(run)
        run.run_started_s = now
        run.since_snapshot_s = 0.0
        run.overhead_s = (
            self.cfg.checkpoint.resume_s(job.state_gib_per_gpu)
            if resumed
            else self.cfg.checkpoint.process_start_s
        )
        if run.first_start_s is None:
            run.first_start_s = now
            run.transfer_s = self.transfer_s(run)
            run.overhead_s += run.transfer_s
        return True

    def transfer_s(self, run: Run) -> float:
        """Moving the job's dataset to the site it starts at, with its GPUs held."""
        job = run.spec
        if self.topology is None or job.dataset is None or job.dataset_gb <= 0:
            return 0.0
        site = self.cfg.pool(run.gpu_type).site
        return self.topology.transfer_s(job.dataset, site, job.dataset_gb)

    def usage(self, team: str, gpu_type: str) -> int:
        return self.held.get((team, gpu_type), 0)

    def preempt(
        self,
        run: Run,
        reason: str,
        now: float,
        reclaim: bool = False,
        for_online_of: str | None = None,
    ) -> None:
        job = run.spec
        above = self.usage(job.team, run.gpu_type) > self.quotas.guaranteed(
            job.team, run.gpu_type, now
        )
        self.cfg.preemption.check(
            job, run.preemptions, above, now - run.run_started_s, reclaim, for_online_of
        )
        run.state = check_transition(job.job_id, run.state, JobState.PREEMPTING)
        self.held[(job.team, run.gpu_type)] -= job.gpu_count
        self.room_since[(job.team, run.gpu_type)] = now
        self.dirty = True
        run.preemptions += 1
        lost = run.done_s - run.saved_s
        run.lost_work_s += lost
        run.done_s = run.saved_s
        run.vacate_at = now + self.write_s(job)
        heapq.heappush(self.vacates, (run.vacate_at, job.job_id))
        self.engine.note(job.job_id, now, f"preempt ({reason}; loses {lost:.0f}s)")

    def vacate(self, run: Run, at: float) -> None:
        self.engine.release(run.spec.job_id, at, "suspend")
        self.running.pop(run.spec.job_id, None)
        self.dirty = True
        run.state = check_transition(run.spec.job_id, run.state, JobState.SUSPENDED)
        run.vacate_at = None
        run.ready_s = at
        self.enqueue(run)
        for claimant, victims in list(self.claims.items()):
            victims.discard(run.spec.job_id)
            if not victims:
                del self.claims[claimant]
                waiting = self.runs[claimant]
                if waiting.state in (JobState.PENDING, JobState.SUSPENDED):
                    self.start(waiting, None, at, self.claim_nodes.pop(claimant, ()))
                    self.advance(waiting, at, self.cycle_end)

    def finish(self, run: Run, at: float, state: JobState, reason: str) -> None:
        job_id = run.spec.job_id
        if run.state is JobState.RUNNING:
            self.held[(run.spec.team, run.gpu_type)] -= run.spec.gpu_count
            self.room_since[(run.spec.team, run.gpu_type)] = at
        elif run.state in (JobState.PENDING, JobState.SUSPENDED):
            self.dequeue(run)
        if run.state in (JobState.RUNNING, JobState.PREEMPTING):
            self.engine.release(job_id, at, "finish" if state is JobState.FINISHED else "stop")
        if run.state is JobState.PREEMPTING:
            run.state = check_transition(job_id, run.state, JobState.SUSPENDED)
        run.state = check_transition(job_id, run.state, state)
        run.end_s, run.end_reason = at, reason
        self.dirty = True
        self.active.pop(job_id, None)
        self.running.pop(job_id, None)
        if run.service is not None:
            self.replicas[run.service].pop(job_id, None)

    # ---- progress -------------------------------------------------------------------------
    def speed_of(self, run: Run) -> float:
        placement = self.state.placements.get(run.spec.job_id)
        if placement is None or run.spec.gpu_milli == MILLI_PER_GPU:
            return run.cap_speed  # a whole GPU is never shared
        speed = run.cap_speed
        for share in placement.shares:
            for g in share.gpus:
                sharers = int(
                    self.state.online_on_gpu[share.node, g] + self.state.other_on_gpu[share.node, g]
                )
                speed = min(speed, self.cfg.colocation.speed(run.spec.kind, sharers))
        return speed

    def advance(self, run: Run, a: float, b: float) -> float | None:
        """Run from a to b; return the finish time if the work completes."""
        if run.state is not JobState.RUNNING or b <= a:
            return None
        t = a
        if run.overhead_s > 0:
            use = min(b - t, run.overhead_s)
            run.overhead_s -= use
            t += use
        if t >= b or run.spec.duration_s is None:
            self.charge(run, a, t - a, b - t)
            self.account(run, a, b)
            return None
        span = b - t
        need = (run.spec.duration_s - run.done_s) / run.speed
        step = min(span, need)
        self.charge(run, a, t - a, step)
        run.done_s += step * run.speed
        run.run_time_s += step
        run.since_snapshot_s += step
        interval = run.spec.checkpoint_interval_s
        if run.since_snapshot_s >= interval:
            run.since_snapshot_s %= interval
            run.saved_s = run.done_s - run.since_snapshot_s * run.speed
        if need <= span:
            self.account(run, a, t + need)
            return t + need
        self.account(run, a, b)
        return None

    def charge(self, run: Run, t: float, idle_s: float, busy_s: float) -> None:
        placement = self.state.placements.get(run.spec.job_id)
        if placement is None:
            return
        share = run.spec.gpu_milli / MILLI_PER_GPU
        for part in placement.shares:
            self.meter.charge_job(
                run.spec.job_id,
                run.spec.team,
                part.node,
                len(part.gpus) * share,
                run.spec.kind,
                run.cap_frac,
                t,
                idle_s,
                busy_s,
            )

    def account(self, run: Run, a: float, b: float) -> None:
        run.held_s += max(0.0, b - a)
        lo, hi = max(a, 0.0), min(b, self.cfg.horizon_s)
        if hi > lo:
            run.gpu_s += run.spec.gpu_count * (hi - lo) * run.spec.gpu_milli / MILLI_PER_GPU

    # ---- services ---------------------------------------------------------------------------
    def replicas_needed(self, svc: ServiceSpec, load_rps: float, shared: bool) -> int:
        speed = self.cfg.colocation.speed(JobKind.ONLINE, self.cfg.share_cap) if shared else 1.0
        want = math.ceil(load_rps * self.cfg.autoscale_headroom / (svc.replica_rps * speed) - 1e-9)
        return min(max(want, svc.min_replicas), svc.max_replicas)

    def sharing_pays(self, svc: ServiceSpec, load_rps: float) -> bool:
        """Pack a service's replicas onto shared GPUs only where the model says it helps:
        the p99 next to `share_cap - 1` neighbours still meets the SLO, and the GPUs the
        shared replicas take (slowed by time-slicing) are fewer than whole-GPU replicas."""
        if svc.replica_gpu_milli >= MILLI_PER_GPU:
            return False
        p99 = svc.base_p99_ms * self.cfg.colocation.online_p99_factor(
            [JobKind.ONLINE] * (self.cfg.share_cap - 1)
        )
        if p99 > svc.slo_p99_ms:
            return False
        shared_gpus = self.replicas_needed(svc, load_rps, True) * svc.replica_gpu_milli / 1000
        return shared_gpus < self.replicas_needed(svc, load_rps, False)

    def autoscale(self, now: float) -> None:
        for svc in self.services.values():
            peak = svc.load.peak(now, now + self.cfg.autoscale_lookahead_s, self.cfg.cycle_s)
            shared = self.sharing_pays(svc, peak)
            want = self.replicas_needed(svc, peak, shared)
            mine = list(self.replicas[svc.name].values())
            if len(mine) < want:
                for _ in range(want - len(mine)):
                    self.replica_seq[svc.name] += 1
                    job = JobSpec(
                        job_id=f"{svc.name}-r{self.replica_seq[svc.name]}",
                        gpu_count=1,
                        gpu_milli=svc.replica_gpu_milli if shared else MILLI_PER_GPU,
                        gpu_models=svc.gpu_models,
                        team=svc.team,
                        priority=svc.priority,
                        kind=JobKind.ONLINE,
                        submit_s=now,
                    )
                    self.submit(job, now, service=svc.name)
            elif len(mine) > want:
                # drop waiting replicas first, then the youngest running ones
                # waiting replicas first, then those on the emptiest nodes, so that the
                # GPUs freed join other free GPUs instead of leaving holes
                mine.sort(key=lambda r: (r.state is JobState.RUNNING, -self.node_free(r)))
                for r in mine[: len(mine) - want]:
                    self.claims.pop(r.spec.job_id, None)
                    self.finish(r, now, JobState.CANCELLED, "scaled down")

    def serve(self, now: float, end: float) -> None:
        """Requests in [now, end] served within the SLO, per service."""
        dt = end - now
        for svc in self.services.values():
            load = svc.load.at(now + dt / 2)
            stats = self.service_stats[svc.name]
            stats.requests += load * dt
            capacity = 0.0
            for r in self.replicas[svc.name].values():
                if r.state is not JobState.RUNNING:
                    continue
                ready = max(0.0, dt - r.overhead_s) if r.run_started_s >= now - 1e-9 else dt
                neighbours = self.neighbour_kinds(r)
                p99 = svc.base_p99_ms * self.cfg.colocation.online_p99_factor(neighbours)
                p99 += self.network_ms(svc, r)
                if p99 > svc.slo_p99_ms:
                    continue
                capacity += svc.replica_rps * r.speed * ready
            stats.ok += min(load * dt, capacity)

    def network_ms(self, svc: ServiceSpec, run: Run) -> float:
        """Round trip from the service's users to the site a replica runs at."""
        if self.topology is None or svc.user_region is None:
            return 0.0
        return self.topology.latency_ms(svc.user_region, self.cfg.pool(run.gpu_type).site)

    def node_free(self, run: Run) -> int:
        placement = self.state.placements.get(run.spec.job_id)
        if placement is None:
            return 0
        return int(self.state.whole_free[placement.shares[0].node])

    def neighbour_kinds(self, run: Run) -> list[JobKind]:
        placement = self.state.placements.get(run.spec.job_id)
        if placement is None:
            return []
        kinds: list[JobKind] = []
        for share in placement.shares:
            for g in share.gpus:
                kinds += [JobKind.ONLINE] * (int(self.state.online_on_gpu[share.node, g]) - 1)
                kinds += [JobKind.TRAINING] * int(self.state.other_on_gpu[share.node, g])
        return kinds

    # ---- guarantees -------------------------------------------------------------------------
    def owed_starts(self, now: float) -> dict[str, list[tuple[float, Run]]]:
        """Waiting jobs that fit inside their team's guarantee, with the time each is owed
        a start by: one cycle plus its victims' checkpoint time after it became runnable."""
        owed: dict[str, list[tuple[float, Run]]] = defaultdict(list)
        waiting: dict[tuple[str, str], list[Run]] = defaultdict(list)
        for r in self.visible(now):
            waiting[(r.spec.team, r.gpu_type)].append(r)
        previous, self.owed_since = self.owed_since, {}
        for (team, gpu_type), runs in waiting.items():
            room = self.quotas.guaranteed(team, gpu_type, now) - self.usage(team, gpu_type)
            for r in runs:  # queue order: what the team would run first is owed first
                job_id = r.spec.job_id
                if r.spec.gpu_count > room:
                    continue
                room -= r.spec.gpu_count
                since = previous.get(job_id)
                if since is None:
                    # owed from when it was runnable and its team had room for it
                    since = max(
                        r.ready_s, self.room_since.get((team, gpu_type), 0.0), self.window_since
                    )
                self.owed_since[job_id] = since
                grace = self.cfg.cycle_s + self.claim_grace.get(job_id, 0.0)
                owed[team].append((since + grace, r))
        return owed

    def check_guarantees(
        self, owed: dict[str, list[tuple[float, Run]]], now: float, end: float
    ) -> None:
        """Time in [now, end] a team spends with an owed start overdue (after the cycle ran,
        so starts at a victim's vacate time count)."""
        for team, items in owed.items():
            spans = []
            for deadline, r in items:
                started = r.state is JobState.RUNNING and r.run_started_s >= now
                until = r.run_started_s if started else end
                lo = max(deadline, now)
                if until > lo:
                    spans.append((lo, until))
            covered, reach = 0.0, now
            for lo, hi in sorted(spans):
                lo = max(lo, reach)
                if hi > lo:
                    covered += hi - lo
                    reach = hi
            self.violation_s[team] += covered

    # ---- the loop ---------------------------------------------------------------------------
    def run(self, progress: Progress | None = None) -> None:
        cfg = self.cfg
        now = 0.0
        nxt = 0
        cycles = math.ceil(cfg.horizon_s / cfg.cycle_s)
        for k in range(cycles):
            now = k * cfg.cycle_s
            self.cycle_end = min(now + cfg.cycle_s, cfg.horizon_s)
            while nxt < len(self.arrivals) and self.arrivals[nxt].submit_s <= now:
                self.submit(self.arrivals[nxt], now)
                nxt += 1
            window = self.quotas.window(now)
            if window is not self._window:
                self._window, self.window_since = window, now
                self.dirty = True
            if self.cloud is not None:
                self.burst_tick(now)
            self.autoscale(now)
            self.rechoose(now)
            if cfg.energy.price_aware:
                self.defer(now)
            if self.dirty:
                self.dirty = False
                self.apply(self.policy.plan(self.view(now)), now)
            if cfg.energy.power_capping or cfg.energy.thermal.aware:
                self.set_power_caps(now)
            for r in self.running.values():
                if r.state is JobState.RUNNING and r.spec.gpu_milli < MILLI_PER_GPU:
                    r.speed = self.speed_of(r)
            self.serve(now, self.cycle_end)
            owed = self.owed_starts(now)
            self.step(now, self.cycle_end)
            self.check_guarantees(owed, now, self.cycle_end)
            self.meter_tick(now, self.cycle_end - now)
            usage: dict[str, float] = defaultdict(float)
            for r in self.running.values():
                usage[r.spec.team] += r.spec.gpu_count
            self.quotas.record_usage(usage, cfg.cycle_s)
            hour = int(now // 3600)
            while len(self.hour_gpu_s) <= hour:
                self.hour_gpu_s.append(0.0)
            self.hour_gpu_s[hour] += sum(usage.values()) * (self.cycle_end - now)
            if progress is not None and (k % max(1, cycles // 100) == 0 or k == cycles - 1):
                progress(k + 1, cycles)
        end = cfg.horizon_s
        for r in sorted(self.active.values(), key=lambda r: r.spec.job_id):
            if r.service is not None:
                self.finish(r, end, JobState.CANCELLED, "scenario ended (service replica)")
            elif r.state is JobState.PENDING and r.first_start_s is None:
                self.finish(r, end, JobState.CANCELLED, "scenario ended before it could start")
            else:
                self.finish(r, end, JobState.CANCELLED, "scenario ended before it finished")
        for job in self.arrivals[nxt:]:
            self.submit(job, end)
            r = self.runs[job.job_id]
            if r.state not in TERMINAL:
                self.finish(r, end, JobState.CANCELLED, "submitted after the scenario ended")

    # ---- energy, heat, clouds -----------------------------------------------------------------
    def up_nodes(self) -> BoolArray:
        if self.cloud is None:
            return np.ones(self.state.node_count, dtype=np.bool_)
        return self.cloud.up_mask(self.state.node_count)

    def working(self) -> Iterator[tuple[Run, Placement]]:
        """Running jobs (not those writing their checkpoint) with where they run."""
        for r in self.running.values():
            placement = self.state.placements.get(r.spec.job_id)
            if r.state is JobState.RUNNING and placement is not None:
                yield r, placement

    def meter_tick(self, now: float, dt: float) -> None:
        """Idle draw of what nobody holds, and the cards' temperatures, over one cycle.
        Charged from the state at the cycle's end: jobs that finished within it leave their
        GPUs idle for the whole cycle (a cycle at most of idle power, per job)."""
        up = self.up_nodes()
        self.meter.charge_idle(now, dt, up)
        if self.heat is None:
            return
        tdp = self.meter.tdp_w
        idle_w = self.meter.power.gpu_power_w(1.0, Load.IDLE)
        real = self.state.gpu_left >= 0
        power = np.where(real & up[:, None], idle_w * tdp[:, None], 0.0)
        for r, placement in self.working():
            share = r.spec.gpu_milli / MILLI_PER_GPU
            for part in placement.shares:
                extra = self.meter.job_power_w(part.node, r.spec.kind, r.cap_frac)
                extra -= idle_w * tdp[part.node]
                for g in part.gpus:
                    power[part.node, g] += share * extra
        idle = real & up[:, None] & (self.state.gpu_left == MILLI_PER_GPU)
        self.heat.step(power, dt, idle, self.state.model_id)
        if isinstance(self.placement, CoolestFirstPolicy):
            self.placement.temps_c = self.heat.temps_c

    def burst_tick(self, now: float) -> None:
        assert self.cloud is not None
        onprem = np.ones(self.state.node_count, dtype=np.bool_)
        onprem[list(self.cloud.nodes)] = False
        gpus = int(self.state.gpu_count[onprem].sum())
        free = int(self.state.whole_free[onprem].sum())
        util = (gpus - free) / gpus if gpus else 0.0
        cloud_pools = set(self.cloud.pool_of.values())
        waiting = sum(
            r.spec.gpu_count
            for r in self.active.values()
            if r.state in (JobState.PENDING, JobState.SUSPENDED)
            and r.gpu_type not in cloud_pools
            and r.spec.job_id not in self.deferred
        )
        pending = max(0, waiting - free)
        events = self.cloud.tick(now, self.cfg.cycle_s, self.state, self.pool_nodes, util, pending)
        for ev in events:
            self.engine.note(
                f"cloud-{ev.action}", now, f"{ev.action} {ev.nodes} node(s): {ev.reason}"
            )
            self.dirty = True

    def defer(self, now: float) -> None:
        """Hold deadline-bound work for cheaper hours (energy.price_aware), re-planned at
        each slot boundary or when the deferrable set changes."""
        e = self.cfg.energy
        kinds = (JobKind.TRAINING, JobKind.OFFLINE, JobKind.BATCH)
        waiting = [
            r
            for r in self.active.values()
            if r.state in (JobState.PENDING, JobState.SUSPENDED)
            and r.spec.deadline_s is not None
            and r.spec.kind in kinds
        ]
        ids = {r.spec.job_id for r in waiting}
        if now < self.deferral_due and ids <= self.deferred | self._deferral_known:
            self.deferred &= ids
            return
        self.deferral_due = (now // e.deferral_slot_s + 1) * e.deferral_slot_s
        self._deferral_known = ids
        before = set(self.deferred)
        self.deferred = set()
        by_pool: dict[str, list[Run]] = defaultdict(list)
        for r in waiting:
            by_pool[r.gpu_type].append(r)
        for pool, runs in by_pool.items():
            tariff = self.tariff_of.get(self.site_of(pool))
            if tariff is None:
                continue
            capacity = int(self.state.gpu_count[self.pool_nodes[pool]].sum())
            busy: list[tuple[int, float]] = []
            for r in self.running.values():
                if r.gpu_type == pool:
                    left = ((r.spec.duration_s or 0.0) - r.done_s) / max(r.speed, 1e-9)
                    busy.append((r.spec.gpu_count, now + left + r.overhead_s))
            for r in self.active.values():  # waiting work that is not deferrable runs first
                if (
                    r.gpu_type == pool
                    and r.state in (JobState.PENDING, JobState.SUSPENDED)
                    and r.spec.job_id not in ids
                ):
                    busy.append((r.spec.gpu_count, now + (r.spec.duration_s or 0.0)))
            waits: dict[int, float] = {}
            width = self.state.max_gpus_per_node
            longest = max(
                (r.spec.duration_s or 0.0 for r in self.running.values() if r.gpu_type == pool),
                default=0.0,
            )
            for r in runs:
                if r.spec.gpu_count not in waits:
                    wait = self.fit_wait_s(pool, r.spec.gpu_count, now)
                    if r.spec.gpu_count >= width:
                        wait = max(wait, longest)
                    waits[r.spec.gpu_count] = wait
            # A job's run counts the wait for GPUs of its shape, so that it is forced early
            # enough to get them by its latest start. A job that needs whole nodes may have
            # to wait for a node to drain whatever starts before it: the longest job
            # running there bounds that wait (forced jobs start before any other).
            jobs = [
                DeferrableJob(
                    r.spec.job_id,
                    r.spec.gpu_count,
                    ((r.spec.duration_s or 0.0) - r.done_s)
                    + self.restart_s(r)
                    + waits[r.spec.gpu_count],
                    r.ready_s,
                    float(r.spec.deadline_s or 0.0),
                )
                for r in runs
            ]
            plan = plan_starts(
                now,
                jobs,
                capacity,
                busy,
                tariff.price_at,
                slot_s=e.deferral_slot_s,
                margin_s=e.deferral_margin_s,
            )
            held = {r.spec.job_id for r in runs} - set(plan.start_now)
            if plan.forced:
                # Jobs out of slack go first: what merely got cheap waits until they run,
                # so a job moved for price never loses its GPUs to one that could wait.
                held |= set(plan.start_now) - set(plan.forced)
            self.deferred |= held
        if self.deferred != before:
            self.dirty = True

    def fit_wait_s(self, pool: str, gpus: int, now: float) -> float:
        """How long until running work frees GPUs of this shape in the pool: `gpus` on one
        node, or that many whole nodes for a wider job (from the running jobs' ends)."""
        ends: dict[int, list[tuple[float, int]]] = defaultdict(list)
        for r in self.running.values():
            placement = self.state.placements.get(r.spec.job_id)
            if r.gpu_type != pool or placement is None:
                continue
            left = ((r.spec.duration_s or 0.0) - r.done_s) / max(r.speed, 1e-9) + r.overhead_s
            if r.vacate_at is not None:
                left = r.vacate_at - now
            for part in placement.shares:
                ends[part.node].append((max(0.0, left), len(part.gpus)))
        width = self.state.max_gpus_per_node
        need, nodes_needed = (gpus, 1) if gpus <= width else (width, math.ceil(gpus / width))
        times = []
        for n in np.flatnonzero(self.pool_nodes[pool]).tolist():
            free = int(self.state.whole_free[n])
            if int(self.state.gpu_count[n]) < need:
                continue
            t = 0.0
            for end, count in sorted(ends.get(n, [])):
                if free >= need:
                    break
                free += count
                t = end
            times.append(t)
        times.sort()
        return times[nodes_needed - 1] if len(times) >= nodes_needed else 0.0

    def restart_s(self, run: Run) -> float:
        if run.state is JobState.SUSPENDED:
            return self.cfg.checkpoint.resume_s(run.spec.state_gib_per_gpu)
        return self.cfg.checkpoint.process_start_s + self.transfer_s(run)

    def set_power_caps(self, now: float) -> None:
        """The core's SetPowerCap plan, carried out on the simulated cards."""
        e = self.cfg.energy
        jobs = []
        for r, placement in self.working():
            gpus = tuple((p.node, g) for p in placement.shares for g in p.gpus)
            left = ((r.spec.duration_s or 0.0) - r.done_s) / max(r.speed, 1e-9) * r.cap_speed
            jobs.append(
                CapJob(
                    r.spec.job_id,
                    r.spec.kind,
                    gpus,
                    float(self.meter.tdp_w[gpus[0][0]]) if gpus else 0.0,
                    r.spec.deadline_s,
                    left + r.overhead_s,
                )
            )
        site_price = {}
        for site, tariff in self.tariff_of.items():
            site_price[site] = (
                (tariff.price_at(now), tariff.mean_price()) if tariff is not None else None
            )
        hot: dict[tuple[int, int], float] = {}
        if e.thermal.aware and self.heat is not None:
            # A card is capped when it runs hot or would settle above the threshold at its
            # job's power: to the power whose steady temperature sits 2 C under it.
            model, limit_c = self.heat.model, e.thermal.threshold_c - 2.0
            for job in jobs:
                for n, g in job.gpus:
                    inlet = float(self.heat.inlet_c[n])
                    draw = self.meter.job_power_w(n, job.kind, None)
                    if (
                        self.heat.temps_c[n, g] > limit_c
                        or inlet + draw * model.r_c_per_w > limit_c
                    ):
                        hot[(n, g)] = max(0.0, (limit_c - inlet) / model.r_c_per_w)
        commands = plan_power_caps(
            jobs,
            now,
            {n: site_price.get(self.node_site[n]) for n in range(self.state.node_count)},
            hot,
            price_capping=e.power_capping,
        )
        held = {(c.node, c.gpu) for c in commands}
        for key in [k for k in self.caps if k not in held]:  # cards whose job left: reset
            del self.caps[key]
            self.cap_commands += 1
        for c in commands:
            key = (c.node, c.gpu)
            if c.is_reset:
                if self.caps.pop(key, None) is not None:
                    self.cap_commands += 1
            elif self.caps.get(key) != c:
                self.caps[key] = c
                self.cap_commands += 1
        for r, placement in self.working():
            load = load_of(r.spec.kind)
            tdp = float(self.meter.tdp_w[placement.shares[0].node])
            fracs = [
                cap_fraction(cmd, load, tdp)
                for cmd in (self.caps.get((p.node, g)) for p in placement.shares for g in p.gpus)
                if cmd is not None
            ]
            frac = min((f for f in fracs if f is not None), default=None)
            if frac != r.cap_frac:
                r.cap_frac = frac
                r.cap_speed = 1.0 if frac is None else speed_at(load, frac)
                r.speed = self.speed_of(r)

    def step(self, now: float, end: float) -> None:
        events: list[tuple[float, int, str]] = []
        for job_id, r in list(self.running.items()):
            if r.state is JobState.RUNNING:
                done = self.advance(r, now, end)
                if done is not None:
                    events.append((done, 1, job_id))
            elif r.state is JobState.PREEMPTING:
                upto = end if r.vacate_at is None else min(end, r.vacate_at)
                self.charge(r, now, max(0.0, upto - now), 0.0)
                self.account(r, now, upto)
        while self.vacates and self.vacates[0][0] <= end:
            at, job_id = heapq.heappop(self.vacates)
            events.append((at, 0, job_id))
        for at, kind, job_id in sorted(events):
            r = self.runs[job_id]
            if kind == 0 and r.state is JobState.PREEMPTING:
                self.vacate(r, at)
            elif kind == 1 and r.state is JobState.RUNNING:
                self.finish(r, at, JobState.FINISHED, "completed")

    def visible(self, now: float) -> list[Run]:
        """The waiting jobs a cycle considers: the head of each team's queue, plus (further
        back) jobs small enough for the room left under the team's guarantee, so that a
        queue headed by big borrowing jobs cannot hide what the team is owed."""
        out: list[Run] = []
        depth = self.queue_depth
        deferred = self.deferred
        for team, queue in self.queues.items():
            if deferred:
                queue = [e for e in queue if e[1] not in deferred]
            head = [self.runs[job_id] for _, job_id in queue[:depth]]
            out += head
            extra = 0
            for _, job_id in queue[depth : depth * 16]:
                r = self.runs[job_id]
                room = self.quotas.guaranteed(team, r.gpu_type, now) - self.usage(team, r.gpu_type)
                if r.spec.gpu_count <= room:
                    out.append(r)
                    extra += 1
                    if extra >= depth:
                        break
        return out

    def view(self, now: float) -> CycleView:
        running: dict[str, RunningView] = {}
        pending: list[PendingView] = []
        vacating: set[str] = set()
        for job_id, r in self.running.items():
            if r.state is JobState.PREEMPTING:
                vacating.add(job_id)
            rate = max(r.speed, 1e-9)
            left = ((r.spec.duration_s or math.inf) - r.done_s) / rate + r.overhead_s
            running[job_id] = RunningView(
                spec=r.spec,
                gpu_type=r.gpu_type,
                run_started_s=r.run_started_s,
                preemptions=r.preemptions,
                vacate_s=self.write_s(r.spec),
                lost_work_s=r.done_s - r.saved_s,
                resume_s=self.cfg.checkpoint.resume_s(r.spec.state_gib_per_gpu),
                est_end_s=now + left,
            )
        for r in self.visible(now):
            pending.append(
                PendingView(r.spec, r.gpu_type, r.ready_s, self.write_s(r.spec), r.preemptions)
            )
        return CycleView(
            now_s=now,
            cycle_s=self.cfg.cycle_s,
            state=self.state,
            running=running,
            pending=pending,
            claimed=frozenset(self.claims),
            vacating=frozenset(vacating),
            quotas=self.quotas,
            pool_nodes=self.pool_nodes,
            team_nodes=self.team_nodes,
            reserve=self.reserve,
            rules=self.cfg.preemption,
            rng=self.rng,
            placement=self.placement,
        )

    def apply(self, commands: list[Start | Preempt | Claim], now: float) -> None:
        for c in commands:
            run = self.runs.get(c.job_id)
            if run is None:
                raise PlanRejected(f"the plan names an unknown job {c.job_id}")
            if isinstance(c, Start):
                if (
                    self.claims.pop(c.job_id, None) is not None
                ):  # GPUs freed before its victims left
                    self.claim_nodes.pop(c.job_id, None)
                    self.claim_grace.pop(c.job_id, None)
                self.start(run, c, now)
            elif isinstance(c, Preempt):
                self.preempt(run, c.reason, now, c.reclaim, c.for_online_of)
            else:
                victims = {v for v in c.victims if self.runs[v].state is JobState.PREEMPTING}
                if victims:
                    self.claims[c.job_id] = victims
                    self.claim_nodes[c.job_id] = c.nodes
                    self.claim_grace[c.job_id] = max(
                        self.write_s(self.runs[v].spec) for v in victims
                    )
                else:
                    self.start(run, None, now)

    # ---- results ------------------------------------------------------------------------------
    def summary(self, wall_s: float) -> dict[str, Any]:
        cfg = self.cfg
        jobs = [r for r in self.runs.values() if r.service is None]
        total_gpu_s = sum(self.pool_gpus.values()) * cfg.horizon_s
        used = sum(r.gpu_s for r in self.runs.values())

        def stats(rs: list[Run]) -> dict[str, Any]:
            fin = [r for r in rs if r.state is JobState.FINISHED]
            jct = np.array([r.end_s - r.spec.submit_s for r in fin if r.end_s is not None])
            queue = np.array(
                [(r.end_s - r.spec.submit_s) - r.held_s for r in fin if r.end_s is not None]
            )
            return {
                "jobs": len(rs),
                "finished": len(fin),
                "gpu_hours": round(sum(r.gpu_s for r in rs) / 3600, 1),
                "avg_jct_h": round(float(jct.mean()) / 3600, 3) if jct.size else None,
                "p99_jct_h": round(float(np.percentile(jct, 99)) / 3600, 3) if jct.size else None,
                "avg_queue_h": round(float(queue.mean()) / 3600, 3) if queue.size else None,
                "preemptions": sum(r.preemptions for r in rs),
                "lost_work_gpu_h": round(
                    sum(r.lost_work_s * r.spec.gpu_count for r in rs) / 3600, 2
                ),
            }

        requests = sum(s.requests for s in self.service_stats.values())
        ok = sum(s.ok for s in self.service_stats.values())
        online_jobs = [r for r in jobs if r.spec.kind is JobKind.ONLINE]
        job_slo = self.online_job_slo(online_jobs)
        parts = [x for x in ((ok / requests) if requests else None, job_slo) if x is not None]
        teams: dict[str, Any] = {}
        for team in sorted(self.known_teams):
            mine = [r for r in jobs if r.spec.team == team]
            svc = [s for s in self.services.values() if s.team == team]
            t_req = sum(self.service_stats[s.name].requests for s in svc)
            t_ok = sum(self.service_stats[s.name].ok for s in svc)
            replicas_gpu_s = sum(
                r.gpu_s for r in self.runs.values() if r.service is not None and r.spec.team == team
            )
            entry = stats(mine)
            entry["gpu_hours"] = round((sum(r.gpu_s for r in mine) + replicas_gpu_s) / 3600, 1)
            entry["utilization"] = round(entry["gpu_hours"] * 3600 / total_gpu_s, 4)
            entry["online_slo_attainment"] = round(t_ok / t_req, 5) if t_req else None
            entry["guarantee_violation_s"] = round(self.violation_s.get(team, 0.0), 1)
            entry["by_kind"] = {
                kind.value: stats([r for r in mine if r.spec.kind is kind])
                for kind in JobKind
                if any(r.spec.kind is kind for r in mine)
            }
            teams[team] = entry
        ended = {s: sum(1 for r in jobs if r.state is s) for s in JobState}
        for team in teams:
            teams[team].update(self.meter.teams[team].rounded())
        return self.resource_summary(jobs) | {
            "scenario": cfg.name,
            "mode": cfg.mode,
            "policy": cfg.policy,
            "jobs_submitted": len(jobs),
            "jobs_finished": ended[JobState.FINISHED],
            "jobs_cancelled": ended[JobState.CANCELLED],
            "jobs_failed": ended[JobState.FAILED] + ended[JobState.UNPLACEABLE],
            "jobs_lost": sum(1 for r in jobs if r.state not in TERMINAL or not r.end_reason),
            "gpu_hours_utilization": round(used / total_gpu_s, 4),
            "online_slo_attainment": round(min(parts), 5) if parts else None,
            "guarantee_violation_s": round(sum(self.violation_s.values()), 1),
            "preemptions": sum(r.preemptions for r in jobs),
            "training_gpu_hours": round(
                sum(r.gpu_s for r in jobs if r.spec.kind is JobKind.TRAINING) / 3600, 1
            ),
            "lost_work_gpu_hours": round(
                sum(r.lost_work_s * r.spec.gpu_count for r in jobs) / 3600, 2
            ),
            "replicas_started": sum(
                1
                for r in self.runs.values()
                if r.service is not None and r.first_start_s is not None
            ),
            "kinds": {
                kind.value: stats([r for r in jobs if r.spec.kind is kind])
                for kind in JobKind
                if any(r.spec.kind is kind for r in jobs)
            },
            "teams": teams,
            "end_reasons": dict(sorted(_count(r.end_reason for r in jobs).items())),
            "wall_s": round(wall_s, 2),
        }

    def site_of(self, pool: str) -> str:
        return self.cfg.pool(pool).site or self.cfg.name

    def run_cost_usd(self, run: Run) -> float:
        """What the GPU time costs where it ran; cloud time is billed per node instead."""
        if not run.gpu_type or (
            self.cloud is not None and run.gpu_type in self.cloud.pool_of.values()
        ):
            return 0.0
        return run.gpu_s * self.pool_price.get(run.gpu_type, 0.0) / 3600.0

    def missed_deadline(self, run: Run) -> bool:
        deadline = run.spec.deadline_s
        if deadline is None:
            return False
        if run.state is JobState.FINISHED and run.end_s is not None:
            return run.end_s > deadline + 1e-6
        return deadline < self.cfg.horizon_s

    def resource_summary(self, jobs: list[Run]) -> dict[str, Any]:
        """Cost, energy, deadlines, clouds and heat: the keys of the right-sizing issue."""
        total = self.meter.total()
        finished = [r for r in jobs if r.state is JobState.FINISHED and r.end_s is not None]
        jct = [r.end_s - r.spec.submit_s for r in finished if r.end_s is not None]
        cloud_usd = self.cloud.billed_usd if self.cloud is not None else 0.0
        events = self.cloud.events if self.cloud is not None else []
        currencies = sorted({t.currency for t in self.tariff_of.values() if t is not None})
        clusters: dict[str, Any] = {}
        for site in sorted(set(self.node_site)):
            entry: dict[str, Any] = self.meter.sites[site].rounded()
            entry["idle_energy_kwh"] = round(self.meter.idle[site].energy_kwh, 2)
            held = [
                r for r in self.runs.values() if r.gpu_type and self.site_of(r.gpu_type) == site
            ]
            entry["gpu_hours"] = round(sum(r.gpu_s for r in held) / 3600, 1)
            clusters[site] = entry
        by_type: dict[str, float] = defaultdict(float)
        for r in self.runs.values():
            if r.gpu_type:
                by_type[self.cfg.pool(r.gpu_type).gpu_type] += r.gpu_s / 3600
        out: dict[str, Any] = {
            "cost_usd": round(sum(self.run_cost_usd(r) for r in self.runs.values()) + cloud_usd, 2),
            "cloud_cost_usd": round(cloud_usd, 2),
            "energy_kwh": round(total.energy_kwh, 2),
            "electricity_cost": round(total.electricity_cost, 2),
            "electricity_currency": currencies[0] if len(currencies) == 1 else ",".join(currencies),
            "carbon_kg": round(total.carbon_kg, 2)
            if any(t is not None and t.carbon_g_per_kwh for t in self.tariff_of.values())
            else None,
            "deadline_misses": sum(1 for r in jobs if self.missed_deadline(r)),
            "jobs_with_deadline": sum(1 for r in jobs if r.spec.deadline_s is not None),
            "avg_jct_s": round(float(np.mean(jct)), 1) if jct else None,
            "bursts": sum(1 for e in events if e.action == "burst"),
            "reclaims": sum(1 for e in events if e.action == "reclaim"),
            "burst_log": [
                {
                    "t_h": round(e.t_s / 3600, 3),
                    "action": e.action,
                    "nodes": e.nodes,
                    "reason": e.reason,
                }
                for e in events
            ],
            "rejected_remote_placements": len(self.rejected_remote),
            "transfer_hours": round(sum(r.transfer_s for r in jobs) / 3600, 2),
            "gpu_hours_by_type": {k: round(v, 1) for k, v in sorted(by_type.items())},
            "power_cap_commands": self.cap_commands,
            "clusters": clusters,
        }
        if self.heat is not None:
            out["thermal"] = {
                "max_temp_c": round(self.heat.max_c, 1),
                "gpu_hours_above_threshold": round(self.heat.above_s / 3600, 2),
                "gpu_hours_hot_while_cooler_idle": round(self.heat.hot_while_cool_idle_s / 3600, 2),
            }
        return out

    def job_rows(self) -> list[dict[str, Any]]:
        """Per job: where it ran, when, and its energy, electricity cost and carbon."""
        rows = []
        for job_id in sorted(self.runs):
            r = self.runs[job_id]
            if r.service is not None:
                continue
            ledger = self.meter.jobs.get(job_id)
            rows.append(
                {
                    "job_id": job_id,
                    "team": r.spec.team,
                    "kind": r.spec.kind.value,
                    "pool": r.gpu_type,
                    "gpus": r.spec.gpu_count,
                    "state": r.state.value,
                    "submit_s": r.spec.submit_s,
                    "start_s": r.first_start_s,
                    "end_s": r.end_s,
                    "deadline_s": r.spec.deadline_s,
                    "transfer_s": round(r.transfer_s, 1),
                    "gpu_hours": round(r.gpu_s / 3600, 3),
                    "cost_usd": round(self.run_cost_usd(r), 3),
                    "energy_kwh": round(ledger.energy_kwh, 3) if ledger else 0.0,
                    "electricity_cost": round(ledger.electricity_cost, 3) if ledger else 0.0,
                    "carbon_kg": round(ledger.carbon_kg, 3) if ledger else 0.0,
                }
            )
        return rows

    def online_job_slo(self, online: list[Run]) -> float | None:
        """Online jobs (tagged services in a job trace): share of their life spent deployed
        on GPUs, allowing one scheduling cycle plus its victims' checkpoint time to start."""
        wanted = served = 0.0
        for r in online:
            end = r.end_s if r.end_s is not None else self.cfg.horizon_s
            life = end - r.spec.submit_s
            if life <= 0:
                continue
            wanted += life
            allowed = self.cfg.cycle_s + self.claim_grace.get(r.spec.job_id, 0.0)
            served += min(life, r.held_s + allowed)
        return served / wanted if wanted else None


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for x in items:
        out[x] += 1
    return dict(out)


def run_scenario(
    cfg: ScenarioConfig,
    traces_dir: Path | None = None,
    progress: Progress | None = None,
    workload: Workload | None = None,
) -> ScenarioResult:
    started = time.perf_counter()
    if workload is None:
        ctx = GenContext(
            cfg.horizon_s,
            traces_dir or find_traces_dir(Path(cfg.path).parent if cfg.path else None),
        )
        workload = build_workload(cfg.workload, cfg.seed, ctx)
    sim = ScenarioSim(cfg, workload)
    sim.run(progress)
    wall = time.perf_counter() - started
    gpus = sum(sim.pool_gpus.values())
    return ScenarioResult(
        name=cfg.name,
        summary=sim.summary(wall),
        log=sim.engine.log,
        node_names=tuple(n.name for n in sim.cluster.nodes),
        wall_s=wall,
        utilization_by_hour=[round(g / (gpus * 3600), 4) for g in sim.hour_gpu_s],
        jobs=sim.job_rows(),
    )

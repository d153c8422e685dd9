"""Scenario simulator: the world a scenario's jobs run in, driving the decision core.

It decides nothing. Each cycle it tells the core what happened (arrivals, measured
progress, GPU temperatures, service demand, cloud nodes that joined), asks it for the
cycle's commands and carries them out in its models: jobs progress at their co-location
and power-cap speed, preempted jobs write their checkpoint and leave (their claimants
start the moment they are gone), cloud nodes spin up and are billed, requests are
served against their SLO, energy, cost, carbon and heat are metered.

Preemption model (calibrated, shared/calibration): jobs snapshot their state to host
memory every `checkpoint_interval_s` of running time, for free. Preempting a job flushes
its last snapshot to disk (state / 0.45 GB/s, GPUs held meanwhile) and loses the work
since that snapshot. Resuming reads it back (state / 1.2 GB/s) and restarts the process
(5 s), on any GPUs that fit.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy as np

from gpupool.domain.lifecycle import TERMINAL, JobState
from gpupool.domain.model import MILLI_PER_GPU, Cluster, JobKind, Node, Placement
from gpupool.domain.state import BoolArray
from gpupool.energy.power import Load, load_of
from gpupool.energy.powercap import SetPowerCap, speed_at
from gpupool.energy.tariff import Tariff, load_tariff
from gpupool.energy.thermal import ThermalModel
from gpupool.errors import SpecError
from gpupool.federation.topology import Topology, parse_topology
from gpupool.policies.power_caps import cap_fraction
from gpupool.scheduler import (
    Burst,
    Cancel,
    Command,
    Defer,
    Event,
    Expire,
    Finished,
    GpuTemps,
    JobProgress,
    JobRecord,
    Launch,
    NodeDown,
    NodeUp,
    Progress,
    Reclaim,
    Resize,
    Resized,
    Scale,
    Scheduler,
    ServiceDemand,
    ServiceRate,
    Stop,
    Submitted,
    Vacated,
    Wait,
)
from gpupool.scheduler.commands import LearnGuard, LearnShadow
from gpupool.scheduler.events import CycleAt
from gpupool.sim.scenario.config import ScenarioConfig
from gpupool.sim.scenario.energy_meter import EnergyMeter, HeatMap
from gpupool.sim.scenario.runs import CloudEvent, Run, ServiceStats
from gpupool.sim.scenario.usage import Recorder, base_p99_at
from gpupool.sim.scenario.workload import ServiceSpec, Workload
from gpupool.sizing.catalog import load_catalog
from gpupool.traces.colocation_setup import load_pair_admission

ProgressFn = Callable[[int, int], None]
"""Told (cycles done, cycles in all) as the world runs, for a progress bar."""


def _cluster(cfg: ScenarioConfig) -> tuple[Cluster, dict[str, BoolArray], list[str]]:
    nodes: list[Node] = []
    node_pool: list[str] = []
    first: dict[str, int] = {}
    """Per topology level, the number of the next pool's first domain."""
    for pool in cfg.pools:
        prefix = f"{pool.site}-" if pool.site else ""
        for k in range(pool.nodes):
            labels = tuple(
                sorted((lv, f"{lv}{first.get(lv, 0) + k // per + 1}") for lv, per in pool.domains)
            )
            nodes.append(
                Node(
                    f"{prefix}{pool.gpu_type}-{k:03d}",
                    pool.gpu_type,
                    pool.gpus_per_node,
                    pool.cpu_milli,
                    pool.mem_mib,
                    cluster=pool.site or cfg.name,
                    labels=labels,
                )
            )
            node_pool.append(pool.key)
        for lv, per in pool.domains:
            first[lv] = first.get(lv, 0) + -(-pool.nodes // per)
    masks = {
        pool.key: np.array([key == pool.key for key in node_pool], dtype=np.bool_)
        for pool in cfg.pools
    }
    return Cluster(cfg.name, tuple(nodes)), masks, node_pool


DOWN, STARTING, UP = 0, 1, 2
VACATE, FINISH, RESIZED = 0, 1, 2


class ScenarioSim:
    def __init__(self, cfg: ScenarioConfig, workload: Workload) -> None:
        self.cfg = cfg
        self.cluster, _, self.node_pool = _cluster(cfg)
        self.known_teams = {t.team for t in cfg.scheduling.teams}
        for team in {j.team for j in workload.jobs} | {s.team for s in workload.services}:
            if team not in self.known_teams:
                raise SpecError(f"{cfg.path}: the workload uses team {team!r}, not under teams:")
        self.pool_gpus = {p.key: p.nodes * p.gpus_per_node for p in cfg.pools}
        self.arrivals = sorted(workload.jobs, key=lambda j: (j.submit_s, j.job_id))
        self.services = {s.name: s for s in workload.services}
        self.service_stats = {s.name: ServiceStats() for s in workload.services}
        self.sized = workload.sized
        self.workload = workload
        self.recorder: Recorder | None = None
        """Set (record_for_review) to write down what a review needs; None: nothing kept."""
        self._setup_sites()
        self._tariffs()
        self.core = self.new_core()
        self.state = self.core.state
        self.engine = self.core.engine
        self.jobs: dict[str, Run] = {}
        self.running: dict[str, Run] = {}
        """Runs holding GPUs: running, or preempted and still writing their checkpoint."""
        self.vacates: list[tuple[float, str]] = []
        self.resizes: list[tuple[float, str]] = []
        """When each resizing elastic job will have checkpointed and left (Resized)."""
        self.relaunching: set[str] = set()
        self.violation_s: dict[str, float] = defaultdict(float)
        self.owed_since: dict[str, float] = {}
        self.hour_gpu_s: list[float] = []
        self.caps: dict[tuple[int, int], SetPowerCap] = {}
        """The power command each simulated card carries out now."""
        self.cap_commands = 0
        self.clock_changes = [0, 0]
        """Cards whose SM clock was locked, and freed again (SetPowerCap)."""
        self.waited_with: dict[str, set[str]] = defaultdict(set)
        """Each reason code the core gave waiting jobs (Wait), with the jobs given it."""
        self.cycle_end = 0.0
        self.recorded: list[Event | CycleAt] | None = None
        """When set, every event fed to the core is appended (parity tests)."""
        self.commands: list[tuple[float, Command]] | None = None
        self.learn_records: list[LearnShadow | LearnGuard] = []
        """The learned policy's records (shadow plans, guard changes): kept, not acted on."""
        self._setup_energy()

    def record_for_review(self, bucket_s: float = 3600.0) -> Recorder:
        """Keep, while it runs, what gpupool.sim.scenario.review_source needs (costs some speed)."""
        width = self.state.gpu_left.shape[1]
        self.recorder = Recorder(self.state.node_count, width, self.cfg.horizon_s, bucket_s)
        return self.recorder

    # ---- the world's fixtures: sites, prices, clouds, energy, heat ----------------------------
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
        self.cloud_nodes: tuple[int, ...] = ()
        self.cloud_status: dict[int, int] = {}
        self.cloud_ready_at: dict[int, float] = {}
        self.cloud_billed_usd = 0.0
        self.cloud_events: list[CloudEvent] = []
        self.scale_events: list[tuple[float, Scale]] = []
        """Every change of a service's replica target, with its reason (core: Scale)."""
        self.spinup_s = 0.0
        if cloud_pools and self.topology is not None:
            self.cloud_nodes = tuple(
                i for i, key in enumerate(self.node_pool) if key in cloud_pools
            )
            sites = {cfg.pool(self.node_pool[i]).site for i in self.cloud_nodes}
            self.spinup_s = max(self.topology.site(s).spinup_s for s in sites)
            self.cloud_status = dict.fromkeys(self.cloud_nodes, DOWN)

    def new_core(self) -> Scheduler:
        """A fresh decision core for this scenario's fleet and scheduling section (the
        parity test replays the recorded events into one)."""
        return Scheduler(
            self.cluster,
            self.cfg.scheduling,
            node_pool=self.node_pool,
            pool_price=self.pool_price,
            topology=self.topology,
            catalog=self.catalog,
            tariffs=self.tariff_of,
            cloud_nodes=[self.cluster.nodes[k].name for k in self.cloud_nodes],
            services=[s.template for s in self.services.values()],
            seed=self.cfg.seed,
            colocation=load_pair_admission(
                self.cfg.scheduling.sharing.admission, self.cfg.path or "the scenario"
            ),
        )

    def _tariffs(self) -> dict[str, Tariff | None]:
        e = self.cfg.scheduling.energy
        base = Path(self.cfg.path).parent if self.cfg.path else Path.cwd()

        def tariff(name: str | None) -> Tariff | None:
            if name is None:
                return None
            local = base / name
            return load_tariff(str(local) if local.suffix in (".yaml", ".yml") else name)

        default = tariff(e.tariff)
        sites = sorted(set(self.node_site))
        self.tariff_of = {
            s: tariff(e.site_tariffs[s]) if s in e.site_tariffs else default for s in sites
        }
        return self.tariff_of

    def _setup_energy(self) -> None:
        cfg = self.cfg
        e = cfg.scheduling.energy
        tdp = np.array(
            [
                self.catalog[n.gpu_model].tdp_w if n.gpu_model in self.catalog else 0.0
                for n in self.cluster.nodes
            ]
        )
        sites = sorted(set(self.node_site))
        cloud_sites = frozenset(
            s
            for s in sites
            if self.topology is not None
            and s in {x.name for x in self.topology.sites}
            and self.topology.site(s).kind == "cloud"
        )
        self.meter = EnergyMeter(
            self.state, tdp, self.node_site, self.tariff_of, e.pue, cloud_sites
        )
        self.heat: HeatMap | None = None
        th = e.thermal
        if th.aware or th.hot_nodes or e.tariff is not None:
            inlet = self.core.room_inlet_c()  # the room the configuration describes
            model = ThermalModel.calibrated()
            temps = np.repeat(inlet[:, None], self.state.gpu_left.shape[1], axis=1).astype(float)
            self.heat = HeatMap(model, inlet, th.threshold_c, temps)

    def attach(self, core: Scheduler) -> None:
        """Make another core the one this world's jobs belong to (a live service's, when
        the world stands behind its executor and telemetry)."""
        self.core = core
        self.state = core.state
        self.engine = core.engine
        self.meter.state = core.state

    # ---- compatibility views ------------------------------------------------------------------
    def job(self, job_id: str) -> Run:
        run = self.jobs.get(job_id)
        if run is None:
            run = self.jobs[job_id] = Run(self.core.records[job_id])
        return run

    @property
    def runs(self) -> dict[str, Run]:
        """Every job the core knows, in submission order, with the world's measurements."""
        return {job_id: self.job(job_id) for job_id in self.core.records}

    @property
    def replicas(self) -> Mapping[str, Mapping[str, JobRecord]]:
        return self.core.replicas

    def usage(self, team: str, gpu_type: str) -> int:
        return self.core.usage(team, gpu_type)

    # ---- feeding the core ---------------------------------------------------------------------
    def feed(self, event: Event) -> list[Command]:
        if self.recorded is not None:
            self.recorded.append(event)
        return self.core.observe(event)

    def cycle(self, now: float) -> list[Command]:
        if self.recorded is not None:
            self.recorded.append(CycleAt(now))
        return self.core.cycle(now)

    def carry_out(self, commands: list[Command], at: float) -> None:
        if self.commands is not None:
            self.commands += [(at, c) for c in commands]
        capped = False
        for c in commands:
            if isinstance(c, Launch):
                if c.job_id in self.relaunching:  # an elastic job on its new GPUs
                    run = self.job(c.job_id)
                    run.speed = self.core.speed_of(run.rec, run.cap_speed)
                else:
                    self.start(self.job(c.job_id), c.resume)
            elif isinstance(c, Resize):
                self.resize(self.job(c.job_id), c, at)
            elif isinstance(c, Stop):
                self.preempt(self.job(c.job_id), at)
            elif isinstance(c, Cancel):
                self.running.pop(c.job_id, None)
            elif isinstance(c, SetPowerCap):
                key = (c.node, c.gpu)
                was = self.caps.get(key)
                locked = was is not None and was.locked_sm_mhz is not None
                if locked != (c.locked_sm_mhz is not None):  # an SM clock locked or freed
                    self.clock_changes[c.locked_sm_mhz is None] += 1
                if c.is_reset:
                    self.caps.pop(key, None)
                else:
                    self.caps[key] = c
                self.cap_commands += 1
                capped = True
            elif isinstance(c, Burst):
                for name in c.nodes:
                    k = self.core.fleet.node_index[name]
                    self.cloud_status[k] = STARTING
                    self.cloud_ready_at[k] = at + self.spinup_s
                self.cloud_events.append(CloudEvent(at, "burst", len(c.nodes), c.reason))
            elif isinstance(c, Reclaim):
                for name in c.nodes:  # a simulated node leaves the moment it is stopped
                    self.cloud_status[self.core.fleet.node_index[name]] = DOWN
                    self.feed(NodeDown(at, name))
                    if self.recorder is not None:
                        self.recorder.node_status.append(
                            (at, self.core.fleet.node_index[name], False)
                        )
                self.cloud_events.append(CloudEvent(at, "reclaim", len(c.nodes), c.reason))
            elif isinstance(c, Expire):  # past its time limit: it stops and has failed
                self.finish(self.job(c.job_id), at, JobState.FAILED, c.reason)
            elif isinstance(c, Wait):
                if c.code:  # the world only counts why jobs waited
                    self.waited_with[c.code].add(c.job_id)
                if self.recorder is not None:
                    self.recorder.wait(c.job_id, at, c.code)
            elif isinstance(c, Defer):
                pass  # the core holds the job; the world has nothing to do
            elif isinstance(c, Scale):
                self.scale_events.append((at, c))
            elif isinstance(c, LearnShadow | LearnGuard):
                self.learn_records.append(c)  # a record only: the world carries out nothing
        if capped or self.caps:
            self.apply_caps()

    def start(self, run: Run, resumed: bool) -> None:
        job = run.spec
        self.owed_since.pop(job.job_id, None)
        self.running[job.job_id] = run
        run.speed = self.core.speed_of(run.rec, run.cap_speed)
        run.since_snapshot_s = 0.0
        run.overhead_s = (
            self.cfg.scheduling.checkpoint.resume_s(job.state_gib_per_gpu)
            if resumed
            else self.cfg.scheduling.checkpoint.process_start_s
        )
        if not run.started:
            run.started = True
            run.transfer_s = self.transfer_s(run)
            run.overhead_s += run.transfer_s

    def transfer_s(self, run: Run) -> float:
        """Moving the job's dataset to the site it starts at, with its GPUs held."""
        job = run.spec
        if self.topology is None or job.dataset is None or job.dataset_gb <= 0:
            return 0.0
        site = self.cfg.pool(run.gpu_type).site
        return self.topology.transfer_s(job.dataset, site, job.dataset_gb)

    def preempt(self, run: Run, now: float) -> None:
        lost = run.done_s - run.saved_s
        run.lost_work_s += lost
        run.done_s = run.saved_s
        run.vacate_at = now + self.cfg.scheduling.checkpoint.write_s(run.spec.state_gib_per_gpu)
        heapq.heappush(self.vacates, (run.vacate_at, run.spec.job_id))

    def resize(self, run: Run, c: Resize, now: float) -> None:
        """An elastic job checkpoints on demand (nothing lost), its processes leave
        (Resized after the write) and restart on the new GPUs (the resume time): no work
        meanwhile, its GPUs held."""
        ck = self.cfg.scheduling.checkpoint
        gib = run.spec.state_gib_per_gpu
        write, resume = ck.write_s(gib), ck.resume_s(gib)
        pending = self.core.book.elastic.pending.get(c.job_id)
        old = pending.old_count if pending is not None else run.spec.gpu_count
        new = c.placement.gpu_count
        run.saved_s = run.done_s
        run.since_snapshot_s = 0.0
        run.overhead_s = write + resume
        run.resize_gpu_s += max(old, new) * write + new * resume
        heapq.heappush(self.resizes, (now + write, c.job_id))

    def resized(self, run: Run, at: float) -> None:
        job_id = run.spec.job_id
        self.relaunching.add(job_id)
        try:
            for c in self.feed(Resized(at, job_id)):
                self.carry_out([c], at)
                if isinstance(c, Launch) and c.job_id != job_id:  # the online job it lent to
                    self.advance(self.job(c.job_id), at, self.cycle_end)
        finally:
            self.relaunching.discard(job_id)

    def apply_caps(self) -> None:
        """Each running job's speed and draw under the caps its cards carry."""
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
                r.speed = self.core.speed_of(r.rec, r.cap_speed)

    def vacate(self, run: Run, at: float) -> None:
        self.running.pop(run.spec.job_id, None)
        run.vacate_at = None
        for c in self.feed(Vacated(at, run.spec.job_id)):
            self.carry_out([c], at)
            if isinstance(c, Launch):
                self.advance(self.job(c.job_id), at, self.cycle_end)

    def finish(self, run: Run, at: float, state: JobState, reason: str) -> None:
        self.running.pop(run.spec.job_id, None)
        self.carry_out(self.feed(Finished(at, run.spec.job_id, state, reason)), at)

    # ---- progress -------------------------------------------------------------------------
    def advance(self, run: Run, a: float, b: float) -> float | None:
        """Run from a to b; return the finish time if the work completes."""
        if b <= a or run.rec.state is not JobState.RUNNING:
            return None
        t = a
        if run.overhead_s > 0:
            use = min(b - t, run.overhead_s)
            run.overhead_s -= use
            t += use
        spec = run.rec.spec
        if t >= b or spec.duration_s is None:
            self.charge(run, a, t - a, b - t)
            self.account(run, a, b)
            return None
        span = b - t
        speed = run.speed
        need = (spec.duration_s - run.done_s) / speed
        step = min(span, need)
        self.charge(run, a, t - a, step)
        run.done_s += step * speed
        run.run_time_s += step
        run.since_snapshot_s += step
        interval = spec.checkpoint_interval_s
        if run.since_snapshot_s >= interval:
            run.since_snapshot_s %= interval
            run.saved_s = run.done_s - run.since_snapshot_s * speed
        if need <= span:
            self.account(run, a, t + need)
            return t + need
        self.account(run, a, b)
        return None

    def charge(self, run: Run, t: float, idle_s: float, busy_s: float) -> None:
        """The energy a job's cards drew over one span: idle_s starting, then busy_s working."""
        spec = run.rec.spec
        placement = self.state.placements.get(spec.job_id)
        if placement is None or (idle_s <= 0 and busy_s <= 0):
            return
        share = spec.gpu_milli / MILLI_PER_GPU
        rec, meter = self.recorder, self.meter
        for part in placement.shares:
            if rec is not None:  # what each of its cards draws (the meter's model, no PUE)
                tdp, idle_w, busy_w = meter.draw_w(part.node, spec.kind, run.cap_frac)
                if tdp > 0:
                    rec.energy(part.node, part.gpus, t, share * (idle_w * idle_s + busy_w * busy_s))
            meter.charge_job(
                spec.job_id,
                spec.team,
                part.node,
                len(part.gpus) * share,
                spec.kind,
                run.cap_frac,
                t,
                idle_s,
                busy_s,
            )

    def account(self, run: Run, a: float, b: float) -> None:
        run.held_s += max(0.0, b - a)
        lo, hi = max(a, 0.0), min(b, self.cfg.horizon_s)
        if hi > lo:
            spec = run.rec.spec
            run.gpu_s += spec.gpu_count * (hi - lo) * spec.gpu_milli / MILLI_PER_GPU
            if self.recorder is not None:
                placement = self.state.placements.get(spec.job_id)
                if placement is not None:
                    self.recorder.hold(spec.job_id, placement, spec.gpu_milli, lo, hi)
            full = self.core.book.elastic.declared.get(spec.job_id)
            if full is not None and run.rec.state is JobState.RUNNING:
                run.lent_gpu_s += (full - spec.gpu_count) * (hi - lo)

    # ---- services ---------------------------------------------------------------------------
    def serve(self, now: float, end: float) -> None:
        """Requests in [now, end] served within the SLO, per service."""
        dt = end - now
        for svc in self.services.values():
            load = svc.load.at(now + dt / 2)
            stats = self.service_stats[svc.name]
            stats.requests += load * dt
            capacity = 0.0
            base = base_p99_at(svc.base_p99_ms, self.workload.updates.get(svc.name, ()), now)
            worst = 0.0
            for rec in self.core.replicas[svc.name].values():
                if rec.state is not JobState.RUNNING:
                    continue
                r = self.job(rec.job_id)
                ready = max(0.0, dt - r.overhead_s) if r.run_started_s >= now - 1e-9 else dt
                neighbours = self.neighbour_kinds(r)
                p99 = base * self.cfg.scheduling.colocation.online_p99_factor(neighbours)
                p99 = p99 / r.cap_speed + self.network_ms(svc, r)  # a lower clock: slower
                if p99 > svc.slo_p99_ms:
                    continue
                capacity += svc.replica_rps * r.speed * ready
                worst = max(worst, p99)
            stats.ok += min(load * dt, capacity)
            if self.recorder is not None and load > 0:
                # The slowest replica serving sets the tail; past 1 % of requests beyond the
                # capacity within the SLO, the p99 is at least the SLO (a floor).
                short = 1.0 - capacity / (load * dt) if capacity < load * dt else 0.0
                p99_seen = max(worst, svc.slo_p99_ms) if short > 0.01 else worst
                self.recorder.served(svc.name, now, dt, load, capacity, p99_seen)

    def network_ms(self, svc: ServiceSpec, run: Run) -> float:
        """Round trip from the service's users to the site a replica runs at."""
        if self.topology is None or svc.user_region is None:
            return 0.0
        return self.topology.latency_ms(svc.user_region, self.cfg.pool(run.gpu_type).site)

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
        core = self.core
        owed: dict[str, list[tuple[float, Run]]] = defaultdict(list)
        waiting: dict[tuple[str, str], list[JobRecord]] = defaultdict(list)
        for r in core.visible(now):
            waiting[(r.spec.team, r.gpu_type)].append(r)
        previous, self.owed_since = self.owed_since, {}
        reserving = self.cfg.scheduling.reservations
        for (team, gpu_type), recs in waiting.items():
            room = core.quotas.guaranteed(team, gpu_type, now) - core.usage(team, gpu_type)
            # What the team would run first is owed first: jobs holding a claim on GPUs
            # that are being vacated for them, then the queue's order.
            recs.sort(key=lambda r: r.spec.job_id not in core.book.claims)
            guaranteed = core.quotas.guaranteed(team, gpu_type, now)
            for r in recs:
                job_id = r.spec.job_id
                if r.spec.gpu_count > room:
                    if reserving and r.spec.gpu_count <= guaranteed:
                        break  # the team's room is kept for it: the jobs behind are not owed
                    continue
                room -= r.spec.gpu_count
                since = previous.get(job_id)
                if since is None:
                    # owed from when it was runnable and its team had room for it
                    since = max(
                        r.ready_s,
                        core.book.room_since.get((team, gpu_type), 0.0),
                        core.quota_window.since_s,
                    )
                self.owed_since[job_id] = since
                grace = self.cfg.scheduling.cycle_s + core.book.claim_grace.get(job_id, 0.0)
                owed[team].append((since + grace, self.job(job_id)))
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
    def observe_into_core(self, now: float) -> None:
        """What the world measured since the last cycle: progress and temperatures."""
        self.feed(
            Progress(
                now,
                {
                    job_id: JobProgress(r.done_s, r.saved_s, r.speed, r.overhead_s, r.cap_speed)
                    for job_id, r in self.running.items()
                    if r.state is JobState.RUNNING
                },
            )
        )
        if self.heat is not None and self.cfg.scheduling.energy.thermal.aware:
            self.feed(GpuTemps(now, self.heat.temps_c.copy(), self.heat.inlet_c.copy()))

    def run(self, progress: ProgressFn | None = None) -> None:
        cfg = self.cfg
        now = 0.0
        nxt = 0
        cycles = math.ceil(cfg.horizon_s / cfg.scheduling.cycle_s)
        for k in range(cycles):
            now = k * cfg.scheduling.cycle_s
            self.cycle_end = min(now + cfg.scheduling.cycle_s, cfg.horizon_s)
            self.observe_into_core(now)
            while nxt < len(self.arrivals) and self.arrivals[nxt].submit_s <= now:
                job = self.arrivals[nxt]
                self.feed(Submitted(now, job, self.sized.get(job.job_id)))
                nxt += 1
            for n in self.cloud_nodes:  # nodes whose spin-up ended join their pool
                if self.cloud_status[n] == STARTING and self.cloud_ready_at[n] <= now:
                    self.cloud_status[n] = UP
                    self.feed(NodeUp(now, self.cluster.nodes[n].name))
                    if self.recorder is not None:
                        self.recorder.node_status.append((now, n, True))
            measured = cfg.scheduling.autoscale_demand != "declared"
            for svc in self.services.values():
                if measured:  # the core's own rules read the offered rate
                    self.feed(ServiceRate(now, svc.name, svc.load.at(now)))
                    continue
                peak = svc.load.peak(
                    now, now + cfg.scheduling.autoscale_lookahead_s, cfg.scheduling.cycle_s
                )
                self.feed(ServiceDemand(now, svc.name, peak))
            self.carry_out(self.cycle(now), now)
            self.bill_cloud()
            for r in self.running.values():
                if r.state is JobState.RUNNING and r.spec.gpu_milli < MILLI_PER_GPU:
                    r.speed = self.core.speed_of(r.rec, r.cap_speed)
            self.serve(now, self.cycle_end)
            owed = self.owed_starts(now)
            self.step(now, self.cycle_end)
            self.check_guarantees(owed, now, self.cycle_end)
            self.meter_tick(now, self.cycle_end - now)
            used = sum(r.spec.gpu_count for r in self.running.values())
            hour = int(now // 3600)
            while len(self.hour_gpu_s) <= hour:
                self.hour_gpu_s.append(0.0)
            self.hour_gpu_s[hour] += used * (self.cycle_end - now)
            if progress is not None and (k % max(1, cycles // 100) == 0 or k == cycles - 1):
                progress(k + 1, cycles)
        end = cfg.horizon_s
        for rec in sorted(self.core.book.active.values(), key=lambda r: r.spec.job_id):
            r = self.job(rec.job_id)
            if r.service is not None:
                self.finish(r, end, JobState.CANCELLED, "scenario ended (service replica)")
            elif r.state is JobState.PENDING and r.first_start_s is None:
                self.finish(r, end, JobState.CANCELLED, "scenario ended before it could start")
            else:
                self.finish(r, end, JobState.CANCELLED, "scenario ended before it finished")
        for job in self.arrivals[nxt:]:
            self.feed(Submitted(end, job, self.sized.get(job.job_id)))
            r = self.job(job.job_id)
            if r.state not in TERMINAL:
                self.finish(r, end, JobState.CANCELLED, "submitted after the scenario ended")

    def step(self, now: float, end: float) -> None:
        for at, kind, job_id in self.timed_events(now, end):
            r = self.job(job_id)
            if kind == VACATE and r.state is JobState.PREEMPTING:
                self.vacate(r, at)
            elif kind == FINISH and r.state is JobState.RUNNING:
                self.finish(r, at, JobState.FINISHED, "completed")
            elif kind == RESIZED and r.state is JobState.RUNNING:
                self.resized(r, at)

    def timed_events(self, now: float, end: float) -> list[tuple[float, int, str]]:
        """Run the jobs through [now, end]: the checkpoints written (VACATE) and the work
        completed (FINISH) in that span, in time order (vacates first at one instant)."""
        events: list[tuple[float, int, str]] = []
        for job_id, r in list(self.running.items()):
            if r.state is JobState.RUNNING:
                done = self.advance(r, now, end)
                if done is not None:
                    events.append((done, FINISH, job_id))
            elif r.state is JobState.PREEMPTING:
                upto = end if r.vacate_at is None else min(end, r.vacate_at)
                self.charge(r, now, max(0.0, upto - now), 0.0)
                self.account(r, now, upto)
        while self.vacates and self.vacates[0][0] <= end:
            at, job_id = heapq.heappop(self.vacates)
            events.append((at, VACATE, job_id))
        while self.resizes and self.resizes[0][0] <= end:
            at, job_id = heapq.heappop(self.resizes)
            events.append((at, RESIZED, job_id))
        return sorted(events)

    # ---- energy, heat, clouds -----------------------------------------------------------------
    def bill_cloud(self) -> None:
        """Cloud nodes are billed from the start request until handed back."""
        for n in self.cloud_nodes:
            if self.cloud_status[n] != DOWN:
                gpus = int(self.state.gpu_count[n])
                self.cloud_billed_usd += (
                    gpus * self.cfg.scheduling.cycle_s * self.pool_price[self.node_pool[n]] / 3600.0
                )

    def up_nodes(self) -> BoolArray:
        mask = np.ones(self.state.node_count, dtype=np.bool_)
        for n in self.cloud_nodes:
            mask[n] = self.cloud_status[n] != DOWN
        return mask

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
        rec = self.recorder
        if rec is not None:  # the unheld part of every card of a node that is up
            free = np.clip(self.state.gpu_left, 0, None) / MILLI_PER_GPU
            card_idle_w = self.meter.power.gpu_power_w(1.0, Load.IDLE) * self.meter.tdp_w
            rec.idle_energy(now, free * (card_idle_w * up)[:, None] * dt)
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
        if rec is not None:
            rec.temperature(now, self.heat.temps_c, dt)

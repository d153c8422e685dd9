"""The stages of a cycle other than the policy's plan: pool choice, service replicas,
price deferral, power caps and cloud burst. Each reads and changes the core's state
(passed in) and returns the commands it decided; `Scheduler.cycle` runs them in order."""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from gpupool.domain.lifecycle import JobState
from gpupool.domain.model import MILLI_PER_GPU, JobKind, JobSpec
from gpupool.domain.state import ClusterState
from gpupool.energy.deferral import DeferrableJob, plan_starts
from gpupool.energy.power import PowerModel, load_of
from gpupool.energy.powercap import SetPowerCap
from gpupool.energy.thermal import ThermalModel
from gpupool.errors import SpecError
from gpupool.federation.burst import BurstController, BurstRules
from gpupool.policies.pool_choice import (
    PoolLoad,
    PoolOption,
    charge,
    choose_across_sites,
    choose_blind,
    choose_by_class,
    choose_cost_aware,
    choose_first,
)
from gpupool.policies.power_caps import CapJob, plan_power_caps
from gpupool.scheduler.commands import Burst, Cancel, Command, Defer, Reclaim, Scale
from gpupool.scheduler.config import SharingConfig
from gpupool.scheduler.events import GpuUsage
from gpupool.scheduler.jobs import WAITING, JobRecord
from gpupool.sizing.planner import sized_options

if TYPE_CHECKING:
    from gpupool.scheduler.scheduler import Scheduler


# ---- pools: GPU type and site ---------------------------------------------------------------
def options_for(core: Scheduler, job: JobSpec) -> tuple[PoolOption, ...]:
    """Every pool the job may run on, with its GPU count and run time there."""
    request = core.sized.get(job.job_id)
    sized: dict[str, tuple[int, float | None]] = {}
    if request is not None and core.catalog is not None:
        catalog = core.catalog
        types = sorted({m for m in core.pool_model.values() if m in catalog})
        for name, opt in sized_options(request, catalog, types).items():
            if opt.fits:  # no run time without tokens: the job's own duration, if any
                sized[name] = (opt.count, opt.run_s if opt.run_s is not None else job.duration_s)
    out = []
    for key in core.pool_nodes:
        model = core.pool_model[key]
        if request is not None:
            if model not in sized:
                continue
            count, duration = sized[model]
        elif job.allows_model(model) and share_milli(core, job, model) is not None:
            count, duration = job.gpu_count, job.duration_s
        else:
            continue
        if count > core.pool_gpus[key]:
            continue
        site = core.pool_site[key]
        out.append(PoolOption(key, model, site, count, duration, core.pool_price.get(key, 0.0)))
    placement = core.config.placement
    if placement.gpu_type == "first" and request is None and core.topology is None:
        return tuple(out[:1])
    return tuple(out)


def card_mem_mib(core: Scheduler, model: str) -> int | None:
    """One card's memory, from the catalogue (as the fake fleet and the planner have it)."""
    if core.catalog is None or model not in core.catalog:
        return None
    return round(core.catalog[model].memory_gib * 1024)


def share_milli(core: Scheduler, job: JobSpec, model: str) -> int | None:
    """The share of one `model` card the job takes: its GPU memory over the card's,
    rounded up to a thousandth; its gpu_milli when it gives no memory. None: the card
    is too small (or its memory unknown)."""
    if job.gpu_mem_mib is None:
        return job.gpu_milli
    card = card_mem_mib(core, model)
    if card is None or job.gpu_mem_mib > card:
        return None
    return min(MILLI_PER_GPU, -(-job.gpu_mem_mib * MILLI_PER_GPU // card))


def choose(
    core: Scheduler, r: JobRecord, loads: dict[str, PoolLoad], now: float
) -> tuple[PoolOption | None, str]:
    """The pool a waiting job should wait for, and why (None: no acceptable pool)."""
    options = r.options
    placement = core.config.placement
    svc = core.services.get(r.service) if r.service is not None else None
    if core.topology is not None:
        choice, decision = choose_across_sites(
            r.spec,
            options,
            loads,
            core.topology,
            now,
            placement.site == "locality-aware",
            svc.user_region if svc is not None else None,
            svc.latency_bound_ms if svc is not None else None,
            placement.value_of_time_usd_per_h,
        )
        if choice is not None and choice.rejected_remote and r.job_id not in core.rejected_remote:
            core.rejected_remote.add(r.job_id)
            refused = "; ".join(f"{site}: {why}" for site, why in decision.rejected)
            core.engine.note(r.job_id, now, f"remote refused ({refused})")
        if choice is None:
            return None, decision.reason
        return choice.option, decision.reason
    if len(options) == 1 or placement.gpu_type == "first":
        picked = choose_first(options)
    elif placement.gpu_type == "by-class":
        picked = choose_by_class(
            r.spec, options, loads, core.type_rankings[r.spec.kind], team_room(core, r, now)
        )
    elif placement.gpu_type == "blind":
        picked = choose_blind(options, loads)
    else:
        picked = choose_cost_aware(r.spec, options, loads, now, placement.value_of_time_usd_per_h)
    return picked.option, picked.reason


def team_room(core: Scheduler, r: JobRecord, now: float) -> dict[str, int] | None:
    """GPUs the job's team may still take in each of the job's pools (its maximum less
    what it holds); None when no team has a maximum."""
    if not core.config.teams and not core.config.windows:
        return None
    team = r.spec.team
    return {
        o.pool: core.quotas.maximum(team, o.pool, now) - core.held.get((team, o.pool), 0)
        for o in r.options
    }


def retarget(core: Scheduler, r: JobRecord, option: PoolOption) -> None:
    """Point a waiting job at a pool: its GPU count and work become that pool's."""
    milli = share_milli(core, r.spec, option.gpu_type) or r.spec.gpu_milli
    if (
        r.gpu_type == option.pool
        and r.spec.gpu_count == option.gpu_count
        and r.spec.gpu_milli == milli
    ):
        return
    queued = r.state in WAITING and r.gpu_type
    if queued:
        core.queues.remove(r)
    r.spec = replace(
        r.spec,
        gpu_count=option.gpu_count,
        gpu_milli=milli,
        duration_s=option.duration_s,
        gpu_models=frozenset({option.gpu_type}),
    )
    r.gpu_type = option.pool
    core.dirty = True
    if queued:
        core.queues.add(r)


def rechoose(core: Scheduler, now: float) -> None:
    """Each cycle, waiting jobs that never ran follow capacity to their best pool."""
    movable = [
        r for r in core.choosers.values() if r.state is JobState.PENDING and r.first_start_s is None
    ]
    if not movable:
        return
    loads = core.pool_loads()
    movable.sort(key=lambda r: (r.ready_s, r.spec.job_id))
    for r in movable[: core.config.queue_depth * 8]:
        option, why = choose(core, r, loads, now)
        if option is None:
            continue
        if option.pool != r.gpu_type:
            core.engine.note(r.job_id, now, f"pool {option.pool}: {why}")
        core.type_why[r.job_id] = why
        retarget(core, r, option)
        charge(loads, option, core.state, core.pool_nodes)


def transfer_s(core: Scheduler, r: JobRecord) -> float:
    """Moving the job's dataset to the site it starts at, with its GPUs held."""
    job = r.spec
    if core.topology is None or job.dataset is None or job.dataset_gb <= 0:
        return 0.0
    return core.topology.transfer_s(job.dataset, core.pool_site[r.gpu_type], job.dataset_gb)


# ---- measured state of shared GPUs ------------------------------------------------------------
class UsageWindow:
    """The GPU usage the driver measured (GpuUsage), kept over `util_window_s`: a card
    whose average SM utilisation there is above `max_sm_util_pct` takes no new sharer,
    and each card's last measured free memory bounds what a new share may ask."""

    def __init__(self, config: SharingConfig) -> None:
        self.config = config
        self.samples: deque[tuple[float, np.ndarray]] = deque()

    def observe(self, state: ClusterState, event: GpuUsage) -> bool:
        """Take a reading into the state; whether what the placement sees changed."""
        shape = state.gpu_left.shape
        arrays = (event.sm_util_pct, event.mem_used_mib, event.mem_total_mib)
        if any(np.shape(a) != shape for a in arrays):
            raise SpecError(
                f"GpuUsage arrays must be [node, gpu] of shape {shape}, got "
                f"{[np.shape(a) for a in arrays]}"
            )
        window = self.config.util_window_s
        self.samples.append((event.t_s, np.asarray(event.sm_util_pct, dtype=np.float64)))
        while self.samples and self.samples[0][0] < event.t_s - window - 1e-9:
            self.samples.popleft()
        before = (state.no_new_sharer, state.measured_free_mib, state.card_mem_mib)
        bound = self.config.max_sm_util_pct
        if bound is not None:
            stack = np.stack([u for _, u in self.samples])
            seen = np.isfinite(stack)
            total = np.where(seen, stack, 0.0).sum(axis=0)
            count = seen.sum(axis=0)
            mean = np.divide(total, count, out=np.zeros(shape), where=count > 0)
            state.no_new_sharer = mean > bound
        used = np.asarray(event.mem_used_mib, dtype=np.int64)
        card = np.asarray(event.mem_total_mib, dtype=np.int64)
        state.measured_free_mib = np.where((used >= 0) & (card > 0), card - used, -1)
        state.card_mem_mib = np.maximum(card, 0)
        after = (state.no_new_sharer, state.measured_free_mib, state.card_mem_mib)
        return any(
            (a is None) != (b is None)
            or (a is not None and b is not None and not np.array_equal(a, b))
            for a, b in zip(before, after, strict=True)
        )


# ---- services: replicas that follow demand ---------------------------------------------------
def replicas_needed(core: Scheduler, name: str, load_rps: float, shared: bool) -> int:
    svc = core.services[name]
    want = replicas_needed_raw(core, name, load_rps, shared)
    return min(max(want, svc.min_replicas), svc.max_replicas)


def replicas_needed_raw(core: Scheduler, name: str, load_rps: float, shared: bool) -> int:
    """Replicas the load needs, before the service's bounds."""
    svc = core.services[name]
    cfg = core.config
    speed = cfg.colocation.speed(JobKind.ONLINE, sharers_per_gpu(core, name)) if shared else 1.0
    return math.ceil(load_rps * cfg.autoscale_headroom / (svc.replica_rps * speed) - 1e-9)


def sharers_per_gpu(core: Scheduler, name: str) -> int:
    """How many of a service's replicas one GPU holds: `share_cap`, else as many as its
    share lets (no cap)."""
    cap = core.config.share_cap
    by_share = max(1, MILLI_PER_GPU // core.services[name].replica_gpu_milli)
    return by_share if cap is None else cap


def sharing_pays(core: Scheduler, name: str, load_rps: float) -> bool:
    """Pack a service's replicas onto shared GPUs only where the model says it helps: the
    p99 next to `share_cap - 1` neighbours still meets the SLO, and the GPUs the shared
    replicas take (slowed by time-slicing) are fewer than whole-GPU replicas."""
    svc = core.services[name]
    cfg = core.config
    if svc.replica_gpu_milli >= MILLI_PER_GPU:
        return False
    neighbours = sharers_per_gpu(core, name) - 1
    p99 = svc.base_p99_ms * cfg.colocation.online_p99_factor([JobKind.ONLINE] * neighbours)
    if p99 > svc.slo_p99_ms:
        return False
    shared_gpus = replicas_needed(core, name, load_rps, True) * svc.replica_gpu_milli / 1000
    return shared_gpus < replicas_needed(core, name, load_rps, False)


SLO_RELEASE = 0.9
"""Replicas the SLO rule added stay until the measured rate is below this share of the
rate that needed them: the demand rule alone would take them back at once and flap."""


def slo_rule(core: Scheduler, name: str, have: int, now: float) -> tuple[int, str] | None:
    """Replicas the measured load asks for, and why: more when the p99 is over the SLO
    (one more) or the requests per replica are over `replica_rps` (enough for the rate
    with headroom). None: no fresh measurement, every replica not yet up, or a change
    made less than one measuring window ago (what was measured predates it)."""
    svc = core.services[name]
    load = core.load.get(name)
    cfg = core.config
    window = cfg.autoscale_load_window_s
    if load is None or now - load.t_s > window + 1e-9 or load.replicas_reporting < 1:
        return None
    running = sum(r.state is JobState.RUNNING for r in core.replicas[name].values())
    if running < have or load.replicas_reporting < running:
        return None  # a scale-up in flight: its replicas are not measured yet
    if now - core.scaled_at.get(name, -math.inf) < window - 1e-9:
        return None
    per = load.rps / load.replicas_reporting
    want, why = have, ""
    if per > svc.replica_rps:
        want = max(have + 1, math.ceil(load.rps * cfg.autoscale_headroom / svc.replica_rps - 1e-9))
        why = f"{per:.0f} rps/replica > {svc.replica_rps:g} rps/replica at {load.rps:.0f} rps"
    if load.p99_ms is not None and load.p99_ms > svc.slo_p99_ms:
        want = max(want, have + 1)
        why = f"p99 {load.p99_ms:.0f} ms > {svc.slo_p99_ms:g} ms at {per:.0f} rps/replica"
    return (min(want, svc.max_replicas), why) if want > have else None


def autoscale(core: Scheduler, now: float) -> list[Command]:
    """Each service to the replicas its expected peak needs (the demand rule), or more
    when what its replicas measured breaks the SLO (the SLO rule): new replicas are
    submitted, surplus ones cancelled once demand has stayed low `down_stable_s`
    (waiting ones first, then those on the emptiest nodes, so the GPUs freed join
    other free GPUs instead of leaving holes). Each change comes with a Scale notice."""
    out: list[Command] = []
    cfg = core.config
    for svc in core.services.values():
        peak = core.demand.get(svc.name, 0.0)
        shared = sharing_pays(core, svc.name, peak)
        want = replicas_needed(core, svc.name, peak, shared)
        mine = list(core.replicas[svc.name].values())
        have = len(mine)
        why = f"expected peak {peak:.0f} rps at {svc.replica_rps:g} rps/replica"
        if want == svc.min_replicas and replicas_needed_raw(core, svc.name, peak, shared) < want:
            why = f"{why}; at least {svc.min_replicas} (the minimum)"
        load = core.load.get(svc.name)
        fresh = load if load is not None and now - load.t_s <= cfg.autoscale_load_window_s else None
        floor = core.slo_floor.get(svc.name)
        if floor is not None:
            held, at_rps = floor
            if fresh is not None and fresh.rps < SLO_RELEASE * at_rps:
                del core.slo_floor[svc.name]  # the load that needed them has passed
            elif want < held:
                want = held
                why = (
                    f"held at {held} by the SLO rule until the rate falls below "
                    f"{SLO_RELEASE * at_rps:.0f} rps"
                )
        slo = slo_rule(core, svc.name, have, now)
        if slo is not None and slo[0] > want and fresh is not None:
            want, why = slo
            core.slo_floor[svc.name] = (want, fresh.rps)
        if want < have:
            since = core.below_since.setdefault(svc.name, now)
            if now - since < cfg.autoscale_down_stable_s - 1e-9:
                continue
            if cfg.autoscale_down_stable_s > 0:
                why += f", low for {now - since:.0f} s"
        else:
            core.below_since.pop(svc.name, None)
        if want == have:
            continue
        core.scaled_at[svc.name] = now
        core.below_since.pop(svc.name, None)
        dropped: list[str] = []
        cancels: list[Command] = []
        if have < want:
            for _ in range(want - have):
                core.replica_seq[svc.name] += 1
                seq = core.replica_seq[svc.name]
                milli = svc.replica_gpu_milli if shared else MILLI_PER_GPU
                job = JobSpec(
                    job_id=(
                        core.replica_id(svc.name, seq, milli)
                        if core.replica_id is not None
                        else f"{svc.name}-r{seq}"
                    ),
                    gpu_count=1,
                    gpu_milli=milli,
                    gpu_models=svc.gpu_models,
                    team=svc.team,
                    priority=svc.priority,
                    kind=JobKind.ONLINE,
                    submit_s=now,
                )
                core.submit(job, now, service=svc.name)
        else:
            mine.sort(key=lambda r: (r.state is JobState.RUNNING, -_node_free(core, r)))
            for r in mine[: have - want]:
                core.claims.pop(r.job_id, None)
                holding = r.state is JobState.RUNNING
                core.finished(r.job_id, now, JobState.CANCELLED, "scaled down")
                if holding:
                    cancels.append(Cancel(r.job_id, "scaled down"))
                else:
                    dropped.append(r.job_id)
        out.append(Scale(svc.name, have, want, why, tuple(dropped)))
        out += cancels
    return out


def _node_free(core: Scheduler, r: JobRecord) -> int:
    placement = core.state.placements.get(r.spec.job_id)
    if placement is None:
        return 0
    return int(core.state.whole_free[placement.shares[0].node])


# ---- price deferral --------------------------------------------------------------------------
@dataclass
class Deferral:
    """Deadline-bound work held for cheaper hours (energy.price_aware), re-planned at each
    slot boundary or when the deferrable set changes; never past a job's deadline."""

    held: set[str] = field(default_factory=set)
    until: dict[str, float] = field(default_factory=dict)
    known: set[str] = field(default_factory=set)
    due_s: float = 0.0

    def plan(self, core: Scheduler, now: float) -> list[Command]:
        e = core.config.energy
        kinds = (JobKind.TRAINING, JobKind.OFFLINE, JobKind.BATCH)
        waiting = [
            r
            for r in core.active.values()
            if r.state in WAITING and r.spec.deadline_s is not None and r.spec.kind in kinds
        ]
        ids = {r.job_id for r in waiting}
        if now < self.due_s and ids <= self.held | self.known:
            self.held &= ids
            return []
        self.due_s = (now // e.deferral_slot_s + 1) * e.deferral_slot_s
        self.known = ids
        before = set(self.held)
        self.held = set()
        planned: dict[str, float] = {}
        by_pool: dict[str, list[JobRecord]] = defaultdict(list)
        for r in waiting:
            by_pool[r.gpu_type].append(r)
        for pool, runs in by_pool.items():
            tariff = core.tariffs.get(core.pool_site[pool])
            if tariff is None:
                continue
            capacity = int(core.state.gpu_count[core.pool_nodes[pool]].sum())
            busy: list[tuple[int, float]] = []
            for r in core.running.values():
                if r.gpu_type == pool:
                    left = ((r.spec.duration_s or 0.0) - r.done_s) / max(r.speed, 1e-9)
                    busy.append((r.spec.gpu_count, now + left + r.overhead_s))
            for r in core.active.values():  # waiting work that is not deferrable runs first
                if r.gpu_type == pool and r.state in WAITING and r.job_id not in ids:
                    busy.append((r.spec.gpu_count, now + (r.spec.duration_s or 0.0)))
            waits: dict[int, float] = {}
            width = core.state.max_gpus_per_node
            longest = max(
                (r.spec.duration_s or 0.0 for r in core.running.values() if r.gpu_type == pool),
                default=0.0,
            )
            for r in runs:
                if r.spec.gpu_count not in waits:
                    wait = fit_wait_s(core, pool, r.spec.gpu_count, now)
                    if r.spec.gpu_count >= width:
                        wait = max(wait, longest)
                    waits[r.spec.gpu_count] = wait
            # A job's run counts the wait for GPUs of its shape, so that it is forced early
            # enough to get them by its latest start. A job that needs whole nodes may have
            # to wait for a node to drain whatever starts before it: the longest job
            # running there bounds that wait (forced jobs start before any other).
            jobs = [
                DeferrableJob(
                    r.job_id,
                    r.spec.gpu_count,
                    ((r.spec.duration_s or 0.0) - r.done_s)
                    + _restart_s(core, r)
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
            held = {r.job_id for r in runs} - set(plan.start_now)
            if plan.forced:
                # Jobs out of slack go first: what merely got cheap waits until they run,
                # so a job moved for price never loses its GPUs to one that could wait.
                held |= set(plan.start_now) - set(plan.forced)
            self.held |= held
            for job_id in held:
                planned[job_id] = plan.planned_start_s.get(job_id, now)
        out: list[Command] = []
        if self.held != before:
            core.dirty = True
        for job_id in sorted(self.held):
            until = max(planned.get(job_id, now), now)
            if job_id not in before or self.until.get(job_id) != until:
                out.append(Defer(job_id, until, "price"))
            self.until[job_id] = until
        for job_id in before - self.held:
            self.until.pop(job_id, None)
        return out


def fit_wait_s(core: Scheduler, pool: str, gpus: int, now: float) -> float:
    """How long until running work frees GPUs of this shape in the pool: `gpus` on one
    node, or that many whole nodes for a wider job (from the running jobs' ends)."""
    ends: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for r in core.running.values():
        placement = core.state.placements.get(r.spec.job_id)
        if r.gpu_type != pool or placement is None:
            continue
        left = ((r.spec.duration_s or 0.0) - r.done_s) / max(r.speed, 1e-9) + r.overhead_s
        if r.vacate_at is not None:
            left = r.vacate_at - now
        for part in placement.shares:
            ends[part.node].append((max(0.0, left), len(part.gpus)))
    width = core.state.max_gpus_per_node
    need, nodes_needed = (gpus, 1) if gpus <= width else (width, math.ceil(gpus / width))
    times = []
    for n in np.flatnonzero(core.pool_nodes[pool]).tolist():
        free = int(core.state.whole_free[n])
        if int(core.state.gpu_count[n]) < need:
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


def _restart_s(core: Scheduler, r: JobRecord) -> float:
    ck = core.config.checkpoint
    if r.state is JobState.SUSPENDED:
        return ck.resume_s(r.spec.state_gib_per_gpu)
    return ck.process_start_s + transfer_s(core, r)


# ---- power caps ------------------------------------------------------------------------------
_POWER = PowerModel.calibrated()
_THERMAL = ThermalModel.calibrated()


def power_caps(core: Scheduler, now: float) -> list[Command]:
    """SetPowerCap for every card whose command changes: memory-bound clock locks, price
    and deadline caps, hot cards; a reset for every card whose job left."""
    e = core.config.energy
    jobs = []
    for r, placement in core.working():
        gpus = tuple((p.node, g) for p in placement.shares for g in p.gpus)
        left = ((r.spec.duration_s or 0.0) - r.done_s) / max(r.speed, 1e-9) * r.cap_speed
        jobs.append(
            CapJob(
                r.job_id,
                r.spec.kind,
                gpus,
                float(core.tdp_w[gpus[0][0]]) if gpus else 0.0,
                r.spec.deadline_s,
                left + r.overhead_s,
            )
        )
    site_price = {}
    for site, tariff in core.tariffs.items():
        site_price[site] = (
            (tariff.price_at(now), tariff.mean_price()) if tariff is not None else None
        )
    hot: dict[tuple[int, int], float] = {}
    if e.thermal.aware and core.temps_c is not None and core.inlet_c is not None:
        # A card is capped when it runs hot or would settle above the threshold at its
        # job's power: to the power whose steady temperature sits 2 C under it.
        limit_c = e.thermal.threshold_c - 2.0
        r_c_per_w = _THERMAL.r_c_per_w
        for job in jobs:
            for n, g in job.gpus:
                inlet = float(core.inlet_c[n])
                draw = _POWER.gpu_power_w(float(core.tdp_w[n]), load_of(job.kind))
                if core.temps_c[n, g] > limit_c or inlet + draw * r_c_per_w > limit_c:
                    hot[(n, g)] = max(0.0, (limit_c - inlet) / r_c_per_w)
    commands = plan_power_caps(
        jobs,
        now,
        {n: site_price.get(core.node_site[n]) for n in range(core.state.node_count)},
        hot,
        price_capping=e.power_capping,
    )
    out: list[Command] = []
    held = {(c.node, c.gpu) for c in commands}
    for key in [k for k in core.caps if k not in held]:  # cards whose job left: reset
        del core.caps[key]
        out.append(SetPowerCap(key[0], key[1], None, None, "its job left: defaults"))
    for c in commands:
        key = (c.node, c.gpu)
        if c.is_reset:
            if core.caps.pop(key, None) is not None:
                out.append(c)
        elif core.caps.get(key) != c:
            core.caps[key] = c
            out.append(c)
    return out


# ---- cloud burst and reclaim -----------------------------------------------------------------
DOWN, STARTING, UP, STOPPING = 0, 1, 2, 3


@dataclass
class Cloud:
    """Cloud nodes: down until a Burst starts them, in the pool once they join, handed
    back (Reclaim) when idle and stopping until they have left. The driver starts and
    stops them and reports joins (NodeUp) and departures (NodeDown)."""

    controller: BurstController
    nodes: tuple[int, ...]
    """Cloud node indices, in the order they are started."""
    pools: frozenset[str]
    status: dict[int, int] = field(default_factory=dict)

    @staticmethod
    def of(core: Scheduler, names: Sequence[str]) -> Cloud:
        listed = tuple(core.node_index[n] for n in names)
        cloud = Cloud(
            BurstController(burst_rules(core.config.burst, len(listed))),
            listed,
            frozenset(core.node_pool[k] for k in listed),
        )
        for k in listed:
            cloud.status[k] = DOWN
            core.pool_nodes[core.node_pool[k]][k] = False
        return cloud

    def joined(self, core: Scheduler, k: int) -> None:
        if self.status[k] == STARTING:
            self.status[k] = UP
            core.pool_nodes[core.node_pool[k]][k] = True

    def tick(self, core: Scheduler, now: float) -> list[Command]:
        state = core.state
        onprem = np.ones(state.node_count, dtype=np.bool_)
        onprem[list(self.nodes)] = False
        gpus = int(state.gpu_count[onprem].sum())
        free = int(state.whole_free[onprem].sum())
        util = (gpus - free) / gpus if gpus else 0.0
        waiting = sum(
            r.spec.gpu_count
            for r in core.active.values()
            if r.state in WAITING
            and r.gpu_type not in self.pools
            and r.job_id not in core.deferral.held
        )
        pending = max(0, waiting - free)
        up = [n for n in self.nodes if self.status[n] == UP]
        starting = [n for n in self.nodes if self.status[n] == STARTING]
        idle = [n for n in up if state.whole_free[n] == state.gpu_count[n]]
        gpus_up = sum(int(state.gpu_count[n]) for n in up)
        used = sum(int(state.gpu_count[n] - state.whole_free[n]) for n in up)
        cloud_util = used / gpus_up if gpus_up else 0.0
        events = self.controller.observe(
            now, util, pending, len(up), len(starting), cloud_util, len(idle)
        )
        out: list[Command] = []
        names = [n.name for n in core.cluster.nodes]
        for ev in events:
            if ev.action == "burst":
                down = [n for n in self.nodes if self.status[n] == DOWN][: ev.nodes]
                for n in down:
                    self.status[n] = STARTING
                out.append(Burst(tuple(names[n] for n in down), ev.reason))
            else:
                gone = idle[: ev.nodes]
                for n in gone:
                    self.status[n] = STOPPING
                    core.pool_nodes[core.node_pool[n]][n] = False
                out.append(Reclaim(tuple(names[n] for n in gone), ev.reason))
            core.engine.note(
                f"cloud-{ev.action}", now, f"{ev.action} {ev.nodes} node(s): {ev.reason}"
            )
            core.dirty = True
        return out


def burst_rules(raw: Mapping[str, Any] | BurstRules | None, max_nodes: int) -> BurstRules:
    """The scheduling section's burst rules (durations in minutes) for `max_nodes` nodes."""
    if isinstance(raw, BurstRules):
        return replace(raw, max_cloud_nodes=max_nodes)
    given = dict(raw or {})
    d = BurstRules(max_cloud_nodes=max_nodes)
    return BurstRules(
        util_threshold=float(given.get("util_threshold", d.util_threshold)),
        sustain_s=60.0 * float(given.get("sustain_min", d.sustain_s / 60.0)),
        pending_gpu_threshold=int(given.get("pending_gpus", d.pending_gpu_threshold)),
        pending_sustain_s=60.0
        * float(given.get("pending_sustain_min", d.pending_sustain_s / 60.0)),
        reclaim_util=float(given.get("reclaim_util", d.reclaim_util)),
        reclaim_sustain_s=60.0
        * float(given.get("reclaim_sustain_min", d.reclaim_sustain_s / 60.0)),
        nodes_per_burst=int(given.get("nodes_per_burst", d.nodes_per_burst)),
        max_cloud_nodes=max_nodes,
    )

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpupool.core.engine import DecisionLog, Engine
from gpupool.core.lifecycle import TERMINAL, JobState, check_transition
from gpupool.core.model import MILLI_PER_GPU, Cluster, JobKind, JobSpec, Node
from gpupool.core.quota import QuotaBook
from gpupool.core.state import BoolArray, ClusterState
from gpupool.errors import PlanRejected, SpecError
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
from gpupool.sim.generators import GenContext, build_workload, find_traces_dir
from gpupool.sim.scenario_config import ScenarioConfig
from gpupool.sim.workload import ServiceSpec, Workload

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


def _cluster(cfg: ScenarioConfig) -> tuple[Cluster, dict[str, BoolArray]]:
    nodes: list[Node] = []
    for pool in cfg.pools:
        for k in range(pool.nodes):
            nodes.append(
                Node(
                    f"{pool.gpu_type}-{k:03d}",
                    pool.gpu_type,
                    pool.gpus_per_node,
                    pool.cpu_milli,
                    pool.mem_mib,
                    cluster=cfg.name,
                )
            )
    masks = {
        pool.gpu_type: np.array([n.gpu_model == pool.gpu_type for n in nodes], dtype=np.bool_)
        for pool in cfg.pools
    }
    return Cluster(cfg.name, tuple(nodes)), masks


def _islands(cfg: ScenarioConfig, cluster: Cluster) -> dict[str, BoolArray]:
    """Static partitions: each team owns whole nodes covering its guarantee."""
    owned = {t.team: np.zeros(len(cluster.nodes), dtype=np.bool_) for t in cfg.teams}
    for pool in cfg.pools:
        idx = [i for i, n in enumerate(cluster.nodes) if n.gpu_model == pool.gpu_type]
        cursor = 0
        for team in cfg.teams:
            gpus = team.guaranteed.get(pool.gpu_type, 0)
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
        self.cluster, self.pool_nodes = _cluster(cfg)
        self.state = ClusterState(self.cluster)
        self.state.share_cap = cfg.share_cap
        self.rng = np.random.default_rng(cfg.seed)
        self.placement = ConsolidatePolicy()
        """Where a claimant goes when its victims leave (policies plan the rest)."""
        self.engine = Engine(self.state, self.placement, self.rng)
        self.policy = CYCLE_POLICIES[cfg.policy]()
        pool_gpus = {p.gpu_type: p.nodes * p.gpus_per_node for p in cfg.pools}
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

    # ---- helpers ------------------------------------------------------------------------
    def gpu_type_of(self, job: JobSpec) -> str:
        for pool in self.cfg.pools:
            if job.allows_model(pool.gpu_type):
                return pool.gpu_type
        raise SpecError(f"job {job.job_id} allows {sorted(job.gpu_models)}; no such pool")

    def write_s(self, job: JobSpec) -> float:
        return self.cfg.checkpoint.write_s(job.state_gib_per_gpu)

    def submit(self, job: JobSpec, now: float, service: str | None = None) -> None:
        gpu_type = self.gpu_type_of(job)
        run = Run(job, gpu_type, ready_s=job.submit_s if service is None else now, service=service)
        self.runs[job.job_id] = run
        self.active[job.job_id] = run
        self.dirty = True
        if service is not None:
            self.replicas[service][job.job_id] = run
        room = self.pool_gpus[gpu_type]
        if self.team_nodes is not None:
            island = self.team_nodes[job.team] & self.pool_nodes[gpu_type]
            room = int(self.state.gpu_count[island].sum())
        if job.gpu_count > room:
            run.state = check_transition(job.job_id, run.state, JobState.UNPLACEABLE)
            run.end_s, run.end_reason = now, f"needs {job.gpu_count} GPUs, at most {room} usable"
            self.engine.note(job.job_id, now, "unplaceable")
            del self.active[job.job_id]
            return
        self.enqueue(run)

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
        return True

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
        if not job.preemptible:
            raise PlanRejected(f"job {job.job_id} is {job.kind.value}: never preempted")
        if run.preemptions >= self.cfg.preemption.max_per_job:
            raise PlanRejected(f"job {job.job_id} was preempted {run.preemptions} times already")
        above = self.usage(job.team, run.gpu_type) > self.quotas.guaranteed(
            job.team, run.gpu_type, now
        )
        if reclaim and not above:
            raise PlanRejected(
                f"job {job.job_id}: team {job.team} is within its guarantee; nothing to reclaim"
            )
        if for_online_of is not None and for_online_of != job.team:
            raise PlanRejected(f"job {job.job_id}: online work displaces only its own team's jobs")
        young = now - run.run_started_s < self.cfg.preemption.min_runtime_s
        if not reclaim and for_online_of is None and young:
            raise PlanRejected(f"job {job.job_id} has not run its minimum time yet")
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
            return 1.0  # a whole GPU is never shared
        speed = 1.0
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
            self.account(run, a, b)
            return None
        span = b - t
        need = (run.spec.duration_s - run.done_s) / run.speed
        step = min(span, need)
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
                if p99 > svc.slo_p99_ms:
                    continue
                capacity += svc.replica_rps * r.speed * ready
            stats.ok += min(load * dt, capacity)

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
            self.autoscale(now)
            if self.dirty:
                self.dirty = False
                self.apply(self.policy.plan(self.view(now)), now)
            for r in self.running.values():
                if r.state is JobState.RUNNING and r.spec.gpu_milli < MILLI_PER_GPU:
                    r.speed = self.speed_of(r)
            self.serve(now, self.cycle_end)
            owed = self.owed_starts(now)
            self.step(now, self.cycle_end)
            self.check_guarantees(owed, now, self.cycle_end)
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

    def step(self, now: float, end: float) -> None:
        events: list[tuple[float, int, str]] = []
        for job_id, r in list(self.running.items()):
            if r.state is JobState.RUNNING:
                done = self.advance(r, now, end)
                if done is not None:
                    events.append((done, 1, job_id))
            elif r.state is JobState.PREEMPTING:
                self.account(r, now, end if r.vacate_at is None else min(end, r.vacate_at))
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
        for team, queue in self.queues.items():
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
        )

    def apply(self, commands: list[Start | Preempt | Claim], now: float) -> None:
        for c in commands:
            run = self.runs.get(c.job_id)
            if run is None:
                raise PlanRejected(f"the plan names an unknown job {c.job_id}")
            if isinstance(c, Start):
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
        return {
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
    )

"""Cycle policies: once per scheduling cycle, look at the whole queue and return a plan.

A plan is a list of commands: Start (a job on a placement), Preempt (a running job, with
a reason) and Claim (start this job as soon as these victims have vacated). The policy
plans on a scratch copy of the cluster state; the decision core (gpupool.scheduler)
validates every command against the real state (capacity, co-location, quota maxima,
lifecycle, preemption rules) before applying it.

* fifo      strict submit order; the head blocks the queue.
* backfill  fifo with EASY backfill: the blocked head gets a reservation, and a later
            job may start now only if it ends before that reservation or uses GPUs the
            head will not need then. Starvation is bounded by the head's reservation.
* priority-quota  online inference first (never preempted; reclaims by preemption),
            then jobs within their team's guarantee (reclaiming borrowed GPUs by
            preemption), then borrowing by fair share; EASY backfill around the first
            blocked job; the online reserve stays available within one cycle.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

from gpupool.domain.model import JobKind, JobSpec, NodeShare, Placement
from gpupool.domain.quota import QuotaBook
from gpupool.domain.state import BoolArray, ClusterState, IntArray
from gpupool.errors import PlanRejected
from gpupool.policies.placement.base import ScoringPolicy
from gpupool.policies.placement.consolidate import ConsolidatePolicy
from gpupool.policies.registry import factories, register


@dataclass(frozen=True)
class Start:
    job_id: str
    placement: Placement


@dataclass(frozen=True)
class Preempt:
    job_id: str
    reason: str
    reclaim: bool = False
    """True when the GPUs go back to a team under its guarantee: the victim must be
    borrowing, and the minimum runtime does not protect it."""
    for_online_of: str | None = None
    """Set when online inference displaces its own team's batch work: the victim must be
    of that team; online outranks the minimum runtime of its own team's jobs."""
    for_job: str | None = None
    """Priority preemption: the waiting job that outranks the victim (online inference
    above all training and batch work, else a strictly higher priority). The victim's
    team must be borrowing; only an online claimant outranks the minimum runtime."""


def outranks(claimant: JobSpec, victim: JobSpec) -> bool:
    """Priority classes: online inference outranks every preemptible job; otherwise a
    strictly higher priority number outranks a lower one."""
    if claimant.kind is JobKind.ONLINE:
        return victim.kind is not JobKind.ONLINE
    return claimant.priority > victim.priority


@dataclass(frozen=True)
class Claim:
    """Start `job_id` the moment `victims` have written their checkpoints and left."""

    job_id: str
    victims: tuple[str, ...]
    nodes: tuple[int, ...] = ()
    """Where the job will go: the nodes its victims free (held for it meanwhile)."""


Command = Start | Preempt | Claim


@dataclass(frozen=True)
class PreemptionRules:
    min_runtime_s: float = 900.0
    """A job runs at least this long (since its last start) before it can be preempted,
    except to give a team back its guarantee (borrowed GPUs are always reclaimable) and
    for online inference, which never waits on a batch job's minimum runtime."""
    max_per_job: int = 3
    """After this many preemptions a job runs to completion: it then starts only inside
    its team's guarantee, where nothing reclaims it, and never in the online reserve."""
    max_lost_work_s: float | None = None
    """A victim that would lose more work than this (seconds since its last checkpoint)
    is not preempted: the policy picks another one, or waits for its next checkpoint.
    None: no bound."""
    by_priority: bool = False
    """Training and batch work may preempt strictly lower-priority preemptible work of
    borrowing teams (after the victim's minimum runtime). Online inference always
    preempts lower classes when it cannot otherwise start, whatever this says."""
    reserve_vacate_s: float | None = None
    """A training or batch job may borrow the online reserve only if its checkpoint is
    written within this long (so an online arrival waits at most one cycle plus this).
    None: one cycle."""

    def reserve_bound_s(self, cycle_s: float) -> float:
        return cycle_s if self.reserve_vacate_s is None else self.reserve_vacate_s

    def check(
        self,
        job: JobSpec,
        preemptions: int,
        team_above_guarantee: bool,
        ran_s: float,
        reclaim: bool,
        for_online_of: str | None,
        *,
        lost_work_s: float = 0.0,
        claimant: JobSpec | None = None,
    ) -> None:
        """Raise PlanRejected unless these rules allow preempting `job` now."""
        if not job.preemptible:
            raise PlanRejected(f"job {job.job_id} is {job.kind.value}: never preempted")
        if preemptions >= self.max_per_job:
            raise PlanRejected(f"job {job.job_id} was preempted {preemptions} times already")
        if self.max_lost_work_s is not None and lost_work_s > self.max_lost_work_s + 1e-9:
            raise PlanRejected(
                f"job {job.job_id} would lose {lost_work_s:.0f}s of work, more than the "
                f"{self.max_lost_work_s:g}s bound (preemption.max_lost_work_s)"
            )
        if reclaim and not team_above_guarantee:
            raise PlanRejected(
                f"job {job.job_id}: team {job.team} is within its guarantee; nothing to reclaim"
            )
        if for_online_of is not None and for_online_of != job.team:
            raise PlanRejected(f"job {job.job_id}: online work displaces only its own team's jobs")
        if claimant is not None:
            if not outranks(claimant, job):
                raise PlanRejected(f"job {claimant.job_id} does not outrank job {job.job_id}")
            online = claimant.kind is JobKind.ONLINE
            if not online and not self.by_priority:
                raise PlanRejected(
                    f"job {job.job_id}: only online inference preempts by priority here "
                    "(preemption.by_priority is off)"
                )
            if not team_above_guarantee and claimant.team != job.team:
                raise PlanRejected(
                    f"job {job.job_id}: team {job.team} is within its guarantee; "
                    "priority does not take another team's guarantee away"
                )
            if not online and ran_s < self.min_runtime_s:
                raise PlanRejected(f"job {job.job_id} has not run its minimum time yet")
            return
        if not reclaim and for_online_of is None and ran_s < self.min_runtime_s:
            raise PlanRejected(f"job {job.job_id} has not run its minimum time yet")


def may_hold_reserve(
    rules: PreemptionRules, cycle_s: float, job: JobSpec, vacate_s: float, preemptions: int
) -> bool:
    """Whether `job` may sit in the online reserve: an online arrival can preempt it
    (budget left, its lost work within the bound at any time) and its checkpoint is
    written within the reserve's vacate bound."""
    return (
        job.preemptible
        and vacate_s <= rules.reserve_bound_s(cycle_s)
        and preemptions < rules.max_per_job
        and (rules.max_lost_work_s is None or job.checkpoint_interval_s <= rules.max_lost_work_s)
    )


class RunningView(NamedTuple):
    """A running job as a cycle sees it (a tuple: thousands are built per cycle)."""

    spec: JobSpec
    gpu_type: str
    run_started_s: float
    preemptions: int
    vacate_s: float
    """Checkpoint write time if preempted now."""
    lost_work_s: float
    """Work since the last checkpoint, lost if preempted now."""
    resume_s: float
    est_end_s: float


class ReserveHolders(NamedTuple):
    """GPUs of each pool that the online reserve rules count."""

    online_all: Mapping[str, int]
    """Held by online inference, vacating jobs included."""
    online: Mapping[str, int]
    """Held by online inference that is not vacating."""
    fast: Mapping[str, int]
    """Held by work (not vacating) that an online arrival may preempt and that writes its
    checkpoint within the reserve's bound (may_hold_reserve)."""


VictimRow = tuple[
    tuple[int, float], str, str, float, float, bool, int, float, tuple[NodeShare, ...]
]
"""A possible victim: key (priority, (lost work + checkpoint write + resume) x GPUs: the
cheapest first), id, team, lost work, last start, whether it is vacating, GPUs, cost per
GPU, its shares (a plain tuple: a cycle makes one per running job of the pool)."""


class VictimTable:
    """One pool's possible victims (batch work with preemptions left and a placement), made
    once per cycle, share by share in the running jobs' order, and each node's floor: a
    bound below any score a victim search can give the node. A search visits nodes by
    floor and stops at the first that cannot beat the best found, so it scores a few
    nodes instead of every running job; the floors are worked out in arrays."""

    def __init__(self, free: IntArray) -> None:
        self.jobs: list[VictimRow] = []
        self._free = free
        self._arrays: tuple[np.ndarray, ...] | None = None
        self._gpus: list[int] = []
        self._orders: dict[int, list[tuple[float, float, int, int]]] = {}

    def add(
        self,
        job_id: str,
        spec: JobSpec,
        lost_work_s: float,
        vacate_s: float,
        resume_s: float,
        run_started_s: float,
        placement: Placement,
        vacating: bool,
    ) -> None:
        unit = lost_work_s + vacate_s + resume_s
        count = spec.gpu_count
        self.jobs.append(
            (
                (spec.priority, unit * count),
                job_id,
                spec.team,
                lost_work_s,
                run_started_s,
                vacating,
                count,
                unit,
                placement.shares,
            )
        )

    def _index(self) -> tuple[np.ndarray, ...]:
        """Shares grouped by node (each node's in the running order) and per node: least
        priority, least cost at that priority, least cost per GPU freed, whether a
        vacating job is there (an orphan costs nothing), and its first share's place."""
        if self._arrays is None:
            jobs = self.jobs
            node = np.array([sh.node for row in jobs for sh in row[8]], dtype=np.int64)
            job = np.array([k for k, row in enumerate(jobs) for _ in row[8]], dtype=np.int64)
            self._gpus = [len(sh.gpus) for row in jobs for sh in row[8]]
            gpus = np.array(self._gpus, dtype=np.float64)
            prio = np.array([row[0][0] for row in jobs], dtype=np.float64)[job]
            prio[np.abs(prio) >= 2.0**53] = -np.inf  # not exact as a float: no bound
            cost = np.array([row[0][1] for row in jobs], dtype=np.float64)[job]
            leaving = np.array([row[5] for row in jobs], dtype=np.bool_)[job]
            count = np.array([row[6] for row in jobs], dtype=np.float64)[job]
            unit = np.array([row[7] for row in jobs], dtype=np.float64)[job]
            # a share of a job over several nodes frees fewer GPUs than the job's cost counts
            per_gpu = np.where(gpus <= count, unit, unit * count / np.maximum(gpus, 1.0))
            size = int(node.max()) + 1 if len(node) else 0
            by_node = np.argsort(node, kind="stable")
            nodes, starts = np.unique(node[by_node], return_index=True)
            p_min = np.full(size, np.inf)
            np.minimum.at(p_min, node, prio)
            at_min = prio == p_min[node]
            c_min = np.full(size, np.inf)
            np.minimum.at(c_min, node[at_min], cost[at_min])
            u_min = np.full(size, np.inf)
            np.minimum.at(u_min, node, per_gpu)
            vac = np.zeros(size, dtype=np.bool_)
            np.logical_or.at(vac, node, leaving)
            # the largest multiple of the least cost per GPU a sum may reach: a victim's
            # GPUs, or all GPUs freed on the node (-1: a share wider than its job)
            widest = np.zeros(size)
            np.add.at(widest, node, gpus)
            np.maximum.at(widest, node, count)
            irregular = np.zeros(size, dtype=np.bool_)
            np.logical_or.at(irregular, node, gpus > count)
            widest[irregular] = -1.0
            first = np.full(size, len(node), dtype=np.int64)
            np.minimum.at(first, node, np.arange(len(node), dtype=np.int64))
            self._arrays = (
                nodes,
                np.append(starts, len(node)),
                by_node,
                job,
                p_min[nodes],
                c_min[nodes],
                u_min[nodes],
                vac[nodes],
                first[nodes],
                _exact_multiples(u_min[nodes], widest[nodes]),
            )
        return self._arrays

    def by_floor(self, need: int) -> list[tuple[float, float, int, int]]:
        """(floor priority, floor cost, first place in the running order, node's row) of
        every node for a job of `need` GPUs, least first. A node's score is (worst
        priority, total cost) of the victims that make room: at least its least priority
        and, at that priority, its least cost and the GPUs still missing times its least
        cost per GPU (less a margin for the sum's rounding, unless the sums are exact:
        _exact_multiples; free GPUs only shrink while a plan is made, so those at the
        cycle's start bound it)."""
        order = self._orders.get(need)
        if order is None:
            nodes, _, _, _, p_min, c_min, u_min, vac, first, exact = self._index()
            missing = need - self._free[nodes]
            margin = np.where(exact, 1.0, 1.0 - 1e-9)
            floor_c = np.where(missing > 0, np.maximum(c_min, missing * u_min * margin), c_min)
            floor_c[u_min < 0.0] = -np.inf  # a negative cost (saved ahead of done): no bound
            floor_p = np.where(vac, -np.inf, p_min)
            floor_c[vac] = 0.0
            rows = np.lexsort((first, floor_c, floor_p))
            order = list(
                zip(
                    floor_p[rows].tolist(),
                    floor_c[rows].tolist(),
                    first[rows].tolist(),
                    rows.tolist(),
                    strict=True,
                )
            )
            self._orders[need] = order
        return order

    def node_of(self, row: int) -> int:
        return int(self._index()[0][row])

    def shares_of(self, row: int) -> Iterator[tuple[int, int, int]]:
        """(place in the running order, job index, GPUs freed) of each share on the node
        of `row`, in the running order."""
        _, starts, by_node, job, *_ = self._index()
        gpus = self._gpus
        for i in by_node[starts[row] : starts[row + 1]].tolist():
            yield i, int(job[i]), gpus[i]


def _exact_multiples(per_gpu: np.ndarray, widest: np.ndarray) -> np.ndarray:
    """Whether every multiple of `per_gpu` up to `widest` times is a float exactly (few
    enough significant bits). Then a node's victims cost at least those multiples and
    their float sum is at least the GPUs freed times `per_gpu`, rounding and all, so the
    floor needs no margin and nodes that tie on it are told apart by the running order
    alone (jobs started together cost the same: many nodes tie)."""
    finite = np.isfinite(per_gpu) & (per_gpu >= 0.0)
    mantissa, _ = np.frexp(np.where(finite, per_gpu, 0.0))
    bits = (mantissa * 2.0**53).astype(np.int64)
    low = bits & -bits  # the lowest bit set: trailing zeros are its log2
    trailing = np.where(bits == 0, 53, np.log2(np.maximum(low, 1)).astype(np.int64))
    needed = np.ceil(np.log2(np.maximum(widest, 1.0) + 1.0)).astype(np.int64)
    exact: np.ndarray = finite & (widest >= 0.0) & ((53 - trailing) + needed <= 53)
    return exact


def victim_table(
    running: Mapping[str, RunningView],
    gpu_type: str,
    state: ClusterState,
    vacating: Set[str],
    max_per_job: int,
) -> VictimTable:
    """A VictimTable made from running views (any mapping of them)."""
    table = VictimTable(state.whole_free)
    placements = state.placements
    for job_id, r in running.items():
        spec = r.spec
        if r.gpu_type != gpu_type or spec.kind is JobKind.ONLINE or r.preemptions >= max_per_job:
            continue
        placement = placements.get(job_id)
        if placement is not None:
            table.add(
                job_id,
                spec,
                r.lost_work_s,
                r.vacate_s,
                r.resume_s,
                r.run_started_s,
                placement,
                job_id in vacating,
            )
    return table


@runtime_checkable
class IndexedRunning(Protocol):
    """What the core's running jobs offer a CycleView beyond a mapping: the reads a plan
    makes over many running jobs, answered from its records without a view per job."""

    def ends(self, gpu_type: str) -> list[tuple[float, int]]: ...

    def batch_in(
        self, gpu_type: str, teams: Set[str] | None, also: Set[str]
    ) -> Iterator[tuple[str, RunningView]]: ...

    def victim_table(self, gpu_type: str, vacating: Set[str], max_per_job: int) -> VictimTable: ...


class PendingView(NamedTuple):
    """A waiting job as a cycle sees it."""

    spec: JobSpec
    gpu_type: str
    ready_s: float
    """When it (last) became runnable: submit, or the end of its last preemption."""
    vacate_s: float = 0.0
    """What preempting it would cost in checkpoint time once it runs."""
    preemptions: int = 0


@dataclass
class CycleView:
    now_s: float
    cycle_s: float
    state: ClusterState
    running: Mapping[str, RunningView]
    pending: Sequence[PendingView]
    claimed: frozenset[str]
    """Jobs already waiting for their victims to vacate; do not plan them again."""
    vacating: frozenset[str]
    quotas: QuotaBook
    pool_nodes: Mapping[str, BoolArray]
    team_nodes: Mapping[str, BoolArray] | None
    """Static islands: the nodes each team may use. None: one shared pool."""
    reserve: Mapping[str, int]
    rules: PreemptionRules
    rng: np.random.Generator
    placement: ScoringPolicy = field(default_factory=ConsolidatePolicy)
    claims: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Each waiting claimant's victims (still writing their checkpoints)."""
    rank: Mapping[str, int] | None = None
    """An order of the waiting jobs inside each priority class (position, first runs
    first), given by the core to its ordered policies (policies/cycle/ordered.py); None: age."""
    held: Mapping[tuple[str, str], int] | None = None
    """GPUs each (team, pool) holds in running jobs, vacating ones excluded, as the core
    counts them; None: counted from `running`."""
    holders: ReserveHolders | None = None
    """The reserve rules' counts, as the core made them; None: counted from `running`."""
    _allowed: dict[tuple[str, str], BoolArray] = field(default_factory=dict)
    _tables: dict[str, VictimTable] = field(default_factory=dict, init=False, repr=False)

    def usage(self) -> dict[tuple[str, str], int]:
        """GPUs each (team, GPU type) holds in running jobs, vacating ones excluded."""
        if self.held is not None:
            return {key: n for key, n in self.held.items() if n}
        out: dict[tuple[str, str], int] = {}
        for job_id, r in self.running.items():
            if job_id in self.vacating:
                continue
            key = (r.spec.team, r.gpu_type)
            out[key] = out.get(key, 0) + r.spec.gpu_count
        return out

    def ends(self, gpu_type: str) -> list[tuple[float, int]]:
        """(expected end, GPUs) of each running job of the pool, in no order."""
        if isinstance(self.running, IndexedRunning):  # the core's: without a view per job
            return self.running.ends(gpu_type)
        return [
            (r.est_end_s, r.spec.gpu_count) for r in self.running.values() if r.gpu_type == gpu_type
        ]

    def batch_in(
        self, gpu_type: str, teams: Set[str] | None, also: Set[str] = frozenset()
    ) -> Iterator[tuple[str, RunningView]]:
        """Running jobs of the pool that are not online inference, of `teams` (None: of
        any team) or in `also`, in the running jobs' order: a victim search's candidates."""
        if isinstance(self.running, IndexedRunning):  # the core's: views of these only
            return self.running.batch_in(gpu_type, teams, also)
        return (
            (job_id, r)
            for job_id, r in self.running.items()
            if r.gpu_type == gpu_type
            and r.spec.kind is not JobKind.ONLINE
            and (teams is None or r.spec.team in teams or job_id in also)
        )

    def victim_table(self, gpu_type: str) -> VictimTable:
        """The pool's possible victims by node, made once per view (VictimTable)."""
        table = self._tables.get(gpu_type)
        if table is None:
            max_per_job = self.rules.max_per_job
            if isinstance(self.running, IndexedRunning):
                table = self.running.victim_table(gpu_type, self.vacating, max_per_job)
            else:
                table = victim_table(self.running, gpu_type, self.state, self.vacating, max_per_job)
            self._tables[gpu_type] = table
        return table

    def reserve_holders(self) -> ReserveHolders:
        """Online GPUs and quick-to-vacate GPUs of each pool (ReserveHolders)."""
        if self.holders is not None:
            return self.holders
        online_all = {t: 0 for t in self.pool_nodes}
        online, fast = dict(online_all), dict(online_all)
        for job_id, r in self.running.items():
            if r.spec.kind is JobKind.ONLINE:
                online_all[r.gpu_type] += r.spec.gpu_count
                if job_id not in self.vacating:
                    online[r.gpu_type] += r.spec.gpu_count
            elif job_id not in self.vacating and may_hold_reserve(
                self.rules, self.cycle_s, r.spec, r.vacate_s, r.preemptions
            ):
                fast[r.gpu_type] += r.spec.gpu_count
        return ReserveHolders(online_all, online, fast)

    def allowed(self, job: JobSpec, gpu_type: str, held: BoolArray | None = None) -> BoolArray:
        key = (gpu_type, job.team if self.team_nodes is not None else "")
        base = self._allowed.get(key)
        if base is None:
            base = self.pool_nodes[gpu_type].copy()
            if self.team_nodes is not None:
                base &= self.team_nodes.get(job.team, np.zeros_like(base))
            self._allowed[key] = base
        if held is not None and held.any():
            return base & ~held
        return base


class CyclePolicy:
    name = "cycle"

    def queue_key(self, job: JobSpec, ready_s: float) -> tuple[object, ...]:
        """Order of each team's queue; the driver shows a policy the head of each queue."""
        return (job.kind is not JobKind.ONLINE, -job.priority, ready_s, job.job_id)

    def plan(self, view: CycleView) -> list[Command]:
        raise NotImplementedError


def _team_milli(view: CycleView, scratch: ClusterState, team: str, gpu_type: str) -> int:
    """GPU thousandths the team holds in the pool, running and planned this cycle: a
    share counts as the part of a GPU it takes (quotas count whole GPUs otherwise)."""
    pool = view.pool_nodes[gpu_type]
    return sum(
        j.total_gpu_milli
        for job_id, j in scratch.jobs.items()
        if j.team == team
        and job_id not in view.vacating
        and (nodes := scratch.placements[job_id].nodes)
        and pool[nodes[0]]
    )


def _over_maximum(
    view: CycleView,
    scratch: ClusterState,
    usage: Mapping[tuple[str, str], int],
    job: JobSpec,
    gpu_type: str,
) -> bool:
    limit = view.quotas.maximum(job.team, gpu_type, view.now_s)
    if job.shares_gpu:
        return _team_milli(view, scratch, job.team, gpu_type) + job.gpu_milli > limit * 1000
    return usage.get((job.team, gpu_type), 0) + job.gpu_count > limit


def _backfills(
    view: CycleView, job: JobSpec, shadow: tuple[float, int] | None
) -> tuple[bool, tuple[float, int] | None]:
    """EASY rule for a job that fits now while an earlier job holds a reservation:
    it may start if it ends before the reservation or fits in the GPUs spare then.
    Returns (may start, the reservation with those spare GPUs updated)."""
    if shadow is None or view.now_s + (job.duration_s or 0.0) <= shadow[0]:
        return True, shadow
    if job.gpu_count > shadow[1]:
        return False, shadow
    return True, (shadow[0], shadow[1] - job.gpu_count)


def _shadow(
    view: CycleView, scratch: ClusterState, job: JobSpec, gpu_type: str
) -> tuple[float, int]:
    """EASY reservation for a blocked job: (start time, GPUs spare at that time)."""
    pool = view.pool_nodes[gpu_type]
    free = int(np.where(scratch.gpu_left[pool] == 1000, 1, 0).sum())
    ends = view.ends(gpu_type)
    heapq.heapify(ends)  # usually a few ends suffice: no need to sort them all
    t = view.now_s
    while ends and free < job.gpu_count:
        end, gpus = heapq.heappop(ends)
        free += gpus
        t = end
    return t, max(0, free - job.gpu_count)


class FifoPolicy(CyclePolicy):
    name = "fifo"
    backfill = False

    def queue_key(self, job: JobSpec, ready_s: float) -> tuple[object, ...]:
        return (job.submit_s, job.job_id)

    def plan(self, view: CycleView) -> list[Command]:
        scratch = view.state.copy()
        commands: list[Command] = []
        usage = view.usage()
        queue = sorted(view.pending, key=lambda p: (p.spec.submit_s, p.spec.job_id))
        # EASY reservations, one per pool: a job blocked in one pool holds back nothing in
        # another (their GPUs are disjoint).
        shadows: dict[str, tuple[float, int] | None] = {}
        for p in queue:
            job = p.spec
            key = (job.team, p.gpu_type)
            plan = view.placement.place(scratch, job, view.rng, view.allowed(job, p.gpu_type))
            if plan is not None and usage.get(key, 0) + job.gpu_count > view.quotas.maximum(
                job.team, p.gpu_type, view.now_s
            ):
                # Held by its team's maximum, not by capacity: like a job held by a QOS
                # limit, it waits without blocking the queue.
                continue
            if plan is not None:
                ok, shadows[p.gpu_type] = _backfills(view, job, shadows.get(p.gpu_type))
                if not ok:
                    continue
            if plan is None:
                if not self.backfill:
                    break
                if shadows.get(p.gpu_type) is None:
                    shadows[p.gpu_type] = _shadow(view, scratch, job, p.gpu_type)
                continue
            scratch.allocate(job, plan)
            commands.append(Start(job.job_id, plan))
            usage[key] = usage.get(key, 0) + job.gpu_count
        return commands


class BackfillPolicy(FifoPolicy):
    name = "backfill"
    backfill = True


class PriorityQuotaPolicy(CyclePolicy):
    name = "priority-quota"

    def class_order(self, view: CycleView) -> Callable[[PendingView], tuple[object, ...]]:
        """The order inside a priority class: oldest ready first (ordered.py overrides)."""
        return lambda p: (p.ready_s, p.spec.job_id)

    def plan(self, view: CycleView) -> list[Command]:
        scratch = view.state.copy()
        running_usage = view.usage()
        usage = dict(running_usage)
        for p in view.pending:  # a job waiting on its victims already counts for its team
            if p.spec.job_id in view.claimed:
                key = (p.spec.team, p.gpu_type)
                usage[key] = usage.get(key, 0) + p.spec.gpu_count
        commands: list[Command] = []
        taken: set[str] = set()  # victims already chosen this cycle
        # GPUs each team holds above its guarantee: what reclaim may take from it.
        excess = {
            key: held - view.quotas.guaranteed(key[0], key[1], view.now_s)
            for key, held in running_usage.items()
        }
        held = {t: np.zeros(view.state.node_count, dtype=np.bool_) for t in view.pool_nodes}

        def start(job: JobSpec, gpu_type: str, plan: Placement) -> None:
            scratch.allocate(job, plan)
            commands.append(Start(job.job_id, plan))
            key = (job.team, gpu_type)
            usage[key] = usage.get(key, 0) + job.gpu_count

        orphans: set[str] = set()

        def reclaim(
            job: JobSpec,
            gpu_type: str,
            own_team: bool = False,
            by_rank: bool = False,
            min_gpus: int = 0,
        ) -> bool:
            """Preempt the cheapest victims that make room for `job`: borrowers (to give
            its team its guarantee back), its own team's batch work (online inference
            short of unguaranteed room), or, by_rank, borrowing work it outranks."""
            victims = self._victims(
                view,
                scratch,
                job,
                gpu_type,
                taken,
                excess,
                job.team if own_team else None,
                orphans,
                job if by_rank else None,
            )
            if victims is None:
                return False
            nodes, chosen = victims
            if sum(view.running[v].spec.gpu_count for v, _ in chosen) < min_gpus:
                return False  # its team would still be past its maximum
            for v, via_reclaim in chosen:
                taken.add(v)
                if v in orphans:
                    continue  # already leaving: claimed, not preempted again
                r = view.running[v]
                if via_reclaim:
                    excess[(r.spec.team, r.gpu_type)] -= r.spec.gpu_count
                commands.append(
                    Preempt(
                        v,
                        f"{'preempted' if by_rank else 'reclaimed'} for {job.job_id} "
                        f"({job.kind.value})",
                        via_reclaim and not by_rank,
                        job.team if own_team and not via_reclaim and not by_rank else None,
                        job.job_id if by_rank else None,
                    )
                )
            chosen_ids = [v for v, _ in chosen]
            commands.append(Claim(job.job_id, tuple(chosen_ids), tuple(sorted(nodes))))
            held[gpu_type][list(nodes)] = True
            key = (job.team, gpu_type)
            usage[key] = usage.get(key, 0) + job.gpu_count
            return True

        # A job waiting for its victims' checkpoints takes GPUs that freed up meanwhile,
        # before a borrower can (its team already counts them in `usage`).
        held_by = dict(view.claims)
        for p in view.pending:
            if p.spec.job_id in view.claimed:
                plan = view.placement.place(
                    scratch, p.spec, view.rng, view.allowed(p.spec, p.gpu_type)
                )
                if plan is not None:
                    scratch.allocate(p.spec, plan)
                    commands.append(Start(p.spec.job_id, plan))
                    held_by.pop(p.spec.job_id, None)
        # Victims whose claimant started elsewhere still leave: their GPUs go to the next
        # entitled job that claims them (no second preemption), not to a borrower.
        orphans.update(view.vacating - frozenset().union(*held_by.values()))
        waiting = [p for p in view.pending if p.spec.job_id not in view.claimed]
        online_held = dict(view.reserve_holders().online_all)
        # Within each team, online first, then by priority and age; what fits inside the
        # team's guarantee is entitled (and may reclaim), the rest borrows by fair share.
        tail = self.class_order(view)
        waiting.sort(key=lambda p: (p.spec.kind is not JobKind.ONLINE, -p.spec.priority, *tail(p)))
        entitled: list[PendingView] = []
        borrowing: list[PendingView] = []
        planned = dict(usage)
        for p in waiting:
            key = (p.spec.team, p.gpu_type)
            if planned.get(key, 0) + p.spec.gpu_count <= view.quotas.guaranteed(
                p.spec.team, p.gpu_type, view.now_s
            ):
                planned[key] = planned.get(key, 0) + p.spec.gpu_count
                entitled.append(p)
            else:
                borrowing.append(p)
        borrowing.sort(
            key=lambda p: (
                p.spec.kind is not JobKind.ONLINE,
                view.quotas.fair_rank(p.spec.team),
                -p.spec.priority,
                *tail(p),
            )
        )
        fast_held = self._fast_held(view)
        by_priority = view.rules.by_priority
        shadows: dict[str, tuple[float, int] | None] = {}
        # The scratch state only fills up while planning: once a shape fails to fit in a
        # set of nodes, anything at least as big fails there too.
        failed: dict[tuple[object, ...], int] = {}
        for within, group in ((True, entitled), (False, borrowing)):
            for p in group:
                job, t = p.spec, p.gpu_type
                online = job.kind is JobKind.ONLINE
                shape = (
                    t,
                    job.team if view.team_nodes is not None else "",
                    job.gpu_milli,
                    job.kind is JobKind.ONLINE,
                    job.cpu_milli // max(1, job.gpu_count),
                    job.mem_mib // max(1, job.gpu_count),
                    job.gpu_models,
                )
                if (
                    job.gpu_count >= failed.get(shape, 1 << 30)
                    and not within
                    and not online
                    and not by_priority
                ):
                    continue  # a borrowing batch job has no other way in than free GPUs
                if _over_maximum(view, scratch, usage, job, t):
                    # At its team's maximum: a whole-GPU job may only take the place of
                    # its own team's work that it outranks (preempting others would take
                    # it past).
                    over = (
                        usage.get((job.team, t), 0)
                        + job.gpu_count
                        - view.quotas.maximum(job.team, t, view.now_s)
                    )
                    if (
                        (online or by_priority)
                        and not job.shares_gpu
                        and over > 0
                        and reclaim(job, t, own_team=True, by_rank=True, min_gpus=over)
                        and online
                    ):
                        online_held[t] += job.gpu_count
                    continue
                if (
                    not within
                    and p.preemptions >= view.rules.max_per_job
                    and not self._unguaranteed_room(view, usage, job, t, scratch)
                ):
                    # Preempted enough: nothing may preempt it again, so like online work
                    # it borrows only capacity no other team is guaranteed.
                    continue
                if (
                    online
                    and not within
                    and not self._unguaranteed_room(view, usage, job, t, scratch)
                ):
                    # No capacity nobody is guaranteed: it may still displace its own
                    # team's batch work, which changes no other team's share.
                    if reclaim(job, t, own_team=True):
                        online_held[t] += job.gpu_count
                    continue
                if (
                    not online
                    and not within
                    and not self._reserve_ok(view, scratch, p, online_held[t], fast_held)
                ):
                    continue  # borrowing must leave the online reserve quick to free
                plan = view.placement.place(scratch, job, view.rng, view.allowed(job, t, held[t]))
                if plan is not None and not online:
                    ok, shadows[t] = _backfills(view, job, shadows.get(t))
                    if not ok:
                        continue
                if plan is not None:
                    start(job, t, plan)
                    if online:
                        online_held[t] += job.gpu_count
                    elif self._can_vacate(view, job, p.vacate_s, p.preemptions):
                        fast_held[t] += job.gpu_count
                    continue
                if not held[t].any():
                    failed[shape] = min(failed.get(shape, 1 << 30), job.gpu_count)
                if within and reclaim(job, t):
                    if online:
                        online_held[t] += job.gpu_count
                    continue
                # Not entitled: it may still displace borrowing work it outranks (online
                # inference always, when it cannot otherwise start; the rest if enabled).
                if not within and (online or by_priority) and reclaim(job, t, by_rank=True):
                    if online:
                        online_held[t] += job.gpu_count
                    continue
                if shadows.get(t) is None:
                    shadows[t] = _shadow(view, scratch, job, t)
        return commands

    @staticmethod
    def _unguaranteed_room(
        view: CycleView,
        usage: Mapping[tuple[str, str], int],
        job: JobSpec,
        gpu_type: str,
        scratch: ClusterState | None = None,
    ) -> bool:
        """Online inference is never preempted, so it borrows only capacity no other team
        is guaranteed: otherwise that team could not get its guarantee back."""
        others = sum(
            view.quotas.guaranteed(team, gpu_type, view.now_s)
            for team in view.quotas.teams
            if team != job.team
        )
        total = int(view.state.gpu_count[view.pool_nodes[gpu_type]].sum())
        if job.shares_gpu and scratch is not None:  # a share counts as its part of a GPU
            room = (total - others) * 1000
            return _team_milli(view, scratch, job.team, gpu_type) + job.gpu_milli <= room
        return usage.get((job.team, gpu_type), 0) + job.gpu_count <= total - others

    @staticmethod
    def _can_vacate(view: CycleView, job: JobSpec, vacate_s: float, preemptions: int) -> bool:
        return may_hold_reserve(view.rules, view.cycle_s, job, vacate_s, preemptions)

    def _fast_held(self, view: CycleView) -> dict[str, int]:
        """GPUs of each pool held by work that could vacate the reserve in time; only a
        pool with a reserve asks (`_reserve_ok`), so without one nothing is counted."""
        if not any(view.reserve.values()):
            return {t: 0 for t in view.pool_nodes}
        return dict(view.reserve_holders().fast)

    def _reserve_ok(
        self,
        view: CycleView,
        scratch: ClusterState,
        p: PendingView,
        online_held: int,
        fast_held: dict[str, int],
    ) -> bool:
        """The online reserve must stay idle or held by jobs that vacate within its bound
        (preemption.reserve_vacate_s, else a cycle) and that an online job may preempt."""
        needed = view.reserve.get(p.gpu_type, 0) - online_held
        if needed <= 0 or self._can_vacate(view, p.spec, p.vacate_s, p.preemptions):
            return True
        pool = view.pool_nodes[p.gpu_type]
        idle = int((scratch.gpu_left[pool] == 1000).sum())
        return idle - p.spec.gpu_count + fast_held[p.gpu_type] >= needed

    def _victims(
        self,
        view: CycleView,
        scratch: ClusterState,
        job: JobSpec,
        gpu_type: str,
        taken: set[str],
        excess: dict[tuple[str, str], int],
        team: str | None = None,
        orphans: Set[str] = frozenset(),
        claimant: JobSpec | None = None,
    ) -> tuple[set[int], list[tuple[str, bool]]] | None:
        """Cheapest set of borrowed jobs whose GPUs, with idle ones, make room for `job`.

        A victim's team must hold GPUs above its guarantee; borrowed GPUs are reclaimable
        whatever their minimum runtime. Cheapest: lowest priority first,
        then least (lost work + checkpoint + resume) x GPUs. A job that fits in one node
        takes victims from one node (a victim spanning nodes leaves them all); a wider
        job takes whole nodes. Returns the nodes and (victim, reclaimed?) pairs.
        Orphans (leaving already, their claimant gone) come first and cost nothing.
        A victim that would lose more than preemption.max_lost_work_s is skipped. With a
        `claimant` (priority preemption) only borrowing jobs it outranks qualify, and,
        unless it is online inference, only once they ran their minimum runtime.
        """
        allowed = view.allowed(job, gpu_type)
        rules = view.rules
        bound = math.inf if rules.max_lost_work_s is None else rules.max_lost_work_s + 1e-9
        patient = claimant is not None and claimant.kind is not JobKind.ONLINE
        online = JobKind.ONLINE
        by_online = claimant is not None and claimant.kind is online
        above = math.inf if claimant is None or by_online else claimant.priority
        now_s, min_runtime_s = view.now_s, rules.min_runtime_s
        # Reclaiming for a job that fits in a node, a victim of a team not above its
        # guarantee is never admitted (admit below): not worth a look.
        teams: Set[str] | None = None
        if team is not None:
            teams = {team}
        elif job.gpu_count <= view.state.max_gpus_per_node:
            teams = {t for (t, pool), n in excess.items() if pool == gpu_type and n > 0}

        def admit(job_id: str, left: dict[tuple[str, str], int]) -> bool | None:
            """True if its team still holds GPUs above its guarantee (a job straddling the
            line goes whole: its team then waits with less room than the job needs)."""
            if job_id in orphans:
                return True
            r = view.running[job_id]
            key = (r.spec.team, r.gpu_type)
            if left.get(key, 0) > 0:
                left[key] = left.get(key, 0) - r.spec.gpu_count
                return True
            if team is not None:
                return False  # its own team's batch work, displaced by its online inference
            return None

        width = view.state.max_gpus_per_node
        if job.gpu_count <= width:
            # One node: the node whose cheapest sufficient victims score least (worst
            # priority, then total cost), the earliest in the running order on a tie.
            # Nodes are visited by floor (VictimTable.by_floor), so the search stops at
            # the first node that cannot beat the best, having scored only those before.
            table = view.victim_table(gpu_type)
            whole_free = scratch.whole_free
            jobs = table.jobs
            best: tuple[tuple[float, float], int, int, list[tuple[str, bool]]] | None = None
            for floor_p, floor_c, first, row in table.by_floor(job.gpu_count):
                if best is not None and ((floor_p, floor_c), first) > best[:2]:
                    break
                node = table.node_of(row)
                if not allowed[node]:
                    continue
                cands: list[tuple[tuple[float, float], str, int, str, int]] = []
                seq = -1
                for e_seq, k, gpus in table.shares_of(row):
                    e_key, job_id, e_team, lost, started, leaving, count, _, _ = jobs[k]
                    orphan = job_id in orphans
                    if (
                        job_id in taken
                        or (teams is not None and e_team not in teams and not orphan)
                        or (team is not None and e_team != team)
                        or (leaving and not orphan)
                    ):
                        continue
                    if not orphan and (
                        lost > bound
                        or e_key[0] >= above
                        or (patient and now_s - started < min_runtime_s)
                    ):
                        continue
                    if seq < 0:
                        seq = e_seq
                    cands.append(
                        ((-math.inf, 0.0) if orphan else e_key, job_id, gpus, e_team, count)
                    )
                if not cands:
                    continue
                free = int(whole_free[node])
                left = dict(excess)
                chosen: list[tuple[str, bool]] = []
                worst: tuple[float, float] = (0.0, 0.0)
                total = 0.0
                for c_key, job_id, gpus, e_team, count in sorted(cands):
                    if free >= job.gpu_count:
                        break
                    # admit, read from the table (no view made)
                    if job_id in orphans:
                        via = True
                    elif left.get((e_team, gpu_type), 0) > 0:
                        left[(e_team, gpu_type)] -= count
                        via = True
                    elif team is not None:
                        via = False
                    else:
                        continue
                    chosen.append((job_id, via))
                    free += gpus
                    worst = max(worst, c_key)
                    total += c_key[1]
                if free >= job.gpu_count and chosen:
                    score = (worst[0], total)
                    if best is None or (score, seq) < best[:2]:
                        best = (score, seq, node, chosen)
            return None if best is None else ({best[2]}, best[3])
        # the loop below visits every running job of the pool: its tests are written out
        # flat (no property, no call)
        max_per_job = rules.max_per_job
        vacating = view.vacating
        placements = view.state.placements
        by_node: dict[int, list[tuple[tuple[float, float], str, int]]] = {}
        for job_id, r in view.batch_in(gpu_type, teams, orphans):
            spec = r.spec
            if (
                r.gpu_type != gpu_type
                or spec.kind is online
                or r.preemptions >= max_per_job
                or job_id in taken
                or (team is not None and spec.team != team)
                or (job_id in vacating and job_id not in orphans)
            ):
                continue
            if job_id not in orphans and (
                r.lost_work_s > bound
                or spec.priority >= above
                or (patient and now_s - r.run_started_s < min_runtime_s)
            ):
                continue
            placement = placements.get(job_id)
            if placement is None:
                continue
            key: tuple[float, float] = (
                (-math.inf, 0.0)
                if job_id in orphans
                else (r.spec.priority, (r.lost_work_s + r.vacate_s + r.resume_s) * r.spec.gpu_count)
            )
            for share in placement.shares:
                by_node.setdefault(share.node, []).append((key, job_id, len(share.gpus)))

        # Wider than a node: whole nodes, every job on them a victim.
        need_nodes = -(-job.gpu_count // width)
        options: list[tuple[tuple[float, float], int, list[str]]] = []
        for node in np.flatnonzero(allowed).tolist():
            items = by_node.get(node, [])
            if int(scratch.whole_free[node]) + sum(g for _, _, g in items) < width:
                continue
            node_cost: tuple[float, float] = (
                max((k[0] for k, _, _ in items), default=0.0),
                float(sum(k[1] for k, _, _ in items)),
            )
            options.append((node_cost, node, [j for _, j, _ in items]))
        options.sort()
        left = dict(excess)
        picked: set[int] = set()
        victims: dict[str, bool] = {}
        for _, node, node_victims in options:
            trial = dict(left)
            how_all: dict[str, bool] = {}
            for job_id in node_victims:
                if job_id in victims:
                    continue
                how = admit(job_id, trial)
                if how is None:
                    break
                how_all[job_id] = how
            else:
                left = trial
                victims.update(how_all)
                picked.add(node)
                if len(picked) == need_nodes:
                    break
        if len(picked) < need_nodes or not victims:
            return None
        return picked, sorted(victims.items())


register("cycle", "fifo")(FifoPolicy)
register("cycle", "backfill")(BackfillPolicy)
register("cycle", "priority-quota")(PriorityQuotaPolicy)
CYCLE_POLICIES: dict[str, Callable[[], CyclePolicy]] = factories("cycle")
"""The registry's cycle policies (kept under this name for the core and the CLI)."""

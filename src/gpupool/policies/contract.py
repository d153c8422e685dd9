"""The cycle policies' contract: the view a policy plans on, and the plan it returns.

A plan is a list of commands: Start (a job on a placement), Preempt (a running job, with
a reason) and Claim (start this job as soon as these victims have vacated). The policy
plans on a scratch copy of the cluster state; the decision core (gpupool.scheduler)
validates every command against the real state (capacity, co-location, quota maxima,
lifecycle, preemption rules) before applying it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

from gpupool.domain.model import JobKind, JobSpec, Placement
from gpupool.domain.quota import QuotaBook
from gpupool.domain.state import BoolArray, ClusterState
from gpupool.policies.placement.base import ScoringPolicy
from gpupool.policies.placement.consolidate import ConsolidatePolicy
from gpupool.policies.preemption import PreemptionRules, may_hold_reserve
from gpupool.policies.registry import factory
from gpupool.policies.victims import ReserveHolders, RunningView, VictimTable, victim_table


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


@dataclass(frozen=True)
class Claim:
    """Start `job_id` the moment `victims` have written their checkpoints and left."""

    job_id: str
    victims: tuple[str, ...]
    nodes: tuple[int, ...] = ()
    """Where the job will go: the nodes its victims free (held for it meanwhile)."""


Command = Start | Preempt | Claim


@dataclass(frozen=True)
class Reservation:
    """GPUs a plan keeps for a waiting job from `start_s` (policies/cycle/reservations.py):
    the core tells it (`gpupool why`, the dashboard); it starts nothing."""

    job_id: str
    pool: str
    start_s: float
    gpus: tuple[tuple[int, int], ...]
    """(node, GPU index) it is to start on."""
    idle: tuple[tuple[int, int], ...]
    """Those of them idle now, kept idle for it (its nodes drain)."""

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(sorted({n for n, _ in self.gpus}))


@runtime_checkable
class IndexedRunning(Protocol):
    """What the core's running jobs offer a CycleView beyond a mapping: the reads a plan
    makes over many running jobs, answered from its records without a view per job."""

    def ends(self, gpu_type: str) -> list[tuple[float, int]]: ...

    def job_ends(self, gpu_type: str) -> list[tuple[str, float]]: ...

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
    reservations: bool = False
    """Reservations of specific GPUs with backfill (policies/cycle/reservations.py);
    False: one EASY reservation per pool, counted in GPUs."""
    placement: ScoringPolicy = field(default_factory=ConsolidatePolicy)
    claims: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Each waiting claimant's victims (still writing their checkpoints)."""
    rank: Mapping[str, int] | None = None
    """An order of the waiting jobs inside each priority class (position, first runs
    first), given by the core to its ordered policies (policies/cycle/ordered.py) and, where
    a team has several users, by fair share (scheduler/user_shares.py); None: age."""
    priority_boost: Mapping[str, int] = field(default_factory=dict)
    """Priority points waiting jobs gained by aging (`priority_aging_h`): they order the
    queue as if their priority were that much higher; preemption ignores them."""
    held: Mapping[tuple[str, str], int] | None = None
    """GPUs each (team, pool) holds in running jobs, vacating ones excluded, as the core
    counts them; None: counted from `running`."""
    lending: Mapping[tuple[str, str], int] = field(default_factory=dict)
    """GPUs the elastic lends in flight move between teams: the online jobs waiting for
    them are hidden from the plan and their donors still hold the cards until they left,
    so `usage` alone shows the online team short of what it has been given."""
    holders: ReserveHolders | None = None
    """The reserve rules' counts, as the core made them; None: counted from `running`."""
    reserved: list[Reservation] = field(default_factory=list)
    """What the plan reserved (it fills this in): the core publishes it after planning."""
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

    def usage_after_lends(self) -> dict[tuple[str, str], int]:
        """`usage` with the lends in flight done: what quotas and guarantees compare."""
        out = self.usage()
        for key, n in self.lending.items():
            out[key] = out.get(key, 0) + n
        return out

    def ends(self, gpu_type: str) -> list[tuple[float, int]]:
        """(expected end, GPUs) of each running job of the pool, in no order."""
        if isinstance(self.running, IndexedRunning):  # the core's: without a view per job
            return self.running.ends(gpu_type)
        return [
            (r.est_end_s, r.spec.gpu_count) for r in self.running.values() if r.gpu_type == gpu_type
        ]

    def job_ends(self, gpu_type: str) -> list[tuple[str, float]]:
        """(job, expected end) of each running job of the pool, in no order."""
        if isinstance(self.running, IndexedRunning):
            return self.running.job_ends(gpu_type)
        return [(j, r.est_end_s) for j, r in self.running.items() if r.gpu_type == gpu_type]

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
    orders_by_rank = False
    """It orders each priority class by `CycleView.rank` when the core gives one (fair
    share inside a team); fifo and backfill keep the submit order."""

    def queue_key(self, job: JobSpec, ready_s: float) -> tuple[object, ...]:
        """Order of each team's queue; the driver shows a policy the head of each queue."""
        return (job.kind is not JobKind.ONLINE, -job.priority, ready_s, job.job_id)

    def plan(self, view: CycleView) -> list[Command]:
        raise NotImplementedError


def cycle_policy(name: str) -> CyclePolicy:
    """A new cycle policy of the kind registered under `name`."""
    policy: CyclePolicy = factory("cycle", name)()
    return policy

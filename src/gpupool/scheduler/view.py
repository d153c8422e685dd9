"""What a policy plans from: the CycleView of the waiting jobs it may start and the running
jobs as a cycle sees them, these built only for the jobs the policy looks at.

A policy plans from a CycleView. Most cycles read only a few running jobs: the victims
of a reclaim, or a reservation's end times. Building a RunningView for every running job
on every cycle made the cycle's cost grow with the fleet (tens of thousands of jobs at
100,000 GPUs). So `RunningViews` builds a job's view the first time the plan reads it.
The totals the policies used to scan for (GPUs per team, online GPUs, reserve holders)
come from the core's own counts (`held`) or from one pass, only when a pool keeps an
online reserve (`reserve_holders`).

A view is valid until the plan it serves is applied: it reads the core's records as
they are when a job is first looked up.
"""

from __future__ import annotations

import math
from collections.abc import ItemsView, Iterator, Mapping, Set, ValuesView

import numpy as np

from gpupool.domain.model import JobKind
from gpupool.policies.contract import CycleView, PendingView
from gpupool.policies.placement.base import ScoringPolicy
from gpupool.policies.preemption import may_hold_reserve
from gpupool.policies.victims import ReserveHolders, RunningView, VictimTable
from gpupool.scheduler.book import JobBook
from gpupool.scheduler.fleet import Fleet
from gpupool.scheduler.jobs import JobRecord


def expected_end_s(r: JobRecord, now: float) -> float:
    """When a running job is expected to end: its work left at its speed, after what is
    left of its start overhead (never, without a duration)."""
    return now + (((r.spec.duration_s or math.inf) - r.done_s) / max(r.speed, 1e-9) + r.overhead_s)


class RunningViews(Mapping[str, RunningView]):
    """The book's running jobs as RunningViews at `now`, each made when first read."""

    def __init__(self, book: JobBook, now: float) -> None:
        self._book = book
        self._running: Mapping[str, JobRecord] = book.running
        self._now = now
        self._made: dict[str, RunningView] = {}
        self._costs: dict[float, tuple[float, float]] = {}
        """(checkpoint write, resume) per GiB of state: a handful of distinct sizes."""

    def __getitem__(self, job_id: str) -> RunningView:
        made = self._made.get(job_id)
        if made is None:
            made = self._made[job_id] = self._make(job_id, self._running[job_id])
        return made

    def _make(self, job_id: str, r: JobRecord) -> RunningView:
        spec = r.spec
        gib = spec.state_gib_per_gpu
        cost = self._costs.get(gib)
        if cost is None:
            ck = self._book.config.checkpoint
            cost = self._costs[gib] = (ck.write_s(gib), ck.resume_s(gib))
        preemptions = r.preemptions
        if job_id in self._book.elastic.pending:  # mid-resize: no policy may take it
            preemptions = max(preemptions, self._book.config.preemption.max_per_job)
        return RunningView(
            spec,
            r.gpu_type,
            r.run_started_s,
            preemptions,
            cost[0],
            r.done_s - r.saved_s,
            cost[1],
            expected_end_s(r, self._now),
        )

    def _all(self) -> dict[str, RunningView]:
        """Every running job's view, in the core's order (a plan that visits them all:
        a victim search): made in one pass, once per view."""
        if len(self._made) < len(self._running):
            made, make = self._made, self._make
            self._made = {
                job_id: made[job_id] if job_id in made else make(job_id, r)
                for job_id, r in self._running.items()
            }
        return self._made

    def batch_in(
        self, gpu_type: str, teams: Set[str] | None, also: Set[str]
    ) -> Iterator[tuple[str, RunningView]]:
        """CycleView.batch_in, choosing on the records before any view is made."""
        online = JobKind.ONLINE
        for job_id, r in self._running.items():
            if (
                r.gpu_type == gpu_type
                and r.spec.kind is not online
                and (teams is None or r.spec.team in teams or job_id in also)
            ):
                yield job_id, self[job_id]

    def items(self) -> ItemsView[str, RunningView]:
        return self._all().items()

    def values(self) -> ValuesView[RunningView]:
        return self._all().values()

    def ends(self, gpu_type: str) -> list[tuple[float, int]]:
        """(expected end, GPUs) of each running job in the pool: what an EASY reservation
        reads, straight from the records (no view made per job)."""
        now = self._now
        return [
            (expected_end_s(r, now), r.spec.gpu_count)
            for r in self._running.values()
            if r.gpu_type == gpu_type
        ]

    def job_ends(self, gpu_type: str) -> list[tuple[str, float]]:
        """(job, expected end) of each running job in the pool: what a reservation of
        specific GPUs reads, straight from the records. A job with a time limit is stopped
        at it, so it ends by then whatever its estimate says (live jobs give no duration)."""
        now, limit_of = self._now, self._book.time_limit_s
        out = []
        for job_id, r in self._running.items():
            if r.gpu_type != gpu_type:
                continue
            end = expected_end_s(r, now)
            limit = limit_of(r.spec)
            if limit is not None:
                end = min(end, max(now, r.run_started_s + limit))
            out.append((job_id, end))
        return out

    def victim_table(self, gpu_type: str, vacating: Set[str], max_per_job: int) -> VictimTable:
        """CycleView.victim_table straight from the records: the same entries as one made
        from every view (cycle.victim_table), without a view per job."""
        book = self._book
        table = VictimTable(book.state.whole_free)
        placements = book.state.placements
        pending = book.elastic.pending
        costs = self._costs
        online = JobKind.ONLINE
        for job_id, r in self._running.items():
            spec = r.spec
            if r.gpu_type != gpu_type or spec.kind is online:
                continue
            preemptions = r.preemptions
            if job_id in pending:  # mid-resize: no policy may take it (as _make)
                preemptions = max(preemptions, book.config.preemption.max_per_job)
            if preemptions >= max_per_job:
                continue
            placement = placements.get(job_id)
            if placement is None:
                continue
            gib = spec.state_gib_per_gpu
            cost = costs.get(gib)
            if cost is None:
                ck = book.config.checkpoint
                cost = costs[gib] = (ck.write_s(gib), ck.resume_s(gib))
            table.add(
                job_id,
                spec,
                r.done_s - r.saved_s,
                cost[0],
                cost[1],
                r.run_started_s,
                placement,
                job_id in vacating,
            )
        return table

    def __iter__(self) -> Iterator[str]:
        return iter(self._running)

    def __len__(self) -> int:
        return len(self._running)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._running


def reserve_holders(
    book: JobBook, pool_nodes: Mapping[str, object], reserve: Mapping[str, int]
) -> ReserveHolders:
    """Who holds each pool's GPUs, as the online reserve rules ask: online GPUs (vacating
    ones counted too, and apart), and GPUs of work that could leave the reserve in time.
    One pass over the running jobs, made only when some pool keeps a reserve: without
    one, no rule reads these counts."""
    pools = {t: 0 for t in pool_nodes}
    if not any(reserve.values()):
        return ReserveHolders(pools, dict(pools), dict(pools))
    online_all, online, fast = dict(pools), dict(pools), dict(pools)
    ck, rules, cycle_s = book.config.checkpoint, book.config.preemption, book.config.cycle_s
    pending, vacating = book.elastic.pending, book.vacating
    for job_id, r in book.running.items():
        spec = r.spec
        if spec.kind is JobKind.ONLINE:
            online_all[r.gpu_type] += spec.gpu_count
            if job_id not in vacating:
                online[r.gpu_type] += spec.gpu_count
            continue
        if job_id in vacating:
            continue
        preemptions = r.preemptions
        if job_id in pending:
            preemptions = max(preemptions, rules.max_per_job)
        if may_hold_reserve(rules, cycle_s, spec, ck.write_s(spec.state_gib_per_gpu), preemptions):
            fast[r.gpu_type] += spec.gpu_count
    return ReserveHolders(online_all, online, fast)


def lends_in_flight(book: JobBook, lent: Set[str]) -> dict[tuple[str, str], int]:
    """GPUs per (team, pool) that the lends in flight move: each online job waiting for a
    lend counts for its team, the cards its donor is giving up no longer for the donor's."""
    moved: dict[tuple[str, str], int] = {}
    for job_id in lent:
        r = book.records[job_id]
        key = (r.spec.team, r.gpu_type)
        moved[key] = moved.get(key, 0) + r.spec.gpu_count
    for job_id, p in book.elastic.pending.items():
        donor = book.running.get(job_id)
        if not p.lent_to or donor is None:
            continue
        key = (donor.spec.team, donor.gpu_type)
        moved[key] = moved.get(key, 0) - max(0, donor.spec.gpu_count - p.placement.gpu_count)
    return moved


def cycle_view(
    book: JobBook,
    fleet: Fleet,
    placement: ScoringPolicy,
    rng: np.random.Generator,
    now: float,
    deferred: set[str],
    rank: Mapping[str, int] | None = None,
    boost: Mapping[str, int] | None = None,
) -> CycleView:
    """What the policy plans from. Running jobs are seen through RunningViews (each made
    when the plan first reads it) and the totals the book keeps, so a cycle costs what the
    plan looks at, not one view per running job."""
    cfg = book.config
    ck = cfg.checkpoint
    reserve = fleet.reserve_now()
    lent = book.elastic.hidden(book.claims) if book.elastic.claimants else set()
    pending = [
        PendingView(
            r.spec, r.gpu_type, r.ready_s, ck.write_s(r.spec.state_gib_per_gpu), r.preemptions
        )
        for r in book.visible(now, deferred, rank)
        if r.job_id not in lent
    ]
    return CycleView(
        now_s=now,
        cycle_s=cfg.cycle_s,
        state=book.state,
        running=RunningViews(book, now),
        pending=pending,
        claimed=frozenset(book.claims),
        vacating=frozenset(book.vacating),
        quotas=book.quotas,
        pool_nodes=fleet.pool_nodes,
        team_nodes=fleet.team_nodes,
        reserve=reserve,
        rules=cfg.preemption,
        reservations=cfg.reservations,
        rng=rng,
        placement=placement,
        claims={c: frozenset(v) for c, v in book.claims.items()},
        rank=rank,
        priority_boost=boost or {},
        held=book.held,
        lending=lends_in_flight(book, lent) if lent else {},
        holders=reserve_holders(book, fleet.pool_nodes, reserve),
    )

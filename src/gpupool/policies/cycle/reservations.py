"""Reservations with backfill, as the cycle policies apply them.

A job that cannot start holds a reservation of specific GPUs from the time they are
expected to be free: the running jobs' expected ends (the core's estimate of their work
left). Jobs planned after it start only on GPUs it does not need, or on its GPUs where
they are expected to end before it starts. Its GPUs that are idle now stay idle: the node
drains for it, so a wide job is not overtaken forever by narrow ones that keep a few GPUs
of every node busy. Reservations are worked out afresh each cycle, from the state: they
follow the running jobs' real ends.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from gpupool.domain.model import JobKind, JobSpec, Placement
from gpupool.domain.state import BoolArray, ClusterState
from gpupool.domain.topology import NO_DOMAIN
from gpupool.policies.contract import CycleView, Reservation


class QuotaHold(NamedTuple):
    """The first job of a (team, pool) that its team's limit holds."""

    job_id: str
    room_at_s: float
    """When the team's running jobs are expected to have left it room."""
    ready_s: float
    limit: int


RESERVE_AFTER_S = 24 * 3600.0
"""A job that has waited this long holds a reservation even behind its queue's head."""


def expected_end_s(now_s: float, job: JobSpec) -> float:
    """When a job started now is expected to end: its duration, else its time limit, else
    never (it may use a reserved GPU only if it surely leaves in time)."""
    limits = [x for x in (job.duration_s, job.time_limit_s) if x is not None]
    return now_s + min(limits) if limits else math.inf


class Reservations:
    """The reservations of one plan, kept in its scratch state: a reserved GPU that is
    idle is out of service there, so a later job's placement does not see it."""

    def __init__(self, view: CycleView, scratch: ClusterState) -> None:
        self.view = view
        self.scratch = scratch
        self.made: list[Reservation] = []
        self.heads: set[tuple[str, str]] = set()
        """(team, pool) queues whose first blocked job holds a reservation."""
        self._free_at: dict[str, dict[int, list[float]]] = {}
        self.quota_heads: dict[tuple[str, str], QuotaHold] = {}
        """(team, pool) -> the first job its team's limit holds, and when the team's
        running jobs are expected to have left it room."""

    def wants(self, job: JobSpec, pool: str, ready_s: float) -> bool:
        """Whether a blocked job holds a reservation: the first of its team's queue for the
        pool, or one that has waited past RESERVE_AFTER_S."""
        if job.gpu_count == 0 or job.shares_gpu:
            return False
        key = (job.team, pool)
        if key not in self.heads:
            return True
        return self.waited_long(ready_s)

    def waited_long(self, ready_s: float) -> bool:
        """Whether a job ready since `ready_s` has waited past RESERVE_AFTER_S."""
        return self.view.now_s - ready_s >= RESERVE_AFTER_S

    def aged(self, job: JobSpec, ready_s: float) -> bool:
        """Whether a batch job has waited past RESERVE_AFTER_S."""
        return job.kind is not JobKind.ONLINE and self.waited_long(ready_s)

    def free_at(self, pool: str) -> dict[int, list[float]]:
        """When each GPU of the pool's nodes is expected to be whole and idle: now if it
        is, the latest expected end of the jobs on it, never if it is out of service."""
        cached = self._free_at.get(pool)
        if cached is not None:
            return cached
        view, scratch = self.view, self.scratch
        now = view.now_s
        ends = dict(view.job_ends(pool))
        times: dict[int, list[float]] = {}
        for n in np.flatnonzero(view.pool_nodes[pool]).tolist():
            out = scratch.out_gpus[n]
            times[n] = [math.inf if g in out else now for g in range(int(scratch.gpu_count[n]))]
        for job_id, placement in scratch.placements.items():
            end = ends.get(job_id)
            for share in placement.shares:
                row = times.get(share.node)
                if row is None or not share.gpus:
                    continue
                if end is None:
                    end = expected_end_s(now, scratch.jobs[job_id])
                for g in share.gpus:
                    row[g] = max(row[g], end)
        self._free_at[pool] = times
        return times

    def started(self, job: JobSpec, pool: str, plan: Placement) -> None:
        """A job planned to start now: its GPUs are busy until it is expected to end."""
        times = self._free_at.get(pool)
        if times is None:
            return
        end = expected_end_s(self.view.now_s, job)
        for share in plan.shares:
            row = times.get(share.node)
            if row is not None:
                for g in share.gpus:
                    row[g] = max(row[g], end)

    def reserve(self, job: JobSpec, pool: str, ready_s: float, allowed: BoolArray) -> None:
        """Reserve GPUs for a blocked job (if it wants one: `wants`) where they are
        expected free first; keep those idle now out of this plan."""
        if not self.wants(job, pool, ready_s):
            return
        self.heads.add((job.team, pool))
        times = self.free_at(pool)
        nodes = [n for n in np.flatnonzero(allowed).tolist() if n in times]
        found = earliest_gpus(times, nodes, job.gpu_count)
        wide = job.gpu_count > self.scratch.max_gpus_per_node
        if job.topology is not None and self.scratch.topology.placing and wide:
            found = earliest_in_domain(self.scratch, job.topology, times, nodes, job.gpu_count)
        if found is None:
            return
        start_s, gpus = found
        now = self.view.now_s
        idle = tuple((n, g) for n, g in gpus if times[n][g] <= now)
        for n, g in idle:
            self.scratch.set_gpu_out(n, g, True)
        end = start_s + (job.duration_s if job.duration_s is not None else math.inf)
        for n, g in gpus:  # a later reservation does not take them while this job runs
            times[n][g] = max(times[n][g], end)
        made = Reservation(job.job_id, pool, start_s, gpus, idle)
        self.made.append(made)
        self.view.reserved.append(made)

    def hold_quota(
        self,
        job: JobSpec,
        pool: str,
        held: int,
        limit: int,
        ahead: Sequence[JobSpec] = (),
        ready_s: float = -math.inf,
    ) -> None:
        """Its team holds `held` GPUs of the pool, and `limit` (its maximum, or the
        guarantee it is entitled to) has no room for the job: the first such job of the
        team keeps the room its team's jobs free as they end; jobs of the team behind it
        may take that room only if they end before it comes (`quota_allows`). `ahead`: jobs
        of the team counted in `held` that are about to start; `ready_s`: since when the
        job has waited (a job wider than `limit` that has waited longer is not behind it)."""
        key = (job.team, pool)
        if key in self.quota_heads or job.shares_gpu:
            return
        view, scratch = self.view, self.scratch
        now = view.now_s
        ends = dict(view.job_ends(pool))
        mask = view.pool_nodes[pool]
        team = sorted(
            [
                (ends.get(j) or expected_end_s(now, spec), spec.gpu_count)
                for j, spec in scratch.jobs.items()
                if spec.team == job.team
                and j not in view.vacating
                and (nodes := scratch.placements[j].nodes)
                and mask[nodes[0]]
            ]
            + [(expected_end_s(now, spec), spec.gpu_count) for spec in ahead]
        )
        short = held + job.gpu_count - limit
        at = now
        for end, gpus in team:
            if short <= 0:
                break
            short -= gpus
            at = end
        self.quota_heads[key] = QuotaHold(
            job.job_id, at if short <= 0 else math.inf, ready_s, limit
        )

    def capped(self, pool: str, limit: int) -> bool:
        """Whether `limit` caps the team below the pool's size: a team without a limit of
        its own is held by capacity, so it gets a reservation of GPUs instead."""
        return limit < int(self.scratch.gpu_count[self.view.pool_nodes[pool]].sum())

    def quota_allows(self, job: JobSpec, pool: str, ready_s: float = math.inf) -> bool:
        """Whether a job may take its team's room in the pool: nothing of its team waits
        for the limit ahead of it, or it is expected to end before that job's room comes.
        The held job itself may start wherever it finds room (borrowing), and so may a job
        the limit can never hold that has waited longer (it is not behind the held job)."""
        head = self.quota_heads.get((job.team, pool))
        if head is None or head.job_id == job.job_id:
            return True
        if job.gpu_count > head.limit and ready_s < head.ready_s:
            return True
        return expected_end_s(self.view.now_s, job) <= head.room_at_s

    def place_before(
        self,
        job: JobSpec,
        pool: str,
        allowed: BoolArray,
        rng: np.random.Generator,
        *,
        overrides: bool = False,
    ) -> Placement | None:
        """A placement that may use reserved idle GPUs whose reservation starts after the
        job is expected to end, or any reserved GPU when it `overrides` reservations
        (online inference); None: none, or nothing reserved it could use."""
        end = -math.inf if overrides else expected_end_s(self.view.now_s, job)
        lent = [
            (n, g)
            for r in self.made
            if r.pool == pool and r.start_s >= end
            for n, g in r.idle
            if allowed[n]
        ]
        if not lent:
            return None
        scratch = self.scratch
        for n, g in lent:
            scratch.set_gpu_out(n, g, False)
        try:
            return self.view.placement.place(scratch, job, rng, allowed)
        finally:
            for n, g in lent:
                scratch.set_gpu_out(n, g, True)


def earliest_in_domain(
    state: ClusterState, level: str, times: dict[int, list[float]], nodes: list[int], need: int
) -> tuple[float, tuple[tuple[int, int], ...]] | None:
    """`earliest_gpus` for a gang that requires one domain of `level`: the domain where its
    GPUs come free first (None: no domain of it has enough)."""
    ids = state.domains_of(level)
    if ids is None:
        return None
    found = None
    for d in sorted({int(ids[n]) for n in nodes} - {NO_DOMAIN}):
        inside = earliest_gpus(times, [n for n in nodes if ids[n] == d], need)
        if inside is not None and (found is None or inside[0] < found[0]):
            found = inside
    return found


def earliest_gpus(
    times: dict[int, list[float]], nodes: list[int], need: int
) -> tuple[float, tuple[tuple[int, int], ...]] | None:
    """Where `need` GPUs are expected free first: on one node when one is big enough
    (its `need` earliest GPUs), else on whole nodes, the earliest free first."""
    best: tuple[float, int] | None = None
    for n in nodes:
        row = times[n]
        if len(row) >= need:
            t = sorted(row)[need - 1]
            if best is None or t < best[0]:
                best = (t, n)
    if best is not None:
        t, n = best
        if math.isinf(t):
            return None
        order = sorted(range(len(times[n])), key=lambda g: (times[n][g], g))[:need]
        return t, tuple((n, g) for g in sorted(order))
    whole = sorted(nodes, key=lambda n: (max(times[n], default=math.inf), n))
    taken: list[int] = []
    for n in whole:
        if sum(len(times[k]) for k in taken) >= need:
            break
        taken.append(n)
    if sum(len(times[k]) for k in taken) < need:
        return None
    t = max(max(times[n]) for n in taken)
    if math.isinf(t):
        return None
    return t, tuple((n, g) for n in sorted(taken) for g in range(len(times[n])))

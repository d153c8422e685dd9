"""Price-aware deferral (energy.price_aware): deadline-bound work is held for cheaper
hours, re-planned at each slot boundary or when the deferrable set changes, never past a
job's deadline. Publishes the jobs it holds (`published.deferred`)."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import ClassVar

import numpy as np

from gpupool.domain.lifecycle import JobState
from gpupool.domain.model import JobKind
from gpupool.energy.deferral import DeferrableJob, plan_starts
from gpupool.energy.power import PowerModel, load_of
from gpupool.scheduler.book import JobBook
from gpupool.scheduler.commands import Command, Defer
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.cycle.base import CycleContext
from gpupool.scheduler.fleet import Fleet
from gpupool.scheduler.jobs import WAITING, JobRecord

POWER = PowerModel.calibrated()


class PriceDeferral:
    name: ClassVar[str] = "price-deferral"

    def __init__(self, config: SchedulerConfig, book: JobBook, fleet: Fleet) -> None:
        self.config = config
        self.book = book
        self.fleet = fleet
        self.held: set[str] = set()
        """Jobs held for a cheaper price now."""
        self.until: dict[str, float] = {}
        """When each held job is planned to start."""
        self.known: set[str] = set()
        self.due_s = 0.0

    def run(self, ctx: CycleContext) -> list[Command]:
        out = self.plan(ctx.now_s)
        ctx.published.deferred = self.held
        ctx.published.deferred_until = self.until
        return out

    def deferred_until(self, job_id: str) -> float | None:
        return self.until.get(job_id) if job_id in self.held else None

    def plan(self, now: float) -> list[Command]:
        e = self.config.energy
        kinds = (JobKind.TRAINING, JobKind.OFFLINE, JobKind.BATCH)
        waiting = [
            r
            for r in self.book.active.values()
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
            tariff = self.fleet.tariffs.get(self.fleet.pool_site[pool])
            if tariff is None:
                continue
            capacity = int(self.book.state.gpu_count[self.fleet.pool_nodes[pool]].sum())
            busy: list[tuple[int, float]] = []
            for r in self.book.running.values():
                if r.gpu_type == pool:
                    left = ((r.spec.duration_s or 0.0) - r.done_s) / max(r.speed, 1e-9)
                    busy.append((r.spec.gpu_count, now + left + r.overhead_s))
            for r in self.book.active.values():  # waiting work that is not deferrable runs first
                if r.gpu_type == pool and r.state in WAITING and r.job_id not in ids:
                    busy.append((r.spec.gpu_count, now + (r.spec.duration_s or 0.0)))
            waits: dict[int, float] = {}
            width = self.book.state.max_gpus_per_node
            running = self.book.running
            longest = max(
                (r.spec.duration_s or 0.0 for r in running.values() if r.gpu_type == pool),
                default=0.0,
            )
            for r in runs:
                if r.spec.gpu_count not in waits:
                    wait = self.fit_wait_s(pool, r.spec.gpu_count, now)
                    if r.spec.gpu_count >= width:
                        wait = max(wait, longest)
                    waits[r.spec.gpu_count] = wait
            tdp_w = float(self.fleet.tdp_w[int(np.argmax(self.fleet.pool_nodes[pool]))])
            # A job's run counts the wait for GPUs of its shape, so that it is forced early
            # enough to get them by its latest start. A job that needs whole nodes may have
            # to wait for a node to drain whatever starts before it: the longest job
            # running there bounds that wait (forced jobs start before any other).
            jobs = [
                DeferrableJob(
                    r.job_id,
                    r.spec.gpu_count,
                    ((r.spec.duration_s or 0.0) - r.done_s)
                    + self.restart_s(r)
                    + waits[r.spec.gpu_count],
                    r.ready_s,
                    float(r.spec.deadline_s or 0.0),
                    POWER.gpu_power_w(tdp_w, load_of(r.spec.kind)) * e.pue,
                    e.value_of_time_for(r.spec.team, r.spec.kind.value) or 0.0,
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
            self.book.dirty = True
        for job_id in sorted(self.held):
            until = max(planned.get(job_id, now), now)
            if job_id not in before or self.until.get(job_id) != until:
                out.append(Defer(job_id, until, "price"))
            self.until[job_id] = until
        for job_id in before - self.held:
            self.until.pop(job_id, None)
        return out

    def fit_wait_s(self, pool: str, gpus: int, now: float) -> float:
        """How long until running work frees GPUs of this shape in the pool: `gpus` on one
        node, or that many whole nodes for a wider job (from the running jobs' ends)."""
        ends: dict[int, list[tuple[float, int]]] = defaultdict(list)
        for r in self.book.running.values():
            placement = self.book.state.placements.get(r.spec.job_id)
            if r.gpu_type != pool or placement is None:
                continue
            left = ((r.spec.duration_s or 0.0) - r.done_s) / max(r.speed, 1e-9) + r.overhead_s
            if r.vacate_at is not None:
                left = r.vacate_at - now
            for part in placement.shares:
                ends[part.node].append((max(0.0, left), len(part.gpus)))
        width = self.book.state.max_gpus_per_node
        need, nodes_needed = (gpus, 1) if gpus <= width else (width, math.ceil(gpus / width))
        times = []
        for n in np.flatnonzero(self.fleet.pool_nodes[pool]).tolist():
            free = int(self.book.state.whole_free[n])
            if int(self.book.state.gpu_count[n]) < need:
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

    def restart_s(self, r: JobRecord) -> float:
        ck = self.config.checkpoint
        if r.state is JobState.SUSPENDED:
            return ck.resume_s(r.spec.state_gib_per_gpu)
        return ck.process_start_s + self.fleet.transfer_s(r.spec, r.gpu_type)

"""Which pool (GPU type, and site) a job waits for when more than one would do: chosen at
submit, and each cycle for waiting jobs that never ran, which follow capacity to their
best pool. It also says why a job got its type (the launch's note, `gpupool show`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import replace
from typing import ClassVar

from gpupool.domain.engine import Engine
from gpupool.domain.lifecycle import JobState
from gpupool.domain.model import JobKind, JobSpec
from gpupool.domain.quota import QuotaBook
from gpupool.policies.pool_choice import (
    ClassRanking,
    PoolLoad,
    PoolOption,
    charge,
    choose_across_sites,
    choose_blind,
    choose_by_class,
    choose_cost_aware,
    choose_first,
    class_rankings,
    plan_text,
    pool_loads,
)
from gpupool.scheduler.book import JobBook, JobWatcher
from gpupool.scheduler.commands import Command
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.cycle.base import CycleContext
from gpupool.scheduler.fleet import Fleet
from gpupool.scheduler.jobs import JobRecord, ServiceTemplate
from gpupool.sizing.planner import sized_options


class PoolChoice(JobWatcher):
    name: ClassVar[str] = "pool-choice"

    def __init__(
        self,
        config: SchedulerConfig,
        book: JobBook,
        fleet: Fleet,
        quotas: QuotaBook,
        engine: Engine,
        services: Mapping[str, ServiceTemplate],
    ) -> None:
        self.config = config
        self.book = book
        self.fleet = fleet
        self.quotas = quotas
        self.engine = engine
        self.services = services
        """The services the core runs (their user region and latency bound)."""
        self.type_rankings: dict[JobKind, ClassRanking] = class_rankings(
            list(fleet.pool_model.values()), fleet.catalog, config.placement.prefer
        )
        """Each job kind's GPU types, most preferred first (placement.gpu_type by-class)."""
        self.type_why: dict[str, str] = {}
        """Why a job that had a choice of GPU type (or named one) got its type: the
        launch carries it to the driver (`gpupool show`)."""
        self.choosers: dict[str, JobRecord] = {}
        """Never-started jobs with more than one pool: each cycle points them at the best."""
        self.rejected_remote: set[str] = set()
        """Jobs a remote site refused (noted once in the decision log)."""
        book.launch_note = self.launch_note
        book.watchers.append(self)

    def has_choosers(self) -> bool:
        return bool(self.choosers)

    # ---- the book's news --------------------------------------------------------------------
    def started(self, r: JobRecord, first: bool) -> None:
        if first:
            self.choosers.pop(r.job_id, None)

    def ended(self, job_id: str) -> None:
        self.choosers.pop(job_id, None)

    def held(self, job_id: str) -> None:
        self.choosers.pop(job_id, None)

    def released(self, r: JobRecord) -> None:
        if len(r.options) > 1 and r.first_start_s is None:
            self.choosers[r.job_id] = r

    def forgotten(self, job_id: str) -> None:
        self.type_why.pop(job_id, None)

    # ---- pools ------------------------------------------------------------------------------
    def options_for(self, job: JobSpec) -> tuple[PoolOption, ...]:
        """Every pool the job may run on, with its GPU count and run time there."""
        fleet = self.fleet
        request = self.book.sized.get(job.job_id)
        sized: dict[str, tuple[int, float | None]] = {}
        if request is not None and fleet.catalog is not None:
            catalog = fleet.catalog
            types = sorted({m for m in fleet.pool_model.values() if m in catalog})
            for name, opt in sized_options(request, catalog, types).items():
                if opt.fits:  # no run time without tokens: the job's own duration, if any
                    sized[name] = (
                        opt.count,
                        opt.run_s if opt.run_s is not None else job.duration_s,
                    )
        out = []
        for key in fleet.pool_nodes:
            model = fleet.pool_model[key]
            if request is not None:
                if model not in sized:
                    continue
                count, duration = sized[model]
            elif job.allows_model(model) and fleet.share_milli(job, model) is not None:
                count, duration = job.gpu_count, job.duration_s
            else:
                continue
            if count > fleet.pool_gpus[key]:
                continue
            site = fleet.pool_site[key]
            out.append(
                PoolOption(key, model, site, count, duration, fleet.pool_price.get(key, 0.0))
            )
        placement = self.config.placement
        if placement.gpu_type == "first" and request is None and fleet.topology is None:
            return tuple(out[:1])
        return tuple(out)

    def loads(self) -> dict[str, PoolLoad]:
        """Free GPUs and drain time of every pool, from one pass over the jobs."""
        return pool_loads(self.book.state, self.fleet.pool_nodes, self.book.pool_work_s())

    def choose(
        self, r: JobRecord, loads: dict[str, PoolLoad], now: float
    ) -> tuple[PoolOption | None, str]:
        """The pool a waiting job should wait for, and why (None: no acceptable pool)."""
        options = r.options
        placement = self.config.placement
        svc = self.services.get(r.service) if r.service is not None else None
        topology = self.fleet.topology
        if topology is not None:
            choice, decision = choose_across_sites(
                r.spec,
                options,
                loads,
                topology,
                now,
                placement.site == "locality-aware",
                svc.user_region if svc is not None else None,
                svc.latency_bound_ms if svc is not None else None,
                placement.value_of_time_usd_per_h,
            )
            if (
                choice is not None
                and choice.rejected_remote
                and r.job_id not in self.rejected_remote
            ):
                self.rejected_remote.add(r.job_id)
                refused = "; ".join(f"{site}: {why}" for site, why in decision.rejected)
                self.engine.note(r.job_id, now, f"remote refused ({refused})")
            if choice is None:
                return None, decision.reason
            return choice.option, decision.reason
        if len(options) == 1 or placement.gpu_type == "first":
            picked = choose_first(options)
        elif placement.gpu_type == "by-class":
            picked = choose_by_class(
                r.spec, options, loads, self.type_rankings[r.spec.kind], self.team_room(r, now)
            )
        elif placement.gpu_type == "blind":
            picked = choose_blind(options, loads)
        else:
            picked = choose_cost_aware(
                r.spec, options, loads, now, placement.value_of_time_usd_per_h
            )
        return picked.option, picked.reason

    def team_room(self, r: JobRecord, now: float) -> dict[str, int] | None:
        """GPUs the job's team may still take in each of the job's pools (its maximum less
        what it holds); None when no team has a maximum."""
        if not self.config.teams and not self.config.windows:
            return None
        team = r.spec.team
        held = self.book.held
        return {
            o.pool: self.quotas.maximum(team, o.pool, now) - held.get((team, o.pool), 0)
            for o in r.options
        }

    def retarget(self, r: JobRecord, option: PoolOption) -> None:
        """Point a waiting job at a pool: its GPU count and work become that pool's."""
        milli = self.fleet.share_milli(r.spec, option.gpu_type) or r.spec.gpu_milli
        if (
            r.gpu_type == option.pool
            and r.spec.gpu_count == option.gpu_count
            and r.spec.gpu_milli == milli
        ):
            return
        spec = replace(
            r.spec,
            gpu_count=option.gpu_count,
            gpu_milli=milli,
            duration_s=option.duration_s,
            gpu_models=frozenset({option.gpu_type}),
        )
        self.book.retarget(r, spec, option.pool)

    def at_submit(self, r: JobRecord, now: float) -> tuple[PoolOption | None, str]:
        """A new job's pool (None: no pool may run it) and why."""
        job = r.spec
        option = None
        why = ""
        if r.options:
            if len(r.options) > 1:
                option, why = self.choose(r, self.loads(), now)
                if option is not None:
                    self.engine.note(job.job_id, now, f"pool {option.pool}: {why}")
                    self.type_why[job.job_id] = why
            else:
                option = r.options[0]
                if job.gpu_models:
                    self.type_why[job.job_id] = (
                        f"GPU type {option.gpu_type}: pinned by the job (gpu_model)"
                    )
        return option, why

    def run(self, ctx: CycleContext) -> list[Command]:
        """Waiting jobs that never ran follow capacity to their best pool."""
        now = ctx.now_s
        movable = [
            r
            for r in self.choosers.values()
            if r.state is JobState.PENDING and r.first_start_s is None
        ]
        if not movable:
            return []
        loads = self.loads()
        movable.sort(key=lambda r: (r.ready_s, r.spec.job_id))
        for r in movable[: self.config.queue_depth * 8]:
            option, why = self.choose(r, loads, now)
            if option is None:
                continue
            if option.pool != r.gpu_type:
                self.engine.note(r.job_id, now, f"pool {option.pool}: {why}")
            self.type_why[r.job_id] = why
            self.retarget(r, option)
            charge(loads, option, self.book.state, self.fleet.pool_nodes)
        return []

    def launch_note(self, r: JobRecord) -> str:
        """Which GPU type a job got and why, with a sized job's plan (its GPU count per
        type of the fleet); "" for a job that had no choice to make."""
        why = self.type_why.get(r.job_id, "")
        request = self.book.sized.get(r.job_id)
        catalog = self.fleet.catalog
        if request is None or catalog is None:
            return why
        if r.attempts > 1:
            return why  # a resume: the note of its first start, plan included
        fleet = self.fleet
        types = sorted({m for m in fleet.pool_model.values() if m in catalog})
        sized = sized_options(request, catalog, types)
        have: dict[str, int] = defaultdict(int)
        for key, gpus in fleet.pool_gpus.items():
            have[fleet.pool_model[key]] = max(have[fleet.pool_model[key]], gpus)
        entries = [(t, sized[t].count if t in sized else None, have[t]) for t in types]
        plan = f"plan {plan_text(entries, fleet.pool_model[r.gpu_type])}"
        self.type_why[r.job_id] = note = f"{why}; {plan}" if why else plan
        return note

"""fifo: strict submit order; the head blocks the queue."""

from __future__ import annotations

from gpupool.domain.model import JobSpec
from gpupool.policies.contract import Command, CyclePolicy, CycleView, Start
from gpupool.policies.cycle.easy import backfills, shadow
from gpupool.policies.cycle.reservations import Reservations
from gpupool.policies.registry import register


class FifoPolicy(CyclePolicy):
    name = "fifo"
    backfill = False

    def queue_key(self, job: JobSpec, ready_s: float) -> tuple[object, ...]:
        return (job.submit_s, job.job_id)

    def plan(self, view: CycleView) -> list[Command]:
        scratch = view.state.copy()
        commands: list[Command] = []
        usage = view.usage_after_lends()
        queue = sorted(view.pending, key=lambda p: (p.spec.submit_s, p.spec.job_id))
        # Reservations of specific GPUs (view.reservations), or EASY reservations, one
        # per pool: a job blocked in one pool holds back nothing in another.
        reservations = Reservations(view, scratch) if view.reservations and self.backfill else None
        shadows: dict[str, tuple[float, int] | None] = {}
        for p in queue:
            job, pool = p.spec, p.gpu_type
            key = (job.team, pool)
            allowed = view.allowed(job, pool)
            plan = view.placement.place(scratch, job, view.rng, allowed)
            limit = view.quotas.maximum(job.team, pool, view.now_s)
            over = usage.get(key, 0) + job.gpu_count > limit
            if over and (
                plan is not None or (reservations is not None and reservations.capped(pool, limit))
            ):
                # Held by its team's maximum, not by capacity: like a job held by a QOS
                # limit, it does not block the queue (with reservations, its team's jobs
                # behind it take the team's room only if they leave it in time).
                if reservations is not None:
                    reservations.hold_quota(job, pool, usage.get(key, 0), limit)
                continue
            if reservations is not None:
                if not reservations.quota_allows(job, pool):
                    continue
                if plan is None and not over:
                    plan = reservations.place_before(job, pool, allowed, view.rng)
                if plan is None:
                    reservations.reserve(job, pool, p.ready_s, allowed)
                    continue
            elif plan is not None:
                ok, shadows[pool] = backfills(view, job, shadows.get(pool))
                if not ok:
                    continue
            if plan is None:
                if not self.backfill:
                    break
                if shadows.get(pool) is None:
                    shadows[pool] = shadow(view, scratch, job, pool)
                continue
            scratch.allocate(job, plan)
            if reservations is not None:
                reservations.started(job, pool, plan)
            commands.append(Start(job.job_id, plan))
            usage[key] = usage.get(key, 0) + job.gpu_count
        return commands


register("cycle", "fifo")(FifoPolicy)

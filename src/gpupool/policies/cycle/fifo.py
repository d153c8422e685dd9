"""fifo: strict submit order; the head blocks the queue."""

from __future__ import annotations

from gpupool.domain.model import JobSpec
from gpupool.policies.contract import Command, CyclePolicy, CycleView, Start
from gpupool.policies.cycle.easy import backfills, shadow
from gpupool.policies.registry import register


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
                ok, shadows[p.gpu_type] = backfills(view, job, shadows.get(p.gpu_type))
                if not ok:
                    continue
            if plan is None:
                if not self.backfill:
                    break
                if shadows.get(p.gpu_type) is None:
                    shadows[p.gpu_type] = shadow(view, scratch, job, p.gpu_type)
                continue
            scratch.allocate(job, plan)
            commands.append(Start(job.job_id, plan))
            usage[key] = usage.get(key, 0) + job.gpu_count
        return commands


register("cycle", "fifo")(FifoPolicy)

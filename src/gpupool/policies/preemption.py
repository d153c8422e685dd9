"""Who may preempt whom, and when: priority classes, the preemption rules, the reserve's
holders. Read by the cycle policies and by the core that validates their plans."""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.domain.model import JobKind, JobSpec
from gpupool.errors import PlanRejected


def outranks(claimant: JobSpec, victim: JobSpec) -> bool:
    """Priority classes: online inference outranks every preemptible job; otherwise a
    strictly higher priority number outranks a lower one."""
    if claimant.kind is JobKind.ONLINE:
        return victim.kind is not JobKind.ONLINE
    return claimant.priority > victim.priority


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

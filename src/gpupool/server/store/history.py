"""The telemetry history (each card's and each service's means per bucket), pruned by
age and row caps, and the finished runs the learner and the replay read."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session

from gpupool.errors import SpecError
from gpupool.server.store.base import Repository, transaction
from gpupool.server.store.rows import FinishedRun, GpuMinute, Pruned, ServiceMinute
from gpupool.server.store.states import ON_GPU
from gpupool.server.store.tables import EventModel, GpuMinuteModel, JobModel, ServiceMinuteModel


@dataclass(frozen=True)
class History(Repository):
    """Telemetry history and finished runs."""

    @transaction
    def add(
        self, gpu_rows: Sequence[GpuMinute], service_rows: Sequence[ServiceMinute] = ()
    ) -> None:
        """One bucket of history (every card's and every service's rows) in one write."""
        if not gpu_rows and not service_rows:
            return
        with self.db.write() as s:
            if gpu_rows:
                s.execute(insert(GpuMinuteModel), [dataclasses.asdict(r) for r in gpu_rows])
            if service_rows:
                s.execute(insert(ServiceMinuteModel), [dataclasses.asdict(r) for r in service_rows])

    @transaction
    def gpu_minutes(
        self, start_s: float | None = None, end_s: float | None = None
    ) -> list[GpuMinute]:
        """Per-card buckets that begin in [start_s, end_s), oldest first (plain rows, not
        ORM objects: a month of a fleet is millions of them)."""
        m = GpuMinuteModel
        query = select(
            m.gpu_id, m.t_s, m.period_s, m.samples, m.mem_used_mib, m.sm_util_pct, m.power_w,
            m.temp_c,
        )  # fmt: skip
        if start_s is not None:
            query = query.where(m.t_s >= start_s)
        if end_s is not None:
            query = query.where(m.t_s < end_s)
        with self.db.read() as s:
            return [GpuMinute(*row) for row in s.execute(query.order_by(m.t_s, m.id))]

    @transaction
    def service_minutes(
        self, start_s: float | None = None, end_s: float | None = None
    ) -> list[ServiceMinute]:
        """Per-service buckets that begin in [start_s, end_s), oldest first."""
        m = ServiceMinuteModel
        query = select(m.service, m.t_s, m.period_s, m.p99_ms, m.rps, m.replicas)
        if start_s is not None:
            query = query.where(m.t_s >= start_s)
        if end_s is not None:
            query = query.where(m.t_s < end_s)
        with self.db.read() as s:
            return [ServiceMinute(*row) for row in s.execute(query.order_by(m.t_s, m.id))]

    @transaction
    def rows(self) -> tuple[int, int]:
        """(GPU rows, service rows) the history holds now."""
        with self.db.read() as s:
            gpus = s.scalar(select(func.count()).select_from(GpuMinuteModel)) or 0
            svcs = s.scalar(select(func.count()).select_from(ServiceMinuteModel)) or 0
            return int(gpus), int(svcs)

    @transaction
    def prune(
        self, before_s: float, max_gpu_rows: int, max_service_rows: int, batch: int = 5000
    ) -> Pruned:
        """Delete the oldest history rows: those that begin before `before_s`, then the
        oldest beyond each table's row cap; at most `batch` rows per table, so one prune
        is a short transaction (call again while `Pruned.more`)."""
        if batch < 1:
            raise SpecError(f"batch is {batch}; prune at least 1 row at a time")
        done: list[int] = []
        more = False
        with self.db.write() as s:
            for model, cap in (
                (GpuMinuteModel, max_gpu_rows),
                (ServiceMinuteModel, max_service_rows),
            ):
                count = int(s.scalar(select(func.count()).select_from(model)) or 0)
                old = int(
                    s.scalar(select(func.count()).select_from(model).where(model.t_s < before_s))
                    or 0
                )
                excess = max(old, count - max(cap, 0))
                take = min(excess, batch)
                if take > 0:
                    ids = select(model.id).order_by(model.t_s, model.id).limit(take)
                    s.execute(delete(model).where(model.id.in_(ids.scalar_subquery())))
                done.append(take)
                more = more or excess > take
        return Pruned(done[0], done[1], more)

    @transaction
    def finished_runs(self, since_s: float | None, until_s: float) -> list[FinishedRun]:
        """Jobs of their own (not a service's replicas) that needed GPUs and succeeded
        between since_s (None: ever) and until_s, in order of finish, each with the time it
        spent on its GPUs (running or checkpointing to leave) summed over its runs from its
        events."""
        query = select(JobModel).where(
            JobModel.state == "succeeded",
            JobModel.service.is_(None),
            JobModel.gpu_count > 0,
            JobModel.ended_at <= until_s,
        )
        if since_s is not None:
            query = query.where(JobModel.ended_at >= since_s)
        query = query.order_by(JobModel.ended_at, JobModel.id)
        with self.db.read() as s:
            jobs = list(s.scalars(query))
            on = _time_on_gpus(s, [m.id for m in jobs])
            return [
                FinishedRun(
                    m.id,
                    m.name,
                    m.team,
                    m.gpu_model,
                    m.gpu_count,
                    m.submitted_at,
                    float(m.ended_at if m.ended_at is not None else m.updated_at),
                    on.get(m.id, 0.0),
                )
                for m in jobs
            ]

    @transaction
    def users_use(self, since_s: float, until_s: float) -> list[tuple[str, str, float, float]]:
        """(team, user, GPU-seconds, ended at) of each job of its own that ended between
        since_s and until_s, whatever its end, in order of ending: what fair share inside a
        team charged its users, read back by a restarted server. The user is the one given
        at submit, else the submitting token's name."""
        query = (
            select(JobModel)
            .where(
                JobModel.service.is_(None),
                JobModel.gpu_count > 0,
                JobModel.ended_at.is_not(None),
                JobModel.ended_at >= since_s,
                JobModel.ended_at <= until_s,
            )
            .order_by(JobModel.ended_at, JobModel.id)
        )
        with self.db.read() as s:
            jobs = list(s.scalars(query))
            on = _time_on_gpus(s, [m.id for m in jobs])
            return [
                (m.team, m.user_name or m.owner_token or "", m.gpu_count * on[m.id], ended)
                for m in jobs
                if on.get(m.id) and (ended := m.ended_at) is not None
            ]


def _time_on_gpus(s: Session, ids: Sequence[int]) -> dict[int, float]:
    """Seconds each job spent on its GPUs (running, or checkpointing to leave), summed over
    its runs, from its state-change events."""
    on: dict[int, float] = {}
    since: dict[int, float] = {}
    for chunk in range(0, len(ids), 500):
        events = s.scalars(
            select(EventModel)
            .where(EventModel.job_id.in_(ids[chunk : chunk + 500]))
            .order_by(EventModel.seq)
        )
        for e in events:
            before, after = (e.data or {}).get("from"), (e.data or {}).get("to")
            if before is None or after is None or e.job_id is None:
                continue
            if after in ON_GPU and before not in ON_GPU:
                since[e.job_id] = e.at_s
            elif before in ON_GPU and after not in ON_GPU and e.job_id in since:
                on[e.job_id] = on.get(e.job_id, 0.0) + e.at_s - since.pop(e.job_id)
    return on

"""Online services: their specs and replica bounds; their replicas are job rows that name
the service, created and stopped by the scheduler."""

from __future__ import annotations

import builtins
from dataclasses import dataclass

from sqlalchemy import select

from gpupool.errors import ConflictError, NotFoundError
from gpupool.server.store.base import Repository, transaction
from gpupool.server.store.checks import check_replicas, check_service
from gpupool.server.store.events import event_row, insert_event
from gpupool.server.store.jobs import job_row
from gpupool.server.store.rows import EventRow, JobRow, NewService, ServiceRow
from gpupool.server.store.states import TERMINAL
from gpupool.server.store.tables import EventModel, JobModel, ServiceModel


def service_row(m: ServiceModel) -> ServiceRow:
    return ServiceRow(
        id=m.id,
        name=m.name,
        team=m.team,
        command=tuple(m.command),
        min_replicas=m.min_replicas,
        max_replicas=m.max_replicas,
        slo_p99_ms=m.slo_p99_ms,
        replica_rps=m.replica_rps,
        model=m.model,
        gpu_model=m.gpu_model,
        gpu_mem_mib=m.gpu_mem_mib,
        gpu_milli=m.gpu_milli,
        port_env=m.port_env,
        cwd=m.cwd,
        env=dict(m.env),
        grace_s=m.grace_s,
        priority=m.priority,
        owner_token=m.owner_token,
        created_at=m.created_at,
        updated_at=m.updated_at,
        deleted_at=m.deleted_at,
    )


@dataclass(frozen=True)
class Services(Repository):
    """Services, and the events of their creation, scaling and deletion."""

    @transaction
    def create(self, svc: NewService, now_s: float) -> ServiceRow:
        """Store a new service and its 'service-created' event; a live one of the same
        name is a conflict (a deleted one's name may be taken again)."""
        check_service(svc)
        with self.db.write() as s:
            taken = s.scalars(
                select(ServiceModel).where(
                    ServiceModel.name == svc.name, ServiceModel.deleted_at.is_(None)
                )
            ).first()
            if taken is not None:
                raise ConflictError(
                    f"service {svc.name} exists already (team {taken.team}); scale it with "
                    f"`gpupool service scale {svc.name} MIN..MAX` or delete it first"
                )
            m = ServiceModel(
                name=svc.name,
                team=svc.team,
                model=svc.model,
                gpu_model=svc.gpu_model,
                gpu_mem_mib=svc.gpu_mem_mib,
                gpu_milli=svc.gpu_milli,
                min_replicas=svc.min_replicas,
                max_replicas=svc.max_replicas,
                replica_rps=svc.replica_rps,
                slo_p99_ms=svc.slo_p99_ms,
                port_env=svc.port_env,
                command=list(svc.command),
                cwd=svc.cwd,
                env=dict(svc.env),
                grace_s=svc.grace_s,
                priority=svc.priority,
                owner_token=svc.owner,
                created_at=now_s,
                updated_at=now_s,
                deleted_at=None,
            )
            s.add(m)
            s.flush()
            row = service_row(m)
            insert_event(
                self.db,
                s,
                "service-created",
                f"service {svc.name} created for team {svc.team}: replicas "
                f"{svc.min_replicas}..{svc.max_replicas}, p99 SLO {svc.slo_p99_ms:g} ms",
                now_s,
                data={"service": svc.name},
            )
        return row

    @transaction
    def list(self, include_deleted: bool = False) -> builtins.list[ServiceRow]:
        """Services in creation order (live ones, unless include_deleted)."""
        query = select(ServiceModel).order_by(ServiceModel.id)
        if not include_deleted:
            query = query.where(ServiceModel.deleted_at.is_(None))
        with self.db.read() as s:
            return [service_row(m) for m in s.scalars(query)]

    @transaction
    def get(self, name: str) -> ServiceRow:
        """The live service of this name."""
        with self.db.read() as s:
            m = s.scalars(
                select(ServiceModel).where(
                    ServiceModel.name == name, ServiceModel.deleted_at.is_(None)
                )
            ).first()
            if m is None:
                raise NotFoundError(f"no service {name}; `gpupool service ls` lists them")
            return service_row(m)

    @transaction
    def scale(self, name: str, low: int, high: int, now_s: float) -> ServiceRow:
        """New replica bounds; the scheduler scales to them at its next cycle."""
        check_replicas(low, high)
        with self.db.write() as s:
            m = s.scalars(
                select(ServiceModel).where(
                    ServiceModel.name == name, ServiceModel.deleted_at.is_(None)
                )
            ).first()
            if m is None:
                raise NotFoundError(f"no service {name}; `gpupool service ls` lists them")
            old = (m.min_replicas, m.max_replicas)
            m.min_replicas, m.max_replicas, m.updated_at = low, high, now_s
            s.flush()
            row = service_row(m)
            insert_event(
                self.db,
                s,
                "service-bounds",
                f"service {name}: replicas {old[0]}..{old[1]} -> {low}..{high}",
                now_s,
                data={"service": name},
            )
        return row

    @transaction
    def delete(self, name: str, now_s: float) -> ServiceRow:
        """Mark the service deleted; the scheduler stops its replicas with their grace."""
        with self.db.write() as s:
            m = s.scalars(
                select(ServiceModel).where(
                    ServiceModel.name == name, ServiceModel.deleted_at.is_(None)
                )
            ).first()
            if m is None:
                raise NotFoundError(f"no service {name}; `gpupool service ls` lists them")
            m.deleted_at = m.updated_at = now_s
            s.flush()
            row = service_row(m)
            insert_event(
                self.db,
                s,
                "service-deleted",
                f"service {name} deleted",
                now_s,
                data={"service": name},
            )
        return row

    @transaction
    def replicas(self, service: str, active_only: bool = True) -> builtins.list[JobRow]:
        """The job rows of a service's replicas, in id order."""
        query = select(JobModel).where(JobModel.service == service).order_by(JobModel.id)
        if active_only:
            query = query.where(JobModel.state.not_in(TERMINAL))
        with self.db.read() as s:
            return [job_row(m) for m in s.scalars(query)]

    @transaction
    def events(self, service: str, limit: int = 100) -> builtins.list[EventRow]:
        """The newest events about a service (created, scaled, bounds, deleted), oldest first."""
        query = (
            select(EventModel)
            .where(EventModel.kind.like("service-%"), EventModel.job_id.is_(None))
            .order_by(EventModel.seq.desc())
            .limit(limit * 20)
        )
        with self.db.read() as s:
            found = [event_row(m) for m in s.scalars(query) if m.data.get("service") == service]
        return list(reversed(found[:limit]))

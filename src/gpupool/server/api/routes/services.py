"""Online services: created, scaled and deleted by a team member (or an admin), seen by
every token."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path

from gpupool.server.api.deps import Db, Live, Who, own_service
from gpupool.server.api.schemas import PRIORITIES, SERVICE_NAME, ScaleIn, ServiceIn
from gpupool.server.loop.views import service_json
from gpupool.server.store import NewService

router = APIRouter()


@router.post("/v1/services", status_code=201, summary="Create an online service")
def create_service(body: ServiceIn, who: Who, service: Live) -> dict[str, Any]:
    team = body.team or who.team
    if team is None:
        raise HTTPException(422, [{"loc": ["body", "team"], "msg": "team is required"}])
    if not who.is_admin and team != who.team:
        raise HTTPException(403, f"a {who.team} token creates services only for {who.team}")
    priority = PRIORITIES[body.priority] if isinstance(body.priority, str) else body.priority
    row = service.operations.create_service(
        NewService(
            name=body.name,
            team=team,
            command=tuple(body.command),
            min_replicas=body.min_replicas,
            max_replicas=body.max_replicas,
            slo_p99_ms=body.slo_p99_ms,
            replica_rps=body.replica_rps,
            model=body.model,
            gpu_model=body.gpu_model,
            gpu_mem_mib=body.gpu_mem_mib,
            gpu_milli=1000 if body.gpu_share is None else max(1, round(body.gpu_share * 1000)),
            port_env=body.port_env,
            cwd=body.cwd,
            env=dict(body.env),
            grace_s=body.grace_s,
            priority=priority,
            owner=who.name,
        )
    )
    return service_json(row)


@router.get("/v1/services", summary="List the online services")
def list_services(who: Who, store: Db, service: Live) -> dict[str, Any]:
    return {"services": [service.views.service_view(r.name) for r in store.services.list()]}


@router.get("/v1/services/{name}", summary="One service with its replicas, rps and p99")
def show_service(
    name: Annotated[str, Path(min_length=1, max_length=63, pattern=SERVICE_NAME)],
    who: Who,
    service: Live,
) -> dict[str, Any]:
    return service.views.service_view(name)


@router.post("/v1/services/{name}/scale", summary="Set a service's replica bounds")
def scale_service(
    name: Annotated[str, Path(min_length=1, max_length=63, pattern=SERVICE_NAME)],
    body: ScaleIn,
    who: Who,
    store: Db,
    service: Live,
) -> dict[str, Any]:
    own_service(store, who, name)
    service.operations.scale_service(name, body.min_replicas, body.max_replicas)
    return service.views.service_view(name)


@router.delete("/v1/services/{name}", summary="Delete a service; its replicas stop")
def delete_service(
    name: Annotated[str, Path(min_length=1, max_length=63, pattern=SERVICE_NAME)],
    who: Who,
    store: Db,
    service: Live,
) -> dict[str, Any]:
    own_service(store, who, name)
    return service_json(service.operations.delete_service(name))

"""A job's lifecycle by hand: hold a waiting job, release it, requeue a running one (the job's
team or an admin). Draining a node is routes/nodes.py."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from gpupool.server.api.deps import Db, Live, Who, own
from gpupool.server.api.schemas import JobId, job_json

router = APIRouter()


@router.post("/v1/jobs/{job_id}/hold", summary="Hold a waiting job: it starts once released")
def hold(job_id: JobId, who: Who, store: Db, service: Live) -> dict[str, Any]:
    own(who, store.jobs.get(job_id))
    return job_json(service.operations.hold(job_id, who.name))


@router.post("/v1/jobs/{job_id}/release", summary="Release a held job")
def release(job_id: JobId, who: Who, store: Db, service: Live) -> dict[str, Any]:
    own(who, store.jobs.get(job_id))
    return job_json(service.operations.release(job_id, who.name))


@router.post(
    "/v1/jobs/{job_id}/requeue",
    summary="Stop a running job with its checkpoint and put it back in the queue",
)
def requeue(
    job_id: JobId, who: Who, store: Db, service: Live, hold: bool = False
) -> dict[str, Any]:
    own(who, store.jobs.get(job_id))
    return job_json(service.operations.requeue(job_id, who.name, hold=hold))

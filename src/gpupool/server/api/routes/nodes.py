"""Nodes: drain one (admin) so nothing new starts there, or undo it (POST /v1/drain); make a
GPU of the fake fleet fail, or repair it (admin, POST /v1/admin/fake-faults)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException

from gpupool.server.api.deps import Live, Who, admin_only
from gpupool.server.api.schemas import DrainIn, FakeFaultIn

router = APIRouter()


@router.post("/v1/drain", summary="Drain a node (admin): nothing new starts there")
def drain(body: DrainIn, who: Who, service: Live) -> dict[str, Any]:
    if not who.is_admin:
        raise HTTPException(403, "only an admin token drains nodes")
    return service.operations.drain(body.node, who.name, undo=body.undo, reason=body.reason)


@router.post(
    "/v1/admin/fake-faults",
    summary="Fail or repair a GPU of the fake fleet (admin; --fake-gpus only)",
)
def fake_fault(body: FakeFaultIn, who: Who, service: Live) -> dict[str, Any]:
    """lost (off the bus, with `problem`), ecc (`count` uncorrected errors), xid (`xid`) or
    repair, on GPU `gpu` as `gpupool nodes` numbers it. Read at the next sample: the card is
    drained as on a real fault (`gpu-unhealthy`), and comes back once repaired. 409 on real
    GPUs."""
    admin_only(who, "injects faults")
    return service.operations.fake_fault(
        body.gpu,
        body.fault,
        who.name,
        node=body.node,
        xid=body.xid,
        count=body.count,
        problem=body.problem,
    )

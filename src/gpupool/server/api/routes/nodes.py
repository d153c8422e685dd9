"""Nodes: drain one (admin) so nothing new starts there, or undo it (POST /v1/drain)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException

from gpupool.server.api.deps import Live, Who
from gpupool.server.api.schemas import DrainIn

router = APIRouter()


@router.post("/v1/drain", summary="Drain a node (admin): nothing new starts there")
def drain(body: DrainIn, who: Who, service: Live) -> dict[str, Any]:
    if not who.is_admin:
        raise HTTPException(403, "only an admin token drains nodes")
    return service.operations.drain(body.node, who.name, undo=body.undo, reason=body.reason)

"""The cluster: its nodes and GPUs with live telemetry (GET /v1/cluster)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from gpupool.server.api.deps import Live, Who

router = APIRouter()


@router.get("/v1/cluster", summary="Nodes and GPUs with live telemetry")
def cluster(who: Who, service: Live) -> dict[str, Any]:
    return service.views.cluster_view()

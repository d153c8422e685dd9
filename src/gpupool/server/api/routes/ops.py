"""What operators and their tools read: liveness (/healthz, open), Prometheus metrics
(/metrics) and the API's own documentation (/openapi.json, /docs, /redoc).

Three routers, because each takes its guard where create_app includes it: /metrics and the
documentation need a token unless the server opens them (open_metrics, open_docs).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response

from gpupool.server.api.deps import Api, Live
from gpupool.server.telemetry.prometheus import CONTENT_TYPE_LATEST, render_metrics

health_router = APIRouter()
metrics_router = APIRouter()
docs_router = APIRouter()


@health_router.get("/healthz", summary="Liveness of the API and of the scheduler loop")
def healthz(service: Live) -> JSONResponse:
    """200 while the scheduler loop completes its cycles; 503 when its last completed
    cycle is late or the loop has stopped. Says the server's role (active), the last
    cycle, the last error and its stage, and why launches wait (DiskFull)."""
    body = service.views.health_view()
    return JSONResponse(body, status_code=200 if body["ok"] else 503)


@metrics_router.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics")
def metrics(api: Api) -> Response:
    return Response(render_metrics(api.registry), media_type=CONTENT_TYPE_LATEST)


@docs_router.get("/openapi.json", include_in_schema=False)
def openapi(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@docs_router.get("/docs", include_in_schema=False)
def docs() -> HTMLResponse:
    return get_swagger_ui_html(openapi_url="/openapi.json", title="gpupool API")


@docs_router.get("/redoc", include_in_schema=False)
def redoc() -> HTMLResponse:
    return get_redoc_html(openapi_url="/openapi.json", title="gpupool API")

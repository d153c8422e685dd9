"""The REST API (FastAPI): jobs, logs, cluster state, events, Prometheus metrics.

Every accepted job is committed to the database before the answer leaves; the scheduler
loop picks it up within a cycle (the API wakes it). Bad input gets a 422 naming each
field; bodies over 64 KiB get a 413; an Idempotency-Key header makes a retried submit
return the job it created the first time. Tokens: an admin token sees and does
everything; a team token sees the whole queue but submits, cancels and reads logs only
for its team's jobs; a read-only token sees the queue and the cluster and changes
nothing. A revoked or expired token is refused at its next request (auth.TokenCache);
changes, refusals and admin reads are audited (GET /v1/audit). /metrics and the API's
documentation (/docs, /redoc, /openapi.json) need a token unless opened.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from fastapi import APIRouter, Depends, FastAPI, Request, params
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from sqlalchemy.exc import DBAPIError
from starlette.routing import BaseRoute, Route

from gpupool.errors import ConflictError, GpupoolError, NotFoundError, SpecError, Unavailable
from gpupool.server.api.admission import Fleet
from gpupool.server.api.batcher import SubmitBatcher
from gpupool.server.api.deps import ApiState, current_principal
from gpupool.server.api.limits import BodyLimit
from gpupool.server.api.rate import RateLimited, SubmitRate
from gpupool.server.api.routes import (
    cluster,
    dashboard,
    events,
    jobs,
    learn,
    lifecycle,
    nodes,
    ops,
    services,
    tokens,
)
from gpupool.server.loop.driver import LiveService
from gpupool.server.security.auth import AuditMiddleware, AuditTrail, TokenCache
from gpupool.server.store import Store, out_of_space
from gpupool.server.telemetry.prometheus import metrics_registry
from gpupool.sizing.catalog import load_catalog

ROUTERS = (
    jobs.router,
    cluster.router,
    events.router,
    tokens.router,
    lifecycle.router,
    services.router,
    nodes.router,
    learn.router,
    dashboard.router,
    ops.health_router,
)
"""The routers in the order their routes are matched and the OpenAPI document lists them
(/metrics and the documentation follow, each behind its guard). A new router goes last: the
order is part of the API (POST /v1/jobs/batch before GET /v1/jobs/{job_id}, the document's
key order)."""


_GUARD = (Depends(current_principal),)
"""What /metrics and the documentation ask of a request unless they are open."""


def create_app(
    service: LiveService,
    store: Store,
    auth: bool = True,
    *,
    open_metrics: bool = False,
    open_docs: bool = False,
    audit_keep_days: float = 90.0,
    wall: Callable[[], float] = time.time,
) -> FastAPI:
    """The API. open_metrics / open_docs serve /metrics and /docs, /redoc, /openapi.json
    without a token (with auth off everything is open anyway); wall is the clock tokens
    expire by and the audit trail is stamped with (not the scheduler's, which a rehearsal
    may start elsewhere)."""
    app = FastAPI(
        title="gpupool",
        version="1",
        description="A GPU scheduler: submit jobs, watch them run, see the GPUs.",
        openapi_url=None,  # served by ops.docs_router, behind a token unless open_docs
        docs_url=None,
        redoc_url=None,
    )
    # what current_principal and the audit read on every request
    app.state.store = store
    app.state.auth = auth
    app.state.wall = wall
    app.state.tokens = TokenCache()
    trail = AuditTrail(store, keep_days=audit_keep_days, wall=wall)
    app.state.audit = trail
    scheduling = service.config.scheduling
    rate = SubmitRate(
        {
            team: lim.submit_per_min
            for team, lim in scheduling.team_limits.items()
            if lim.submit_per_min is not None
        },
        time.monotonic,
    )
    app.state.submit_rate = rate
    app.state.api = ApiState(
        service=service,
        store=store,
        batcher=SubmitBatcher(store, service.state.wake.set, service.clock.now),
        rate=rate,
        trail=trail,
        wall=wall,
        scheduling=scheduling,
        fleet=Fleet.of(service.cluster.nodes),  # fixed for the service's life, cloud nodes too
        gangs=bool(getattr(service.executor, "runs_gangs", False)),  # jobs across nodes (Ray)
        fleet_models=frozenset(n.gpu_model for n in service.cluster.nodes),
        catalog=load_catalog(),
        registry=metrics_registry(service.views, store),  # the app's own, not the global one
    )

    app.exception_handler(RequestValidationError)(_invalid)
    app.exception_handler(NotFoundError)(_not_found)
    app.exception_handler(ConflictError)(_conflict)
    app.exception_handler(SpecError)(_bad_spec)
    app.exception_handler(RateLimited)(_rate_limited)
    app.exception_handler(Unavailable)(_unavailable)
    app.exception_handler(GpupoolError)(_refused)
    app.exception_handler(DBAPIError)(_database_failed)

    # the fast door to POST /v1/jobs, first in the table (routes/jobs.py)
    app.router.routes.insert(0, Route("/v1/jobs", jobs.submit_direct, methods=["POST"]))
    for router in ROUTERS:
        _include(app, router)
    _include(app, ops.metrics_router, guarded=not open_metrics)
    _include(app, ops.docs_router, guarded=not open_docs)

    app.add_middleware(BodyLimit)
    app.add_middleware(AuditMiddleware, trail=trail, wall=wall)
    return app


def _include(app: FastAPI, router: APIRouter, *, guarded: bool = False) -> None:
    """Add the router's routes to the app's own table, each built as `@app.get(...)` builds
    it, the guard first among its dependencies where `guarded`. FastAPI's include_router
    (0.165) keeps a router as a table of its own that every request walks, router by
    router: about 100 µs more a request for these routers, measured on /healthz and /v1/me.

    The routes are built once per process: building one (FastAPI reads its endpoint's
    signature and makes a pydantic model of each parameter) costs about 4 ms, 0.15 s an app.
    A built route keeps no reference to an app (what a request needs it reads from
    request.app.state), so every app of the process shares them."""
    key = (id(router), guarded)  # the routers are module constants: their ids stay theirs
    if key not in _BUILT:
        _BUILT[key] = _build_routes(router, _GUARD if guarded else ())
    app.router.routes.extend(_BUILT[key])


_BUILT: dict[tuple[int, bool], tuple[BaseRoute, ...]] = {}


def _build_routes(router: APIRouter, guard: Sequence[params.Depends]) -> tuple[BaseRoute, ...]:
    table = APIRouter()
    for route in router.routes:
        if not isinstance(route, APIRoute):
            raise TypeError(f"{route!r}: a router of routes/ holds FastAPI routes only")
        table.add_api_route(
            route.path,
            route.endpoint,
            response_model=route.response_model,
            status_code=route.status_code,
            tags=route.tags,
            dependencies=[*guard, *route.dependencies],
            summary=route.summary,
            description=route.description,
            response_description=route.response_description,
            responses=route.responses,
            deprecated=route.deprecated,
            methods=route.methods,
            operation_id=route.operation_id,
            response_model_include=route.response_model_include,
            response_model_exclude=route.response_model_exclude,
            response_model_by_alias=route.response_model_by_alias,
            response_model_exclude_unset=route.response_model_exclude_unset,
            response_model_exclude_defaults=route.response_model_exclude_defaults,
            response_model_exclude_none=route.response_model_exclude_none,
            include_in_schema=route.include_in_schema,
            response_class=route.response_class,
            name=route.name,
            route_class_override=type(route),
            callbacks=route.callbacks,
            openapi_extra=route.openapi_extra,
            generate_unique_id_function=route.generate_unique_id_function,
            strict_content_type=route.strict_content_type,
            max_body_size=route.max_body_size,
        )
    return tuple(table.routes)


async def _invalid(_: Request, err: RequestValidationError) -> JSONResponse:
    # Each problem by field; the offending value is not echoed (it may be NaN, bytes
    # or a lone surrogate, which JSON cannot carry).
    detail = [
        {
            "loc": [x if isinstance(x, int) else str(x) for x in e.get("loc", ())],
            "msg": str(e.get("msg", "")),
            "type": str(e.get("type", "")),
        }
        for e in err.errors()
    ]
    return JSONResponse({"detail": detail}, status_code=422)


async def _not_found(_: Request, err: NotFoundError) -> JSONResponse:
    return JSONResponse({"detail": str(err)}, status_code=404)


async def _conflict(_: Request, err: ConflictError) -> JSONResponse:
    return JSONResponse({"detail": str(err)}, status_code=409)


async def _bad_spec(_: Request, err: SpecError) -> JSONResponse:
    return JSONResponse({"detail": str(err)}, status_code=422)


async def _rate_limited(_: Request, err: RateLimited) -> JSONResponse:
    return JSONResponse(
        {"detail": str(err)},
        status_code=429,
        headers={"Retry-After": str(max(1, math.ceil(err.retry_after_s)))},
    )


async def _unavailable(_: Request, err: Unavailable) -> JSONResponse:
    return JSONResponse({"detail": str(err)}, status_code=503, headers={"Retry-After": "1"})


async def _database_failed(_: Request, err: DBAPIError) -> JSONResponse:
    """A write the database refused for want of disk space: 507 and what to do. Nothing of
    the request was committed (each store call is one transaction). Any other database
    error stays the server's fault (500)."""
    if out_of_space(err):
        return JSONResponse(
            {
                "detail": "the server's database has no disk space left, so nothing was "
                "recorded: free space on the disk that holds it (the state directory, or "
                "the PostgreSQL server's data directory), then send this again"
            },
            status_code=507,
        )
    raise err


async def _refused(_: Request, err: GpupoolError) -> JSONResponse:
    """Any other GpupoolError: the request was wrong (400)."""
    return JSONResponse({"detail": str(err)}, status_code=400)

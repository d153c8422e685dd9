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

import asyncio
import email.message
import json
import math
import time
from collections.abc import Callable
from pathlib import Path as FsPath
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, HTTPException, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from pydantic import StringConstraints, TypeAdapter, ValidationError
from starlette.routing import Route

from gpupool.domain.job_fields import JOB_FIELDS
from gpupool.errors import ConflictError, GpupoolError, NotFoundError, SpecError, Unavailable
from gpupool.server.api.admission import Fleet, admit
from gpupool.server.api.batcher import SubmitBatcher
from gpupool.server.api.limits import BodyLimit
from gpupool.server.api.rate import RateLimited, SubmitRate
from gpupool.server.api.schemas import (
    JOB_IN_NAME,
    JOB_IN_OMITS,
    MAX_ID,
    NAME,
    PRIORITIES,
    SERVICE_NAME,
    BatchIn,
    DemoteIn,
    DrainIn,
    JobId,
    JobIn,
    PromoteIn,
    ScaleIn,
    ServiceIn,
    TokenIn,
    audit_json,
    job_json,
    token_json,
)
from gpupool.server.api.share_admission import check_share
from gpupool.server.loop.driver import LiveService, service_json
from gpupool.server.security.auth import AuditMiddleware, AuditTrail, TokenCache
from gpupool.server.store import JobRow, NewJob, NewService, Principal, Store
from gpupool.server.telemetry.prometheus import (
    CONTENT_TYPE_LATEST,
    metrics_registry,
    render_metrics,
)
from gpupool.sizing.catalog import load_catalog

IDEMPOTENCY_KEY: TypeAdapter[str] = TypeAdapter(
    Annotated[str, StringConstraints(max_length=128, pattern=r"^[\x21-\x7e]+$")]
)
"""The Idempotency-Key header's rule (as `submit` declares it), for `submit_direct`."""


def _is_json(content_type: str) -> bool:
    """application/json or application/<anything>+json, read as FastAPI reads it (a body
    without a content type is not JSON)."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


def _located(err: ValidationError, where: tuple[str, ...]) -> list[dict[str, Any]]:
    """A model's errors as FastAPI reports a request's: each `loc` under `where`."""
    return [{**e, "loc": (*where, *e["loc"])} for e in err.errors(include_url=False)]


async def current_principal(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> Principal:
    """Who is asking: the bearer token's owner, cached per token (auth.TokenCache), its
    expiry checked on every request. A read-only token is refused anything but reading."""
    if not request.app.state.auth:
        return Principal("anonymous", None)
    if not authorization or not authorization.startswith("Bearer "):
        raise HTTPException(401, "missing bearer token; set GPUPOOL_TOKEN")
    token = authorization[7:].strip()
    cache: TokenCache = request.app.state.tokens
    now = request.app.state.wall()
    who = cache.get(token)
    if who is None:
        # off the event loop: an unknown token reaches the database every time
        who = await run_in_threadpool(request.app.state.store.auth.principal, token, now)
        if who is None:
            raise HTTPException(
                401, "unknown token, or one revoked or expired; ask an admin for one"
            )
        cache.put(token, who)
    request.state.gpupool_principal = who  # auth.PRINCIPAL_KEY, for the audit
    if who.expired(now):
        cache.forget(token_id=who.token_id, name=who.name)
        raise HTTPException(
            401, f"token {who.name} expired; ask an admin for a new one (gpupool token create)"
        )
    if who.read_only and request.method not in ("GET", "HEAD", "OPTIONS"):
        raise HTTPException(
            403, f"token {who.name} is read-only: it lists and shows, it changes nothing"
        )
    return who


Who = Annotated[Principal, Depends(current_principal)]


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
        openapi_url=None,  # served below, behind a token unless open_docs
        docs_url=None,
        redoc_url=None,
    )
    app.state.store = store
    app.state.auth = auth
    app.state.wall = wall
    batcher = SubmitBatcher(store, service.wake.set, service.clock.now)
    app.state.tokens = TokenCache()
    trail = AuditTrail(store, keep_days=audit_keep_days, wall=wall)
    app.state.audit = trail
    docs_guard = [] if open_docs else [Depends(current_principal)]
    metrics_guard = [] if open_metrics else [Depends(current_principal)]

    def admin_only(who: Principal, what: str) -> None:
        if not who.is_admin:
            raise HTTPException(403, f"only an admin token {what}; token {who.name} is not one")

    def peer(request: Request) -> str | None:
        return None if request.client is None else f"{request.client.host}:{request.client.port}"

    scheduling = service.config.scheduling
    fleet = Fleet.of(service.cluster.nodes)  # fixed for the service's life, cloud nodes too
    gangs = bool(getattr(service.executor, "runs_gangs", False))  # jobs across nodes (Ray)
    fleet_models = {n.gpu_model for n in service.cluster.nodes}
    catalog = load_catalog()
    rate = SubmitRate(
        {
            team: lim.submit_per_min
            for team, lim in scheduling.team_limits.items()
            if lim.submit_per_min is not None
        },
        time.monotonic,
    )
    app.state.submit_rate = rate

    def own(who: Principal, row: JobRow) -> None:
        if not who.is_admin and who.team != row.team:
            raise HTTPException(403, f"job {row.id} belongs to team {row.team}, not {who.team}")

    @app.exception_handler(RequestValidationError)
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

    @app.exception_handler(NotFoundError)
    async def _nf(_: Request, err: NotFoundError) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=404)

    @app.exception_handler(ConflictError)
    async def _cf(_: Request, err: ConflictError) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=409)

    @app.exception_handler(SpecError)
    async def _se(_: Request, err: SpecError) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=422)

    @app.exception_handler(RateLimited)
    async def _rl(_: Request, err: RateLimited) -> JSONResponse:
        return JSONResponse(
            {"detail": str(err)},
            status_code=429,
            headers={"Retry-After": str(max(1, math.ceil(err.retry_after_s)))},
        )

    @app.exception_handler(Unavailable)
    async def _un(_: Request, err: Unavailable) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(GpupoolError)
    async def _ge(_: Request, err: GpupoolError) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=400)

    def new_job(body: JobIn, who: Principal) -> NewJob:
        team = body.team or who.team
        if team is None:
            raise HTTPException(422, [{"loc": ["body", "team"], "msg": "team is required"}])
        if not who.is_admin and team != who.team:
            raise HTTPException(403, f"a {who.team} token submits only for team {who.team}")
        priority = PRIORITIES[body.priority] if isinstance(body.priority, str) else body.priority
        sizing = None if body.sizing is None else body.sizing.mapping()
        admit(
            fleet,
            load_catalog(),
            gpus=body.gpus,
            gpu_model=body.gpu_model,
            sizing=sizing,
            gangs=gangs,
        )
        given = {
            name: getattr(body, JOB_IN_NAME.get(name, name))
            for name in JOB_FIELDS
            if name not in JOB_IN_OMITS
        }
        given.update(  # the fields JobIn holds in another form
            name=body.name or body.command[0].rsplit("/", 1)[-1][:128],
            team=team,
            priority=priority,
            sizing=sizing,
            time_limit_s=body.time_limit_s
            if body.time_limit_s is not None
            else scheduling.time_limit_s.get(body.kind),
            gpu_milli=1000 if body.gpu_share is None else max(1, round(body.gpu_share * 1000)),
            owner=who.name,
        )
        job = NewJob(**given)
        check_share(job, fleet_models, catalog)
        return job

    @app.post(
        "/v1/jobs",
        status_code=201,
        summary="Submit a job",
        responses={200: {"description": "The job this Idempotency-Key created before"}},
    )
    async def submit(
        body: JobIn,
        who: Who,
        idempotency_key: Annotated[
            str | None, Header(max_length=128, pattern=r"^[\x21-\x7e]+$")
        ] = None,
    ) -> JSONResponse:
        # Group commit: submissions that arrive while a commit runs share the next one,
        # and the scheduler is woken once per commit.
        job = new_job(body, who)
        rate.take(job.team)
        row, created = await batcher.submit(job, idempotency_key)
        return JSONResponse(job_json(row), status_code=201 if created else 200)

    async def submit_direct(request: Request) -> Response:
        """POST /v1/jobs as `submit` above does it, without FastAPI's per-request solving
        of parameters and dependencies, which took a third of a submit's CPU: the same
        token check, Idempotency-Key rule and JobIn model, the same errors (through the
        app's handlers), the same group commit. `submit` stays for the OpenAPI document
        (tests/test_submit_direct.py holds the two to the same answers)."""
        # the three headers in one pass (Headers.get scans the list and raises for a
        # missing one, once per header); the first of repeated ones, as Headers.get
        authorization = key = content_type = None
        for name, raw_value in request.scope["headers"]:
            if name == b"authorization" and authorization is None:
                authorization = raw_value.decode("latin-1")
            elif name == b"idempotency-key" and key is None:
                key = raw_value.decode("latin-1")
            elif name == b"content-type" and content_type is None:
                content_type = raw_value.decode("latin-1")
        who = await current_principal(request, authorization)
        problems: list[dict[str, Any]] = []
        if key is not None:
            try:
                key = IDEMPOTENCY_KEY.validate_python(key)
            except ValidationError as err:
                problems += _located(err, ("header", "idempotency-key"))
        raw = await request.body()
        body: JobIn | None = None
        if not raw:
            problems.append(
                {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}
            )
        else:
            # as FastAPI reads a body: JSON only under a JSON content type, by the standard
            # library's parser (NaN included, refused then by the model), validated as
            # Python objects
            value: Any = raw
            if _is_json(content_type or ""):
                try:
                    value = json.loads(raw)
                except ValueError as err:
                    if not isinstance(err, json.JSONDecodeError):  # undecodable bytes
                        raise HTTPException(400, "There was an error parsing the body") from None
                    raise RequestValidationError(
                        [
                            {
                                "type": "json_invalid",
                                "loc": ("body", err.pos),
                                "msg": "JSON decode error",
                                "input": {},
                                "ctx": {"error": err.msg},
                            }
                        ]
                    ) from None
            try:
                body = JobIn.model_validate(value, from_attributes=True)
            except ValidationError as err:
                problems += _located(err, ("body",))
        if problems or body is None:
            raise RequestValidationError(problems)
        return await submit(body, who, key)

    app.router.routes.insert(0, Route("/v1/jobs", submit_direct, methods=["POST"]))

    @app.post("/v1/jobs/batch", status_code=201, summary="Submit up to 1,000 jobs at once")
    def submit_batch(body: BatchIn, who: Who) -> dict[str, Any]:
        new = [new_job(j, who) for j in body.jobs]
        for team in sorted({j.team for j in new}):
            rate.take(team, sum(j.team == team for j in new))
        rows = store.jobs.submit_many(new, service.clock.now())
        service.wake.set()
        return {"jobs": [job_json(r) for r in rows]}

    @app.get("/v1/jobs", summary="List jobs")
    def jobs(
        who: Who,
        state: Annotated[str | None, Query(max_length=32)] = None,
        team: Annotated[str | None, Query(max_length=64, pattern=NAME)] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
        after: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
        before: Annotated[int | None, Query(ge=1, le=MAX_ID + 1)] = None,
        order: Literal["asc", "desc"] = "asc",
    ) -> dict[str, Any]:
        """Jobs with after < id < before, oldest first (order=asc: page on with after=the
        last id) or newest first (order=desc: page on with before=the last id)."""
        db_state = None if state is None else state.lower()
        if db_state is not None and db_state not in (
            "pending",
            "running",
            "suspended",
            "succeeded",
            "failed",
            "cancelled",
        ):
            raise HTTPException(422, [{"loc": ["query", "state"], "msg": f"unknown state {state}"}])

        def page(db_state: str | None) -> list[JobRow]:
            return store.jobs.list(
                state=db_state,
                team=team,
                limit=limit,
                after_id=after,
                before_id=before,
                newest_first=order == "desc",
            )

        rows = page(db_state)
        if db_state == "running":
            rows += page("preempting")
            rows.sort(key=lambda r: r.id, reverse=order == "desc")
            del rows[limit:]  # a page is `limit` rows in order, so the next one misses none
        return {"jobs": [job_json(r) for r in rows]}

    @app.get("/v1/jobs/{job_id}", summary="One job")
    def job(job_id: JobId, who: Who) -> dict[str, Any]:
        return job_json(store.jobs.get(job_id))

    @app.post("/v1/jobs/{job_id}/cancel", summary="Cancel a job")
    def cancel(job_id: JobId, who: Who) -> dict[str, Any]:
        own(who, store.jobs.get(job_id))
        return job_json(service.cancel(job_id))

    @app.get("/v1/jobs/{job_id}/logs", summary="A job's output", response_class=PlainTextResponse)
    def logs(
        job_id: JobId,
        who: Who,
        stream: Literal["stdout", "stderr"] = "stdout",
        offset: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=1, le=1 << 22)] = 1 << 20,
        rank: Annotated[int, Query(ge=0, le=1 << 16)] = 0,
    ) -> Response:
        row = store.jobs.get(job_id)
        own(who, row)
        data = service.read_log(job_id, stream, offset, limit, rank=rank)
        state = "running" if row.state == "preempting" else row.state
        return Response(
            data,
            media_type="text/plain; charset=utf-8",
            headers={"X-Log-Offset": str(offset + len(data)), "X-Job-State": state},
        )

    @app.get("/v1/cluster", summary="Nodes and GPUs with live telemetry")
    def cluster(who: Who) -> dict[str, Any]:
        return service.cluster_view()

    @app.get("/v1/events", summary="Events after a sequence number (long poll)")
    async def events(
        who: Who,
        after: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
        wait: Annotated[float, Query(ge=0, le=30)] = 0.0,
    ) -> dict[str, Any]:
        deadline = time.monotonic() + wait
        while True:
            rows = await run_in_threadpool(store.events.after, after, 500)
            if rows or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.2)
        return {
            "events": [
                {
                    "seq": e.seq,
                    "at_s": e.at_s,
                    "kind": e.kind,
                    "job_id": e.job_id,
                    "message": e.message,
                }
                for e in rows
            ],
            "next": rows[-1].seq if rows else after,
        }

    @app.post("/v1/tokens", status_code=201, summary="Create a token (admin)")
    def create_token(body: TokenIn, who: Who, request: Request) -> dict[str, Any]:
        admin_only(who, "creates tokens")
        trail.flush()  # the requests before it stay before it in the trail
        now = wall()
        token, row = store.auth.issue_token(
            body.name,
            body.team,
            now,
            role=body.role,
            expires_at=None if body.expires_in_s is None else now + body.expires_in_s,
            by=who,
            client=peer(request),
        )
        return {**token_json(row, now), "token": token}

    @app.get("/v1/tokens", summary="Every token, revoked and expired ones too (admin)")
    def list_tokens(who: Who) -> dict[str, Any]:
        admin_only(who, "lists tokens")
        now = wall()
        return {"tokens": [token_json(r, now) for r in store.auth.tokens()]}

    @app.post("/v1/tokens/{ref}/revoke", summary="Revoke a token by name or id (admin)")
    def revoke_token(
        ref: Annotated[str, Path(min_length=1, max_length=64, pattern=NAME)],
        who: Who,
        request: Request,
    ) -> dict[str, Any]:
        admin_only(who, "revokes tokens")
        trail.flush()
        now = wall()
        row = store.auth.revoke_token(ref, now, by=who, client=peer(request))
        app.state.tokens.forget(name=row.name, token_id=row.id)  # refused from the next request
        return token_json(row, now)

    @app.get("/v1/audit", summary="The audit trail, newest first (admin)")
    def audit(
        who: Who,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
        before: Annotated[int | None, Query(ge=1, le=MAX_ID + 1)] = None,
        since: Annotated[float | None, Query(ge=0, le=1e11)] = None,
        token: Annotated[str | None, Query(max_length=64, pattern=NAME)] = None,
    ) -> dict[str, Any]:
        """Token changes, every request that changed something or was refused, and admin
        reads of tokens and of this trail: page on with before=the last id."""
        admin_only(who, "reads the audit trail")
        trail.flush()
        rows = store.auth.audit(limit=limit, before_id=before, since_s=since, token=token)
        return {"audit": [audit_json(r) for r in rows]}

    # ---- lifecycle: hold, release, requeue (the job's team or an admin), drain (admin) ----
    @app.post("/v1/jobs/{job_id}/hold", summary="Hold a waiting job: it starts once released")
    def hold(job_id: JobId, who: Who) -> dict[str, Any]:
        own(who, store.jobs.get(job_id))
        return job_json(service.hold(job_id, who.name))

    @app.post("/v1/jobs/{job_id}/release", summary="Release a held job")
    def release(job_id: JobId, who: Who) -> dict[str, Any]:
        own(who, store.jobs.get(job_id))
        return job_json(service.release(job_id, who.name))

    @app.post(
        "/v1/jobs/{job_id}/requeue",
        summary="Stop a running job with its checkpoint and put it back in the queue",
    )
    def requeue(job_id: JobId, who: Who, hold: bool = False) -> dict[str, Any]:
        own(who, store.jobs.get(job_id))
        return job_json(service.requeue(job_id, who.name, hold=hold))

    # ---- services: created by a team member (or an admin), seen by every token ----------
    def own_service(who: Principal, name: str) -> None:
        row = store.services.get(name)
        if not who.is_admin and who.team != row.team:
            raise HTTPException(403, f"service {name} belongs to team {row.team}, not {who.team}")

    @app.post("/v1/services", status_code=201, summary="Create an online service")
    def create_service(body: ServiceIn, who: Who) -> dict[str, Any]:
        team = body.team or who.team
        if team is None:
            raise HTTPException(422, [{"loc": ["body", "team"], "msg": "team is required"}])
        if not who.is_admin and team != who.team:
            raise HTTPException(403, f"a {who.team} token creates services only for {who.team}")
        priority = PRIORITIES[body.priority] if isinstance(body.priority, str) else body.priority
        row = service.create_service(
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

    @app.get("/v1/services", summary="List the online services")
    def list_services(who: Who) -> dict[str, Any]:
        return {"services": [service.service_view(r.name) for r in store.services.list()]}

    @app.get("/v1/services/{name}", summary="One service with its replicas, rps and p99")
    def show_service(
        name: Annotated[str, Path(min_length=1, max_length=63, pattern=SERVICE_NAME)], who: Who
    ) -> dict[str, Any]:
        return service.service_view(name)

    @app.post("/v1/services/{name}/scale", summary="Set a service's replica bounds")
    def scale_service(
        name: Annotated[str, Path(min_length=1, max_length=63, pattern=SERVICE_NAME)],
        body: ScaleIn,
        who: Who,
    ) -> dict[str, Any]:
        own_service(who, name)
        service.scale_service(name, body.min_replicas, body.max_replicas)
        return service.service_view(name)

    @app.delete("/v1/services/{name}", summary="Delete a service; its replicas stop")
    def delete_service(
        name: Annotated[str, Path(min_length=1, max_length=63, pattern=SERVICE_NAME)], who: Who
    ) -> dict[str, Any]:
        own_service(who, name)
        return service_json(service.delete_service(name))

    @app.post("/v1/drain", summary="Drain a node (admin): nothing new starts there")
    def drain(body: DrainIn, who: Who) -> dict[str, Any]:
        if not who.is_admin:
            raise HTTPException(403, "only an admin token drains nodes")
        return service.drain(body.node, who.name, undo=body.undo, reason=body.reason)

    # ---- the learned policy: status, the history its replay needs, promote and demote ----
    @app.get("/v1/learn", summary="The learned policy: data seen, accuracy, guard, mode")
    def learn(who: Who) -> dict[str, Any]:
        return service.learning_view()

    @app.get("/v1/learn/history", summary="Jobs finished in the last N days, and the fleet")
    def learn_history(
        who: Who, days: Annotated[float, Query(gt=0, le=3650, allow_inf_nan=False)] = 14.0
    ) -> dict[str, Any]:
        return service.learning_history(days)

    @app.post("/v1/learn/promote", summary="Make the learned policy active on a replay win (admin)")
    def learn_promote(body: PromoteIn, who: Who) -> dict[str, Any]:
        admin_only(who, "promotes the learned policy")
        return service.promote_learning(body.evidence.model_dump(), who.name)

    @app.post("/v1/learn/demote", summary="Return the learned policy to shadow (admin)")
    def learn_demote(who: Who, body: DemoteIn | None = None) -> dict[str, Any]:
        admin_only(who, "demotes the learned policy")
        return service.demote_learning(who.name, body.reason if body is not None else "")

    # ---- the dashboard: `/` (static, no token) and the read endpoints its panels need ----
    @app.get("/", include_in_schema=False)
    def dashboard() -> Response:
        """The dashboard page; its data calls carry the token the person signs in with."""
        return _dashboard_asset("index.html")

    @app.get("/dashboard/{name}", include_in_schema=False)
    def dashboard_asset(name: Annotated[str, Path(max_length=64)]) -> Response:
        if name not in DASHBOARD_ASSETS:
            raise HTTPException(404, f"no dashboard file {name}")
        return _dashboard_asset(name)

    @app.get("/v1/me", summary="Who the token belongs to (anonymous without one)")
    async def me(
        request: Request, authorization: Annotated[str | None, Header()] = None
    ) -> dict[str, Any]:
        """The token's name, role and team; without a token, whether the API needs one (so
        a page can ask for a token instead of failing its calls). A bad token is a 401."""
        if authorization is None and request.app.state.auth:
            return {"auth": True, "signed_in": False, "name": None, "role": None, "team": None}
        who = await current_principal(request, authorization)
        return {
            "auth": bool(request.app.state.auth),
            "signed_in": True,
            "name": who.name,
            "role": who.role,
            "team": who.team,
        }

    @app.get("/v1/teams", summary="Teams against their quotas and the active time window")
    def teams(
        who: Who, team: Annotated[str | None, Query(max_length=64, pattern=NAME)] = None
    ) -> dict[str, Any]:
        """Per team and pool (GPU type): GPUs held now against what the team is guaranteed
        and may hold at most at this time of day (the active window's shares, else the
        team's quota), with its running and waiting job counts."""
        return teams_view(service, team)

    @app.get("/v1/jobs/{job_id}/events", summary="A job's history: its events, oldest first")
    def job_events(
        job_id: JobId,
        who: Who,
        after: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
        limit: Annotated[int, Query(ge=1, le=1000)] = 500,
    ) -> dict[str, Any]:
        store.jobs.get(job_id)  # a 404 for a job that is not there
        rows = store.events.after(after, limit, job_id=job_id)
        return {
            "job_id": job_id,
            "events": [
                {"seq": e.seq, "at_s": e.at_s, "kind": e.kind, "message": e.message} for e in rows
            ],
            "next": rows[-1].seq if rows else after,
        }

    @app.get("/healthz", summary="Liveness of the API and of the scheduler loop")
    def healthz() -> JSONResponse:
        """200 while the scheduler loop completes its cycles; 503 when its last completed
        cycle is late or the loop has stopped. Says the server's role (active), the last
        cycle, the last error and its stage, and why launches wait (DiskFull)."""
        body = service.health_view()
        return JSONResponse(body, status_code=200 if body["ok"] else 503)

    registry = metrics_registry(service, store)  # the app's own, not the global one

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        summary="Prometheus metrics",
        dependencies=metrics_guard,
    )
    def metrics() -> Response:
        return Response(render_metrics(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/openapi.json", include_in_schema=False, dependencies=docs_guard)
    def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False, dependencies=docs_guard)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="gpupool API")

    @app.get("/redoc", include_in_schema=False, dependencies=docs_guard)
    def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title="gpupool API")

    app.add_middleware(BodyLimit)
    app.add_middleware(AuditMiddleware, trail=trail, wall=wall)
    return app


DASHBOARD_DIR = FsPath(__file__).parent / "dashboard"
DASHBOARD_ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
}
DASHBOARD_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""The page may load and ask nothing but this server (no CDN, no fonts, no inline code)."""


def _dashboard_asset(name: str) -> Response:
    body = (DASHBOARD_DIR / name).read_bytes()
    return Response(
        body,
        media_type=DASHBOARD_ASSETS[name],
        headers={"Content-Security-Policy": DASHBOARD_CSP, "Cache-Control": "no-cache"},
    )


def _hhmm(seconds: float) -> str:
    minutes = round(seconds / 60.0)
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def teams_view(service: LiveService, only: str | None = None) -> dict[str, Any]:
    """GET /v1/teams: the core's quota book read at the scheduler's now, under its lock."""
    if not service.lock.acquire(timeout=service.VIEW_WAIT_S):
        raise Unavailable(
            f"the scheduler loop has held its state for over {service.VIEW_WAIT_S:g} s; "
            "/healthz says more; retry shortly"
        )
    try:
        core = service.scheduler
        now = service.clock.now()
        book = core.quotas
        active = book.window(now)
        queued = {t: len(q) for t, q in core.book.queues.by_team.items() if q}
        running: dict[str, int] = {}
        for r in core.running.values():
            running[r.spec.team] = running.get(r.spec.team, 0) + 1
        held = {key for key, n in core.book.held.items() if n > 0}
        names = list(book.teams)
        names += sorted(({t for t, _ in held} | set(queued) | set(running)) - set(names))
        quota = {q.team: q for q in book.quotas}
        out = []
        for name in names:
            if only is not None and name != only:
                continue
            q = quota.get(name)
            pools = []
            for pool, total in core.fleet.pool_gpus.items():
                pools.append(
                    {
                        "pool": pool,
                        "gpu_model": core.fleet.pool_model.get(pool),
                        "pool_gpus": total,
                        "used_gpus": core.usage(name, pool),
                        "guaranteed_gpus": book.guaranteed(name, pool, now),
                        "max_gpus": book.maximum(name, pool, now),
                        "quota_guaranteed_gpus": q.guaranteed.get(pool, 0) if q else 0,
                        "quota_max_gpus": q.maximum.get(pool, total) if q else total,
                    }
                )
            out.append(
                {
                    "team": name,
                    "configured": q is not None,
                    "running_jobs": running.get(name, 0),
                    "waiting_jobs": queued.get(name, 0),
                    "pools": pools,
                }
            )

        def window_json(w: Any) -> dict[str, Any]:
            return {
                "start": _hhmm(w.start_s),
                "end": _hhmm(w.end_s),
                "guaranteed_share": dict(w.guaranteed_share),
                "max_share": dict(w.max_share),
            }

        return {
            "at_s": now,
            "window": None if active is None else window_json(active),
            "windows": [window_json(w) for w in book.windows],
            "teams": out,
        }
    finally:
        service.lock.release()

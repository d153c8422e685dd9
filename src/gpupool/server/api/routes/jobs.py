"""Jobs: submit (one, or up to 1,000 at once), list, show, cancel, and read a job's output.

POST /v1/jobs has two doors: `submit_direct`, a plain Starlette route that create_app puts
first in the app's table and that skips FastAPI's per-request solving (a third of a submit's
CPU), and `submit`, the FastAPI route the OpenAPI document describes. Both end in `submit`,
so they answer alike (tests/server/api/test_submit_direct.py).
"""

from __future__ import annotations

import email.message
import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import StringConstraints, TypeAdapter, ValidationError

from gpupool.domain.job_fields import JOB_FIELDS
from gpupool.server.api.admission import admit
from gpupool.server.api.deps import Api, ApiState, Db, Live, Who, current_principal, own
from gpupool.server.api.schemas import (
    JOB_IN_NAME,
    JOB_IN_OMITS,
    MAX_ID,
    NAME,
    PRIORITIES,
    BatchIn,
    JobId,
    JobIn,
    job_json,
)
from gpupool.server.api.share_admission import check_share
from gpupool.server.store import JobRow, NewJob, Principal
from gpupool.sizing.catalog import load_catalog

router = APIRouter()


def new_job(api: ApiState, body: JobIn, who: Principal) -> NewJob:
    """The job a submit asks for, or the HTTPException (403, 422) that refuses it."""
    team = body.team or who.team
    if team is None:
        raise HTTPException(422, [{"loc": ["body", "team"], "msg": "team is required"}])
    if not who.is_admin and team != who.team:
        raise HTTPException(403, f"a {who.team} token submits only for team {who.team}")
    priority = PRIORITIES[body.priority] if isinstance(body.priority, str) else body.priority
    sizing = None if body.sizing is None else body.sizing.mapping()
    admit(
        api.fleet,
        load_catalog(),
        gpus=body.gpus,
        gpu_model=body.gpu_model,
        sizing=sizing,
        gangs=api.gangs,
    )
    levels = api.scheduling.topology.levels
    for flag, level in (
        ("topology", body.topology),
        ("topology-preferred", body.topology_preferred),
    ):
        if level is not None and level not in levels:
            have = f"its levels are {', '.join(levels)}" if levels else "it names no levels"
            raise HTTPException(
                422,
                f"--{flag} {level}: this service's topology has no level {level!r} ({have}; "
                "`topology: levels:` in the --config file, with node labels of those keys)",
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
        else api.scheduling.time_limit_s.get(body.kind),
        gpu_milli=1000 if body.gpu_share is None else max(1, round(body.gpu_share * 1000)),
        owner=who.name,
    )
    job = NewJob(**given)
    check_share(job, api.fleet_models, api.catalog)
    return job


@router.post(
    "/v1/jobs",
    status_code=201,
    summary="Submit a job",
    responses={200: {"description": "The job this Idempotency-Key created before"}},
)
async def submit(
    body: JobIn,
    who: Who,
    api: Api,
    idempotency_key: Annotated[
        str | None, Header(max_length=128, pattern=r"^[\x21-\x7e]+$")
    ] = None,
) -> JSONResponse:
    # Group commit: submissions that arrive while a commit runs share the next one,
    # and the scheduler is woken once per commit.
    job = new_job(api, body, who)
    api.rate.take(job.team)
    row, created = await api.batcher.submit(job, idempotency_key)
    return JSONResponse(job_json(row), status_code=201 if created else 200)


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


async def submit_direct(request: Request) -> Response:
    """POST /v1/jobs as `submit` above does it, without FastAPI's per-request solving
    of parameters and dependencies, which took a third of a submit's CPU: the same
    token check, Idempotency-Key rule and JobIn model, the same errors (through the
    app's handlers), the same group commit. `submit` stays for the OpenAPI document
    (tests/server/api/test_submit_direct.py holds the two to the same answers)."""
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
    return await submit(body, who, request.app.state.api, key)


@router.post("/v1/jobs/batch", status_code=201, summary="Submit up to 1,000 jobs at once")
def submit_batch(body: BatchIn, who: Who, api: Api, store: Db, service: Live) -> dict[str, Any]:
    new = [new_job(api, j, who) for j in body.jobs]
    for team in sorted({j.team for j in new}):
        api.rate.take(team, sum(j.team == team for j in new))
    rows = store.jobs.submit_many(new, service.clock.now())
    service.state.wake.set()
    return {"jobs": [job_json(r) for r in rows]}


@router.get("/v1/jobs", summary="List jobs")
def jobs(
    who: Who,
    store: Db,
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


@router.get("/v1/jobs/{job_id}", summary="One job")
def job(job_id: JobId, who: Who, store: Db) -> dict[str, Any]:
    return job_json(store.jobs.get(job_id))


@router.post("/v1/jobs/{job_id}/cancel", summary="Cancel a job")
def cancel(job_id: JobId, who: Who, store: Db, service: Live) -> dict[str, Any]:
    own(who, store.jobs.get(job_id))
    return job_json(service.operations.cancel(job_id))


@router.get("/v1/jobs/{job_id}/logs", summary="A job's output", response_class=PlainTextResponse)
def logs(
    job_id: JobId,
    who: Who,
    store: Db,
    service: Live,
    stream: Literal["stdout", "stderr"] = "stdout",
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=1 << 22)] = 1 << 20,
    rank: Annotated[int, Query(ge=0, le=1 << 16)] = 0,
) -> Response:
    row = store.jobs.get(job_id)
    own(who, row)
    data = service.views.read_log(job_id, stream, offset, limit, rank=rank)
    state = "running" if row.state == "preempting" else row.state
    return Response(
        data,
        media_type="text/plain; charset=utf-8",
        headers={"X-Log-Offset": str(offset + len(data)), "X-Job-State": state},
    )

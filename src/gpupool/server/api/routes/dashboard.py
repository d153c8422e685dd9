"""The dashboard: its page and files at / (static, no token; its data calls carry the token
the person signs in with) and the read endpoints only its panels use: who a token is
(/v1/me), teams against their quotas (/v1/teams) and one job's history
(/v1/jobs/{job_id}/events)."""

from __future__ import annotations

from pathlib import Path as FsPath
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Path, Query, Request
from fastapi.responses import Response

from gpupool.errors import Unavailable
from gpupool.server.api.deps import Db, Live, Who, current_principal
from gpupool.server.api.schemas import MAX_ID, NAME, JobId
from gpupool.server.loop.driver import LiveService

router = APIRouter()


@router.get("/", include_in_schema=False)
def dashboard() -> Response:
    """The dashboard page; its data calls carry the token the person signs in with."""
    return _dashboard_asset("index.html")


@router.get("/dashboard/{name}", include_in_schema=False)
def dashboard_asset(name: Annotated[str, Path(max_length=64)]) -> Response:
    if name not in DASHBOARD_ASSETS:
        raise HTTPException(404, f"no dashboard file {name}")
    return _dashboard_asset(name)


@router.get("/v1/me", summary="Who the token belongs to (anonymous without one)")
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


@router.get("/v1/teams", summary="Teams against their quotas and the active time window")
def teams(
    who: Who,
    service: Live,
    team: Annotated[str | None, Query(max_length=64, pattern=NAME)] = None,
) -> dict[str, Any]:
    """Per team and pool (GPU type): GPUs held now against what the team is guaranteed
    and may hold at most at this time of day (the active window's shares, else the
    team's quota), with its running and waiting job counts."""
    return teams_view(service, team)


@router.get("/v1/jobs/{job_id}/events", summary="A job's history: its events, oldest first")
def job_events(
    job_id: JobId,
    who: Who,
    store: Db,
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


DASHBOARD_DIR = FsPath(__file__).parent.parent / "dashboard"
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
    if not service.state.lock.acquire(timeout=service.views.VIEW_WAIT_S):
        raise Unavailable(
            f"the scheduler loop has held its state for over {service.views.VIEW_WAIT_S:g} s; "
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
        service.state.lock.release()

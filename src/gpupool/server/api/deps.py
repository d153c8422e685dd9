"""What the routes depend on: the app's shared handles (ApiState), who is asking (the bearer
token's principal) and the checks on what that principal may touch.

The handles are FastAPI dependencies (Api, Live, Db) read from app.state, so a route names what
it needs in its signature and reaches nothing of create_app's. The ownership checks stay plain
functions a route calls after loading the row: as dependencies they would run before FastAPI
validates the rest of the request, and a 403 would then win over the 422 a client gets today.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from prometheus_client import CollectorRegistry

from gpupool.scheduler.config import SchedulerConfig
from gpupool.server.api.admission import Fleet
from gpupool.server.api.batcher import SubmitBatcher
from gpupool.server.api.rate import SubmitRate
from gpupool.server.loop.driver import LiveService
from gpupool.server.security.auth import AuditTrail, TokenCache
from gpupool.server.store import JobRow, Principal, Store
from gpupool.sizing.catalog import Catalog


@dataclass(frozen=True)
class ApiState:
    """What create_app builds once and the routes share, kept at app.state.api. The token
    cache is not here: it stays at app.state.tokens, where current_principal reads it on
    every request (and a test may swap it)."""

    service: LiveService
    store: Store
    batcher: SubmitBatcher
    """Group commit of single submits (POST /v1/jobs)."""
    rate: SubmitRate
    """Each team's submit rate (its submit_per_min)."""
    trail: AuditTrail
    wall: Callable[[], float]
    """The clock tokens expire by and the audit trail is stamped with."""
    scheduling: SchedulerConfig
    fleet: Fleet
    """What a job may ask for: fixed for the service's life, cloud nodes too."""
    gangs: bool
    """Whether the executor runs jobs across nodes (Ray)."""
    fleet_models: frozenset[str]
    catalog: Catalog
    registry: CollectorRegistry
    """The app's own Prometheus registry (not the global one)."""


async def api_state(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state


async def live_service(request: Request) -> LiveService:
    state: ApiState = request.app.state.api
    return state.service


async def app_store(request: Request) -> Store:
    state: ApiState = request.app.state.api
    return state.store


Api = Annotated[ApiState, Depends(api_state)]
Live = Annotated[LiveService, Depends(live_service)]
Db = Annotated[Store, Depends(app_store)]


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


def admin_only(who: Principal, what: str) -> None:
    if not who.is_admin:
        raise HTTPException(403, f"only an admin token {what}; token {who.name} is not one")


def own(who: Principal, row: JobRow) -> None:
    if not who.is_admin and who.team != row.team:
        raise HTTPException(403, f"job {row.id} belongs to team {row.team}, not {who.team}")


def own_service(store: Store, who: Principal, name: str) -> None:
    row = store.services.get(name)
    if not who.is_admin and who.team != row.team:
        raise HTTPException(403, f"service {name} belongs to team {row.team}, not {who.team}")

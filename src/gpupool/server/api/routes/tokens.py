"""Tokens and the audit trail (admin only): create, list and revoke tokens; read the trail.

Each change flushes the trail first, so the requests before it stay before it; a revoked
token is forgotten by the app's token cache, so its next request is refused.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request

from gpupool.server.api.deps import Api, Db, Who, admin_only
from gpupool.server.api.schemas import MAX_ID, NAME, TokenIn, audit_json, token_json
from gpupool.server.security.auth import TokenCache

router = APIRouter()


def peer(request: Request) -> str | None:
    """The client's address as the audit trail keeps it."""
    return None if request.client is None else f"{request.client.host}:{request.client.port}"


@router.post("/v1/tokens", status_code=201, summary="Create a token (admin)")
def create_token(body: TokenIn, who: Who, request: Request, api: Api, store: Db) -> dict[str, Any]:
    admin_only(who, "creates tokens")
    api.trail.flush()  # the requests before it stay before it in the trail
    now = api.wall()
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


@router.get("/v1/tokens", summary="Every token, revoked and expired ones too (admin)")
def list_tokens(who: Who, api: Api, store: Db) -> dict[str, Any]:
    admin_only(who, "lists tokens")
    now = api.wall()
    return {"tokens": [token_json(r, now) for r in store.auth.tokens()]}


@router.post("/v1/tokens/{ref}/revoke", summary="Revoke a token by name or id (admin)")
def revoke_token(
    ref: Annotated[str, Path(min_length=1, max_length=64, pattern=NAME)],
    who: Who,
    request: Request,
    api: Api,
    store: Db,
) -> dict[str, Any]:
    admin_only(who, "revokes tokens")
    api.trail.flush()
    now = api.wall()
    row = store.auth.revoke_token(ref, now, by=who, client=peer(request))
    tokens: TokenCache = request.app.state.tokens  # current_principal's cache
    tokens.forget(name=row.name, token_id=row.id)  # refused from the next request
    return token_json(row, now)


@router.get("/v1/audit", summary="The audit trail, newest first (admin)")
def audit(
    who: Who,
    api: Api,
    store: Db,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    before: Annotated[int | None, Query(ge=1, le=MAX_ID + 1)] = None,
    since: Annotated[float | None, Query(ge=0, le=1e11)] = None,
    token: Annotated[str | None, Query(max_length=64, pattern=NAME)] = None,
) -> dict[str, Any]:
    """Token changes, every request that changed something or was refused, and admin
    reads of tokens and of this trail: page on with before=the last id."""
    admin_only(who, "reads the audit trail")
    api.trail.flush()
    rows = store.auth.audit(limit=limit, before_id=before, since_s=since, token=token)
    return {"audit": [audit_json(r) for r in rows]}

"""API tokens (only their hashes are stored) and the audit trail of who did what."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import delete, func, insert, select
from sqlalchemy.engine import CursorResult
from sqlalchemy.exc import IntegrityError

from gpupool.errors import ConflictError, NotFoundError, SpecError
from gpupool.server.store.base import Repository, transaction
from gpupool.server.store.events import insert_event
from gpupool.server.store.rows import AuditEntry, AuditRow, Principal, TokenRow
from gpupool.server.store.states import ROLES
from gpupool.server.store.tables import AuditModel, TokenModel


def token_hash(token: str) -> str:
    """What the tokens table keeps instead of the token: a leaked database leaks no access."""
    return hashlib.sha256(token.encode()).hexdigest()


def _active_admin(now_s: float) -> tuple[Any, ...]:
    """WHERE clauses of an active admin token."""
    return (
        TokenModel.role == "admin",
        TokenModel.revoked_at.is_(None),
        (TokenModel.expires_at.is_(None)) | (TokenModel.expires_at > now_s),
    )


def token_row(m: TokenModel) -> TokenRow:
    role = m.role or ("admin" if m.team is None else "team")
    return TokenRow(
        m.id, m.name, role, m.team, m.created_at, m.expires_at, m.revoked_at, m.created_by
    )


def audit_values(e: AuditEntry) -> dict[str, Any]:
    """The entry's fields as the audit table's columns (the same names)."""
    return dataclasses.asdict(e)


def audit_row(m: AuditModel) -> AuditRow:
    entry = AuditEntry(
        at_s=m.at_s,
        action=m.action,
        token=m.token,
        role=m.role,
        team=m.team,
        method=m.method,
        path=m.path,
        status=m.status,
        client=m.client,
        detail=m.detail,
    )
    return AuditRow(m.id, entry)


@dataclass(frozen=True)
class Auth(Repository):
    """Tokens, who holds them, and the audit trail."""

    def create_token(
        self,
        name: str,
        team: str | None,
        now_s: float,
        *,
        role: str | None = None,
        expires_at: float | None = None,
        by: Principal | None = None,
        client: str | None = None,
    ) -> str:
        """A new API token for a team (None: an admin); only its hash is stored, so show the
        returned token to the user now: it cannot be recovered later."""
        return self.issue_token(
            name, team, now_s, role=role, expires_at=expires_at, by=by, client=client
        )[0]

    @transaction
    def issue_token(
        self,
        name: str,
        team: str | None,
        now_s: float,
        *,
        role: str | None = None,
        expires_at: float | None = None,
        by: Principal | None = None,
        client: str | None = None,
    ) -> tuple[str, TokenRow]:
        """create_token, and the stored row. A name held by a revoked or expired token is
        taken over (the audit trail keeps the old one's history); an active one's is not.
        The audit row is written in the same transaction as the token."""
        if not name:
            raise SpecError("a token needs a name, e.g. the person or robot that will use it")
        role = role or ("admin" if team is None else "team")
        if role not in ROLES:
            raise SpecError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
        if (role == "team") != (team is not None):
            raise SpecError(
                "a team token needs its team (--team T); admin and read-only tokens have none"
            )
        if expires_at is not None and not (math.isfinite(expires_at) and expires_at > now_s):
            raise SpecError("a token's expiry must lie in the future, e.g. --expires 30d")
        token = "gp_" + secrets.token_urlsafe(32)
        scope = f"team {team}" if role == "team" else role
        until = "" if expires_at is None else f", expires at {expires_at:.0f}"
        try:
            with self.db.write() as s:
                old = s.scalars(select(TokenModel).where(TokenModel.name == name)).one_or_none()
                if old is not None:
                    if token_row(old).state(now_s) == "active":
                        raise ConflictError(
                            f"a token named {name!r} exists; pick another name or revoke "
                            "that one first"
                        )
                    s.delete(old)
                    s.flush()
                model = TokenModel(
                    name=name,
                    team=team,
                    hash=token_hash(token),
                    created_at=now_s,
                    role=role,
                    expires_at=expires_at,
                    revoked_at=None,
                    created_by=None if by is None else by.name,
                )
                s.add(model)
                s.flush()
                row = token_row(model)
                entry = AuditEntry.by(
                    by,
                    now_s,
                    "token-created",
                    client=client,
                    detail=f"token {name} (id {row.id}) for {scope}{until}",
                )
                s.execute(insert(AuditModel), [audit_values(entry)])
                insert_event(
                    self.db, s, "token-created", f"token {name} created for {scope}", now_s
                )
        except IntegrityError as exc:
            raise ConflictError(
                f"a token named {name!r} exists; pick another name or revoke that one first"
            ) from exc
        return token, row

    @transaction
    def tokens(self) -> list[TokenRow]:
        """Every token, revoked and expired ones included, in id order."""
        with self.db.read() as s:
            return [token_row(m) for m in s.scalars(select(TokenModel).order_by(TokenModel.id))]

    @transaction
    def revoke_token(
        self,
        ref: str | int,
        now_s: float,
        *,
        by: Principal | None = None,
        client: str | None = None,
    ) -> TokenRow:
        """Revoke the active token named ref (or, for a number no token is named, with that
        id); refused for the last active admin token, which would lock every admin out."""
        with self.db.write() as s:
            found = s.scalars(select(TokenModel).where(TokenModel.name == str(ref))).one_or_none()
            if found is None and str(ref).isdigit() and int(ref) <= 2**31 - 1:
                found = s.get(TokenModel, int(ref))
            if found is None or token_row(found).state(now_s) == "revoked":
                raise NotFoundError(
                    f"no token is named {ref!r} (or has that id); nothing was revoked; "
                    "gpupool token ls lists them"
                )
            if found.role == "admin" and token_row(found).state(now_s) == "active":
                others = s.scalar(
                    select(func.count())
                    .select_from(TokenModel)
                    .where(TokenModel.id != found.id, *_active_admin(now_s))
                )
                if not others:
                    raise ConflictError(
                        f"token {found.name} is the last active admin token; create another "
                        "admin token first (gpupool token create NAME --admin)"
                    )
            found.revoked_at = now_s
            s.flush()
            row = token_row(found)
            entry = AuditEntry.by(
                by, now_s, "token-revoked", client=client, detail=f"token {row.name} (id {row.id})"
            )
            s.execute(insert(AuditModel), [audit_values(entry)])
            insert_event(self.db, s, "token-revoked", f"token {row.name} revoked", now_s)
            return row

    @transaction
    def principal(self, token: str, now_s: float | None = None) -> Principal | None:
        """Who a presented token belongs to, or None for an unknown, revoked or expired one
        (now_s: the wall clock, Unix s; default now)."""
        now = time.time() if now_s is None else now_s
        with self.db.read() as s:
            found = s.scalars(
                select(TokenModel).where(TokenModel.hash == token_hash(token))
            ).one_or_none()
            if found is None or token_row(found).state(now) != "active":
                return None
            return Principal(found.name, found.team, found.role, found.expires_at, found.id)

    @transaction
    def has_admin(self, now_s: float | None = None) -> bool:
        """Whether an active (unrevoked, unexpired) admin token exists."""
        now = time.time() if now_s is None else now_s
        with self.db.read() as s:
            query = select(TokenModel.id).where(*_active_admin(now)).limit(1)
            return s.scalar(query) is not None

    @transaction
    def add_audit(self, entries: Sequence[AuditEntry]) -> None:
        """Append audit entries, all in one transaction (a background write: on a locked
        SQLite database it fails soon, and the trail keeps the entries for its next try)."""
        if not entries:
            return
        with self.db.background_write() as s:
            s.execute(insert(AuditModel), [audit_values(e) for e in entries])

    @transaction
    def audit(
        self,
        limit: int = 100,
        before_id: int | None = None,
        since_s: float | None = None,
        token: str | None = None,
    ) -> list[AuditRow]:
        """Audit rows newest first, a page at a time: pass the last id seen as before_id."""
        if limit < 1:
            raise SpecError(f"limit is {limit}; ask for at least 1 audit row")
        query = select(AuditModel)
        if before_id is not None:
            query = query.where(AuditModel.id < before_id)
        if since_s is not None:
            query = query.where(AuditModel.at_s >= since_s)
        if token is not None:
            query = query.where(AuditModel.token == token)
        with self.db.read() as s:
            found = s.scalars(query.order_by(AuditModel.id.desc()).limit(limit))
            return [audit_row(m) for m in found]

    @transaction
    def purge_audit(self, older_than_s: float, keep_rows: int | None = None) -> int:
        """Delete audit rows from before older_than_s (Unix s), and beyond the newest
        keep_rows; returns how many went."""
        with self.db.background_write() as s:
            old = delete(AuditModel).where(AuditModel.at_s < older_than_s)
            gone = cast(CursorResult[Any], s.execute(old)).rowcount
            if keep_rows is not None:
                top = s.scalar(select(func.max(AuditModel.id)))
                if top is not None and top > keep_rows:
                    cut = delete(AuditModel).where(AuditModel.id <= top - keep_rows)
                    gone += cast(CursorResult[Any], s.execute(cut)).rowcount
            return int(gone)

"""Credentials at the API: a token cache that honours revocation and expiry, and the audit
trail of who did what, written off the request path.

The database is the truth about tokens. The cache spares a lookup per request, but each
entry carries its token's expiry (refused the instant it passes) and lives at most ttl_s
(a token revoked by another process is refused within that); a revoke through this server
drops the entry at once, so its next request is refused.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from gpupool.server.store import AuditEntry, Principal, Store, transient

log = logging.getLogger(__name__)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
PRINCIPAL_KEY = "gpupool_principal"
"""Where current_principal leaves who asked, in the request's scope state, for the audit."""


class TokenCache:
    """Principals by token hash, each with the monotonic time it was read from the store."""

    def __init__(
        self,
        ttl_s: float = 5.0,
        max_entries: int = 10_000,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[Principal, float]] = {}

    @staticmethod
    def key(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    def get(self, token: str) -> Principal | None:
        """The cached principal if read within ttl_s (expiry is the caller's to check)."""
        key = self.key(token)
        with self._lock:
            hit = self._entries.get(key)
            if hit is None:
                return None
            if self.monotonic() - hit[1] > self.ttl_s:
                del self._entries[key]
                return None
            return hit[0]

    def put(self, token: str, who: Principal) -> None:
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()  # a flood of distinct tokens costs lookups, not memory
            self._entries[self.key(token)] = (who, self.monotonic())

    def forget(self, name: str | None = None, token_id: int | None = None) -> None:
        """Drop every entry of the token with this name or id (after a revoke)."""
        with self._lock:
            for key, (who, _) in list(self._entries.items()):
                if who.name == name or (token_id is not None and who.token_id == token_id):
                    del self._entries[key]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


class AuditTrail:
    """Audit entries queued by requests and written in batches by a short-lived thread.

    A request never waits for its audit row: it is queued, and whatever queued while a
    batch was being written goes in the next transaction (one commit for many requests).
    flush() waits until everything queued so far is stored; reading the trail calls it.
    Token changes are not queued: the store writes their rows with the change itself.
    Bounded: each write purges rows older than keep_days (at most every purge_every_s)
    and beyond the newest keep_rows. A crash loses at most the entries still queued.
    A database that is briefly locked or unreachable costs nothing: the batch waits in the
    queue (at most max_queued entries, the oldest dropped beyond) and is tried again with
    backoff; the store gives audit writes a short lock wait, so they never hold the
    scheduler's writes up for long.
    """

    def __init__(
        self,
        store: Store,
        keep_days: float = 90.0,
        keep_rows: int | None = 1_000_000,
        purge_every_s: float = 3600.0,
        wall: Callable[[], float] = time.time,
        linger_s: float = 0.05,
        max_queued: int = 100_000,
        retry_first_s: float = 0.5,
        retry_max_s: float = 5.0,
    ) -> None:
        self.store = store
        self.linger_s = linger_s
        """How long the writer lets entries gather before a transaction (a flush skips it):
        under load, one audit commit per many requests instead of one per request."""
        self.keep_days = keep_days
        self.keep_rows = keep_rows
        self.purge_every_s = purge_every_s
        self.wall = wall
        self.max_queued = max_queued
        self.retry_first_s = retry_first_s
        self.retry_max_s = retry_max_s
        self.dropped = 0
        """Entries lost to a failing database or a full queue (logged)."""
        self._cond = threading.Condition()
        self._queue: list[AuditEntry] = []
        self._writing = False
        self._waiting = 0
        self._last_purge = -float("inf")

    def record(self, entry: AuditEntry) -> None:
        with self._cond:
            self._queue.append(entry)
            if not self._writing:
                self._writing = True
                threading.Thread(target=self._drain, name="gpupool-audit", daemon=True).start()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every entry queued so far is written; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._waiting += 1
            self._cond.notify_all()  # the writer stops lingering
            try:
                while self._writing or self._queue:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)
            finally:
                self._waiting -= 1
        return True

    def purge(self) -> int:
        """Apply the retention now; returns the rows deleted."""
        self._last_purge = time.monotonic()
        return self.store.auth.purge_audit(self.wall() - self.keep_days * 86400.0, self.keep_rows)

    def _drain(self) -> None:
        delay_s = self.retry_first_s
        while True:
            with self._cond:
                if not self._waiting:
                    self._cond.wait_for(lambda: self._waiting > 0, self.linger_s)
                batch, self._queue = self._queue, []
                if not batch:
                    self._writing = False
                    self._cond.notify_all()
                    return
            try:
                self.store.auth.add_audit(batch)
            except Exception as err:
                if not transient(err):
                    self.dropped += len(batch)
                    log.exception("audit: could not write %d entries; they are lost", len(batch))
                    continue
                self._requeue(batch, err, delay_s)
                time.sleep(delay_s)
                delay_s = min(2 * delay_s, self.retry_max_s)
                continue
            delay_s = self.retry_first_s
            if time.monotonic() - self._last_purge >= self.purge_every_s:
                try:
                    self.purge()
                except Exception as err:
                    self._last_purge = -float("inf")  # tried again at the next write
                    log.warning("audit: purge put off: %s", err)

    def _requeue(self, batch: list[AuditEntry], err: BaseException, delay_s: float) -> None:
        """Put a batch the database refused for now back in front of the queue, in order,
        keeping at most max_queued entries (the oldest go first)."""
        with self._cond:
            queue = batch + self._queue
            over = len(queue) - self.max_queued
            if over > 0:
                self.dropped += over
                queue = queue[over:]
            self._queue = queue
        log.warning(
            "audit: database unavailable (%s); %d entries kept, next try in %g s%s",
            type(err).__name__,
            len(queue),
            delay_s,
            f", {over} oldest dropped" if over > 0 else "",
        )


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class AuditMiddleware:
    """Queues an audit entry for every request that changes something (any method but
    GET/HEAD/OPTIONS), every refused credential (401, 403) and every admin read of
    /v1/audit or /v1/tokens: who (the token's name, role and team), what (method, path,
    status), when and from where (the peer address)."""

    def __init__(
        self,
        app: Callable[[Scope, Receive, Send], Awaitable[None]],
        trail: AuditTrail,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.app = app
        self.trail = trail
        self.wall = wall

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        status: list[int] = []

        async def sending(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except BaseException:
            if not status:
                status.append(500)
            raise
        finally:
            self._note(scope, state, status[0] if status else None)

    def _note(self, scope: Scope, state: Any, status: int | None) -> None:
        method = str(scope.get("method", ""))
        path = str(scope.get("path", ""))
        admin_read = path.startswith(("/v1/audit", "/v1/tokens"))
        if method in SAFE_METHODS and status not in (401, 403) and not admin_read:
            return
        who = state.get(PRINCIPAL_KEY) if isinstance(state, dict) else None
        peer = scope.get("client")
        client = f"{peer[0]}:{peer[1]}" if peer else None
        entry = AuditEntry.by(
            who, self.wall(), "request", method=method, path=path, status=status, client=client
        )
        self.trail.record(entry)

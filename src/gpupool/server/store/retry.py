"""Riding out a database that is briefly unavailable: which errors are worth another try,
and the backoff the scheduler loop's store retries its calls with."""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as SqlTimeoutError

P = ParamSpec("P")
T = TypeVar("T")


def transient(err: BaseException) -> bool:
    """Whether a failed call may succeed if tried again: the database was locked, busy,
    unreachable, out of space, read-only or out of file descriptors. A retried call is safe:
    each Store method is one transaction, and these errors leave it uncommitted."""
    if isinstance(err, OperationalError | SqlTimeoutError | InterfaceError):
        return True
    return isinstance(err, DBAPIError) and bool(err.connection_invalidated)


SQLITE_FULL = 13
"""SQLite's result code for a write the disk (or max_page_count) had no room for."""
POSTGRES_DISK_FULL = "53100"
"""PostgreSQL's SQLSTATE disk_full."""
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def out_of_space(err: BaseException) -> bool:
    """Whether a failed call failed for want of disk space where the database writes: SQLite's
    SQLITE_FULL, PostgreSQL's disk_full, or ENOSPC/EDQUOT anywhere in the cause chain. Such a
    write left nothing committed; it can succeed once space is freed."""
    seen: BaseException | None = err
    for _ in range(8):  # a cause chain is short; never follow a cycle
        if seen is None:
            return False
        original = getattr(seen, "orig", None)
        for e in (seen, original):
            if getattr(e, "sqlite_errorcode", None) == SQLITE_FULL:
                return True
            if getattr(e, "sqlstate", None) == POSTGRES_DISK_FULL:
                return True
            if isinstance(e, OSError) and e.errno in NO_SPACE_ERRNOS:
                return True
        seen = seen.__cause__ or seen.__context__
    return False


@dataclass
class RetryPolicy:
    """Backoff from first_s doubling to at most max_s, for at most give_up_s in all."""

    first_s: float = 0.1
    max_s: float = 5.0
    give_up_s: float = 300.0


@dataclass(frozen=True)
class Retry:
    """How a store's calls retry transient errors (see `transient`) with the policy's
    backoff, each retry reported to `on_retry(error, attempt, delay_s)`, until the call
    succeeds, `give_up_s` has passed, or `stopping` is set; then the last error is raised.
    The scheduler loop's store carries one (Store.retrying), since the loop would otherwise
    lose the change it was writing; the API's store has none: it answers with errors
    instead of waiting."""

    policy: RetryPolicy = field(default_factory=RetryPolicy)
    on_retry: Callable[[BaseException, int, float], None] | None = None
    stopping: threading.Event = field(default_factory=threading.Event)

    def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """fn(*args, **kwargs), tried again after each transient error."""
        p = self.policy
        deadline = time.monotonic() + p.give_up_s
        delay, attempt = p.first_s, 0
        while True:
            try:
                return fn(*args, **kwargs)
            except Exception as err:
                attempt += 1
                if not transient(err) or time.monotonic() + delay > deadline:
                    raise
                if self.on_retry is not None:
                    self.on_retry(err, attempt, delay)
                if self.stopping.wait(delay):
                    raise
                delay = min(delay * 2, p.max_s)

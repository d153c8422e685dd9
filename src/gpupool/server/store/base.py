"""The store's contract, which every repository keeps.

* **One transaction per public call.** Each public method of a repository (marked
  `@transaction`) runs in exactly one transaction, `with db.write()` or `with db.read()`:
  a crash of the process or of the method never leaves half a change behind, and every
  write is committed before the method returns, so the API can promise a job exists the
  moment it answers. A marked method calls no other marked one.
* **Errors.** SpecError: a value the store refuses before writing anything (a bad spec,
  an unknown state, a non-positive limit). NotFoundError: the job, service or token named
  is not there. IllegalTransition: the job is in a state it may not move from, or changed
  meanwhile (read it again and decide anew). ConflictError: the change clashes with what
  is stored (a reused idempotency key, a live service's name, an active token's name, the
  last admin token). An SQLAlchemy error is the database's: `retry.transient` tells which
  ones may pass if the call is tried again; none of them leaves anything committed.
* **Retries.** A store built with `Store.retrying(Retry(...))` retries a whole public call
  on a transient error (the scheduler loop's); a plain store raises at once (the API's).
* **Threads.** A store is safe to share between threads: each call checks its own
  connection out of the engine's pool. On SQLite this process's writers take turns on one
  lock (SQLite has one writer at a time); readers never wait for a writer (WAL).
* **SQLite vs PostgreSQL.** SQLite: WAL with synchronous=NORMAL (a commit survives the
  process being killed, not a power cut), BEGIN IMMEDIATE for writers, a 30-s busy timeout
  (1 s for background writes such as the audit trail). PostgreSQL: a pool of 8 (+8)
  connections, full durability, row locks where SQLite relies on its single writer, and an
  advisory lock that makes event seqs commit in order (`Database.lock_events`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from gpupool.server.store.db import Database

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Repository:
    """One aggregate's tables behind the store's one database."""

    db: Database


def transaction(method: F) -> F:
    """Marks a public method of a repository: one transaction, retried whole under the
    database's retry policy (Database.run)."""

    @functools.wraps(method)
    def run(self: Repository, *args: Any, **kwargs: Any) -> Any:
        return self.db.run(method, self, *args, **kwargs)

    return cast(F, run)

"""One controller per database: a lease the scheduling server holds for as long as it lives.

Two `gpupool serve` on one database would each schedule the same queue (a job started twice,
two jobs on one GPU). The lease is held by the operating system or the database for the
holder's process, never by a timestamp it must renew, so a holder killed with SIGKILL lets
go at once and a holder that merely runs slow never loses it:

* SQLite: an exclusive `flock` on a lock file beside the database (`<db>.lease`); the
  kernel drops it when the last descriptor of the holder closes, i.e. when it dies. The
  descriptor is close-on-exec, so a job process never inherits it.
* PostgreSQL: a session advisory lock (`pg_try_advisory_lock`) on a connection of its own;
  the server drops it when that session ends. The key is derived from the schema the
  store's connections see, so two gpupool databases in one PostgreSQL do not collide.

`held()` tells the holder whether it still has the lease: the PostgreSQL lock goes with its
connection, so a holder whose connection broke must stop scheduling (the live loop checks
every cycle and the server exits). `FakeLease` is the same interface for tests.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import time
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.pool import NullPool

from gpupool.errors import SpecError

CHECK_S = 1.0
"""How often held() asks PostgreSQL whether the lease's session is still there."""


class Lease(Protocol):
    def try_acquire(self) -> bool:
        """Take the lease if nobody holds it; True if this process holds it now."""
        ...

    def held(self) -> bool:
        """Whether this process still holds it (False once lost, e.g. a dropped session)."""
        ...

    def holder(self) -> str:
        """Who holds it, as far as can be told (for messages)."""
        ...

    def release(self) -> None: ...

    @property
    def where(self) -> str:
        """What the lease is on (the lock file, the database), for messages."""
        ...


def _me() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}"


class FileLease:
    """An exclusive flock on `path` (created if missing), for a SQLite database."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def where(self) -> str:
        return str(self.path)

    def try_acquire(self) -> bool:
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        with contextlib.suppress(OSError):  # who holds it: for the other server's message
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{_me()} since {time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode(), 0)
        return True

    def held(self) -> bool:
        """Ours while the lock file is still the one we locked: a file deleted or replaced
        under us would let a second server lock a new one."""
        if self._fd is None:
            return False
        try:
            same = os.stat(self.path).st_ino == os.fstat(self._fd).st_ino
        except OSError as err:
            if err.errno in (errno.EMFILE, errno.ENFILE, errno.EIO):
                return True  # cannot tell now; the lock itself is still ours
            same = False
        return same

    def holder(self) -> str:
        if self._fd is not None:
            return _me()
        try:
            return self.path.read_text(encoding="utf-8").strip() or "another gpupool serve"
        except OSError:
            return "another gpupool serve"

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the lock
            self._fd = None


class AdvisoryLease:
    """A PostgreSQL session advisory lock on a connection of its own."""

    QUERY_KEY = "hashtextextended('gpupool-controller:' || current_schema(), 0)"

    def __init__(self, url: str) -> None:
        self.url = url
        self._engine = create_engine(make_url(url), poolclass=NullPool)
        self._conn: Connection | None = None
        self._checked = 0.0
        self._alive = False

    @property
    def where(self) -> str:
        u = make_url(self.url)
        return f"PostgreSQL database {u.database} on {u.host}:{u.port or 5432}"

    def _connect(self) -> Connection:
        conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        name = f"gpupool lease {_me()}"[:63]
        conn.execute(text("SELECT set_config('application_name', :n, false)"), {"n": name})
        return conn

    def try_acquire(self) -> bool:
        if self._alive:
            return True
        conn = self._connect()
        try:
            query = text(f"SELECT pg_try_advisory_lock({self.QUERY_KEY})")
            got = bool(conn.execute(query).scalar())
        except BaseException:
            conn.close()
            raise
        if not got:
            conn.close()
            return False
        self._conn, self._alive, self._checked = conn, True, time.monotonic()
        return True

    def held(self) -> bool:
        if not self._alive or self._conn is None:
            return False
        now = time.monotonic()
        if now - self._checked < CHECK_S:
            return True
        self._checked = now
        try:
            self._conn.execute(text("SELECT 1"))
        except Exception:  # the session is gone, and the lock with it
            self._alive = False
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
        return self._alive

    def holder(self) -> str:
        if self._alive:
            return _me()
        query = text(
            "SELECT a.application_name, a.client_addr, a.pid FROM pg_locks l "
            "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' "
            "AND l.granted AND l.objsubid = 1 AND (l.classid::bigint << 32 | l.objid::bigint) "
            f"= {self.QUERY_KEY} LIMIT 1"
        )
        try:
            with self._engine.connect() as conn:
                row: Any = conn.execute(query).first()
        except Exception:
            row = None
        if row is None or not row[0]:
            return "another gpupool serve"
        return f"{row[0].removeprefix('gpupool lease ')} (backend {row[2]})"

    def release(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()  # the session ends, and its advisory locks with it
        self._conn, self._alive = None, False
        self._engine.dispose()


class FakeLease:
    """A lease a test hands out or takes away."""

    def __init__(self, free: bool = True) -> None:
        self.free = free
        self._held = False
        self.lost = False

    @property
    def where(self) -> str:
        return "a fake lease"

    def try_acquire(self) -> bool:
        if not self._held and self.free:
            self._held, self.free = True, False
        return self._held

    def held(self) -> bool:
        return self._held and not self.lost

    def holder(self) -> str:
        return _me() if self._held else "another gpupool serve"

    def release(self) -> None:
        if self._held:
            self._held, self.free = False, True


def controller_lease(url: str) -> Lease:
    """The lease for the database at `url` (a SQLAlchemy URL as Store takes)."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if not parsed.database:
            raise SpecError("the SQLite database has no file; give --db sqlite:///FILE")
        return FileLease(Path(parsed.database + ".lease"))
    if backend == "postgresql":
        return AdvisoryLease(url)
    raise SpecError(f"no controller lease for a {backend} database; use SQLite or PostgreSQL")

"""One database behind the store: the engine, its transactions (one per public call),
SQLite's locking hooks, the PostgreSQL advisory locks, migration, and the user's URL.

SQLite runs in WAL mode with synchronous=NORMAL: a committed transaction survives the
process being killed (SIGKILL, OOM) because it is in the WAL file the OS already holds;
only an OS crash or power cut can lose the last few commits. Writers start with
BEGIN IMMEDIATE so two writers queue on the busy timeout instead of failing on a lock
upgrade. PostgreSQL gets a pool of connections and its own full durability.
"""

from __future__ import annotations

import copy
import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import Session, sessionmaker

from gpupool.errors import SpecError
from gpupool.server.store.retry import Retry

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SCHEMA_HEAD = "0013"
"""The newest migration's revision. A server start on a current database compares its version
row with this and loads nothing of alembic (its import alone is a fifth of a start-up); a test
holds it equal to alembic's own head of MIGRATIONS_DIR, so a new migration must raise it."""
SQLITE_BUSY_TIMEOUT_S = 30.0
"""How long a SQLite writer waits for another writer before giving up with 'database is locked'."""

SQLITE_BACKGROUND_BUSY_S = 1.0
"""How long a background writer (the audit trail) waits for another writer: it holds this
process's write turn meanwhile, so a long wait would stall the scheduler's writes behind
it; it gives up soon and tries again later instead."""

_WRITE = "gpupool_write"
"""Execution option marking a write transaction (SQLite: BEGIN IMMEDIATE)."""
_BUSY_MS = "gpupool_busy_ms"
"""Execution option: the SQLite busy timeout of a write transaction, ms (default: the
SQLITE_BUSY_TIMEOUT_S every connection starts with)."""
_DEFAULT_BUSY_MS = int(SQLITE_BUSY_TIMEOUT_S * 1000)
_EVENT_LOCK = 0x67707570_0001
"""PostgreSQL advisory lock taken before inserting events, so their seqs commit in order."""
_MIGRATE_LOCK = 0x67707570_0002
"""PostgreSQL advisory lock that lets only one process migrate at a time."""

_URL_EXAMPLE = (
    "use sqlite:////var/lib/gpupool/gpupool.db or postgresql://USER:PASSWORD@HOST:5432/gpupool"
)

P = ParamSpec("P")
T = TypeVar("T")


class Database:
    """The engine and its transactions; `retry`, when set, retries a whole public call.

    Safe to share between threads: each transaction checks its own connection out of
    the engine's pool. `with_retry` gives a view on the same engine and pool."""

    def __init__(self, url: str) -> None:
        self.url = url
        parsed = make_url(url)
        self.dialect = parsed.get_backend_name()
        self.retry: Retry | None = None
        if self.dialect == "sqlite":
            if parsed.database:
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            self._engine = create_engine(
                parsed,
                connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S},
                hide_parameters=True,  # job env and token hashes stay out of logs and errors
            )
            event.listen(self._engine, "connect", _sqlite_connect)
            event.listen(self._engine, "begin", _sqlite_begin)
        elif self.dialect == "postgresql":
            self._engine = create_engine(
                parsed,
                pool_size=8,
                max_overflow=8,
                pool_pre_ping=True,  # a restarted server must not fail the next call
                hide_parameters=True,
            )
        else:
            raise SpecError(f"database {url!r} is neither SQLite nor PostgreSQL; {_URL_EXAMPLE}")
        self._write_engine = self._engine.execution_options(**{_WRITE: True})
        self._write_lock: AbstractContextManager[Any] = (
            threading.Lock() if self.dialect == "sqlite" else nullcontext()
        )
        self._reads = sessionmaker(self._engine, expire_on_commit=False)
        self._writes = sessionmaker(self._write_engine, expire_on_commit=False)
        self._background_writes = sessionmaker(
            self._write_engine.execution_options(
                **{_BUSY_MS: int(SQLITE_BACKGROUND_BUSY_S * 1000)}
            ),
            expire_on_commit=False,
        )

    def with_retry(self, retry: Retry | None) -> Database:
        """This database (its engine, pool and write lock) with calls retried by `retry`."""
        view = copy.copy(self)
        view.retry = retry
        return view

    def close(self) -> None:
        """Close every pooled connection (at shutdown; nothing may use it after)."""
        self._engine.dispose()

    # -- transactions --
    def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """fn(*args, **kwargs), retried whole under this database's retry policy, if any."""
        if self.retry is None:
            return fn(*args, **kwargs)
        return self.retry.call(fn, *args, **kwargs)

    @contextmanager
    def read(self) -> Iterator[Session]:
        """One read transaction."""
        with self._reads.begin() as session:
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One write transaction: committed when the block ends, rolled back if it raises.

        SQLite has one writer at a time; threads of this process take turns on a lock
        instead of colliding in BEGIN IMMEDIATE, where SQLite's busy handler sleeps
        (1, 2, 5, 10... ms) and concurrent submissions would crawl."""
        with self._write_lock, self._writes.begin() as session:
            yield session

    @contextmanager
    def background_write(self) -> Iterator[Session]:
        """A write that can wait: on SQLite it gives up after SQLITE_BACKGROUND_BUSY_S
        when another process holds the database, rather than keep this process's other
        writers (the scheduler loop, submits) queued behind it for the full timeout."""
        with self._write_lock, self._background_writes.begin() as session:
            yield session

    def lock_events(self, session: Session) -> None:
        """Before inserting events, as the last thing a transaction does (PostgreSQL).

        Seqs come from a sequence, which hands them out at INSERT, not at COMMIT: without
        this lock a reader polling events_after(seq) could skip a seq committed late.
        Holding it until commit serialises event writers; nothing waits while holding it.
        SQLite needs none: its writers take turns already."""
        if self.dialect == "postgresql":
            session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _EVENT_LOCK})

    # -- schema --
    def migrate(self) -> None:
        """Bring the schema to the newest revision; a no-op on an up-to-date database.

        Runs in one transaction under a lock, so two processes starting together do not both
        create the tables, and a failed migration leaves the old schema. A database already at
        the head is told by its version row alone: alembic's upgrade would load every
        revision's script first (most of a server's start-up on a current database).
        """
        with self._write_engine.begin() as conn:
            if self.dialect == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATE_LOCK})
            if _revision(conn) == SCHEMA_HEAD:
                return
            from alembic import command
            from alembic.config import Config

            config = Config()
            config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
            config.set_main_option("path_separator", "os")
            config.attributes["connection"] = conn
            command.upgrade(config, "head")

    def table_names(self) -> set[str]:
        """The tables the database holds (whatever their schema)."""
        with self._engine.connect() as conn:
            return set(inspect(conn).get_table_names())


def _revision(conn: Connection) -> str | None:
    """The schema revision a database's version row records (None: never migrated)."""
    if not inspect(conn).has_table("alembic_version"):
        return None
    return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


@functools.cache
def schema_head() -> str:
    """The newest schema revision, the one Store.migrate() brings a database to (read once
    per process: the migrations ship with the code)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
    assert head is not None, f"no migrations in {MIGRATIONS_DIR}"
    return head


def database_url(text: str | None, state_dir: Path) -> str:
    """The SQLAlchemy URL for a user's --database value; None means SQLite under state_dir."""
    if text is None:
        return f"sqlite:///{state_dir}/gpupool.db"
    url = text.strip()
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            url = "postgresql+psycopg://" + url[len(prefix) :]
    if url.startswith("sqlite:///"):
        if url[len("sqlite:///") :] in ("", ":memory:"):
            raise SpecError(
                f"database {text!r} is not a file; the service needs state that survives "
                f"a restart: {_URL_EXAMPLE}"
            )
    elif not url.startswith("postgresql+psycopg://"):
        raise SpecError(f"database {text!r} is neither SQLite nor PostgreSQL; {_URL_EXAMPLE}")
    try:
        make_url(url)
    except ArgumentError as exc:
        raise SpecError(f"database {text!r} is not a valid URL ({exc}); {_URL_EXAMPLE}") from exc
    return url


# ---- SQLite's hooks ---------------------------------------------------------------------------
def _sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
    """Per connection: WAL, NORMAL sync, foreign keys, a busy timeout; we emit BEGIN ourselves."""
    dbapi_conn.isolation_level = None  # the sqlite3 module must not BEGIN behind our back
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={_DEFAULT_BUSY_MS}")
    cursor.close()


def _sqlite_begin(conn: Connection) -> None:
    """Writers take the write lock up front, so they wait their turn instead of deadlocking;
    a transaction that asks for another busy timeout sets it on its connection first (kept
    in the pooled connection's info, so the usual case costs no statement)."""
    options = conn.get_execution_options()
    busy_ms = options.get(_BUSY_MS, _DEFAULT_BUSY_MS)
    info = conn.connection.info
    if info.get(_BUSY_MS, _DEFAULT_BUSY_MS) != busy_ms:
        conn.exec_driver_sql(f"PRAGMA busy_timeout={int(busy_ms)}")
        info[_BUSY_MS] = busy_ms
    mode = "IMMEDIATE" if options.get(_WRITE) else "DEFERRED"
    conn.exec_driver_sql(f"BEGIN {mode}")

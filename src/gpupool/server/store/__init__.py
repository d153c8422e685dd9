"""The live service's durable state: jobs, services, their event log, nodes, API tokens
and the audit trail, telemetry history and settings, in SQLite or PostgreSQL.

Contract (base.py): every public method of a repository is exactly one transaction, so a
crash never leaves half a change behind and a write is committed before the method
returns; a Store is safe to share between threads; the scheduler loop's store retries
transient database errors (Store.retrying), the API's raises them. `Store` is one
Database (db.py) with a repository per aggregate: store.jobs, store.services,
store.events, store.nodes, store.auth, store.history, store.settings.

Adding a table or an aggregate: tables -> rows -> repository -> migration. Declare the
ORM model in tables.py, the frozen values it is read into in rows.py, the queries in a
repository (a frozen dataclass over Repository, each public method marked @transaction
and holding one `with self.db.write()` or `with self.db.read()`), wire the repository
into Store (store.py), and write the alembic revision in migrations/versions that creates
exactly the model (tests/server/store/test_store.py compares them). A job's submit-time field starts
in gpupool.domain.job_fields instead. Modules of this package import each other
directly, never through this file.
"""

from gpupool.server.store.auth import audit_values, token_hash
from gpupool.server.store.db import MIGRATIONS_DIR, Database, database_url, schema_head
from gpupool.server.store.retry import Retry, RetryPolicy, out_of_space, transient
from gpupool.server.store.rows import (
    AuditEntry,
    AuditRow,
    EventRow,
    FinishedRun,
    FleetGpu,
    GpuMinute,
    JobRow,
    LearningChange,
    LearningMode,
    NewJob,
    NewService,
    Principal,
    Pruned,
    Purged,
    ServiceMinute,
    ServiceRow,
    TokenRow,
)
from gpupool.server.store.states import (
    KINDS,
    LEARNING_MODES,
    ON_GPU,
    ROLES,
    STATES,
    TERMINAL,
    TRANSITIONS,
)
from gpupool.server.store.store import Store
from gpupool.server.store.tables import Base

__all__ = [
    "KINDS",
    "LEARNING_MODES",
    "MIGRATIONS_DIR",
    "ON_GPU",
    "ROLES",
    "STATES",
    "TERMINAL",
    "TRANSITIONS",
    "AuditEntry",
    "AuditRow",
    "Base",
    "Database",
    "EventRow",
    "FinishedRun",
    "FleetGpu",
    "GpuMinute",
    "JobRow",
    "LearningChange",
    "LearningMode",
    "NewJob",
    "NewService",
    "Principal",
    "Pruned",
    "Purged",
    "Retry",
    "RetryPolicy",
    "ServiceMinute",
    "ServiceRow",
    "Store",
    "TokenRow",
    "audit_values",
    "database_url",
    "out_of_space",
    "schema_head",
    "token_hash",
    "transient",
]

"""The live service's durable state: jobs, their event log, API tokens and the audit trail,
in SQLite or PostgreSQL.

Every public method is exactly one transaction, so a crash (of the process or of the method)
never leaves half a change behind, and every write is committed before the method returns, so
the API can promise a job exists the moment it answers. A Store is safe to share between
threads: each call checks its own connection out of the engine's pool.
"""

from __future__ import annotations

import builtins
import dataclasses
import hashlib
import math
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from alembic import command
from alembic.config import Config
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Double,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    bindparam,
    create_engine,
    delete,
    event,
    false,
    func,
    insert,
    inspect,
    or_,
    select,
    text,
)
from sqlalchemy import update as sql_update
from sqlalchemy.engine import Connection, CursorResult, Row, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    IntegrityError,
    InterfaceError,
    OperationalError,
)
from sqlalchemy.exc import TimeoutError as SqlTimeoutError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from gpupool.domain.lifecycle import TRANSITIONS as CORE_TRANSITIONS
from gpupool.domain.lifecycle import JobState
from gpupool.domain.model import JobKind, check_elastic
from gpupool.errors import (
    ConflictError,
    GpupoolError,
    IllegalTransition,
    NotFoundError,
    SpecError,
)
from gpupool.sizing.request_json import plan_request_from

KINDS: tuple[str, ...] = ("training", "online-inference", "offline-inference", "batch")
STATE_OF: dict[JobState, str] = {
    JobState.PENDING: "pending",
    JobState.RUNNING: "running",
    JobState.PREEMPTING: "preempting",
    JobState.SUSPENDED: "suspended",
    JobState.FINISHED: "succeeded",
    JobState.FAILED: "failed",
    JobState.CANCELLED: "cancelled",
    JobState.UNPLACEABLE: "failed",
}
"""The core's lifecycle in the database's words: a job the fleet cannot run has failed."""
STATES: tuple[str, ...] = tuple(dict.fromkeys(STATE_OF.values()))


def _transitions() -> dict[str, frozenset[str]]:
    """The store's table is the core's (core/lifecycle.TRANSITIONS), renamed."""
    out: dict[str, set[str]] = {name: set() for name in STATES}
    for state, allowed in CORE_TRANSITIONS.items():
        out[STATE_OF[state]] |= {STATE_OF[t] for t in allowed}
    return {name: frozenset(nxt) for name, nxt in out.items()}


TRANSITIONS: dict[str, frozenset[str]] = _transitions()
TERMINAL: frozenset[str] = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
ON_GPU: frozenset[str] = frozenset({"running", "preempting"})
"""States in which a job holds its GPUs (a preempting job still runs to its checkpoint)."""
LEARNING_MODES: tuple[str, ...] = ("shadow", "active")
"""How the learned policy may stand in the live service (off is the other policies)."""
SETTABLE: frozenset[str] = frozenset(
    {
        "gpus",
        "resize_gpus",
        "node",
        "pid",
        "pgid",
        "start_ticks",
        "attempts",
        "preemptions",
        "retries",
        "exit_code",
        "reason",
        "started_at",
        "ended_at",
        "cancel_requested",
        "held",
        "port",
    }
)
"""Columns transition() and update() may change; the job's spec is immutable once submitted."""

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
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
_EVENT_LOCK = 0x67707570_0001
"""PostgreSQL advisory lock taken before inserting events, so their seqs commit in order."""
_MIGRATE_LOCK = 0x67707570_0002
"""PostgreSQL advisory lock that lets only one process migrate at a time."""

_NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_name)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


# ---- schema (the migrations in migrations/versions create exactly this) ---------------------
class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=_NAMING)


class JobModel(Base):
    __tablename__ = "jobs"
    __table_args__ = {"sqlite_autoincrement": True}  # noqa: RUF012  (ids are never reused)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String)
    team: Mapped[str] = mapped_column(String, index=True)
    kind: Mapped[str] = mapped_column(String)
    priority: Mapped[int] = mapped_column(Integer)
    gpu_count: Mapped[int] = mapped_column(Integer)
    gpu_model: Mapped[str | None] = mapped_column(String)
    command: Mapped[list[str]] = mapped_column(JSON)
    env: Mapped[dict[str, str]] = mapped_column(JSON)
    cwd: Mapped[str | None] = mapped_column(Text)
    checkpoint_every_s: Mapped[float | None] = mapped_column(Double)
    grace_s: Mapped[float] = mapped_column(Double)
    max_retries: Mapped[int] = mapped_column(Integer)
    retries: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    state: Mapped[str] = mapped_column(String, index=True)
    reason: Mapped[str] = mapped_column(Text, server_default="")
    gpus: Mapped[list[list[Any]]] = mapped_column(JSON)
    node: Mapped[str | None] = mapped_column(String)
    attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    preemptions: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    exit_code: Mapped[int | None] = mapped_column(Integer)
    pid: Mapped[int | None] = mapped_column(Integer)
    pgid: Mapped[int | None] = mapped_column(Integer)
    start_ticks: Mapped[int | None] = mapped_column(BigInteger)
    duration_s: Mapped[float | None] = mapped_column(Double)
    submitted_at: Mapped[float] = mapped_column(Double)
    started_at: Mapped[float | None] = mapped_column(Double)
    ended_at: Mapped[float | None] = mapped_column(Double)
    updated_at: Mapped[float] = mapped_column(Double)
    idempotency_key: Mapped[str | None] = mapped_column(String, unique=True)
    owner_token: Mapped[str | None] = mapped_column(String)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, server_default=false())
    # what multi-cluster placement needs (revision 0002)
    dataset: Mapped[str | None] = mapped_column(String)
    dataset_gb: Mapped[float] = mapped_column(Double, server_default=text("0"))
    deadline_at: Mapped[float | None] = mapped_column(Double)
    user_region: Mapped[str | None] = mapped_column(String)
    latency_bound_ms: Mapped[float | None] = mapped_column(Double)
    # what the decision core sizes and prices preemption by (revision 0003)
    state_gib_per_gpu: Mapped[float] = mapped_column(Double, server_default=text("0"))
    sizing: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    # the job's lifecycle controls (revision 0005)
    time_limit_s: Mapped[float | None] = mapped_column(Double)
    # part of one GPU (revision 0006): thousandths of it, or GPU memory in MiB
    gpu_milli: Mapped[int] = mapped_column(Integer, server_default=text("1000"))
    gpu_mem_mib: Mapped[int | None] = mapped_column(Integer)
    # elastic jobs (revision 0008): the fewest GPUs it runs on (gpu_count the most), and
    # the GPUs a resize in flight moves it to (so a restart mid-resize finishes it)
    gpu_count_min: Mapped[int | None] = mapped_column(Integer)
    resize_gpus: Mapped[list[list[Any]] | None] = mapped_column(JSON(none_as_null=True))
    held: Mapped[bool] = mapped_column(Boolean, server_default=false())
    # the service a replica belongs to (revision 0007)
    service: Mapped[str | None] = mapped_column(String, index=True)
    port: Mapped[int | None] = mapped_column(Integer)
    """The loopback port a replica serves on (its attempt's; set at launch)."""


class ServiceModel(Base):
    """A long-lived online service (revision 0007): the core creates, places and stops
    its replicas, job rows of kind online-inference that name it in `service`."""

    __tablename__ = "services"
    __table_args__ = {"sqlite_autoincrement": True}  # noqa: RUF012  (ids are never reused)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String, index=True)
    team: Mapped[str] = mapped_column(String)
    model: Mapped[str | None] = mapped_column(String)
    gpu_model: Mapped[str | None] = mapped_column(String)
    gpu_mem_mib: Mapped[int | None] = mapped_column(Integer)
    gpu_milli: Mapped[int] = mapped_column(Integer, server_default=text("1000"))
    min_replicas: Mapped[int] = mapped_column(Integer)
    max_replicas: Mapped[int] = mapped_column(Integer)
    replica_rps: Mapped[float] = mapped_column(Double)
    slo_p99_ms: Mapped[float] = mapped_column(Double)
    port_env: Mapped[str] = mapped_column(String)
    command: Mapped[list[str]] = mapped_column(JSON)
    cwd: Mapped[str | None] = mapped_column(Text)
    env: Mapped[dict[str, str]] = mapped_column(JSON)
    grace_s: Mapped[float] = mapped_column(Double)
    priority: Mapped[int] = mapped_column(Integer)
    owner_token: Mapped[str | None] = mapped_column(String)
    created_at: Mapped[float] = mapped_column(Double)
    updated_at: Mapped[float] = mapped_column(Double)
    deleted_at: Mapped[float | None] = mapped_column(Double)


class NodeDrainModel(Base):
    """A node an admin drained: no new job goes there until undrained (revision 0005)."""

    __tablename__ = "node_drains"

    node: Mapped[str] = mapped_column(String, primary_key=True)
    since_s: Mapped[float] = mapped_column(Double)
    by: Mapped[str] = mapped_column(String)
    reason: Mapped[str] = mapped_column(Text)


class EventModel(Base):
    __tablename__ = "events"
    __table_args__ = {"sqlite_autoincrement": True}  # noqa: RUF012  (seqs are never reused)

    seq: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    at_s: Mapped[float] = mapped_column(Double)
    kind: Mapped[str] = mapped_column(String)
    job_id: Mapped[int | None] = mapped_column(Integer, ForeignKey("jobs.id"), index=True)
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)


class TokenModel(Base):
    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String, unique=True)
    team: Mapped[str | None] = mapped_column(String)
    hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[float] = mapped_column(Double)
    # roles, expiry and revocation (revision 0004)
    role: Mapped[str] = mapped_column(String, server_default="team")
    expires_at: Mapped[float | None] = mapped_column(Double)
    revoked_at: Mapped[float | None] = mapped_column(Double)
    created_by: Mapped[str | None] = mapped_column(String)


class AuditModel(Base):
    """Who did what, when and from where (revision 0004): mutating requests, refused
    credentials, admin reads and token changes. Purged by age and capped in rows."""

    __tablename__ = "audit"
    __table_args__ = {"sqlite_autoincrement": True}  # noqa: RUF012  (ids are never reused)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at_s: Mapped[float] = mapped_column(Double, index=True)
    action: Mapped[str] = mapped_column(String)
    token: Mapped[str | None] = mapped_column(String)
    role: Mapped[str | None] = mapped_column(String)
    team: Mapped[str | None] = mapped_column(String)
    method: Mapped[str] = mapped_column(String, server_default="")
    path: Mapped[str] = mapped_column(Text, server_default="")
    status: Mapped[int | None] = mapped_column(Integer)
    client: Mapped[str | None] = mapped_column(String)
    detail: Mapped[str] = mapped_column(Text, server_default="")


class GpuMinuteModel(Base):
    """One card's means over one bucket of the telemetry history (revision 0009)."""

    __tablename__ = "gpu_minutes"
    __table_args__ = {"sqlite_autoincrement": True}  # noqa: RUF012  (ids are never reused)

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    gpu_id: Mapped[str] = mapped_column(String)
    t_s: Mapped[float] = mapped_column(Double, index=True)
    period_s: Mapped[float] = mapped_column(Double)
    samples: Mapped[int] = mapped_column(Integer)
    mem_used_mib: Mapped[float] = mapped_column(Double)
    sm_util_pct: Mapped[float] = mapped_column(Double)
    power_w: Mapped[float | None] = mapped_column(Double)
    temp_c: Mapped[float | None] = mapped_column(Double)


class ServiceMinuteModel(Base):
    """One service's p99 and rate over one bucket (revision 0009)."""

    __tablename__ = "service_minutes"
    __table_args__ = {"sqlite_autoincrement": True}  # noqa: RUF012  (ids are never reused)

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    service: Mapped[str] = mapped_column(String)
    t_s: Mapped[float] = mapped_column(Double, index=True)
    period_s: Mapped[float] = mapped_column(Double)
    p99_ms: Mapped[float | None] = mapped_column(Double)
    rps: Mapped[float] = mapped_column(Double)
    replicas: Mapped[int] = mapped_column(Integer)


class FleetGpuModel(Base):
    """A card the service ran on, and when it was first and last seen (revision 0009)."""

    __tablename__ = "fleet_gpus"

    gpu_id: Mapped[str] = mapped_column(String, primary_key=True)
    node: Mapped[str] = mapped_column(String)
    gpu_index: Mapped[int] = mapped_column(Integer)
    gpu_type: Mapped[str] = mapped_column(String)
    site: Mapped[str] = mapped_column(String)
    mem_total_mib: Mapped[int] = mapped_column(Integer)
    first_seen_s: Mapped[float] = mapped_column(Double)
    last_seen_s: Mapped[float] = mapped_column(Double)


class SettingModel(Base):
    """What the service was configured with that a later reader needs (revision 0009)."""

    __tablename__ = "service_settings"

    key: Mapped[str] = mapped_column(String, primary_key=True)
    value: Mapped[Any] = mapped_column(JSON)
    updated_at: Mapped[float] = mapped_column(Double)


class LearningModeModel(Base):
    """The learned policy's mode (shadow or active), kept across restarts (revision 0010)."""

    __tablename__ = "learning_mode"

    key: Mapped[str] = mapped_column(String, primary_key=True)
    mode: Mapped[str] = mapped_column(String)
    set_at_s: Mapped[float] = mapped_column(Double)
    reason: Mapped[str] = mapped_column(Text)


class LearningChangeModel(Base):
    """A promotion or demotion of the learned policy, with its evidence (revision 0010)."""

    __tablename__ = "learning_changes"
    __table_args__ = {"sqlite_autoincrement": True}  # noqa: RUF012  (ids are never reused)

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    at_s: Mapped[float] = mapped_column(Double, index=True)
    action: Mapped[str] = mapped_column(String)
    mode: Mapped[str] = mapped_column(String)
    by: Mapped[str] = mapped_column(String)
    reason: Mapped[str] = mapped_column(Text)
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON)


# ---- values handed to and returned by the Store ---------------------------------------------
@dataclass(frozen=True)
class NewJob:
    """What a user submits; everything the scheduler later learns lives in JobRow."""

    name: str
    team: str
    kind: str
    priority: int
    gpu_count: int
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    gpu_model: str | None = None
    checkpoint_every_s: float | None = None
    grace_s: float = 60.0
    max_retries: int = 0
    duration_s: float | None = None
    owner: str | None = None
    dataset: str | None = None
    """A data location of the federation topology the job reads (free text in the store)."""
    dataset_gb: float = 0.0
    deadline_at: float | None = None
    """Absolute Unix time (s) by which the job should finish."""
    user_region: str | None = None
    latency_bound_ms: float | None = None
    """Only meaningful for online-inference; needs user_region."""
    state_gib_per_gpu: float = 0.0
    """Checkpoint size: GiB of state per GPU the job writes when preempted (and reads back
    when resumed); 0: it vacates its GPUs at once."""
    sizing: Mapping[str, Any] | None = None
    """A job given by its model: the planner's PlanRequest as a mapping
    (gpupool.sizing.request_json); the core then sizes it per GPU type."""
    time_limit_s: float | None = None
    """Wall time one run may take (since its start or resume); None: no limit."""
    gpu_milli: int = 1000
    """The share of its one GPU a job asks for (`--gpus 0.25`: 250); 1000: whole GPUs."""
    gpu_mem_mib: int | None = None
    """GPU memory a sharing job asks for (`--gpu-mem 20GiB`); the core sizes its share
    per GPU type (memory over the card's). None: `gpu_milli` as given."""
    service: str | None = None
    """The service this job is a replica of (the core made it); None: a job of its own."""
    gpu_count_min: int | None = None
    """An elastic job (`--gpus 2..4`): it runs on this many GPUs up to gpu_count, lending
    the rest to online work at its peak. None: exactly gpu_count."""

    def __post_init__(self) -> None:
        # a list or a caller's dict would make two equal specs compare unequal or change later
        object.__setattr__(self, "command", tuple(self.command))
        object.__setattr__(self, "env", dict(self.env))
        if self.sizing is not None:
            # as JSON reads it back (lists, not tuples), so a stored spec equals its NewJob
            object.__setattr__(self, "sizing", _as_json(self.sizing))


@dataclass(frozen=True)
class JobRow:
    """One job as stored: its spec, where it runs and how its life went so far."""

    id: int
    name: str
    team: str
    kind: str
    priority: int
    gpu_count: int
    gpu_model: str | None
    command: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None
    checkpoint_every_s: float | None
    grace_s: float
    max_retries: int
    retries: int
    state: str
    reason: str
    gpus: tuple[tuple[str, int], ...]
    node: str | None
    attempts: int
    preemptions: int
    exit_code: int | None
    pid: int | None
    pgid: int | None
    start_ticks: int | None
    duration_s: float | None
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    updated_at: float
    idempotency_key: str | None
    owner_token: str | None
    cancel_requested: bool
    dataset: str | None = None
    dataset_gb: float = 0.0
    deadline_at: float | None = None
    user_region: str | None = None
    latency_bound_ms: float | None = None
    state_gib_per_gpu: float = 0.0
    sizing: Mapping[str, Any] | None = None
    """gpupool.sizing.request_json.plan_request_of(row) makes it a PlanRequest again."""
    time_limit_s: float | None = None
    gpu_milli: int = 1000
    gpu_mem_mib: int | None = None
    gpu_count_min: int | None = None
    resize_gpus: tuple[tuple[str, int], ...] | None = None
    """Mid-resize: the GPUs it restarts on once its processes left."""
    held: bool = False
    """On hold (gpupool hold): it starts only once released."""
    service: str | None = None
    port: int | None = None
    """A replica's loopback port (its env var `port_env`), set when it starts."""

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def spec(self) -> NewJob:
        """The NewJob this row was submitted as (to compare a resubmission with)."""
        return NewJob(
            name=self.name,
            team=self.team,
            kind=self.kind,
            priority=self.priority,
            gpu_count=self.gpu_count,
            command=self.command,
            env=self.env,
            cwd=self.cwd,
            gpu_model=self.gpu_model,
            checkpoint_every_s=self.checkpoint_every_s,
            grace_s=self.grace_s,
            max_retries=self.max_retries,
            duration_s=self.duration_s,
            owner=self.owner_token,
            dataset=self.dataset,
            dataset_gb=self.dataset_gb,
            deadline_at=self.deadline_at,
            user_region=self.user_region,
            latency_bound_ms=self.latency_bound_ms,
            state_gib_per_gpu=self.state_gib_per_gpu,
            sizing=self.sizing,
            time_limit_s=self.time_limit_s,
            gpu_milli=self.gpu_milli,
            gpu_mem_mib=self.gpu_mem_mib,
            service=self.service,
            gpu_count_min=self.gpu_count_min,
        )


@dataclass(frozen=True)
class NewService:
    """What a user creates: a service whose replicas each run `command` on part of (or a
    whole) GPU, with a free loopback port in the env var `port_env`."""

    name: str
    team: str
    command: tuple[str, ...]
    min_replicas: int = 1
    max_replicas: int = 1
    slo_p99_ms: float = 200.0
    replica_rps: float = 10.0
    """Requests/s one replica serves within the SLO: the demand rule's and the load
    bound's unit."""
    model: str | None = None
    """Free text: the model it serves (shown, not scheduled by)."""
    gpu_model: str | None = None
    gpu_mem_mib: int | None = None
    gpu_milli: int = 1000
    port_env: str = "PORT"
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    grace_s: float = 10.0
    priority: int = 100
    owner: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "command", tuple(self.command))
        object.__setattr__(self, "env", dict(self.env))


@dataclass(frozen=True)
class ServiceRow:
    """One service as stored; `deleted_at` set once deleted (its replicas are stopping)."""

    id: int
    name: str
    team: str
    command: tuple[str, ...]
    min_replicas: int
    max_replicas: int
    slo_p99_ms: float
    replica_rps: float
    model: str | None
    gpu_model: str | None
    gpu_mem_mib: int | None
    gpu_milli: int
    port_env: str
    cwd: str | None
    env: Mapping[str, str]
    grace_s: float
    priority: int
    owner_token: str | None
    created_at: float
    updated_at: float
    deleted_at: float | None


_PORT_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SERVICE_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


def _check_service(svc: NewService) -> None:
    """Refuse a service the scheduler could never run, before anything is written."""
    if not _SERVICE_NAME.fullmatch(svc.name):
        raise SpecError(
            f"service name {svc.name!r}: use 1-63 lower-case letters, digits and dashes "
            "(e.g. chat-bot)"
        )
    if not svc.team:
        raise SpecError("a service needs a team; pass --team")
    if not svc.command or not all(isinstance(a, str) for a in svc.command):
        raise SpecError("command must be a non-empty list of strings, e.g. ['python', 'serve.py']")
    _check_range(svc.min_replicas, svc.max_replicas)
    if not svc.slo_p99_ms > 0 or not svc.replica_rps > 0:
        raise SpecError("slo_p99_ms and replica_rps must be positive numbers")
    if not _PORT_ENV.fullmatch(svc.port_env):
        raise SpecError(f"port_env {svc.port_env!r} is not an environment variable name")
    if not 0 < svc.gpu_milli <= 1000:
        raise SpecError(f"gpu_milli is {svc.gpu_milli}; give a share of one GPU in 1..1000")
    if svc.gpu_mem_mib is not None and svc.gpu_mem_mib <= 0:
        raise SpecError(f"gpu_mem_mib is {svc.gpu_mem_mib}; give a positive amount")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in svc.env.items()):
        raise SpecError("env must map strings to strings")
    if svc.grace_s < 0:
        raise SpecError("grace_s must not be negative")


def _check_range(low: int, high: int) -> None:
    if not 0 <= low <= high or high < 1:
        raise SpecError(
            f"replicas {low}..{high}: give MIN..MAX with 0 <= MIN <= MAX and MAX >= 1 (e.g. 1..8)"
        )


def _service_row(m: ServiceModel) -> ServiceRow:
    return ServiceRow(
        id=m.id,
        name=m.name,
        team=m.team,
        command=tuple(m.command),
        min_replicas=m.min_replicas,
        max_replicas=m.max_replicas,
        slo_p99_ms=m.slo_p99_ms,
        replica_rps=m.replica_rps,
        model=m.model,
        gpu_model=m.gpu_model,
        gpu_mem_mib=m.gpu_mem_mib,
        gpu_milli=m.gpu_milli,
        port_env=m.port_env,
        cwd=m.cwd,
        env=dict(m.env),
        grace_s=m.grace_s,
        priority=m.priority,
        owner_token=m.owner_token,
        created_at=m.created_at,
        updated_at=m.updated_at,
        deleted_at=m.deleted_at,
    )


@dataclass(frozen=True)
class Purged:
    """What one purge batch deleted."""

    job_ids: tuple[int, ...]
    events: int
    more: bool
    """A batch was full: call again for the rest."""


@dataclass(frozen=True)
class GpuMinute:
    """Means of one card over [t_s, t_s + period_s), of `samples` samples."""

    gpu_id: str
    t_s: float
    period_s: float
    samples: int
    mem_used_mib: float
    sm_util_pct: float
    power_w: float | None = None
    temp_c: float | None = None


@dataclass(frozen=True)
class ServiceMinute:
    """A service's p99 (None: no request) and rate over [t_s, t_s + period_s)."""

    service: str
    t_s: float
    period_s: float
    p99_ms: float | None
    rps: float
    replicas: int


@dataclass(frozen=True)
class FleetGpu:
    """A card the service ran on; `gpu_id` is "node/index" as job rows name it."""

    gpu_id: str
    node: str
    gpu_index: int
    gpu_type: str
    site: str
    mem_total_mib: int
    first_seen_s: float = 0.0
    last_seen_s: float = 0.0


@dataclass(frozen=True)
class Pruned:
    """History rows one prune deleted; `more` when a cap still asks for more."""

    gpu_rows: int
    service_rows: int
    more: bool


@dataclass(frozen=True)
class LearningMode:
    """The stored mode of the learned policy: shadow or active, since when and why."""

    mode: str
    set_at_s: float
    reason: str


@dataclass(frozen=True)
class LearningChange:
    """A promotion (shadow -> active) or demotion (active -> shadow) as recorded."""

    id: int
    at_s: float
    action: str
    mode: str
    by: str
    reason: str
    evidence: Mapping[str, Any]


@dataclass(frozen=True)
class FinishedRun:
    """A job that completed, as the learner and the replay see it: its facts at submit and
    the GPU service it took (GPUs x the time it spent running, over all its runs)."""

    job_id: int
    name: str
    team: str
    gpu_model: str | None
    gpu_count: int
    submit_s: float
    finish_s: float
    run_s: float

    @property
    def gpu_time_s(self) -> float:
        return self.gpu_count * self.run_s


@dataclass(frozen=True)
class EventRow:
    seq: int
    at_s: float
    kind: str
    job_id: int | None
    message: str
    data: Mapping[str, Any]


ROLES: tuple[str, ...] = ("admin", "team", "read-only")
"""admin: sees and does everything; team: sees the queue, acts for its one team; read-only:
sees the queue and the cluster, changes nothing and reads no team's logs."""


@dataclass(frozen=True)
class Principal:
    """Who holds a token: an admin, a member of one team, or a read-only observer.

    Principal(name, team) is a team member, or an admin when team is None (the role
    follows from the team unless given). expires_at (Unix s) travels with it, so a cached
    principal is refused the moment its token expires."""

    name: str
    team: str | None
    role: str = ""
    expires_at: float | None = None
    token_id: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.role:
            object.__setattr__(self, "role", "admin" if self.team is None else "team")
        if self.role not in ROLES:
            raise SpecError(f"unknown role {self.role!r}; roles are {', '.join(ROLES)}")

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def read_only(self) -> bool:
        return self.role == "read-only"

    def expired(self, now_s: float) -> bool:
        return self.expires_at is not None and now_s >= self.expires_at


@dataclass(frozen=True)
class TokenRow:
    """A token as `gpupool token ls` shows it: never the token, never its hash."""

    id: int
    name: str
    role: str
    team: str | None
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    created_by: str | None

    def state(self, now_s: float) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and now_s >= self.expires_at:
            return "expired"
        return "active"


@dataclass(frozen=True)
class AuditEntry:
    """One line of the audit trail, before it is stored (AuditRow once it has an id)."""

    at_s: float
    action: str
    """'request' for an API call; 'token-created', 'token-revoked' for token changes."""
    token: str | None = None
    """The token's name (never the token); None when none or an unknown one was presented."""
    role: str | None = None
    team: str | None = None
    method: str = ""
    path: str = ""
    status: int | None = None
    client: str | None = None
    """The peer address as the server saw it (a proxy in front shows as the proxy)."""
    detail: str = ""

    @staticmethod
    def by(who: Principal | None, at_s: float, action: str, **fields: Any) -> AuditEntry:
        if who is None:
            return AuditEntry(at_s, action, **fields)
        return AuditEntry(at_s, action, who.name, who.role, who.team, **fields)


@dataclass(frozen=True)
class AuditRow:
    id: int
    entry: AuditEntry


# ---- URLs -----------------------------------------------------------------------------------
_URL_EXAMPLE = (
    "use sqlite:////var/lib/gpupool/gpupool.db or postgresql://USER:PASSWORD@HOST:5432/gpupool"
)


def schema_head() -> str:
    """The newest schema revision, the one Store.migrate() brings a database to."""
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


# ---- the store ------------------------------------------------------------------------------
def _missing(job_id: int) -> NotFoundError:
    return NotFoundError(f"job {job_id} does not exist; gpupool ls lists jobs")


def _illegal(job_id: int, old: str, new: str) -> IllegalTransition:
    allowed = ", ".join(sorted(TRANSITIONS[old])) or "nowhere (it is finished)"
    return IllegalTransition(
        f"job {job_id} cannot go from {old} to {new}; from {old} it may go to {allowed}"
    )


def _check_state(state: str) -> None:
    if state not in TRANSITIONS:
        raise SpecError(f"unknown job state {state!r}; states are {', '.join(STATES)}")


def _check_new(job: NewJob) -> None:
    """Refuse a spec the scheduler could never run, before anything is written."""
    if not job.name or not job.team:
        raise SpecError("a job needs a name and a team; set both and resubmit")
    if job.kind not in KINDS:
        raise SpecError(f"unknown job kind {job.kind!r}; kinds are {', '.join(KINDS)}")
    if job.gpu_count < 0:
        raise SpecError(f"gpu_count is {job.gpu_count}; ask for 0 or more GPUs")
    if not job.command or not all(isinstance(a, str) for a in job.command):
        raise SpecError("command must be a non-empty list of strings, e.g. ['python', 'train.py']")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in job.env.items()):
        raise SpecError("env must map strings to strings; quote numbers, e.g. {'SEED': '1'}")
    if job.grace_s < 0 or job.max_retries < 0:
        raise SpecError("grace_s and max_retries must not be negative")
    if job.time_limit_s is not None and not 0 < job.time_limit_s < math.inf:
        raise SpecError(f"time_limit_s is {job.time_limit_s}; give a positive number of seconds")
    _check_placement(job)
    _check_sizing(job)
    _check_share(job)
    _check_elastic(job)


def _check_elastic(job: NewJob) -> None:
    """An elastic range (`--gpus 2..4`): whole GPUs of work that may restart."""
    if job.gpu_count_min is None:
        return
    if job.gpu_milli < 1000 or job.gpu_mem_mib is not None or job.sizing is not None:
        raise SpecError(
            "an elastic job (--gpus MIN..MAX) asks for whole GPUs; drop the GPU share, "
            "--gpu-mem or the model sizing"
        )
    check_elastic(job.name, JobKind(job.kind), job.gpu_count_min, job.gpu_count)


def _check_share(job: NewJob) -> None:
    """Part of one GPU: by share (1..1000 thousandths) or by GPU memory, never both."""
    if not 0 < job.gpu_milli <= 1000:
        raise SpecError(f"gpu_milli is {job.gpu_milli}; give a share of one GPU in 1..1000")
    if job.gpu_mem_mib is not None and job.gpu_mem_mib <= 0:
        raise SpecError(f"gpu_mem_mib is {job.gpu_mem_mib}; give a positive amount of memory")
    sharing = job.gpu_milli < 1000 or job.gpu_mem_mib is not None
    if sharing and job.gpu_count != 1:
        raise SpecError(
            f"a share of a GPU is part of one GPU; the job asks for {job.gpu_count} GPUs "
            "(give --gpus 0.25 or --gpu-mem alone, or whole GPUs)"
        )
    if job.gpu_mem_mib is not None and job.gpu_milli < 1000:
        raise SpecError("give a GPU share (--gpus 0.25) or GPU memory (--gpu-mem), not both")


def _check_placement(job: NewJob) -> None:
    """The multi-cluster placement fields: the same rules the API applies (and FedJob needs)."""
    if not (math.isfinite(job.dataset_gb) and job.dataset_gb >= 0):
        raise SpecError(f"dataset_gb is {job.dataset_gb}; give 0 or more gigabytes")
    if job.deadline_at is not None and not (math.isfinite(job.deadline_at) and job.deadline_at > 0):
        raise SpecError(f"deadline_at is {job.deadline_at}; give a Unix time in seconds")
    if job.latency_bound_ms is not None:
        if not (math.isfinite(job.latency_bound_ms) and job.latency_bound_ms > 0):
            raise SpecError(
                f"latency_bound_ms is {job.latency_bound_ms}; give more than 0 milliseconds"
            )
        if job.user_region is None:
            raise SpecError(
                "latency_bound_ms needs user_region (latency from where?); set both or neither"
            )


def _check_sizing(job: NewJob) -> None:
    """The checkpoint size, and the model request by building the planner's PlanRequest
    (a SizingError, which is a SpecError, names the offending field)."""
    gib = job.state_gib_per_gpu
    if isinstance(gib, bool) or not isinstance(gib, int | float) or not math.isfinite(gib):
        raise SpecError(f"state_gib_per_gpu is {gib!r}; give 0 or more GiB per GPU")
    if gib < 0:
        raise SpecError(f"state_gib_per_gpu is {gib}; give 0 or more GiB per GPU")
    if job.sizing is not None:
        plan_request_from(job.sizing)


def _as_json(value: Any) -> Any:
    """A copy of a JSON-like value in the types a JSON column reads back as."""
    if isinstance(value, Mapping):
        return {k: _as_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_as_json(v) for v in value]
    return value


def _job_row(m: JobModel | SimpleNamespace) -> JobRow:
    """A job from its ORM object or from a plain row of the jobs table (`_plain`)."""
    return JobRow(
        id=m.id,
        name=m.name,
        team=m.team,
        kind=m.kind,
        priority=m.priority,
        gpu_count=m.gpu_count,
        gpu_model=m.gpu_model,
        command=tuple(m.command),
        env=dict(m.env),
        cwd=m.cwd,
        checkpoint_every_s=m.checkpoint_every_s,
        grace_s=m.grace_s,
        max_retries=m.max_retries,
        retries=m.retries,
        state=m.state,
        reason=m.reason,
        gpus=tuple((str(n), int(i)) for n, i in m.gpus),
        node=m.node,
        attempts=m.attempts,
        preemptions=m.preemptions,
        exit_code=m.exit_code,
        pid=m.pid,
        pgid=m.pgid,
        start_ticks=m.start_ticks,
        duration_s=m.duration_s,
        submitted_at=m.submitted_at,
        started_at=m.started_at,
        ended_at=m.ended_at,
        updated_at=m.updated_at,
        idempotency_key=m.idempotency_key,
        owner_token=m.owner_token,
        cancel_requested=bool(m.cancel_requested),
        dataset=m.dataset,
        dataset_gb=float(m.dataset_gb),
        deadline_at=m.deadline_at,
        user_region=m.user_region,
        latency_bound_ms=m.latency_bound_ms,
        state_gib_per_gpu=float(m.state_gib_per_gpu),
        sizing=None if m.sizing is None else dict(m.sizing),
        time_limit_s=m.time_limit_s,
        gpu_milli=m.gpu_milli if m.gpu_milli is not None else 1000,
        gpu_mem_mib=m.gpu_mem_mib,
        gpu_count_min=m.gpu_count_min,
        resize_gpus=None
        if m.resize_gpus is None
        else tuple((str(n), int(i)) for n, i in m.resize_gpus),
        held=bool(m.held),
        service=m.service,
        port=m.port,
    )


def _plain(r: Row[Any]) -> SimpleNamespace:
    """A row of the jobs table with its columns as attributes: where many jobs are read
    at once this skips the ORM's per-object work, and a namespace's attributes read
    faster than a Row's (3,000 jobs made into rows in ~47 ms instead of ~69)."""
    return SimpleNamespace(**r._mapping)


def _learning_change(m: LearningChangeModel) -> LearningChange:
    return LearningChange(m.id, m.at_s, m.action, m.mode, m.by, m.reason, dict(m.evidence))


def _event_row(m: EventModel) -> EventRow:
    return EventRow(m.seq, m.at_s, m.kind, m.job_id, m.message, dict(m.data))


def _settable(fields: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(fields) - SETTABLE)
    if unknown:
        raise TypeError(f"cannot set {unknown}; settable columns: {sorted(SETTABLE)}")
    values = dict(fields)
    if "gpus" in values:
        values["gpus"] = [[node, index] for node, index in values["gpus"]]
    if values.get("resize_gpus") is not None:
        values["resize_gpus"] = [[node, index] for node, index in values["resize_gpus"]]
    return values


def token_hash(token: str) -> str:
    """What the tokens table keeps instead of the token: a leaked database leaks no access."""
    return hashlib.sha256(token.encode()).hexdigest()


def _job_values(job: NewJob, idempotency_key: str | None, now_s: float) -> dict[str, Any]:
    """The columns of a newly submitted job."""
    values: dict[str, Any] = {
        "name": job.name,
        "team": job.team,
        "kind": job.kind,
        "priority": job.priority,
        "gpu_count": job.gpu_count,
        "gpu_model": job.gpu_model,
        "command": list(job.command),
        "env": dict(job.env),
        "cwd": job.cwd,
        "checkpoint_every_s": job.checkpoint_every_s,
        "grace_s": job.grace_s,
        "max_retries": job.max_retries,
        "retries": 0,
        "state": "pending",
        "reason": "",
        "gpus": [],
        "node": None,
        "attempts": 0,
        "preemptions": 0,
        "exit_code": None,
        "pid": None,
        "pgid": None,
        "start_ticks": None,
        "duration_s": job.duration_s,
        "submitted_at": now_s,
        "started_at": None,
        "ended_at": None,
        "updated_at": now_s,
        "idempotency_key": idempotency_key,
        "owner_token": job.owner,
        "cancel_requested": False,
        "dataset": job.dataset,
        "dataset_gb": float(job.dataset_gb),
        "deadline_at": job.deadline_at,
        "user_region": job.user_region,
        "latency_bound_ms": job.latency_bound_ms,
        "state_gib_per_gpu": float(job.state_gib_per_gpu),
        "sizing": None if job.sizing is None else _as_json(job.sizing),
        "time_limit_s": job.time_limit_s,
        "gpu_milli": job.gpu_milli,
        "gpu_mem_mib": job.gpu_mem_mib,
        "gpu_count_min": job.gpu_count_min,
        "resize_gpus": None,
        "held": False,
        "service": job.service,
        "port": None,
    }
    return values


# Prepared once: a statement built per call costs more than the insert itself.
_JOBS = Table("jobs", Base.metadata)  # the mapped tables, looked up by name
_EVENTS = Table("events", Base.metadata)
_INSERT_JOB = insert(_JOBS).returning(_JOBS.c.id, sort_by_parameter_order=True)
_INSERT_EVENT = insert(_EVENTS).returning(_EVENTS.c.seq)
_NEXT_JOB_IDS = text(
    "SELECT nextval(pg_get_serial_sequence('jobs', 'id')) FROM generate_series(1, :n)"
)
"""PostgreSQL: n fresh job ids from the jobs table's own sequence."""
_SET_REASON = (
    sql_update(_JOBS)
    .where(
        _JOBS.c.id == bindparam("w_id"),
        or_(_JOBS.c.state == "pending", _JOBS.c.state == "suspended"),
    )
    .values(updated_at=bindparam("w_now_s"), reason=bindparam("w_reason"))
)
"""A waiting job's reason (executemany); the state guard stays as the row's last word."""
_IN_CHUNK = 500
"""Ids per IN (...) list: under SQLite's bound-parameter limit, whatever its build."""


class Store:
    """Jobs, events and tokens behind one engine; every public method is one transaction.

    SQLite runs in WAL mode with synchronous=NORMAL: a committed transaction survives the
    process being killed (SIGKILL, OOM) because it is in the WAL file the OS already holds;
    only an OS crash or power cut can lose the last few commits. Writers start with
    BEGIN IMMEDIATE so two writers queue on the busy timeout instead of failing on a lock
    upgrade. PostgreSQL gets a pool of connections and its own full durability.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        parsed = make_url(url)
        self.dialect = parsed.get_backend_name()
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

    def close(self) -> None:
        """Close every pooled connection (at shutdown; the Store must not be used after)."""
        self._engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- transactions --
    @contextmanager
    def _read(self) -> Iterator[Session]:
        with self._reads.begin() as session:
            yield session

    @contextmanager
    def _write(self) -> Iterator[Session]:
        """One write transaction: committed when the block ends, rolled back if it raises.

        SQLite has one writer at a time; threads of this process take turns on a lock
        instead of colliding in BEGIN IMMEDIATE, where SQLite's busy handler sleeps
        (1, 2, 5, 10... ms) and concurrent submissions would crawl."""
        with self._write_lock, self._writes.begin() as session:
            yield session

    @contextmanager
    def _background_write(self) -> Iterator[Session]:
        """A write that can wait: on SQLite it gives up after SQLITE_BACKGROUND_BUSY_S
        when another process holds the database, rather than keep this process's other
        writers (the scheduler loop, submits) queued behind it for the full timeout."""
        with self._write_lock, self._background_writes.begin() as session:
            yield session

    def _insert_submitted(
        self,
        s: Session,
        ids: Sequence[int],
        items: Sequence[tuple[NewJob, str | None]],
        now_s: float,
    ) -> None:
        """The 'submitted' events of freshly inserted jobs, last in their transaction."""
        if self.dialect == "postgresql":
            s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _EVENT_LOCK})
        s.execute(
            insert(_EVENTS),
            [
                {
                    "at_s": now_s,
                    "kind": "submitted",
                    "job_id": job_id,
                    "message": f"{job.name} ({job.kind}, {job.gpu_count} GPU) submitted for "
                    f"team {job.team}" + (f" by {job.owner}" if job.owner else ""),
                    "data": {"team": job.team, "kind": job.kind, "gpu_count": job.gpu_count},
                }
                for job_id, (job, _key) in zip(ids, items, strict=True)
            ],
        )

    def _insert_event(
        self,
        session: Session,
        kind: str,
        message: str,
        now_s: float,
        job_id: int | None = None,
        data: Mapping[str, Any] | None = None,
    ) -> int:
        """Insert an event as the last thing a transaction does (the PostgreSQL lock needs it)."""
        if self.dialect == "postgresql":
            # seqs come from a sequence, which hands them out at INSERT, not at COMMIT: without
            # this lock a reader polling events_after(seq) could skip a seq committed late.
            # Holding it until commit serialises event writers; nothing waits while holding it.
            session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _EVENT_LOCK})
        seq = session.execute(
            _INSERT_EVENT,
            {
                "at_s": now_s,
                "kind": kind,
                "job_id": job_id,
                "message": message,
                "data": dict(data or {}),
            },
        ).scalar_one()
        return int(seq)

    # -- schema --
    def migrate(self) -> None:
        """Bring the schema to the newest revision; a no-op on an up-to-date database.

        Runs in one transaction under a lock, so two processes starting together do not both
        create the tables, and a failed migration leaves the old schema.
        """
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
        config.set_main_option("path_separator", "os")
        with self._write_engine.begin() as conn:
            if self.dialect == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATE_LOCK})
            config.attributes["connection"] = conn
            command.upgrade(config, "head")

    # -- jobs --
    def submit(
        self, job: NewJob, now_s: float, idempotency_key: str | None = None
    ) -> tuple[JobRow, bool]:
        """Store a pending job and its 'submitted' event; (row, False) if the key was used."""
        _check_new(job)
        try:
            with self._write() as s:
                if idempotency_key is not None:
                    found = s.scalars(
                        select(JobModel).where(JobModel.idempotency_key == idempotency_key)
                    ).one_or_none()
                    if found is not None:
                        return self._resubmitted(_job_row(found), job), False
                row = self._insert_job(s, job, now_s, idempotency_key)
        except IntegrityError:
            # another submit with this key committed between our SELECT and INSERT
            if idempotency_key is None:
                raise
            with self._read() as s:
                found = s.scalars(
                    select(JobModel).where(JobModel.idempotency_key == idempotency_key)
                ).one_or_none()
                if found is None:
                    raise
                return self._resubmitted(_job_row(found), job), False
        return row, True

    def submit_group(
        self, items: Sequence[tuple[NewJob, str | None]], now_s: float
    ) -> builtins.list[tuple[JobRow, bool] | GpupoolError]:
        """Many independent submissions in one transaction (group commit): the API
        gathers the requests that arrive while the previous commit runs. Each item gets
        what `submit` would have given it: (row, created), or its own error (a bad spec,
        a reused key) without failing the others. Durable when this returns."""
        out: builtins.list[tuple[JobRow, bool] | GpupoolError | None] = [None] * len(items)
        todo: builtins.list[int] = []
        for k, (job, _key) in enumerate(items):
            try:
                _check_new(job)
                todo.append(k)
            except GpupoolError as err:
                out[k] = err
        try:
            with self._write() as s:
                keys = [items[k][1] for k in todo if items[k][1] is not None]
                existing: dict[str, JobRow] = {}
                if keys:
                    for m in s.scalars(select(JobModel).where(JobModel.idempotency_key.in_(keys))):
                        existing[str(m.idempotency_key)] = _job_row(m)
                fresh: builtins.list[int] = []
                later: builtins.list[int] = []  # repeats of a key new in this group
                claimed: set[str] = set()
                for k in todo:
                    job, key = items[k]
                    if key is not None and key in existing:
                        try:
                            out[k] = (self._resubmitted(existing[key], job), False)
                        except ConflictError as err:
                            out[k] = err
                    elif key is not None and key in claimed:
                        later.append(k)
                    else:
                        fresh.append(k)
                        if key is not None:
                            claimed.add(key)
                rows = self._insert_jobs(s, [items[k] for k in fresh], now_s)
                for k, row in zip(fresh, rows, strict=True):
                    out[k] = (row, True)
                    if row.idempotency_key is not None:
                        existing[row.idempotency_key] = row
                for k in later:
                    job, key = items[k]
                    try:
                        out[k] = (self._resubmitted(existing[str(key)], job), False)
                    except ConflictError as err:
                        out[k] = err
        except IntegrityError:
            # a key committed by another process meanwhile: one by one, each on its own
            return [
                o if isinstance(o, GpupoolError) else self._submit_one(*items[k], now_s)
                for k, o in enumerate(out)
            ]
        return [o for o in out if o is not None]

    def _submit_one(
        self, job: NewJob, key: str | None, now_s: float
    ) -> tuple[JobRow, bool] | GpupoolError:
        try:
            return self.submit(job, now_s, key)
        except GpupoolError as err:
            return err

    @staticmethod
    def _resubmitted(row: JobRow, job: NewJob) -> JobRow:
        if row.spec() != job:
            raise ConflictError(
                f"idempotency key reused for a different job (job {row.id} was submitted "
                "with it); resubmit with a new key"
            )
        return row

    def submit_many(self, jobs: Sequence[NewJob], now_s: float) -> builtins.list[JobRow]:
        """Store a batch of pending jobs all together or not at all."""
        for job in jobs:
            _check_new(job)
        with self._write() as s:
            return self._insert_jobs(s, [(job, None) for job in jobs], now_s)

    def _insert_job(
        self, s: Session, job: NewJob, now_s: float, idempotency_key: str | None
    ) -> JobRow:
        return self._insert_jobs(s, [(job, idempotency_key)], now_s)[0]

    def _insert_jobs(
        self, s: Session, items: Sequence[tuple[NewJob, str | None]], now_s: float
    ) -> builtins.list[JobRow]:
        """Insert pending jobs and their 'submitted' events: two multi-row statements."""
        if not items:
            return []
        rows = [_job_values(job, key, now_s) for job, key in items]
        if self.dialect == "postgresql":
            # Ids from the sequence first, then one single-row INSERT run for every job
            # (executemany): psycopg converts that short statement once and pipelines
            # it, where the multi-row INSERT ... RETURNING that SQLAlchemy builds is
            # too long for psycopg's statement cache and was re-parsed on every commit
            # (a quarter of the server's CPU under a stream of submits).
            ids = sorted(int(i) for i in s.execute(_NEXT_JOB_IDS, {"n": len(rows)}).scalars())
            for values, job_id in zip(rows, ids, strict=True):
                values["id"] = job_id
            s.execute(insert(_JOBS), rows)
        else:
            ids = [int(i) for i in s.execute(_INSERT_JOB, rows).scalars()]
        self._insert_submitted(s, ids, items, now_s)
        out = []
        for job_id, values, (job, _key) in zip(ids, rows, items, strict=True):
            values.update(id=job_id, command=tuple(job.command), gpus=(), env=dict(job.env))
            out.append(JobRow(**values))
        return out

    # -- services --
    def create_service(self, svc: NewService, now_s: float) -> ServiceRow:
        """Store a new service and its 'service-created' event; a live one of the same
        name is a conflict (a deleted one's name may be taken again)."""
        _check_service(svc)
        with self._write() as s:
            taken = s.scalars(
                select(ServiceModel).where(
                    ServiceModel.name == svc.name, ServiceModel.deleted_at.is_(None)
                )
            ).first()
            if taken is not None:
                raise ConflictError(
                    f"service {svc.name} exists already (team {taken.team}); scale it with "
                    f"`gpupool service scale {svc.name} MIN..MAX` or delete it first"
                )
            m = ServiceModel(
                name=svc.name,
                team=svc.team,
                model=svc.model,
                gpu_model=svc.gpu_model,
                gpu_mem_mib=svc.gpu_mem_mib,
                gpu_milli=svc.gpu_milli,
                min_replicas=svc.min_replicas,
                max_replicas=svc.max_replicas,
                replica_rps=svc.replica_rps,
                slo_p99_ms=svc.slo_p99_ms,
                port_env=svc.port_env,
                command=list(svc.command),
                cwd=svc.cwd,
                env=dict(svc.env),
                grace_s=svc.grace_s,
                priority=svc.priority,
                owner_token=svc.owner,
                created_at=now_s,
                updated_at=now_s,
                deleted_at=None,
            )
            s.add(m)
            s.flush()
            row = _service_row(m)
            self._insert_event(
                s,
                "service-created",
                f"service {svc.name} created for team {svc.team}: replicas "
                f"{svc.min_replicas}..{svc.max_replicas}, p99 SLO {svc.slo_p99_ms:g} ms",
                now_s,
                data={"service": svc.name},
            )
        return row

    def services(self, include_deleted: bool = False) -> builtins.list[ServiceRow]:
        """Services in creation order (live ones, unless include_deleted)."""
        query = select(ServiceModel).order_by(ServiceModel.id)
        if not include_deleted:
            query = query.where(ServiceModel.deleted_at.is_(None))
        with self._read() as s:
            return [_service_row(m) for m in s.scalars(query)]

    def service(self, name: str) -> ServiceRow:
        """The live service of this name."""
        with self._read() as s:
            m = s.scalars(
                select(ServiceModel).where(
                    ServiceModel.name == name, ServiceModel.deleted_at.is_(None)
                )
            ).first()
            if m is None:
                raise NotFoundError(f"no service {name}; `gpupool service ls` lists them")
            return _service_row(m)

    def scale_service(self, name: str, low: int, high: int, now_s: float) -> ServiceRow:
        """New replica bounds; the scheduler scales to them at its next cycle."""
        _check_range(low, high)
        with self._write() as s:
            m = s.scalars(
                select(ServiceModel).where(
                    ServiceModel.name == name, ServiceModel.deleted_at.is_(None)
                )
            ).first()
            if m is None:
                raise NotFoundError(f"no service {name}; `gpupool service ls` lists them")
            old = (m.min_replicas, m.max_replicas)
            m.min_replicas, m.max_replicas, m.updated_at = low, high, now_s
            s.flush()
            row = _service_row(m)
            self._insert_event(
                s,
                "service-bounds",
                f"service {name}: replicas {old[0]}..{old[1]} -> {low}..{high}",
                now_s,
                data={"service": name},
            )
        return row

    def delete_service(self, name: str, now_s: float) -> ServiceRow:
        """Mark the service deleted; the scheduler stops its replicas with their grace."""
        with self._write() as s:
            m = s.scalars(
                select(ServiceModel).where(
                    ServiceModel.name == name, ServiceModel.deleted_at.is_(None)
                )
            ).first()
            if m is None:
                raise NotFoundError(f"no service {name}; `gpupool service ls` lists them")
            m.deleted_at = m.updated_at = now_s
            s.flush()
            row = _service_row(m)
            self._insert_event(
                s, "service-deleted", f"service {name} deleted", now_s, data={"service": name}
            )
        return row

    def replicas(self, service: str, active_only: bool = True) -> builtins.list[JobRow]:
        """The job rows of a service's replicas, in id order."""
        query = select(JobModel).where(JobModel.service == service).order_by(JobModel.id)
        if active_only:
            query = query.where(JobModel.state.not_in(TERMINAL))
        with self._read() as s:
            return [_job_row(m) for m in s.scalars(query)]

    def service_events(self, service: str, limit: int = 100) -> builtins.list[EventRow]:
        """The newest events about a service (created, scaled, bounds, deleted), oldest first."""
        query = (
            select(EventModel)
            .where(EventModel.kind.like("service-%"), EventModel.job_id.is_(None))
            .order_by(EventModel.seq.desc())
            .limit(limit * 20)
        )
        with self._read() as s:
            found = [_event_row(m) for m in s.scalars(query) if m.data.get("service") == service]
        return list(reversed(found[:limit]))

    def get(self, job_id: int) -> JobRow:
        with self._read() as s:
            found = s.get(JobModel, job_id)
            if found is None:
                raise _missing(job_id)
            return _job_row(found)

    def list(
        self,
        state: str | None = None,
        team: str | None = None,
        limit: int = 1000,
        after_id: int = 0,
        before_id: int | None = None,
        newest_first: bool = False,
    ) -> builtins.list[JobRow]:
        """Jobs in id order, a page at a time: pass the last id seen as after_id; newest
        first, pass the last id seen as before_id."""
        if limit < 1:
            raise SpecError(f"limit is {limit}; ask for at least 1 job")
        query = select(_JOBS).where(_JOBS.c.id > after_id)
        if before_id is not None:
            query = query.where(_JOBS.c.id < before_id)
        if state is not None:
            _check_state(state)
            query = query.where(_JOBS.c.state == state)
        if team is not None:
            query = query.where(_JOBS.c.team == team)
        order = _JOBS.c.id.desc() if newest_first else _JOBS.c.id
        with self._read() as s:
            return [_job_row(_plain(r)) for r in s.execute(query.order_by(order).limit(limit))]

    def active(self) -> builtins.list[JobRow]:
        """Every job the scheduler still has to look after, in id order."""
        query = select(_JOBS).where(_JOBS.c.state.not_in(TERMINAL)).order_by(_JOBS.c.id)
        with self._read() as s:
            return [_job_row(_plain(r)) for r in s.execute(query)]

    def counts(self) -> dict[tuple[str, str, str], int]:
        """(team, kind, state) -> number of jobs, for the metrics endpoint."""
        query = select(JobModel.team, JobModel.kind, JobModel.state, func.count()).group_by(
            JobModel.team, JobModel.kind, JobModel.state
        )
        with self._read() as s:
            return {(t, k, st): int(n) for t, k, st, n in s.execute(query)}

    def transition(
        self,
        job_id: int,
        to_state: str,
        now_s: float,
        expect: str | tuple[str, ...] | None = None,
        event: str | None = None,
        **fields: Any,
    ) -> JobRow:
        """Move a job to to_state if it is in one of expect (default: any state allowed to).

        A compare-and-set: the UPDATE only matches while the row is still in an expected
        state, so two threads racing on one job cannot both win. Also sets updated_at, the
        given columns, ended_at on reaching a terminal state and started_at on first running
        (unless given), and writes an event (kind = event or to_state, message = reason) in the
        same transaction.
        """
        _check_state(to_state)
        values = _settable(fields)
        if expect is None:
            expected = tuple(s for s in STATES if to_state in TRANSITIONS[s])
        else:
            expected = (expect,) if isinstance(expect, str) else tuple(expect)
            for old in expected:
                _check_state(old)
                if to_state not in TRANSITIONS[old]:
                    raise _illegal(job_id, old, to_state)
        with self._write() as s:
            current = s.execute(
                select(JobModel.state, JobModel.started_at)
                .where(JobModel.id == job_id)
                .with_for_update(key_share=True)
            ).one_or_none()
            if current is None:
                raise _missing(job_id)
            old_state, started_at = current
            if old_state not in expected:
                if to_state not in TRANSITIONS[old_state]:
                    raise _illegal(job_id, old_state, to_state)
                raise IllegalTransition(
                    f"job {job_id} is {old_state}, not {' or '.join(expected)}, so it was not "
                    f"moved to {to_state}; it changed meanwhile: read it again and decide anew"
                )
            if to_state in TERMINAL:
                values.setdefault("ended_at", now_s)
            if to_state == "running" and started_at is None:
                values.setdefault("started_at", now_s)
            updated = s.scalars(
                sql_update(JobModel)
                .where(JobModel.id == job_id, JobModel.state.in_(expected))
                .values(state=to_state, updated_at=now_s, **values)
                .returning(JobModel),
                execution_options={"populate_existing": True},
            ).one_or_none()
            if updated is None:  # unreachable while the row lock holds; kept as the CAS guard
                raise IllegalTransition(f"job {job_id} changed while moving to {to_state}")
            reason = values.get("reason") or f"{old_state} -> {to_state}"
            data: dict[str, Any] = {"from": old_state, "to": to_state}
            if "gpus" in values:  # which cards each run held: the review's allocations
                data["gpus"] = values["gpus"]
            self._insert_event(s, event or to_state, reason, now_s, job_id, data)
            return _job_row(updated)

    def update(
        self,
        job_id: int,
        now_s: float,
        expect: str | tuple[str, ...] | None = None,
        event: str | None = None,
        **fields: Any,
    ) -> JobRow:
        """Change columns without changing state (e.g. the pid once a process started).

        With expect, only while the job is in one of those states (IllegalTransition if not);
        an event is written only when event is given.
        """
        values = _settable(fields)
        expected = None if expect is None else ((expect,) if isinstance(expect, str) else expect)
        for wanted in expected or ():
            _check_state(wanted)
        with self._write() as s:
            query = sql_update(JobModel).where(JobModel.id == job_id)
            if expected is not None:
                query = query.where(JobModel.state.in_(expected))
            updated = s.scalars(
                query.values(updated_at=now_s, **values).returning(JobModel),
                execution_options={"populate_existing": True},
            ).one_or_none()
            if updated is None:
                state = s.scalar(select(JobModel.state).where(JobModel.id == job_id))
                if state is None:
                    raise _missing(job_id)
                raise IllegalTransition(
                    f"job {job_id} is {state}, not {' or '.join(expected or ())}; "
                    "it changed meanwhile: read it again and decide anew"
                )
            if event is not None:
                data = {"gpus": values["gpus"]} if "gpus" in values else None
                self._insert_event(s, event, str(values.get("reason", "")), now_s, job_id, data)
            return _job_row(updated)

    def set_reasons(
        self, reasons: Sequence[tuple[int, str, str | None]], now_s: float
    ) -> dict[int, str | None]:
        """Many waiting jobs' reasons in one transaction: (job id, reason, event kind or
        None) each, written only while the job is pending or suspended, the events after
        every update (as `_insert_event` needs). A cycle that tells thousands of new
        jobs why they wait costs one commit and a few statements, not one each: the
        loop calls this with every job submitted since its last cycle, and per-row ORM
        updates there took a third of the server's CPU under a stream of submissions.
        Returns the jobs left as they were, with the state each is in now (None: no such
        job)."""
        left: dict[int, str | None] = {}
        if not reasons:
            return left
        with self._write() as s:
            # Their states, read under the write lock (SQLite) or row locks (PostgreSQL,
            # taken in id order), so none changes between this read and the update.
            states: dict[int, str] = {}
            ids = sorted({job_id for job_id, _, _ in reasons})
            for k in range(0, len(ids), _IN_CHUNK):
                query = select(_JOBS.c.id, _JOBS.c.state).where(
                    _JOBS.c.id.in_(ids[k : k + _IN_CHUNK])
                )
                if self.dialect == "postgresql":
                    query = query.order_by(_JOBS.c.id).with_for_update()
                states.update((int(i), str(st)) for i, st in s.execute(query))
            changes: builtins.list[dict[str, Any]] = []
            events: builtins.list[dict[str, Any]] = []
            for job_id, reason, event_kind in reasons:
                state = states.get(job_id)
                if state not in ("pending", "suspended"):
                    left[job_id] = state
                    continue
                changes.append({"w_id": job_id, "w_reason": reason})
                if event_kind is not None:
                    events.append(
                        {
                            "at_s": now_s,
                            "kind": event_kind,
                            "job_id": job_id,
                            "message": reason,
                            "data": {},
                        }
                    )
            if changes:
                s.execute(_SET_REASON, [{**c, "w_now_s": now_s} for c in changes])
            if events:
                if self.dialect == "postgresql":
                    s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _EVENT_LOCK})
                s.execute(insert(_EVENTS), events)
        return left

    def set_process(
        self, job_id: int, pid: int, pgid: int, start_ticks: int | None, now_s: float
    ) -> JobRow:
        """Record the process a job runs as, so a restarted scheduler can find (or kill) it."""
        return self.update(job_id, now_s, pid=pid, pgid=pgid, start_ticks=start_ticks)

    def request_cancel(self, job_id: int, now_s: float, reason: str = "cancelled") -> JobRow:
        """Ask for a job to stop: pending/suspended ones are cancelled at once, running ones
        get cancel_requested for the scheduler to act on; a finished job is returned as is."""
        with self._write() as s:
            job = s.scalars(
                select(JobModel).where(JobModel.id == job_id).with_for_update(key_share=True)
            ).one_or_none()
            if job is None:
                raise _missing(job_id)
            if job.state in TERMINAL or job.cancel_requested:
                return _job_row(job)  # asking twice, or too late, changes nothing
            old_state = job.state
            job.cancel_requested = True
            job.updated_at = now_s
            if old_state in ("pending", "suspended"):
                job.state = "cancelled"
                job.reason = reason
                job.ended_at = now_s
                kind, data = "cancelled", {"from": old_state, "to": "cancelled"}
            else:
                kind, data = "cancel-requested", {"state": old_state}
            s.flush()
            self._insert_event(s, kind, reason, now_s, job_id, data)
            return _job_row(job)

    # -- events --
    def add_event(
        self,
        kind: str,
        message: str,
        now_s: float,
        job_id: int | None = None,
        data: Mapping[str, Any] | None = None,
    ) -> int:
        """Append to the event log; returns the new event's seq."""
        try:
            with self._write() as s:
                return self._insert_event(s, kind, message, now_s, job_id, data)
        except IntegrityError as exc:
            if job_id is not None:
                raise _missing(job_id) from exc
            raise

    def events_after(
        self, seq: int, limit: int = 500, job_id: int | None = None
    ) -> builtins.list[EventRow]:
        """Events with a seq above `seq`, oldest first: poll with the last seq seen.

        Seqs are committed in increasing order, so a poller never skips one.
        """
        query = select(EventModel).where(EventModel.seq > seq)
        if job_id is not None:
            query = query.where(EventModel.job_id == job_id)
        with self._read() as s:
            return [_event_row(m) for m in s.scalars(query.order_by(EventModel.seq).limit(limit))]

    # -- lifecycle: holds, drains, purge --
    def set_held(self, job_id: int, held: bool, now_s: float, reason: str) -> JobRow:
        """Put a waiting job (or one being requeued) on hold, or release it; an event
        either way. Holding a running or ended job, holding twice or releasing a job that
        is not held is a ConflictError."""
        with self._write() as s:
            job = s.scalars(
                select(JobModel).where(JobModel.id == job_id).with_for_update(key_share=True)
            ).one_or_none()
            if job is None:
                raise _missing(job_id)
            if held and job.state not in ("pending", "suspended", "preempting"):
                raise ConflictError(
                    f"job {job_id} is {job.state}; only a waiting (or requeued) job is held"
                )
            if bool(job.held) == held:
                raise ConflictError(
                    f"job {job_id} is {'on hold already' if held else 'not on hold'}"
                )
            job.held = held
            job.reason = reason
            job.updated_at = now_s
            s.flush()
            self._insert_event(s, "held" if held else "released", reason, now_s, job_id)
            return _job_row(job)

    def drains(self) -> dict[str, tuple[float, str, str]]:
        """Drained nodes: name -> (since, by whom, why)."""
        with self._read() as s:
            return {m.node: (m.since_s, m.by, m.reason) for m in s.scalars(select(NodeDrainModel))}

    def set_drain(self, node: str, drained: bool, now_s: float, by: str, reason: str) -> bool:
        """Record (or clear) a node's drain; False when it already was (or was not)."""
        with self._write() as s:
            found = s.get(NodeDrainModel, node)
            if (found is not None) == drained:
                return False
            if drained:
                s.add(NodeDrainModel(node=node, since_s=now_s, by=by, reason=reason))
            else:
                s.delete(found)
            s.flush()
            kind = "node-drain" if drained else "node-undrain"
            self._insert_event(s, kind, reason, now_s, None, {"node": node, "by": by})
            return True

    def run_started_at(self, job_id: int) -> float | None:
        """When the job's current run began: its last move to running."""
        query = (
            select(EventModel.at_s)
            .where(EventModel.job_id == job_id, EventModel.kind == "running")
            .order_by(EventModel.seq.desc())
            .limit(1)
        )
        with self._read() as s:
            at = s.scalar(query)
            return None if at is None else float(at)

    def purge(self, before_s: float, batch: int = 200) -> Purged:
        """Delete up to `batch` jobs that ended before `before_s` with their events, and
        up to `batch` job-less events from before then. Small batches keep each
        transaction short; call again while `Purged.more`."""
        if batch < 1:
            raise SpecError(f"batch is {batch}; purge at least 1 row at a time")
        with self._write() as s:
            ids = [
                int(i)
                for i in s.scalars(
                    select(JobModel.id)
                    .where(JobModel.state.in_(TERMINAL), JobModel.ended_at < before_s)
                    .order_by(JobModel.id)
                    .limit(batch)
                )
            ]
            events = 0
            if ids:
                gone = delete(EventModel).where(EventModel.job_id.in_(ids))
                events += len(s.scalars(gone.returning(EventModel.seq)).all())
                s.execute(delete(JobModel).where(JobModel.id.in_(ids)))
            old = select(EventModel.seq).where(
                EventModel.job_id.is_(None), EventModel.at_s < before_s
            )
            seqs = builtins.list(s.scalars(old.order_by(EventModel.seq).limit(batch)))
            more = len(ids) >= batch or len(seqs) >= batch
            if seqs:
                gone = delete(EventModel).where(EventModel.seq.in_(seqs))
                events += len(s.scalars(gone.returning(EventModel.seq)).all())
            return Purged(tuple(ids), events, more)

    # -- tokens --
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
            with self._write() as s:
                old = s.scalars(select(TokenModel).where(TokenModel.name == name)).one_or_none()
                if old is not None:
                    if _token_row(old).state(now_s) == "active":
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
                row = _token_row(model)
                entry = AuditEntry.by(
                    by,
                    now_s,
                    "token-created",
                    client=client,
                    detail=f"token {name} (id {row.id}) for {scope}{until}",
                )
                s.execute(insert(AuditModel), [audit_values(entry)])
                self._insert_event(s, "token-created", f"token {name} created for {scope}", now_s)
        except IntegrityError as exc:
            raise ConflictError(
                f"a token named {name!r} exists; pick another name or revoke that one first"
            ) from exc
        return token, row

    def tokens(self) -> builtins.list[TokenRow]:
        """Every token, revoked and expired ones included, in id order."""
        with self._read() as s:
            return [_token_row(m) for m in s.scalars(select(TokenModel).order_by(TokenModel.id))]

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
        with self._write() as s:
            found = s.scalars(select(TokenModel).where(TokenModel.name == str(ref))).one_or_none()
            if found is None and str(ref).isdigit() and int(ref) <= 2**31 - 1:
                found = s.get(TokenModel, int(ref))
            if found is None or _token_row(found).state(now_s) == "revoked":
                raise NotFoundError(
                    f"no token is named {ref!r} (or has that id); nothing was revoked; "
                    "gpupool token ls lists them"
                )
            if found.role == "admin" and _token_row(found).state(now_s) == "active":
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
            row = _token_row(found)
            entry = AuditEntry.by(
                by, now_s, "token-revoked", client=client, detail=f"token {row.name} (id {row.id})"
            )
            s.execute(insert(AuditModel), [audit_values(entry)])
            self._insert_event(s, "token-revoked", f"token {row.name} revoked", now_s)
            return row

    def principal(self, token: str, now_s: float | None = None) -> Principal | None:
        """Who a presented token belongs to, or None for an unknown, revoked or expired one
        (now_s: the wall clock, Unix s; default now)."""
        now = time.time() if now_s is None else now_s
        with self._read() as s:
            found = s.scalars(
                select(TokenModel).where(TokenModel.hash == token_hash(token))
            ).one_or_none()
            if found is None or _token_row(found).state(now) != "active":
                return None
            return Principal(found.name, found.team, found.role, found.expires_at, found.id)

    def has_admin(self, now_s: float | None = None) -> bool:
        """Whether an active (unrevoked, unexpired) admin token exists."""
        now = time.time() if now_s is None else now_s
        with self._read() as s:
            query = select(TokenModel.id).where(*_active_admin(now)).limit(1)
            return s.scalar(query) is not None

    # -- audit --
    def add_audit(self, entries: Sequence[AuditEntry]) -> None:
        """Append audit entries, all in one transaction (a background write: on a locked
        SQLite database it fails soon, and the trail keeps the entries for its next try)."""
        if not entries:
            return
        with self._background_write() as s:
            s.execute(insert(AuditModel), [audit_values(e) for e in entries])

    def audit(
        self,
        limit: int = 100,
        before_id: int | None = None,
        since_s: float | None = None,
        token: str | None = None,
    ) -> builtins.list[AuditRow]:
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
        with self._read() as s:
            found = s.scalars(query.order_by(AuditModel.id.desc()).limit(limit))
            return [_audit_row(m) for m in found]

    def purge_audit(self, older_than_s: float, keep_rows: int | None = None) -> int:
        """Delete audit rows from before older_than_s (Unix s), and beyond the newest
        keep_rows; returns how many went."""
        with self._background_write() as s:
            old = delete(AuditModel).where(AuditModel.at_s < older_than_s)
            gone = cast(CursorResult[Any], s.execute(old)).rowcount
            if keep_rows is not None:
                top = s.scalar(select(func.max(AuditModel.id)))
                if top is not None and top > keep_rows:
                    cut = delete(AuditModel).where(AuditModel.id <= top - keep_rows)
                    gone += cast(CursorResult[Any], s.execute(cut)).rowcount
            return int(gone)

    # -- telemetry history (revision 0009) --
    def add_history(
        self, gpu_rows: Sequence[GpuMinute], service_rows: Sequence[ServiceMinute] = ()
    ) -> None:
        """One bucket of history (every card's and every service's rows) in one write."""
        if not gpu_rows and not service_rows:
            return
        with self._write() as s:
            if gpu_rows:
                s.execute(insert(GpuMinuteModel), [dataclasses.asdict(r) for r in gpu_rows])
            if service_rows:
                s.execute(insert(ServiceMinuteModel), [dataclasses.asdict(r) for r in service_rows])

    def gpu_minutes(
        self, start_s: float | None = None, end_s: float | None = None
    ) -> builtins.list[GpuMinute]:
        """Per-card buckets that begin in [start_s, end_s), oldest first (plain rows, not
        ORM objects: a month of a fleet is millions of them)."""
        m = GpuMinuteModel
        query = select(
            m.gpu_id, m.t_s, m.period_s, m.samples, m.mem_used_mib, m.sm_util_pct, m.power_w,
            m.temp_c,
        )  # fmt: skip
        if start_s is not None:
            query = query.where(m.t_s >= start_s)
        if end_s is not None:
            query = query.where(m.t_s < end_s)
        with self._read() as s:
            return [GpuMinute(*row) for row in s.execute(query.order_by(m.t_s, m.id))]

    def service_minutes(
        self, start_s: float | None = None, end_s: float | None = None
    ) -> builtins.list[ServiceMinute]:
        """Per-service buckets that begin in [start_s, end_s), oldest first."""
        m = ServiceMinuteModel
        query = select(m.service, m.t_s, m.period_s, m.p99_ms, m.rps, m.replicas)
        if start_s is not None:
            query = query.where(m.t_s >= start_s)
        if end_s is not None:
            query = query.where(m.t_s < end_s)
        with self._read() as s:
            return [ServiceMinute(*row) for row in s.execute(query.order_by(m.t_s, m.id))]

    def history_rows(self) -> tuple[int, int]:
        """(GPU rows, service rows) the history holds now."""
        with self._read() as s:
            gpus = s.scalar(select(func.count()).select_from(GpuMinuteModel)) or 0
            svcs = s.scalar(select(func.count()).select_from(ServiceMinuteModel)) or 0
            return int(gpus), int(svcs)

    def prune_history(
        self, before_s: float, max_gpu_rows: int, max_service_rows: int, batch: int = 5000
    ) -> Pruned:
        """Delete the oldest history rows: those that begin before `before_s`, then the
        oldest beyond each table's row cap; at most `batch` rows per table, so one prune
        is a short transaction (call again while `Pruned.more`)."""
        if batch < 1:
            raise SpecError(f"batch is {batch}; prune at least 1 row at a time")
        done: builtins.list[int] = []
        more = False
        with self._write() as s:
            for model, cap in (
                (GpuMinuteModel, max_gpu_rows),
                (ServiceMinuteModel, max_service_rows),
            ):
                count = int(s.scalar(select(func.count()).select_from(model)) or 0)
                old = int(
                    s.scalar(select(func.count()).select_from(model).where(model.t_s < before_s))
                    or 0
                )
                excess = max(old, count - max(cap, 0))
                take = min(excess, batch)
                if take > 0:
                    ids = select(model.id).order_by(model.t_s, model.id).limit(take)
                    s.execute(delete(model).where(model.id.in_(ids.scalar_subquery())))
                done.append(take)
                more = more or excess > take
        return Pruned(done[0], done[1], more)

    def record_fleet(self, gpus: Sequence[FleetGpu], now_s: float) -> None:
        """The cards the service runs on now: new ones added, known ones marked seen."""
        with self._write() as s:
            for g in gpus:
                found = s.get(FleetGpuModel, g.gpu_id)
                if found is None:
                    s.add(
                        FleetGpuModel(
                            **{**dataclasses.asdict(g), "first_seen_s": now_s, "last_seen_s": now_s}
                        )
                    )
                else:
                    found.node, found.gpu_index, found.gpu_type = g.node, g.gpu_index, g.gpu_type
                    found.site, found.mem_total_mib = g.site, g.mem_total_mib
                    found.last_seen_s = now_s

    def fleet(self) -> builtins.list[FleetGpu]:
        with self._read() as s:
            return [
                FleetGpu(
                    m.gpu_id,
                    m.node,
                    m.gpu_index,
                    m.gpu_type,
                    m.site,
                    m.mem_total_mib,
                    m.first_seen_s,
                    m.last_seen_s,
                )
                for m in s.scalars(select(FleetGpuModel).order_by(FleetGpuModel.gpu_id))
            ]

    def table_names(self) -> set[str]:
        """The tables the database holds (whatever their schema)."""
        with self._engine.connect() as conn:
            return set(inspect(conn).get_table_names())

    def put_setting(self, key: str, value: Any, now_s: float) -> None:
        with self._write() as s:
            found = s.get(SettingModel, key)
            if found is None:
                s.add(SettingModel(key=key, value=value, updated_at=now_s))
            else:
                found.value, found.updated_at = value, now_s

    def setting(self, key: str) -> Any:
        """A stored setting's value; None when never stored."""
        with self._read() as s:
            found = s.get(SettingModel, key)
            return None if found is None else found.value

    # -- the learned policy --
    def learning_mode(self) -> LearningMode | None:
        """The mode last set (promote, demote, or the first start); None when never set."""
        with self._read() as s:
            found = s.get(LearningModeModel, "mode")
            return None if found is None else LearningMode(found.mode, found.set_at_s, found.reason)

    def set_learning_mode(
        self,
        mode: str,
        now_s: float,
        reason: str,
        action: str | None = None,
        by: str = "",
        evidence: Mapping[str, Any] | None = None,
    ) -> LearningChange | None:
        """Store the mode; with an action (promote, demote, fallback) also record the change
        and its evidence, in the same transaction. Returns the change recorded, if any."""
        if mode not in LEARNING_MODES:
            raise SpecError(
                f"learning mode must be one of {', '.join(LEARNING_MODES)}, got {mode!r}"
            )
        with self._write() as s:
            found = s.get(LearningModeModel, "mode")
            if found is None:
                s.add(LearningModeModel(key="mode", mode=mode, set_at_s=now_s, reason=reason))
            else:
                found.mode, found.set_at_s, found.reason = mode, now_s, reason
            if action is None:
                return None
            change = LearningChangeModel(
                at_s=now_s,
                action=action,
                mode=mode,
                by=by,
                reason=reason,
                evidence=_as_json(dict(evidence or {})),
            )
            s.add(change)
            s.flush()
            return _learning_change(change)

    def learning_changes(self, limit: int = 20) -> builtins.list[LearningChange]:
        """Promotions and demotions, newest first."""
        query = select(LearningChangeModel).order_by(LearningChangeModel.id.desc()).limit(limit)
        with self._read() as s:
            return [_learning_change(m) for m in s.scalars(query)]

    def finished_runs(self, since_s: float | None, until_s: float) -> builtins.list[FinishedRun]:
        """Jobs of their own (not a service's replicas) that needed GPUs and succeeded
        between since_s (None: ever) and until_s, in order of finish, each with the time it
        spent on its GPUs (running or checkpointing to leave) summed over its runs from its
        events."""
        query = select(JobModel).where(
            JobModel.state == "succeeded",
            JobModel.service.is_(None),
            JobModel.gpu_count > 0,
            JobModel.ended_at <= until_s,
        )
        if since_s is not None:
            query = query.where(JobModel.ended_at >= since_s)
        query = query.order_by(JobModel.ended_at, JobModel.id)
        with self._read() as s:
            jobs = builtins.list(s.scalars(query))
            on: dict[int, float] = {}
            since: dict[int, float] = {}
            ids = [m.id for m in jobs]
            for chunk in range(0, len(ids), 500):
                events = s.scalars(
                    select(EventModel)
                    .where(EventModel.job_id.in_(ids[chunk : chunk + 500]))
                    .order_by(EventModel.seq)
                )
                for e in events:
                    before, after = (e.data or {}).get("from"), (e.data or {}).get("to")
                    if before is None or after is None or e.job_id is None:
                        continue
                    if after in ON_GPU and before not in ON_GPU:
                        since[e.job_id] = e.at_s
                    elif before in ON_GPU and after not in ON_GPU and e.job_id in since:
                        on[e.job_id] = on.get(e.job_id, 0.0) + e.at_s - since.pop(e.job_id)
            return [
                FinishedRun(
                    m.id,
                    m.name,
                    m.team,
                    m.gpu_model,
                    m.gpu_count,
                    m.submitted_at,
                    float(m.ended_at if m.ended_at is not None else m.updated_at),
                    on.get(m.id, 0.0),
                )
                for m in jobs
            ]


def _active_admin(now_s: float) -> tuple[Any, ...]:
    """WHERE clauses of an active admin token."""
    return (
        TokenModel.role == "admin",
        TokenModel.revoked_at.is_(None),
        (TokenModel.expires_at.is_(None)) | (TokenModel.expires_at > now_s),
    )


def _token_row(m: TokenModel) -> TokenRow:
    role = m.role or ("admin" if m.team is None else "team")
    return TokenRow(
        m.id, m.name, role, m.team, m.created_at, m.expires_at, m.revoked_at, m.created_by
    )


def audit_values(e: AuditEntry) -> dict[str, Any]:
    """The entry's fields as the audit table's columns (the same names)."""
    return dataclasses.asdict(e)


def _audit_row(m: AuditModel) -> AuditRow:
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


def _sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
    """Per connection: WAL, NORMAL sync, foreign keys, a busy timeout; we emit BEGIN ourselves."""
    dbapi_conn.isolation_level = None  # the sqlite3 module must not BEGIN behind our back
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={_DEFAULT_BUSY_MS}")
    cursor.close()


_DEFAULT_BUSY_MS = int(SQLITE_BUSY_TIMEOUT_S * 1000)


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


# ---- riding out a database that is briefly unavailable (the live loop's calls) ---------------
def transient(err: BaseException) -> bool:
    """Whether a failed call may succeed if tried again: the database was locked, busy,
    unreachable, out of space, read-only or out of file descriptors. A retried call is safe:
    each Store method is one transaction, and these errors leave it uncommitted."""
    if isinstance(err, OperationalError | SqlTimeoutError | InterfaceError):
        return True
    return isinstance(err, DBAPIError) and bool(err.connection_invalidated)


@dataclass
class RetryPolicy:
    """Backoff from first_s doubling to at most max_s, for at most give_up_s in all."""

    first_s: float = 0.1
    max_s: float = 5.0
    give_up_s: float = 300.0


class RetryingStore:
    """A Store whose calls retry transient database errors with backoff (see `transient`),
    each retry reported to `on_retry(error, attempt, delay_s)`, until the call succeeds,
    `give_up_s` has passed, or `stopping` is set; then the last error is raised. Used by
    the scheduler loop, which would otherwise lose the change it was writing; the API
    answers with errors instead of waiting."""

    def __init__(
        self,
        store: Store,
        policy: RetryPolicy | None = None,
        on_retry: Callable[[BaseException, int, float], None] | None = None,
        stopping: threading.Event | None = None,
    ) -> None:
        self.inner = store
        self.policy = policy or RetryPolicy()
        self.on_retry = on_retry
        self.stopping = stopping or threading.Event()

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
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

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        def retried(*args: Any, **kwargs: Any) -> Any:
            return self.call(attr, *args, **kwargs)

        return retried


def count_events(store: Store, job_id: int, kind: str, prefix: str = "") -> int:
    """How many events of `kind` (with a message starting with `prefix`) a job has had."""
    query = select(func.count()).where(EventModel.job_id == job_id, EventModel.kind == kind)
    if prefix:
        query = query.where(EventModel.message.startswith(prefix, autoescape=True))
    with store._read() as s:
        return int(s.scalar(query) or 0)

"""The store's schema as ORM models: 13 tables; the migrations in migrations/versions
create exactly this (tests/server/store/test_store.py compares them)."""

from __future__ import annotations

from typing import Any

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
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

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
    # who submitted it inside its team, for fair share (revision 0011)
    user_name: Mapped[str | None] = mapped_column(String)
    # the topology level a gang requires or prefers (revision 0012)
    topology: Mapped[str | None] = mapped_column(String)
    topology_preferred: Mapped[str | None] = mapped_column(String)


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
    """Each learner's mode (shadow or active), kept across restarts (revision 0010): key
    "mode" for the learned job order, the learner's name for the others."""

    __tablename__ = "learning_mode"

    key: Mapped[str] = mapped_column(String, primary_key=True)
    mode: Mapped[str] = mapped_column(String)
    set_at_s: Mapped[float] = mapped_column(Double)
    reason: Mapped[str] = mapped_column(Text)


class LearningChangeModel(Base):
    """A promotion or demotion of a learner, with its evidence (revisions 0010, 0013)."""

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
    learner: Mapped[str] = mapped_column(String, server_default="order")


JOBS = Table("jobs", Base.metadata)
"""The jobs table (looked up by name), for Core statements where many rows go at once."""
EVENTS = Table("events", Base.metadata)
"""The events table, for Core statements."""

"""The values the store is handed and hands back: a job's spec and row, a service's,
events, tokens and audit lines, telemetry history, the learned policy's mode. Frozen;
a job's submit-time fields are gpupool.domain.job_fields.JobFields, written once."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupool.domain.job_fields import JOB_FIELDS, JobFields
from gpupool.errors import SpecError
from gpupool.server.store.states import ROLES, TERMINAL


@dataclass(frozen=True)
class NewJob(JobFields):
    """A job as submitted to the store: its JobFields, nothing learned yet."""


@dataclass(frozen=True, kw_only=True)
class JobRow(JobFields):
    """One job as stored: its spec (JobFields), where it runs and how its life went so far."""

    id: int
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
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    updated_at: float
    idempotency_key: str | None
    cancel_requested: bool
    resize_gpus: tuple[tuple[str, int], ...] | None = None
    """Mid-resize: the GPUs it restarts on once its processes left."""
    held: bool = False
    """On hold (gpupool hold): it starts only once released."""
    port: int | None = None
    """A replica's loopback port (its env var `port_env`), set when it starts."""

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def spec(self) -> NewJob:
        """The NewJob this row was submitted as (to compare a resubmission with)."""
        return NewJob(**{name: getattr(self, name) for name in JOB_FIELDS})


JOB_ROW_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(JobRow))
"""Every field of a JobRow: the JobFields, then what the store learned."""


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
    learner: str = "order"
    """Which learner (learning.config.LEARNERS)."""


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

"""The REST API (FastAPI): jobs, logs, cluster state, events, Prometheus metrics.

Every accepted job is committed to the database before the answer leaves; the scheduler
loop picks it up within a cycle (the API wakes it). Bad input gets a 422 naming each
field; bodies over 64 KiB get a 413; an Idempotency-Key header makes a retried submit
return the job it created the first time. Tokens: an admin token sees and does
everything; a team token sees the whole queue but submits, cancels and reads logs only
for its team's jobs; a read-only token sees the queue and the cluster and changes
nothing. A revoked or expired token is refused at its next request (auth.TokenCache);
changes, refusals and admin reads are audited (GET /v1/audit). /metrics and the API's
documentation (/docs, /redoc, /openapi.json) need a token unless opened.
"""

from __future__ import annotations

import asyncio
import email.message
import json
import math
import operator
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path as FsPath
from typing import Annotated, Any, Literal, TypeVar

from fastapi import Depends, FastAPI, Header, HTTPException, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    Strict,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from starlette.routing import Route

from gpupool.domain.job_fields import JOB_FIELDS
from gpupool.errors import ConflictError, GpupoolError, NotFoundError, SpecError, Unavailable
from gpupool.scheduler.cycle.wait_reasons import reason_code
from gpupool.server.api.admission import Fleet, admit
from gpupool.server.api.rate import RateLimited, SubmitRate
from gpupool.server.api.share_admission import check_share
from gpupool.server.loop.driver import LiveService
from gpupool.server.loop.views import service_json
from gpupool.server.security.auth import AuditMiddleware, AuditTrail, TokenCache
from gpupool.server.store import (
    AuditRow,
    JobRow,
    NewJob,
    NewService,
    Principal,
    Store,
    TokenRow,
    audit_values,
)
from gpupool.server.telemetry.prometheus import (
    CONTENT_TYPE_LATEST,
    metrics_registry,
    render_metrics,
)
from gpupool.sizing import request_json as sf
from gpupool.sizing.catalog import load_catalog
from gpupool.sizing.planner import PlanRequest

MAX_BODY_BYTES = 64 * 1024
MAX_ID = 2**31 - 1
"""Job ids and event numbers are 32-bit integers in the database."""
JobId = Annotated[int, Path(ge=1, le=MAX_ID)]
PRIORITIES = {"low": 0, "normal": 50, "high": 100}
NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
KINDS = Literal["training", "online-inference", "offline-inference", "batch"]
MAX_STATE_GIB = 1e5
"""state_gib_per_gpu: at most 100 TiB of checkpoint per GPU."""


def _whole(lo: int, hi: int, default: Any = ..., description: str | None = None) -> Any:
    """A strict integer field (no booleans, no numeric strings) within lo..hi."""
    return Field(default, ge=lo, le=hi, strict=True, description=description)


def _choice(key: str, description: str, nullable: bool = False) -> Any:
    """A string field that must be one of sizing_field.CHOICES[key] (said in the schema)."""
    choices: list[Any] = list(sf.CHOICES[key])
    return Field(
        sf.DEFAULTS[key],
        description=description,
        json_schema_extra={"enum": [*choices, None] if nullable else choices},
    )


class ShapeIn(BaseModel):
    """A model that is not packaged, by its shape: layers, hidden and heads at least. The
    rest take the usual choices: kv_heads = heads, head_dim = hidden / heads, ffn_hidden =
    8/3 x hidden, vocab 32000, params_b estimated from the shape (gpupool plan --shape)."""

    model_config = ConfigDict(extra="forbid")

    layers: int = _whole(1, sf.SHAPE_INTS["layers"], description="Transformer layers.")
    hidden: int = _whole(1, sf.SHAPE_INTS["hidden"], description="Hidden size.")
    heads: int = _whole(1, sf.SHAPE_INTS["heads"], description="Attention heads.")
    kv_heads: int | None = _whole(1, sf.SHAPE_INTS["kv_heads"], None, "Key/value heads.")
    head_dim: int | None = _whole(1, sf.SHAPE_INTS["head_dim"], None)
    vocab: int | None = _whole(1, sf.SHAPE_INTS["vocab"], None)
    ffn_hidden: int | None = _whole(1, sf.SHAPE_INTS["ffn_hidden"], None)
    params_b: float | None = Field(
        None, gt=0, le=sf.MAX_PARAMS_B, allow_inf_nan=False, description="Parameters, billions."
    )
    active_params_b: float | None = Field(
        None,
        gt=0,
        le=sf.MAX_PARAMS_B,
        allow_inf_nan=False,
        description="Parameters a token runs through, billions (mixture-of-experts models).",
    )
    name: str | None = Field(
        None,
        min_length=1,
        max_length=sf.MAX_SHAPE_NAME,
        json_schema_extra={"pattern": "^[^\\x00]*$"},
    )
    source: str | None = Field(
        None,
        min_length=1,
        max_length=sf.MAX_SHAPE_SOURCE,
        description="Where the numbers come from.",
        json_schema_extra={"pattern": "^[^\\x00]*$"},
    )

    @field_validator("name", "source")
    @classmethod
    def _no_nul(cls, v: str | None) -> str | None:
        if v is not None and "\x00" in v:
            raise ValueError("must not contain NUL characters")
        return v

    @model_validator(mode="after")
    def _shape(self) -> ShapeIn:
        try:
            sf.shape_from(self.model_dump(exclude_none=True))
        except sf.SizingError as err:
            raise ValueError(err.reason) from None
        return self


class SizingIn(BaseModel):
    """Size the job by its model, as `gpupool plan` does (the planner's PlanRequest): give
    model or shape, and the work. The scheduler then decides per GPU type how many GPUs the
    job needs (the fewest that fit, and with deadline_s the fewest that meet it) instead of
    taking gpus. Inference: batch concurrent sequences of context tokens, tokens to generate;
    training: micro-batch batch per data-parallel rank of seq_len tokens, grad_accum
    micro-batches per step, tokens to train on. Stored as given plus the planner's defaults."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"dependentRequired": {"deadline_s": ["tokens"]}}
    )

    model: str | None = Field(
        None,
        description="A packaged model (exactly one of model and shape).",
        json_schema_extra={"enum": [*sf.model_names(), None]},
    )
    shape: ShapeIn | None = Field(None, description="Any other model, by its shape.")
    task: str = _choice("task", "inference or training.")
    precision: str = _choice("precision", "Weights (and training math) precision.")
    kv_precision: str | None = _choice("kv_precision", "KV cache precision.", nullable=True)
    context: int = _whole(
        1, sf.MAX_SEQ_TOKENS, sf.DEFAULTS["context"], "Inference: tokens held in KV cache."
    )
    seq_len: int = _whole(
        1, sf.MAX_SEQ_TOKENS, sf.DEFAULTS["seq_len"], "Training: tokens per sequence."
    )
    batch: int = _whole(
        1,
        sf.MAX_BATCH,
        sf.DEFAULTS["batch"],
        "Inference: concurrent sequences; training: micro-batch per data-parallel rank.",
    )
    grad_accum: int = _whole(
        1, sf.MAX_GRAD_ACCUM, sf.DEFAULTS["grad_accum"], "Training: micro-batches per step."
    )
    tokens: float | None = Field(
        None,
        gt=0,
        le=sf.MAX_TOKENS,
        allow_inf_nan=False,
        description="The work: tokens to generate or train on.",
    )
    deadline_s: float | None = Field(
        None,
        gt=0,
        le=sf.MAX_DEADLINE_S,
        allow_inf_nan=False,
        description="Run time (seconds) the sizing should meet; needs tokens.",
    )
    counts: list[Annotated[int, Strict(), Field(ge=1, le=sf.MAX_COUNT)]] = Field(
        list(sf.DEFAULTS["counts"]),  # pydantic copies it for every instance
        min_length=1,
        max_length=sf.MAX_COUNTS,
        description="GPU counts to try.",
    )
    gpus: (
        list[
            Annotated[
                str,
                Field(
                    min_length=1,
                    max_length=sf.MAX_NAME,
                    json_schema_extra={"pattern": "^[^\\x00]*$"},
                ),
            ]
        ]
        | None
    ) = Field(
        None,
        min_length=1,
        max_length=sf.MAX_GPU_TYPES,
        description="GPU types to plan for (gpupool plan); the scheduler sizes the job for "
        "the GPU types of its cluster.",
    )
    zero_stage: int = _whole(0, 3, sf.DEFAULTS["zero_stage"], "Training: ZeRO stage.")
    recompute: str = _choice("recompute", "Training: activation recomputation.")
    optimizer: str = _choice("optimizer", "Training: the optimizer.")

    _request: PlanRequest | None = PrivateAttr(None)

    @field_validator("model")
    @classmethod
    def _model(cls, v: str | None) -> str | None:
        return None if v is None else _sized(sf.check_model, v)

    @field_validator("task", "precision", "kv_precision", "recompute", "optimizer")
    @classmethod
    def _choices(cls, v: str | None, info: ValidationInfo) -> str | None:
        key = str(info.field_name)
        return None if v is None else _sized(lambda x: sf.check_choice(key, x), v)

    @field_validator("gpus")
    @classmethod
    def _gpu_names(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and any("\x00" in g for g in v):
            raise ValueError("must not contain NUL characters")
        return v

    @model_validator(mode="after")
    def _plan_request(self) -> SizingIn:
        """The definitive check: the planner's PlanRequest must build from what was given."""
        try:
            self._request = sf.plan_request_from(self.model_dump(exclude_unset=True))
        except sf.SizingError as err:
            raise ValueError(str(err)) from None
        return self

    def mapping(self) -> dict[str, Any]:
        """The canonical mapping the store keeps (sizing_field.sizing_of)."""
        assert self._request is not None  # set by the validator
        return sf.sizing_of(self._request)


def _sized(check: Callable[[object], str], value: object) -> str:
    """check(value), its SizingError as the ValueError pydantic reports at the field."""
    try:
        return check(value)
    except sf.SizingError as err:
        raise ValueError(err.reason) from None


class JobIn(BaseModel):
    """A job to run: the command, and what it needs."""

    model_config = ConfigDict(
        extra="forbid",
        # said in the schema too, so clients (and the fuzzer) know it up front
        json_schema_extra={"dependentRequired": {"latency_bound_ms": ["user_region"]}},
    )

    command: list[Annotated[str, Field(min_length=1, max_length=4096)]] = Field(
        min_length=1, max_length=256
    )
    name: str | None = Field(None, min_length=1, max_length=128)
    team: str | None = Field(None, min_length=1, max_length=64, pattern=NAME)
    kind: KINDS = "training"
    priority: Annotated[int, Strict()] | Literal["low", "normal", "high"] = "normal"
    gpus: int = Field(
        1,
        ge=0,
        le=1024,
        description="GPUs the job needs; with sizing, the scheduler decides per GPU type.",
    )
    gpus_min: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="An elastic job (offline-inference, batch, training): it runs on "
        "gpus_min..gpus GPUs and lends the rest to online work at its peak (checkpoint, "
        "restart on fewer), growing back after. Needs whole GPUs.",
    )
    gpu_model: str | None = Field(None, min_length=1, max_length=64)
    gpu_share: float | None = Field(
        None,
        gt=0,
        lt=1,
        allow_inf_nan=False,
        description="Part of one GPU (0.25: a quarter), shared with other jobs; needs gpus 1.",
    )
    gpu_mem_mib: int | None = Field(
        None,
        ge=1,
        le=16 * 1024 * 1024,
        description="GPU memory of one shared GPU (MiB); the share is this over the memory "
        "of the card the job lands on. Needs gpus 1; not with gpu_share.",
    )
    checkpoint_every_s: float | None = Field(None, gt=0, le=1e7)
    grace_s: float = Field(60.0, ge=0, le=86_400)
    max_retries: int = Field(0, ge=0, le=100)
    duration_s: float | None = Field(None, gt=0, le=1e9)
    time_limit_s: float | None = Field(
        None,
        gt=0,
        le=1e8,
        allow_inf_nan=False,
        description="Wall time one run may take (since its start or resume); past it the "
        "job gets SIGTERM, its grace, SIGKILL, and fails. Default: its kind's, if any.",
    )
    env: dict[
        Annotated[str, Field(min_length=1, max_length=256)], Annotated[str, Field(max_length=8192)]
    ] = Field(default_factory=dict, max_length=256)
    cwd: str | None = Field(None, min_length=1, max_length=4096)
    # what multi-cluster placement needs (gpupool.federation.placement.FedJob)
    dataset: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="A data location of the federation topology the job reads.",
        json_schema_extra={"pattern": "^[^\\x00]*$"},
    )
    dataset_gb: float = Field(
        0.0, ge=0, le=1e9, allow_inf_nan=False, description="Size of the dataset in GB."
    )
    deadline_at: float | None = Field(
        None,
        gt=0,
        le=1e11,
        allow_inf_nan=False,
        description="Absolute Unix time (seconds) by which the job should finish.",
    )
    latency_bound_ms: float | None = Field(
        None,
        gt=0,
        le=1e7,
        allow_inf_nan=False,
        description="Latency bound to user_region; only meaningful for online-inference.",
    )
    user_region: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        validate_default=True,  # so a missing one is checked against latency_bound_ms
        description="Where the job's users are; required with latency_bound_ms.",
        json_schema_extra={"pattern": "^[^\\x00]*$"},
    )
    # what the decision core sizes the job and prices its preemption by
    state_gib_per_gpu: float = Field(
        0.0,
        ge=0,
        le=MAX_STATE_GIB,
        allow_inf_nan=False,
        description="Checkpoint size: GiB of state per GPU the job writes when preempted "
        "(and reads back when resumed). The scheduler turns it into checkpoint write and "
        "resume times; 0 counts as vacating its GPUs at once.",
    )
    sizing: SizingIn | None = Field(
        None,
        description="Size the job by its model instead of (or besides) gpus: the planner's "
        "request (gpupool plan). Stored with every field filled in.",
    )

    @field_validator("priority")
    @classmethod
    def _priority(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not -1000 <= v <= 1000:
            raise ValueError("priority must be within -1000..1000 or low, normal, high")
        return v

    @field_validator("command", "cwd", "name", "gpu_model", "dataset", "user_region")
    @classmethod
    def _no_nul(cls, v: Any) -> Any:
        items = v if isinstance(v, list) else [v]
        if any(x is not None and "\x00" in x for x in items):
            raise ValueError("must not contain NUL characters")
        return v

    @field_validator("user_region")
    @classmethod
    def _region_for_bound(cls, v: str | None, info: ValidationInfo) -> str | None:
        # declared after latency_bound_ms, so a valid bound is in info.data by now
        if v is None and info.data.get("latency_bound_ms") is not None:
            raise ValueError(
                "latency_bound_ms needs user_region (latency from where?); set both or neither"
            )
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"environment variable name {key!r} is not valid")
            if "\x00" in value:
                raise ValueError(f"environment variable {key} must not contain NUL")
        return v


SERVICE_NAME = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"


class ServiceIn(BaseModel):
    """An online service: each replica runs `command` with a free loopback port in the
    env var `port_env` and serves /metrics there (docs/services.md)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=63, pattern=SERVICE_NAME)
    team: str | None = Field(None, min_length=1, max_length=64, pattern=NAME)
    command: list[Annotated[str, Field(min_length=1, max_length=4096)]] = Field(
        min_length=1, max_length=256
    )
    model: str | None = Field(None, min_length=1, max_length=128, description="What it serves.")
    gpu_model: str | None = Field(None, min_length=1, max_length=64)
    gpu_mem_mib: int | None = Field(
        None, ge=1, le=16 * 1024 * 1024, description="GPU memory of one replica (MiB)."
    )
    gpu_share: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    min_replicas: int = Field(1, ge=0, le=1024)
    max_replicas: int = Field(1, ge=1, le=1024)
    slo_p99_ms: float = Field(200.0, gt=0, le=600_000, allow_inf_nan=False)
    replica_rps: float = Field(
        10.0,
        gt=0,
        le=1e7,
        allow_inf_nan=False,
        description="Requests/s one replica serves within the SLO.",
    )
    port_env: str = Field("PORT", min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    cwd: str | None = Field(None, min_length=1, max_length=4096)
    env: dict[str, str] = Field(default_factory=dict, max_length=256)
    grace_s: float = Field(10.0, ge=0, le=86_400, allow_inf_nan=False)
    priority: Annotated[int, Strict()] | Literal["low", "normal", "high"] = "high"

    @field_validator("command", "cwd", "model", "gpu_model")
    @classmethod
    def _no_nul(cls, v: Any) -> Any:
        items = v if isinstance(v, list) else [v]
        if any(isinstance(x, str) and "\x00" in x for x in items):
            raise ValueError("must not contain NUL characters")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            if not k or "=" in k or "\x00" in k or "\x00" in val:
                raise ValueError("env names must be non-empty without '=' or NUL")
        return v

    @model_validator(mode="after")
    def _bounds(self) -> ServiceIn:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} > max_replicas {self.max_replicas}")
        if self.gpu_share is not None and self.gpu_mem_mib is not None:
            raise ValueError("give gpu_share or gpu_mem_mib, not both")
        return self


class ScaleIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min_replicas: int = Field(ge=0, le=1024)
    max_replicas: int = Field(ge=1, le=1024)

    @model_validator(mode="after")
    def _bounds(self) -> ScaleIn:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} > max_replicas {self.max_replicas}")
        return self


class BatchIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    jobs: list[JobIn] = Field(min_length=1, max_length=1000)


MAX_TOKEN_LIFE_S = 10 * 365 * 86400.0


class EvidenceIn(BaseModel):
    """A replay of this cluster's own history under the rule and the learned policy, as
    `gpupool learn promote` ran it (the server cannot simulate: the CLI does)."""

    model_config = ConfigDict(extra="allow")
    days: float = Field(gt=0, le=3650, allow_inf_nan=False)
    jobs: int = Field(ge=0, le=10**9, strict=True)
    rule: Literal["las", "gittins"]
    rule_mean_jct_s: float = Field(ge=0, allow_inf_nan=False)
    learned_mean_jct_s: float = Field(ge=0, allow_inf_nan=False)


class PromoteIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    evidence: EvidenceIn


class DemoteIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field("", max_length=512, json_schema_extra={"pattern": "^[^\\x00]*$"})


class DrainIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    node: str = Field(min_length=1, max_length=256, json_schema_extra={"pattern": "^[^\\x00]*$"})
    undo: bool = False
    reason: str = Field("", max_length=512)

    @field_validator("node", "reason")
    @classmethod
    def _no_nul(cls, v: str) -> str:
        if "\x00" in v:
            raise ValueError("must not contain NUL characters")
        return v


class TokenIn(BaseModel):
    """A token to create: for a team (team given), an admin or a read-only observer."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64, pattern=NAME)
    team: str | None = Field(None, min_length=1, max_length=64, pattern=NAME)
    role: Literal["admin", "team", "read-only"] | None = Field(
        None, description="Default: team with a team, admin without."
    )
    expires_in_s: float | None = Field(
        None,
        gt=0,
        le=MAX_TOKEN_LIFE_S,
        allow_inf_nan=False,
        description="Seconds from now until the token stops working; none: never.",
    )


def token_json(row: TokenRow, now_s: float) -> dict[str, Any]:
    return {
        "id": row.id,
        "name": row.name,
        "role": row.role,
        "team": row.team,
        "state": row.state(now_s),
        "created_at": row.created_at,
        "expires_at": row.expires_at,
        "revoked_at": row.revoked_at,
        "created_by": row.created_by,
    }


def audit_json(row: AuditRow) -> dict[str, Any]:
    return {"id": row.id, **audit_values(row.entry)}


JOB_IN_NAME: dict[str, str] = {
    "gpu_count": "gpus",
    "gpu_count_min": "gpus_min",
    "gpu_milli": "gpu_share",
}
"""JobFields that JobIn takes under another name (the rest keep theirs); gpu_share is in
GPUs where gpu_milli is in thousandths of one (new_job converts it)."""
JOB_IN_OMITS: frozenset[str] = frozenset({"owner", "service"})
"""JobFields a client does not give: its token's name is the owner, and only the core
makes a service's replicas."""
JOB_JSON_OMITS: frozenset[str] = frozenset({"env", "cwd", "max_retries", "duration_s", "owner"})
"""JobFields a job's JSON leaves out (its environment may hold secrets)."""
_JOB_JSON_ORDER = (
    "id", "name", "team", "kind", "priority", "gpu_count", "gpu_model", "gpu_milli",
    "gpu_mem_mib", "gpu_count_min", "gpus", "state", "preempting", "reason", "reason_code",
    "command", "attempts", "preemptions", "retries", "exit_code", "submitted_at",
    "started_at", "ended_at", "checkpoint_every_s", "grace_s", "dataset", "dataset_gb",
    "deadline_at", "user_region", "latency_bound_ms", "state_gib_per_gpu", "sizing",
    "time_limit_s", "held", "service", "port",
)  # fmt: skip
"""The order of a job's keys in the API's answers (and `gpupool show --json`)."""
_JOB_JSON_KEYS = _JOB_JSON_ORDER + tuple(
    name for name in JOB_FIELDS if name not in JOB_JSON_OMITS and name not in _JOB_JSON_ORDER
)
"""Every key of a job's JSON: a field added to JobFields comes last unless placed above."""
_JOB_JSON_VALUES = operator.attrgetter(
    *({"preempting": "state", "reason_code": "reason"}.get(k, k) for k in _JOB_JSON_KEYS)
)
"""The row's attributes under those keys (job_json then fixes the few it derives)."""


def job_json(row: JobRow) -> dict[str, Any]:
    """A job as the API answers with it: its JobFields (but JOB_JSON_OMITS) and what the
    scheduler made of it."""
    out = dict(zip(_JOB_JSON_KEYS, _JOB_JSON_VALUES(row), strict=True))
    out["command"] = list(row.command)
    out["sizing"] = None if row.sizing is None else dict(row.sizing)
    out["gpus"] = [{"node": node, "index": index} for node, index in row.gpus]
    out["state"] = "running" if row.state == "preempting" else row.state
    out["preempting"] = row.state == "preempting"
    out["reason_code"] = reason_code(
        row.reason, row.state in ("pending", "suspended"), row.held and not row.terminal
    )
    out["held"] = row.held and not row.terminal
    return out


_T = TypeVar("_T")


class SubmitBatcher:
    """Group commit for single-job submissions.

    Each request waits for its own commit (the job is durable before the answer), but
    requests that arrive while a commit is running are written together in the next
    transaction: one commit, one fsync, one event-lock hold for many jobs. At low load a
    batch is one job and nothing waits longer than its own write.

    The commits run on one thread of their own: they run one at a time anyway, and
    anyio's worker-thread hand-off (capacity limiter, cancel scopes) cost a tenth of the
    server's CPU under a stream of submits."""

    MAX_BATCH = 256

    def __init__(
        self,
        store: Store,
        wake: Callable[[], None] | None = None,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.wake = wake
        self.now = now
        """The scheduler's clock: a job's submit time is on the clock the core decides by."""
        self.pending: list[tuple[NewJob, str | None, asyncio.Future[tuple[JobRow, bool]]]] = []
        self.flushing = False
        self.task: asyncio.Future[None] | None = None
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpupool-submit")

    async def _off_loop(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self.writer, fn, *args)

    async def submit(self, job: NewJob, key: str | None) -> tuple[JobRow, bool]:
        future: asyncio.Future[tuple[JobRow, bool]] = asyncio.get_running_loop().create_future()
        self.pending.append((job, key, future))
        if not self.flushing:
            self.flushing = True
            self.task = asyncio.ensure_future(self._flush())  # kept: tasks are weakly held
        return await future

    async def _flush(self) -> None:
        try:
            while self.pending:
                batch = self.pending[: self.MAX_BATCH]
                del self.pending[: self.MAX_BATCH]
                try:
                    results = await self._off_loop(
                        self.store.jobs.submit_group, [(j, k) for j, k, _ in batch], self.now()
                    )
                except Exception:
                    # each on its own, so only that one hears of its error
                    for job, key, future in batch:
                        try:
                            one = await self._off_loop(self.store.jobs.submit, job, self.now(), key)
                        except Exception as err:
                            if not future.done():
                                future.set_exception(err)
                        else:
                            if not future.done():
                                future.set_result(one)
                    continue
                if self.wake is not None:
                    self.wake()  # once per commit, not per request
                for (_, _, future), result in zip(batch, results, strict=True):
                    if future.done():
                        continue
                    if isinstance(result, GpupoolError):
                        future.set_exception(result)
                    else:
                        future.set_result(result)
        finally:
            self.flushing = False


class BodyLimit:
    """Refuses request bodies over MAX_BODY_BYTES, whether announced or streamed."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
        send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for key, value in scope.get("headers", []):
            if key == b"content-length" and value.isdigit() and int(value) > MAX_BODY_BYTES:
                await _too_large(send)
                return
        # Read the whole body first (it is small by definition) so that an oversized one,
        # announced or streamed, gets a 413 before any handler sees it.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > MAX_BODY_BYTES:
                await _too_large(send)
                return
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _too_large(send: Callable[[MutableMapping[str, Any]], Awaitable[None]]) -> None:
    body = b'{"detail":"request body over 65536 bytes; submit fewer or smaller jobs"}'
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


IDEMPOTENCY_KEY: TypeAdapter[str] = TypeAdapter(
    Annotated[str, StringConstraints(max_length=128, pattern=r"^[\x21-\x7e]+$")]
)
"""The Idempotency-Key header's rule (as `submit` declares it), for `submit_direct`."""


def _is_json(content_type: str) -> bool:
    """application/json or application/<anything>+json, read as FastAPI reads it (a body
    without a content type is not JSON)."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


def _located(err: ValidationError, where: tuple[str, ...]) -> list[dict[str, Any]]:
    """A model's errors as FastAPI reports a request's: each `loc` under `where`."""
    return [{**e, "loc": (*where, *e["loc"])} for e in err.errors(include_url=False)]


async def current_principal(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> Principal:
    """Who is asking: the bearer token's owner, cached per token (auth.TokenCache), its
    expiry checked on every request. A read-only token is refused anything but reading."""
    if not request.app.state.auth:
        return Principal("anonymous", None)
    if not authorization or not authorization.startswith("Bearer "):
        raise HTTPException(401, "missing bearer token; set GPUPOOL_TOKEN")
    token = authorization[7:].strip()
    cache: TokenCache = request.app.state.tokens
    now = request.app.state.wall()
    who = cache.get(token)
    if who is None:
        # off the event loop: an unknown token reaches the database every time
        who = await run_in_threadpool(request.app.state.store.auth.principal, token, now)
        if who is None:
            raise HTTPException(
                401, "unknown token, or one revoked or expired; ask an admin for one"
            )
        cache.put(token, who)
    request.state.gpupool_principal = who  # auth.PRINCIPAL_KEY, for the audit
    if who.expired(now):
        cache.forget(token_id=who.token_id, name=who.name)
        raise HTTPException(
            401, f"token {who.name} expired; ask an admin for a new one (gpupool token create)"
        )
    if who.read_only and request.method not in ("GET", "HEAD", "OPTIONS"):
        raise HTTPException(
            403, f"token {who.name} is read-only: it lists and shows, it changes nothing"
        )
    return who


Who = Annotated[Principal, Depends(current_principal)]


def create_app(
    service: LiveService,
    store: Store,
    auth: bool = True,
    *,
    open_metrics: bool = False,
    open_docs: bool = False,
    audit_keep_days: float = 90.0,
    wall: Callable[[], float] = time.time,
) -> FastAPI:
    """The API. open_metrics / open_docs serve /metrics and /docs, /redoc, /openapi.json
    without a token (with auth off everything is open anyway); wall is the clock tokens
    expire by and the audit trail is stamped with (not the scheduler's, which a rehearsal
    may start elsewhere)."""
    app = FastAPI(
        title="gpupool",
        version="1",
        description="A GPU scheduler: submit jobs, watch them run, see the GPUs.",
        openapi_url=None,  # served below, behind a token unless open_docs
        docs_url=None,
        redoc_url=None,
    )
    app.state.store = store
    app.state.auth = auth
    app.state.wall = wall
    batcher = SubmitBatcher(store, service.state.wake.set, service.clock.now)
    app.state.tokens = TokenCache()
    trail = AuditTrail(store, keep_days=audit_keep_days, wall=wall)
    app.state.audit = trail
    docs_guard = [] if open_docs else [Depends(current_principal)]
    metrics_guard = [] if open_metrics else [Depends(current_principal)]

    def admin_only(who: Principal, what: str) -> None:
        if not who.is_admin:
            raise HTTPException(403, f"only an admin token {what}; token {who.name} is not one")

    def peer(request: Request) -> str | None:
        return None if request.client is None else f"{request.client.host}:{request.client.port}"

    scheduling = service.config.scheduling
    fleet = Fleet.of(service.cluster.nodes)  # fixed for the service's life, cloud nodes too
    gangs = bool(getattr(service.executor, "runs_gangs", False))  # jobs across nodes (Ray)
    fleet_models = {n.gpu_model for n in service.cluster.nodes}
    catalog = load_catalog()
    rate = SubmitRate(
        {
            team: lim.submit_per_min
            for team, lim in scheduling.team_limits.items()
            if lim.submit_per_min is not None
        },
        time.monotonic,
    )
    app.state.submit_rate = rate

    def own(who: Principal, row: JobRow) -> None:
        if not who.is_admin and who.team != row.team:
            raise HTTPException(403, f"job {row.id} belongs to team {row.team}, not {who.team}")

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        # Each problem by field; the offending value is not echoed (it may be NaN, bytes
        # or a lone surrogate, which JSON cannot carry).
        detail = [
            {
                "loc": [x if isinstance(x, int) else str(x) for x in e.get("loc", ())],
                "msg": str(e.get("msg", "")),
                "type": str(e.get("type", "")),
            }
            for e in err.errors()
        ]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(NotFoundError)
    async def _nf(_: Request, err: NotFoundError) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=404)

    @app.exception_handler(ConflictError)
    async def _cf(_: Request, err: ConflictError) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=409)

    @app.exception_handler(SpecError)
    async def _se(_: Request, err: SpecError) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=422)

    @app.exception_handler(RateLimited)
    async def _rl(_: Request, err: RateLimited) -> JSONResponse:
        return JSONResponse(
            {"detail": str(err)},
            status_code=429,
            headers={"Retry-After": str(max(1, math.ceil(err.retry_after_s)))},
        )

    @app.exception_handler(Unavailable)
    async def _un(_: Request, err: Unavailable) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(GpupoolError)
    async def _ge(_: Request, err: GpupoolError) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=400)

    def new_job(body: JobIn, who: Principal) -> NewJob:
        team = body.team or who.team
        if team is None:
            raise HTTPException(422, [{"loc": ["body", "team"], "msg": "team is required"}])
        if not who.is_admin and team != who.team:
            raise HTTPException(403, f"a {who.team} token submits only for team {who.team}")
        priority = PRIORITIES[body.priority] if isinstance(body.priority, str) else body.priority
        sizing = None if body.sizing is None else body.sizing.mapping()
        admit(
            fleet,
            load_catalog(),
            gpus=body.gpus,
            gpu_model=body.gpu_model,
            sizing=sizing,
            gangs=gangs,
        )
        given = {
            name: getattr(body, JOB_IN_NAME.get(name, name))
            for name in JOB_FIELDS
            if name not in JOB_IN_OMITS
        }
        given.update(  # the fields JobIn holds in another form
            name=body.name or body.command[0].rsplit("/", 1)[-1][:128],
            team=team,
            priority=priority,
            sizing=sizing,
            time_limit_s=body.time_limit_s
            if body.time_limit_s is not None
            else scheduling.time_limit_s.get(body.kind),
            gpu_milli=1000 if body.gpu_share is None else max(1, round(body.gpu_share * 1000)),
            owner=who.name,
        )
        job = NewJob(**given)
        check_share(job, fleet_models, catalog)
        return job

    @app.post(
        "/v1/jobs",
        status_code=201,
        summary="Submit a job",
        responses={200: {"description": "The job this Idempotency-Key created before"}},
    )
    async def submit(
        body: JobIn,
        who: Who,
        idempotency_key: Annotated[
            str | None, Header(max_length=128, pattern=r"^[\x21-\x7e]+$")
        ] = None,
    ) -> JSONResponse:
        # Group commit: submissions that arrive while a commit runs share the next one,
        # and the scheduler is woken once per commit.
        job = new_job(body, who)
        rate.take(job.team)
        row, created = await batcher.submit(job, idempotency_key)
        return JSONResponse(job_json(row), status_code=201 if created else 200)

    async def submit_direct(request: Request) -> Response:
        """POST /v1/jobs as `submit` above does it, without FastAPI's per-request solving
        of parameters and dependencies, which took a third of a submit's CPU: the same
        token check, Idempotency-Key rule and JobIn model, the same errors (through the
        app's handlers), the same group commit. `submit` stays for the OpenAPI document
        (tests/test_submit_direct.py holds the two to the same answers)."""
        # the three headers in one pass (Headers.get scans the list and raises for a
        # missing one, once per header); the first of repeated ones, as Headers.get
        authorization = key = content_type = None
        for name, raw_value in request.scope["headers"]:
            if name == b"authorization" and authorization is None:
                authorization = raw_value.decode("latin-1")
            elif name == b"idempotency-key" and key is None:
                key = raw_value.decode("latin-1")
            elif name == b"content-type" and content_type is None:
                content_type = raw_value.decode("latin-1")
        who = await current_principal(request, authorization)
        problems: list[dict[str, Any]] = []
        if key is not None:
            try:
                key = IDEMPOTENCY_KEY.validate_python(key)
            except ValidationError as err:
                problems += _located(err, ("header", "idempotency-key"))
        raw = await request.body()
        body: JobIn | None = None
        if not raw:
            problems.append(
                {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}
            )
        else:
            # as FastAPI reads a body: JSON only under a JSON content type, by the standard
            # library's parser (NaN included, refused then by the model), validated as
            # Python objects
            value: Any = raw
            if _is_json(content_type or ""):
                try:
                    value = json.loads(raw)
                except ValueError as err:
                    if not isinstance(err, json.JSONDecodeError):  # undecodable bytes
                        raise HTTPException(400, "There was an error parsing the body") from None
                    raise RequestValidationError(
                        [
                            {
                                "type": "json_invalid",
                                "loc": ("body", err.pos),
                                "msg": "JSON decode error",
                                "input": {},
                                "ctx": {"error": err.msg},
                            }
                        ]
                    ) from None
            try:
                body = JobIn.model_validate(value, from_attributes=True)
            except ValidationError as err:
                problems += _located(err, ("body",))
        if problems or body is None:
            raise RequestValidationError(problems)
        return await submit(body, who, key)

    app.router.routes.insert(0, Route("/v1/jobs", submit_direct, methods=["POST"]))

    @app.post("/v1/jobs/batch", status_code=201, summary="Submit up to 1,000 jobs at once")
    def submit_batch(body: BatchIn, who: Who) -> dict[str, Any]:
        new = [new_job(j, who) for j in body.jobs]
        for team in sorted({j.team for j in new}):
            rate.take(team, sum(j.team == team for j in new))
        rows = store.jobs.submit_many(new, service.clock.now())
        service.state.wake.set()
        return {"jobs": [job_json(r) for r in rows]}

    @app.get("/v1/jobs", summary="List jobs")
    def jobs(
        who: Who,
        state: Annotated[str | None, Query(max_length=32)] = None,
        team: Annotated[str | None, Query(max_length=64, pattern=NAME)] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
        after: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
        before: Annotated[int | None, Query(ge=1, le=MAX_ID + 1)] = None,
        order: Literal["asc", "desc"] = "asc",
    ) -> dict[str, Any]:
        """Jobs with after < id < before, oldest first (order=asc: page on with after=the
        last id) or newest first (order=desc: page on with before=the last id)."""
        db_state = None if state is None else state.lower()
        if db_state is not None and db_state not in (
            "pending",
            "running",
            "suspended",
            "succeeded",
            "failed",
            "cancelled",
        ):
            raise HTTPException(422, [{"loc": ["query", "state"], "msg": f"unknown state {state}"}])

        def page(db_state: str | None) -> list[JobRow]:
            return store.jobs.list(
                state=db_state,
                team=team,
                limit=limit,
                after_id=after,
                before_id=before,
                newest_first=order == "desc",
            )

        rows = page(db_state)
        if db_state == "running":
            rows += page("preempting")
            rows.sort(key=lambda r: r.id, reverse=order == "desc")
            del rows[limit:]  # a page is `limit` rows in order, so the next one misses none
        return {"jobs": [job_json(r) for r in rows]}

    @app.get("/v1/jobs/{job_id}", summary="One job")
    def job(job_id: JobId, who: Who) -> dict[str, Any]:
        return job_json(store.jobs.get(job_id))

    @app.post("/v1/jobs/{job_id}/cancel", summary="Cancel a job")
    def cancel(job_id: JobId, who: Who) -> dict[str, Any]:
        own(who, store.jobs.get(job_id))
        return job_json(service.operations.cancel(job_id))

    @app.get("/v1/jobs/{job_id}/logs", summary="A job's output", response_class=PlainTextResponse)
    def logs(
        job_id: JobId,
        who: Who,
        stream: Literal["stdout", "stderr"] = "stdout",
        offset: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=1, le=1 << 22)] = 1 << 20,
        rank: Annotated[int, Query(ge=0, le=1 << 16)] = 0,
    ) -> Response:
        row = store.jobs.get(job_id)
        own(who, row)
        data = service.views.read_log(job_id, stream, offset, limit, rank=rank)
        state = "running" if row.state == "preempting" else row.state
        return Response(
            data,
            media_type="text/plain; charset=utf-8",
            headers={"X-Log-Offset": str(offset + len(data)), "X-Job-State": state},
        )

    @app.get("/v1/cluster", summary="Nodes and GPUs with live telemetry")
    def cluster(who: Who) -> dict[str, Any]:
        return service.views.cluster_view()

    @app.get("/v1/events", summary="Events after a sequence number (long poll)")
    async def events(
        who: Who,
        after: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
        wait: Annotated[float, Query(ge=0, le=30)] = 0.0,
    ) -> dict[str, Any]:
        deadline = time.monotonic() + wait
        while True:
            rows = await run_in_threadpool(store.events.after, after, 500)
            if rows or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.2)
        return {
            "events": [
                {
                    "seq": e.seq,
                    "at_s": e.at_s,
                    "kind": e.kind,
                    "job_id": e.job_id,
                    "message": e.message,
                }
                for e in rows
            ],
            "next": rows[-1].seq if rows else after,
        }

    @app.post("/v1/tokens", status_code=201, summary="Create a token (admin)")
    def create_token(body: TokenIn, who: Who, request: Request) -> dict[str, Any]:
        admin_only(who, "creates tokens")
        trail.flush()  # the requests before it stay before it in the trail
        now = wall()
        token, row = store.auth.issue_token(
            body.name,
            body.team,
            now,
            role=body.role,
            expires_at=None if body.expires_in_s is None else now + body.expires_in_s,
            by=who,
            client=peer(request),
        )
        return {**token_json(row, now), "token": token}

    @app.get("/v1/tokens", summary="Every token, revoked and expired ones too (admin)")
    def list_tokens(who: Who) -> dict[str, Any]:
        admin_only(who, "lists tokens")
        now = wall()
        return {"tokens": [token_json(r, now) for r in store.auth.tokens()]}

    @app.post("/v1/tokens/{ref}/revoke", summary="Revoke a token by name or id (admin)")
    def revoke_token(
        ref: Annotated[str, Path(min_length=1, max_length=64, pattern=NAME)],
        who: Who,
        request: Request,
    ) -> dict[str, Any]:
        admin_only(who, "revokes tokens")
        trail.flush()
        now = wall()
        row = store.auth.revoke_token(ref, now, by=who, client=peer(request))
        app.state.tokens.forget(name=row.name, token_id=row.id)  # refused from the next request
        return token_json(row, now)

    @app.get("/v1/audit", summary="The audit trail, newest first (admin)")
    def audit(
        who: Who,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
        before: Annotated[int | None, Query(ge=1, le=MAX_ID + 1)] = None,
        since: Annotated[float | None, Query(ge=0, le=1e11)] = None,
        token: Annotated[str | None, Query(max_length=64, pattern=NAME)] = None,
    ) -> dict[str, Any]:
        """Token changes, every request that changed something or was refused, and admin
        reads of tokens and of this trail: page on with before=the last id."""
        admin_only(who, "reads the audit trail")
        trail.flush()
        rows = store.auth.audit(limit=limit, before_id=before, since_s=since, token=token)
        return {"audit": [audit_json(r) for r in rows]}

    # ---- lifecycle: hold, release, requeue (the job's team or an admin), drain (admin) ----
    @app.post("/v1/jobs/{job_id}/hold", summary="Hold a waiting job: it starts once released")
    def hold(job_id: JobId, who: Who) -> dict[str, Any]:
        own(who, store.jobs.get(job_id))
        return job_json(service.operations.hold(job_id, who.name))

    @app.post("/v1/jobs/{job_id}/release", summary="Release a held job")
    def release(job_id: JobId, who: Who) -> dict[str, Any]:
        own(who, store.jobs.get(job_id))
        return job_json(service.operations.release(job_id, who.name))

    @app.post(
        "/v1/jobs/{job_id}/requeue",
        summary="Stop a running job with its checkpoint and put it back in the queue",
    )
    def requeue(job_id: JobId, who: Who, hold: bool = False) -> dict[str, Any]:
        own(who, store.jobs.get(job_id))
        return job_json(service.operations.requeue(job_id, who.name, hold=hold))

    # ---- services: created by a team member (or an admin), seen by every token ----------
    def own_service(who: Principal, name: str) -> None:
        row = store.services.get(name)
        if not who.is_admin and who.team != row.team:
            raise HTTPException(403, f"service {name} belongs to team {row.team}, not {who.team}")

    @app.post("/v1/services", status_code=201, summary="Create an online service")
    def create_service(body: ServiceIn, who: Who) -> dict[str, Any]:
        team = body.team or who.team
        if team is None:
            raise HTTPException(422, [{"loc": ["body", "team"], "msg": "team is required"}])
        if not who.is_admin and team != who.team:
            raise HTTPException(403, f"a {who.team} token creates services only for {who.team}")
        priority = PRIORITIES[body.priority] if isinstance(body.priority, str) else body.priority
        row = service.operations.create_service(
            NewService(
                name=body.name,
                team=team,
                command=tuple(body.command),
                min_replicas=body.min_replicas,
                max_replicas=body.max_replicas,
                slo_p99_ms=body.slo_p99_ms,
                replica_rps=body.replica_rps,
                model=body.model,
                gpu_model=body.gpu_model,
                gpu_mem_mib=body.gpu_mem_mib,
                gpu_milli=1000 if body.gpu_share is None else max(1, round(body.gpu_share * 1000)),
                port_env=body.port_env,
                cwd=body.cwd,
                env=dict(body.env),
                grace_s=body.grace_s,
                priority=priority,
                owner=who.name,
            )
        )
        return service_json(row)

    @app.get("/v1/services", summary="List the online services")
    def list_services(who: Who) -> dict[str, Any]:
        return {"services": [service.views.service_view(r.name) for r in store.services.list()]}

    @app.get("/v1/services/{name}", summary="One service with its replicas, rps and p99")
    def show_service(
        name: Annotated[str, Path(min_length=1, max_length=63, pattern=SERVICE_NAME)], who: Who
    ) -> dict[str, Any]:
        return service.views.service_view(name)

    @app.post("/v1/services/{name}/scale", summary="Set a service's replica bounds")
    def scale_service(
        name: Annotated[str, Path(min_length=1, max_length=63, pattern=SERVICE_NAME)],
        body: ScaleIn,
        who: Who,
    ) -> dict[str, Any]:
        own_service(who, name)
        service.operations.scale_service(name, body.min_replicas, body.max_replicas)
        return service.views.service_view(name)

    @app.delete("/v1/services/{name}", summary="Delete a service; its replicas stop")
    def delete_service(
        name: Annotated[str, Path(min_length=1, max_length=63, pattern=SERVICE_NAME)], who: Who
    ) -> dict[str, Any]:
        own_service(who, name)
        return service_json(service.operations.delete_service(name))

    @app.post("/v1/drain", summary="Drain a node (admin): nothing new starts there")
    def drain(body: DrainIn, who: Who) -> dict[str, Any]:
        if not who.is_admin:
            raise HTTPException(403, "only an admin token drains nodes")
        return service.operations.drain(body.node, who.name, undo=body.undo, reason=body.reason)

    # ---- the learned policy: status, the history its replay needs, promote and demote ----
    @app.get("/v1/learn", summary="The learned policy: data seen, accuracy, guard, mode")
    def learn(who: Who) -> dict[str, Any]:
        return service.views.learning_view()

    @app.get("/v1/learn/history", summary="Jobs finished in the last N days, and the fleet")
    def learn_history(
        who: Who, days: Annotated[float, Query(gt=0, le=3650, allow_inf_nan=False)] = 14.0
    ) -> dict[str, Any]:
        return service.views.learning_history(days)

    @app.post("/v1/learn/promote", summary="Make the learned policy active on a replay win (admin)")
    def learn_promote(body: PromoteIn, who: Who) -> dict[str, Any]:
        admin_only(who, "promotes the learned policy")
        return service.operations.promote_learning(body.evidence.model_dump(), who.name)

    @app.post("/v1/learn/demote", summary="Return the learned policy to shadow (admin)")
    def learn_demote(who: Who, body: DemoteIn | None = None) -> dict[str, Any]:
        admin_only(who, "demotes the learned policy")
        return service.operations.demote_learning(who.name, body.reason if body is not None else "")

    # ---- the dashboard: `/` (static, no token) and the read endpoints its panels need ----
    @app.get("/", include_in_schema=False)
    def dashboard() -> Response:
        """The dashboard page; its data calls carry the token the person signs in with."""
        return _dashboard_asset("index.html")

    @app.get("/dashboard/{name}", include_in_schema=False)
    def dashboard_asset(name: Annotated[str, Path(max_length=64)]) -> Response:
        if name not in DASHBOARD_ASSETS:
            raise HTTPException(404, f"no dashboard file {name}")
        return _dashboard_asset(name)

    @app.get("/v1/me", summary="Who the token belongs to (anonymous without one)")
    async def me(
        request: Request, authorization: Annotated[str | None, Header()] = None
    ) -> dict[str, Any]:
        """The token's name, role and team; without a token, whether the API needs one (so
        a page can ask for a token instead of failing its calls). A bad token is a 401."""
        if authorization is None and request.app.state.auth:
            return {"auth": True, "signed_in": False, "name": None, "role": None, "team": None}
        who = await current_principal(request, authorization)
        return {
            "auth": bool(request.app.state.auth),
            "signed_in": True,
            "name": who.name,
            "role": who.role,
            "team": who.team,
        }

    @app.get("/v1/teams", summary="Teams against their quotas and the active time window")
    def teams(
        who: Who, team: Annotated[str | None, Query(max_length=64, pattern=NAME)] = None
    ) -> dict[str, Any]:
        """Per team and pool (GPU type): GPUs held now against what the team is guaranteed
        and may hold at most at this time of day (the active window's shares, else the
        team's quota), with its running and waiting job counts."""
        return teams_view(service, team)

    @app.get("/v1/jobs/{job_id}/events", summary="A job's history: its events, oldest first")
    def job_events(
        job_id: JobId,
        who: Who,
        after: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
        limit: Annotated[int, Query(ge=1, le=1000)] = 500,
    ) -> dict[str, Any]:
        store.jobs.get(job_id)  # a 404 for a job that is not there
        rows = store.events.after(after, limit, job_id=job_id)
        return {
            "job_id": job_id,
            "events": [
                {"seq": e.seq, "at_s": e.at_s, "kind": e.kind, "message": e.message} for e in rows
            ],
            "next": rows[-1].seq if rows else after,
        }

    @app.get("/healthz", summary="Liveness of the API and of the scheduler loop")
    def healthz() -> JSONResponse:
        """200 while the scheduler loop completes its cycles; 503 when its last completed
        cycle is late or the loop has stopped. Says the server's role (active), the last
        cycle, the last error and its stage, and why launches wait (DiskFull)."""
        body = service.views.health_view()
        return JSONResponse(body, status_code=200 if body["ok"] else 503)

    registry = metrics_registry(service.views, store)  # the app's own, not the global one

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        summary="Prometheus metrics",
        dependencies=metrics_guard,
    )
    def metrics() -> Response:
        return Response(render_metrics(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/openapi.json", include_in_schema=False, dependencies=docs_guard)
    def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False, dependencies=docs_guard)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="gpupool API")

    @app.get("/redoc", include_in_schema=False, dependencies=docs_guard)
    def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title="gpupool API")

    app.add_middleware(BodyLimit)
    app.add_middleware(AuditMiddleware, trail=trail, wall=wall)
    return app


DASHBOARD_DIR = FsPath(__file__).parent / "dashboard"
DASHBOARD_ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
}
DASHBOARD_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""The page may load and ask nothing but this server (no CDN, no fonts, no inline code)."""


def _dashboard_asset(name: str) -> Response:
    body = (DASHBOARD_DIR / name).read_bytes()
    return Response(
        body,
        media_type=DASHBOARD_ASSETS[name],
        headers={"Content-Security-Policy": DASHBOARD_CSP, "Cache-Control": "no-cache"},
    )


def _hhmm(seconds: float) -> str:
    minutes = round(seconds / 60.0)
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def teams_view(service: LiveService, only: str | None = None) -> dict[str, Any]:
    """GET /v1/teams: the core's quota book read at the scheduler's now, under its lock."""
    if not service.state.lock.acquire(timeout=service.views.VIEW_WAIT_S):
        raise Unavailable(
            f"the scheduler loop has held its state for over {service.views.VIEW_WAIT_S:g} s; "
            "/healthz says more; retry shortly"
        )
    try:
        core = service.scheduler
        now = service.clock.now()
        book = core.quotas
        active = book.window(now)
        queued = {t: len(q) for t, q in core.book.queues.by_team.items() if q}
        running: dict[str, int] = {}
        for r in core.running.values():
            running[r.spec.team] = running.get(r.spec.team, 0) + 1
        held = {key for key, n in core.book.held.items() if n > 0}
        names = list(book.teams)
        names += sorted(({t for t, _ in held} | set(queued) | set(running)) - set(names))
        quota = {q.team: q for q in book.quotas}
        out = []
        for name in names:
            if only is not None and name != only:
                continue
            q = quota.get(name)
            pools = []
            for pool, total in core.fleet.pool_gpus.items():
                pools.append(
                    {
                        "pool": pool,
                        "gpu_model": core.fleet.pool_model.get(pool),
                        "pool_gpus": total,
                        "used_gpus": core.usage(name, pool),
                        "guaranteed_gpus": book.guaranteed(name, pool, now),
                        "max_gpus": book.maximum(name, pool, now),
                        "quota_guaranteed_gpus": q.guaranteed.get(pool, 0) if q else 0,
                        "quota_max_gpus": q.maximum.get(pool, total) if q else total,
                    }
                )
            out.append(
                {
                    "team": name,
                    "configured": q is not None,
                    "running_jobs": running.get(name, 0),
                    "waiting_jobs": queued.get(name, 0),
                    "pools": pools,
                }
            )

        def window_json(w: Any) -> dict[str, Any]:
            return {
                "start": _hhmm(w.start_s),
                "end": _hhmm(w.end_s),
                "guaranteed_share": dict(w.guaranteed_share),
                "max_share": dict(w.max_share),
            }

        return {
            "at_s": now,
            "window": None if active is None else window_json(active),
            "windows": [window_json(w) for w in book.windows],
            "teams": out,
        }
    finally:
        service.state.lock.release()

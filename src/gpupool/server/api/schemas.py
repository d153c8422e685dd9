"""The API's request bodies and JSON answers: what a client may send (every bound said in the
OpenAPI document, so clients and the fuzzer know it up front) and how rows are rendered.

A new field goes into JobFields (gpupool.domain.job_fields) first; JobIn takes it under the same
name unless JOB_IN_NAME says otherwise, and job_json shows it unless JOB_JSON_OMITS hides it.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    Strict,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpupool.domain.job_fields import JOB_FIELDS
from gpupool.scheduler.cycle.wait_reasons import reason_code
from gpupool.server.store import AuditRow, JobRow, TokenRow, audit_values
from gpupool.sizing import request_json as sf
from gpupool.sizing.planner import PlanRequest

MAX_ID = 2**31 - 1
"""Job ids and event numbers are 32-bit integers in the database."""
JobId = Annotated[int, Path(ge=1, le=MAX_ID)]
PRIORITIES = {"low": 0, "normal": 50, "high": 100}
NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
LABEL_KEY = r"^[A-Za-z0-9][A-Za-z0-9-]*$"
"""A node label key: letters, digits and - (a Ray resource name carries it before an _)."""
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
    user: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        pattern=NAME,
        description="Who submits it inside its team (fair share orders a team's queue by "
        "its users' GPU use); default: the token's name.",
    )
    topology: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        pattern=LABEL_KEY,
        description="A gang (wider than a node) runs inside one domain of this topology "
        "level (a node label key such as rack) or waits for one.",
    )
    topology_preferred: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        pattern=LABEL_KEY,
        description="A gang runs inside one domain of this topology level when one has "
        "room, else anywhere its `topology` allows.",
    )
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


class FakeFaultIn(BaseModel):
    """POST /v1/admin/fake-faults: a fault on a GPU of the fake fleet (tests, rehearsals)."""

    model_config = ConfigDict(extra="forbid")
    gpu: int = Field(ge=0, le=1_000_000, description="The GPU's index as `gpupool nodes` shows it")
    node: str | None = Field(
        None, min_length=1, max_length=256, description="Needed where GPU indices repeat"
    )
    fault: Literal["lost", "ecc", "xid", "repair"]
    xid: int | None = Field(None, ge=1, le=1_000_000, description="The XID (fault xid)")
    count: int = Field(1, ge=1, le=1_000_000, description="Uncorrected ECC errors (fault ecc)")
    problem: str = Field("", max_length=512, description="The lost GPU's problem (fault lost)")

    @field_validator("node", "problem")
    @classmethod
    def _no_nul(cls, v: str | None) -> str | None:
        if v is not None and "\x00" in v:
            raise ValueError("must not contain NUL characters")
        return v

    @model_validator(mode="after")
    def _xid_given(self) -> FakeFaultIn:
        if (self.fault == "xid") != (self.xid is not None):
            raise ValueError("xid goes with fault xid, and fault xid needs it (e.g. 79)")
        return self


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

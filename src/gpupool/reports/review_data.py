"""What the monthly review is built from, whichever source it came from.

The live service's database and a simulation result are two sources of one record: the
GPUs, when each was down, which job held which share of which card over which interval,
what each card measured (per-bucket means), each job's life, and each service's latency
history. The review reads only this record, so a policy reviewed in the simulator and the
same policy reviewed live are read the same way.

Times are Unix seconds (UTC). A simulation maps its t=0 to `ReviewData.start_s`'s origin
(`origin_s`), so hour-of-day charts mean the same in both. Shares are milli-GPU integers
(1000 = a whole card) so that GPU-hours add up exactly.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from gpupool.errors import SpecError

FORMAT = "gpupool-review-data/1"


@dataclass(frozen=True)
class GpuRecord:
    """One card of the pool. `gpu_id` is "node/index", stable across restarts."""

    gpu_id: str
    node: str
    index: int
    gpu_type: str
    site: str = "local"
    mem_total_mib: int = 0


@dataclass(frozen=True)
class DownInterval:
    """A card that could take no work: its node lost, unhealthy or drained."""

    gpu_id: str
    start_s: float
    end_s: float
    reason: str


@dataclass(frozen=True)
class Allocation:
    """A job held `share_milli` of card `gpu_id` over [start_s, end_s)."""

    job_id: str
    gpu_id: str
    start_s: float
    end_s: float
    share_milli: int = 1000


@dataclass(frozen=True)
class JobReview:
    """One job's life as the review needs it. `wait_s_by_reason` splits the time it waited
    by the scheduler's reason codes (Priority, Resources, QuotaMax, ...); `lost_gpu_s` is the
    work preemptions threw away (GPU-seconds since the last checkpoint)."""

    job_id: str
    team: str
    kind: str
    gpu_count: int
    submit_s: float
    state: str
    first_start_s: float | None = None
    end_s: float | None = None
    service: str | None = None
    model: str | None = None
    gpu_mem_mib: int | None = None
    gpu_type: str | None = None
    priority: int = 0
    preemptions: int = 0
    lost_gpu_s: float = 0.0
    wait_s_by_reason: dict[str, float] = field(default_factory=dict)
    energy_kwh: float | None = None


@dataclass(frozen=True)
class UsageSample:
    """Means over one bucket [t_s, t_s + period_s) of what card `gpu_id` measured."""

    gpu_id: str
    t_s: float
    period_s: float
    mem_used_mib: float
    sm_util_pct: float
    power_w: float | None = None
    temp_c: float | None = None
    mem_peak_mib: float | None = None
    """Highest memory used within the bucket, where the source knows it (None: not kept)."""


@dataclass(frozen=True)
class LatencySample:
    """A service's measured p99 latency and request rate over one bucket."""

    service: str
    t_s: float
    p99_ms: float
    rps: float = 0.0


@dataclass(frozen=True)
class ReviewQuota:
    """A team's guarantee and maximum per GPU type (cards)."""

    team: str
    guaranteed: dict[str, int] = field(default_factory=dict)
    max: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ReviewTariff:
    """The electricity price and carbon intensity the review charges energy at. Hourly
    lists (24 entries, local hour of day) where the tariff varies by hour, else one value."""

    name: str
    price_per_kwh: tuple[float, ...]
    currency: str = "USD"
    carbon_g_per_kwh: tuple[float, ...] = ()
    pue: float = 1.0


@dataclass(frozen=True)
class ReviewData:
    """Everything one review is built from (see the module docstring)."""

    source: str
    start_s: float
    end_s: float
    gpus: tuple[GpuRecord, ...]
    allocations: tuple[Allocation, ...] = ()
    down: tuple[DownInterval, ...] = ()
    jobs: tuple[JobReview, ...] = ()
    usage: tuple[UsageSample, ...] = ()
    latency: tuple[LatencySample, ...] = ()
    teams: tuple[ReviewQuota, ...] = ()
    tariff: ReviewTariff | None = None
    gpu_price_per_hour: dict[str, float] = field(default_factory=dict)
    day_window: tuple[int, int] = (8, 20)
    """Local hours [from, to) counted as day; the rest of the day is night."""
    utc_offset_h: float = 0.0
    origin_s: float = 0.0
    """Unix time of a simulation's t=0 (0 for live data, whose times are already Unix)."""

    def __post_init__(self) -> None:
        if not self.end_s > self.start_s:
            raise SpecError(
                f"review period is empty: start {self.start_s} is not before end {self.end_s}; "
                "give --from before --to"
            )

    # ---- files ---------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["format"] = FORMAT
        return body

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> ReviewData:
        if body.get("format") != FORMAT:
            raise SpecError(
                f"not gpupool review data (format {body.get('format')!r}, want {FORMAT!r}); "
                "write it with `gpupool simulate scenario FILE --json RESULT.json`"
            )
        parts: dict[str, Any] = {}
        kinds: dict[str, type] = {
            "gpus": GpuRecord,
            "allocations": Allocation,
            "down": DownInterval,
            "jobs": JobReview,
            "usage": UsageSample,
            "latency": LatencySample,
            "teams": ReviewQuota,
        }
        names = {f.name for f in fields(cls)}
        for key, value in body.items():
            if key not in names:
                continue
            if key in kinds:
                parts[key] = tuple(kinds[key](**row) for row in value)
            elif key == "tariff" and value is not None:
                parts[key] = ReviewTariff(
                    **{
                        **value,
                        "price_per_kwh": tuple(value["price_per_kwh"]),
                        "carbon_g_per_kwh": tuple(value.get("carbon_g_per_kwh", ())),
                    }
                )
            elif key == "day_window":
                parts[key] = (int(value[0]), int(value[1]))
            else:
                parts[key] = value
        return cls(**parts)

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True))

    @classmethod
    def read(cls, path: Path) -> ReviewData:
        try:
            body = json.loads(path.read_text())
        except FileNotFoundError:
            raise SpecError(f"{path}: no such file") from None
        except json.JSONDecodeError as exc:
            raise SpecError(f"{path}: not JSON ({exc})") from None
        if isinstance(body, dict) and "review" in body and "format" not in body:
            body = body["review"]
        if not isinstance(body, dict):
            raise SpecError(f"{path}: expected a JSON object")
        return cls.from_json(body)

"""The review's output: one frozen row type per table, the summary, and `Review`, which
holds them and lists its tables in the order the HTML and the CSVs show them."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from gpupool.reports.review.rules import MILLI, MS_PER_HOUR, ReviewRules


@dataclass(frozen=True)
class Reconciliation:
    """The period's capacity split exactly, in milli-GPU x milliseconds (1000 x 3.6e6 per
    GPU-hour): allocated + idle + down == capacity, and `by_team` sums to allocated."""

    capacity: int
    allocated: int
    idle: int
    down: int
    by_team: tuple[tuple[str, int], ...] = ()

    UNIT_PER_GPU_HOUR: ClassVar[int] = MILLI * MS_PER_HOUR

    def gpu_hours(self, value: int) -> float:
        return value / (MILLI * MS_PER_HOUR)

    def team(self, name: str) -> int:
        return dict(self.by_team).get(name, 0)


@dataclass(frozen=True)
class GpuRow:
    """One card over the period: exact split, measured use, and why it is (not) reclaimable."""

    gpu_id: str
    gpu_type: str
    capacity_mgpu_ms: int
    allocated_mgpu_ms: int
    idle_mgpu_ms: int
    down_mgpu_ms: int
    capacity_gpu_h: float
    allocated_gpu_h: float
    idle_gpu_h: float
    down_gpu_h: float
    used_gpu_h: float
    allocated_pct: float
    mean_sm_pct: float
    """Mean SM utilisation over the card's up time (unmeasured time counts as 0 %)."""
    sampled_pct: float
    """Share of the card's up time covered by usage samples."""


@dataclass(frozen=True)
class TeamRow:
    """A team's allocated GPU-hours (exact) against what its jobs used (SM-weighted)."""

    team: str
    jobs: int
    allocated_mgpu_ms: int
    allocated_gpu_h: float
    allocated_share_pct: float
    used_gpu_h: float
    used_pct: float
    idle_cost: float


@dataclass(frozen=True)
class TypeRow:
    """Utilisation of one GPU type: allocated and used against capacity."""

    gpu_type: str
    gpus: int
    capacity_gpu_h: float
    down_gpu_h: float
    allocated_gpu_h: float
    used_gpu_h: float
    allocated_pct: float
    used_pct: float


@dataclass(frozen=True)
class HourRow:
    """One local hour of the day summed over the period; `window` is day or night."""

    hour: int
    window: str
    capacity_gpu_h: float
    allocated_gpu_h: float
    used_gpu_h: float
    allocated_pct: float
    used_pct: float


@dataclass(frozen=True)
class JobUsageRow:
    """What one job was given against what it measurably used. SM and memory are per card,
    attributed by share where a card was shared; -1 where no sample covered the job."""

    job_id: str
    team: str
    kind: str
    gpu_count: int
    gpu_type: str
    allocated_gpu_h: float
    used_gpu_h: float
    used_pct: float
    mean_sm_pct: float
    peak_sm_pct: float
    mean_mem_mib: float
    peak_mem_mib: float
    asked_mem_mib: int
    card_mem_mib: int
    sampled_h: float
    sampled_pct: float
    """Share of the job's held card-time covered by usage samples."""
    idle_cost: float
    never_used: bool


@dataclass(frozen=True)
class Recommendation:
    """What to change, about whom, and the measured evidence for it."""

    kind: str
    subjects: tuple[str, ...]
    evidence: str


@dataclass(frozen=True)
class RecommendationRow:
    kind: str
    subjects: str
    evidence: str


@dataclass(frozen=True)
class LatencyRow:
    """A service's p99 history: its levels, and the change point if it drifted."""

    service: str
    samples: int
    mean_p99_ms: float
    before_p99_ms: float
    after_p99_ms: float
    change_pct: float
    changed_at: str
    """UTC ISO time the level moved; empty when no drift was found."""
    drifted: bool


@dataclass(frozen=True)
class WaitRow:
    """Queue wait (submit to first start; still waiting: to the period's end) by kind x team."""

    kind: str
    team: str
    jobs: int
    started: int
    mean_wait_s: float
    p95_wait_s: float
    max_wait_s: float


@dataclass(frozen=True)
class PreemptionRow:
    team: str
    jobs: int
    preempted_jobs: int
    preemptions: int
    lost_gpu_h: float


@dataclass(frozen=True)
class ReasonRow:
    """Why jobs waited: seconds by the scheduler's reason code."""

    reason: str
    jobs: int
    wait_h: float
    share_pct: float


@dataclass(frozen=True)
class CostRow:
    """GPU-hours of one type at its price: the pool's cost, what was allocated, what was
    held but unused, and what nobody held."""

    gpu_type: str
    gpus: int
    price_per_gpu_h: float
    price_from: str
    """"data" (the source's price), "catalogue" (the sizing catalogue's) or "none"."""
    capacity_gpu_h: float
    allocated_gpu_h: float
    used_gpu_h: float
    capacity_cost: float
    allocated_cost: float
    held_unused_cost: float
    unallocated_cost: float


@dataclass(frozen=True)
class EnergyRow:
    """Electricity by local hour of the day at the tariff's hourly price and carbon."""

    hour: int
    kwh: float
    price_per_kwh: float
    cost: float
    carbon_kg: float


@dataclass(frozen=True)
class Summary:
    """The numbers at the top of the review."""

    source: str
    period_from: str
    period_to: str
    days: float
    gpus: int
    capacity_gpu_h: float
    allocated_pct: float
    used_pct: float
    down_pct: float
    gpu_cost: float
    held_unused_cost: float
    energy_kwh: float
    energy_cost: float
    currency: str
    carbon_kg: float | None
    energy_source: str
    """"samples" (power x time x PUE) or "jobs" (their energy_kwh) or "none"."""
    recommendations: int
    tariff: str
    day_window: str
    utc_offset_h: float
    day_allocated_pct: float = 0.0
    """Allocated share of up card-time in the local day window ..."""
    day_used_pct: float = 0.0
    night_allocated_pct: float = 0.0
    """... and outside it."""
    night_used_pct: float = 0.0


@dataclass(frozen=True)
class Table:
    """One section's table: a name (the CSV's file name), a title and its frozen rows."""

    name: str
    title: str
    rows: tuple[Any, ...]
    row_type: type

    def columns(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self.row_type))

    def values(self) -> list[tuple[Any, ...]]:
        cols = self.columns()
        return [tuple(getattr(r, c) for c in cols) for r in self.rows]


@dataclass(frozen=True)
class Review:
    """The whole review: summary, exact reconciliation and one table per section."""

    summary: Summary
    reconciliation: Reconciliation
    gpus: tuple[GpuRow, ...]
    teams: tuple[TeamRow, ...]
    by_type: tuple[TypeRow, ...]
    by_hour: tuple[HourRow, ...]
    jobs: tuple[JobUsageRow, ...]
    recommendations: tuple[Recommendation, ...]
    latency: tuple[LatencyRow, ...]
    latency_series: tuple[tuple[str, tuple[tuple[float, float], ...]], ...]
    """Each service's (t_s, p99_ms) points as the chart draws them."""
    queue_wait: tuple[WaitRow, ...]
    preemptions: tuple[PreemptionRow, ...]
    wait_reasons: tuple[ReasonRow, ...]
    cost_by_type: tuple[CostRow, ...]
    energy_by_hour: tuple[EnergyRow, ...]
    rules: ReviewRules = field(default_factory=ReviewRules)

    def recommendations_of(self, kind: str) -> tuple[Recommendation, ...]:
        return tuple(r for r in self.recommendations if r.kind == kind)

    def tables(self) -> tuple[Table, ...]:
        """Every table, in the order the HTML shows them; the CSVs are these."""
        recs = tuple(
            RecommendationRow(r.kind, " ".join(r.subjects), r.evidence)
            for r in self.recommendations
        )
        return (
            Table("recommendations", "Recommendations", recs, RecommendationRow),
            Table("reconciliation_gpus", "Capacity split per GPU", self.gpus, GpuRow),
            Table("teams", "Allocated vs used per team", self.teams, TeamRow),
            Table("utilisation_by_type", "Utilisation by GPU type", self.by_type, TypeRow),
            Table("utilisation_by_hour", "Utilisation by local hour", self.by_hour, HourRow),
            Table("jobs", "Allocated vs used per job", self.jobs, JobUsageRow),
            Table("latency", "Service p99 latency", self.latency, LatencyRow),
            Table("queue_wait", "Queue wait by kind and team", self.queue_wait, WaitRow),
            Table("preemptions", "Preemptions and work lost", self.preemptions, PreemptionRow),
            Table("wait_reasons", "Why jobs waited", self.wait_reasons, ReasonRow),
            Table("cost_by_type", "GPU cost by type", self.cost_by_type, CostRow),
            Table("energy_by_hour", "Electricity by local hour", self.energy_by_hour, EnergyRow),
        )

"""The monthly review: what the pool was given, what it used, what it cost, what to change.

`build_review` is pure: it reads one `ReviewData` (from the live database or a simulation)
and returns a `Review` of frozen rows, one table per section, that the HTML charts and the
CSV writes. Reconciliation is exact: every GPU's period is split into allocated, idle and
down in integer milli-GPU x milliseconds, so allocated + idle + down == capacity and the
teams' allocated sums to the cluster's without rounding. Measured use (SM %, memory) comes
from the per-card usage samples, attributed to the jobs holding the card in proportion to
their share x overlap. Recommendations carry evidence sentences with the numbers in them.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Any, ClassVar

from gpupool.errors import GpupoolError, SpecError
from gpupool.reports.review_data import (
    Allocation,
    GpuRecord,
    JobReview,
    LatencySample,
    ReviewData,
    UsageSample,
)

MS_PER_HOUR = 3_600_000
MILLI = 1000
UNKNOWN_TEAM = "(unknown)"
ONLINE_KIND = "online-inference"
"""JobKind.ONLINE's value: the core lets online inference share a card only with online."""
RECOMMENDATION_KINDS = (
    "never-used",
    "reclaimable-card",
    "share-a-card",
    "right-size",
    "latency-drift",
)


@dataclass(frozen=True)
class ReviewRules:
    """The thresholds the recommendations fire at (docs/review.md explains each)."""

    min_sampled_frac: float = 0.5
    """A job's recommendations need usage samples over at least this share of its held time."""
    reclaimable_mean_sm_pct: float = 30.0
    """A card whose mean SM utilisation over its up time is under this is reclaimable."""
    never_used_sm_pct: float = 1.0
    """A job whose attributed SM stayed under this on every sample never used its GPU ..."""
    never_used_mem_frac: float = 0.02
    """... and whose attributed memory stayed under this fraction of the card."""
    share_mem_headroom_frac: float = 0.10
    """Two jobs share a card when their peak memories sum to at most card x (1 - this) ..."""
    share_sm_sum_pct: float = 100.0
    """... and their mean SM percentages sum to at most this ..."""
    share_min_overlap_frac: float = 0.5
    """... and they ran together for at least this fraction of the shorter one's time."""
    right_size_ratio: float = 2.0
    """A job that asked at least this many times its measured peak memory is over-asking."""
    right_size_headroom_frac: float = 0.2
    """The plain suggestion asks for the measured peak plus this much."""
    drift_min_change_frac: float = 0.20
    """A p99 level change of at least this fraction (that stays) is a drift."""
    drift_penalty: float = 3.0
    """Change-point penalty, in noise variance x log(n) (ruptures KernelCPD, l2 cost)."""
    drift_min_points: int = 6
    """Fewer latency buckets than this per side: no drift is claimed."""
    drift_max_points: int = 720
    """Latency series longer than this are averaged into this many buckets for ruptures."""

    def __post_init__(self) -> None:
        if not self.right_size_ratio > 0:
            raise SpecError("right_size_ratio must be > 0")
        if not 0 <= self.share_mem_headroom_frac < 1:
            raise SpecError("share_mem_headroom_frac must be in [0, 1)")
        if self.drift_min_points < 2:
            raise SpecError("drift_min_points must be at least 2")


# ---- rows ---------------------------------------------------------------------------------
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
class JobRow:
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
    jobs: tuple[JobRow, ...]
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
            Table("jobs", "Allocated vs used per job", self.jobs, JobRow),
            Table("latency", "Service p99 latency", self.latency, LatencyRow),
            Table("queue_wait", "Queue wait by kind and team", self.queue_wait, WaitRow),
            Table("preemptions", "Preemptions and work lost", self.preemptions, PreemptionRow),
            Table("wait_reasons", "Why jobs waited", self.wait_reasons, ReasonRow),
            Table("cost_by_type", "GPU cost by type", self.cost_by_type, CostRow),
            Table("energy_by_hour", "Electricity by local hour", self.energy_by_hour, EnergyRow),
        )


# ---- helpers -----------------------------------------------------------------------------
def _ms(t_s: float) -> int:
    return round(t_s * 1000)


def _h(mgpu_ms: int) -> float:
    return round(mgpu_ms / (MILLI * MS_PER_HOUR), 6)


def _r(x: float, digits: int = 4) -> float:
    return round(x, digits)


def _pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 3) if whole > 0 else 0.0


def iso(t_s: float) -> str:
    """UTC ISO time to the second, e.g. 2026-11-14T09:00:00Z."""
    return datetime.fromtimestamp(round(t_s), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _merge(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _overlap_with(merged: Sequence[tuple[int, int]], a: int, b: int) -> int:
    """Milliseconds of [a, b) covered by the sorted disjoint intervals `merged`."""
    total = 0
    for x, y in merged:
        if y <= a:
            continue
        if x >= b:
            break
        total += min(b, y) - max(a, x)
    return total


def _up_parts(merged_down: Sequence[tuple[int, int]], a: int, b: int) -> list[tuple[int, int]]:
    """[a, b) minus the down intervals."""
    parts: list[tuple[int, int]] = []
    cur = a
    for x, y in merged_down:
        if y <= cur:
            continue
        if x >= b:
            break
        if x > cur:
            parts.append((cur, x))
        cur = max(cur, y)
    if cur < b:
        parts.append((cur, b))
    return parts


def _hour_split(a_s: float, b_s: float, offset_s: float) -> Iterable[tuple[int, float]]:
    """(local hour of day, seconds) pieces of [a_s, b_s)."""
    t = a_s
    while t < b_s:
        local = t + offset_s
        hour_start = math.floor(local / 3600.0) * 3600.0
        nxt = min(b_s, hour_start + 3600.0 - offset_s)
        if nxt <= t:  # float guard
            nxt = b_s
        yield int((hour_start / 3600.0) % 24), nxt - t
        t = nxt


def _hour_of(t_s: float, offset_s: float) -> int:
    return int(math.floor((t_s + offset_s) / 3600.0) % 24)


def _p95(values: Sequence[float]) -> float:
    """Nearest-rank 95th percentile."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def _in_day(hour: int, window: tuple[int, int]) -> bool:
    lo, hi = window
    return lo <= hour < hi if lo <= hi else (hour >= lo or hour < hi)


def _gib(mib: float) -> str:
    return f"{mib / 1024:.1f} GiB"


# ---- measured use per job ----------------------------------------------------------------
@dataclass
class _Use:
    """Running sums of one job's attributed measurements."""

    overlap_s: float = 0.0
    used_gpu_s: float = 0.0
    sm_weighted: float = 0.0
    mem_weighted: float = 0.0
    peak_sm: float = 0.0
    peak_mem: float = 0.0
    samples: int = 0


@dataclass
class _CardUse:
    used_gpu_s: float = 0.0
    sampled_s: float = 0.0
    by_hour: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    energy_by_hour: dict[int, float] = field(default_factory=lambda: defaultdict(float))


def _attribute(
    gpu_samples: Sequence[UsageSample],
    gpu_allocs: Sequence[Allocation],
    start_s: float,
    end_s: float,
    offset_s: float,
    uses: dict[str, _Use],
    card: _CardUse,
) -> None:
    """Sweep one card's samples against its allocations (both sorted by time)."""
    allocs = sorted(gpu_allocs, key=lambda a: (a.start_s, a.end_s, a.job_id))
    nxt = 0
    active: list[Allocation] = []
    for s in sorted(gpu_samples, key=lambda s: s.t_s):
        a_s = max(s.t_s, start_s)
        b_s = min(s.t_s + s.period_s, end_s)
        if b_s <= a_s:
            continue
        dur = b_s - a_s
        while nxt < len(allocs) and allocs[nxt].start_s < b_s:
            active.append(allocs[nxt])
            nxt += 1
        active = [a for a in active if a.end_s > a_s]
        sm = max(0.0, s.sm_util_pct)
        mem = max(0.0, s.mem_used_mib)
        card.used_gpu_s += sm / 100.0 * dur
        card.sampled_s += dur
        hour_end = math.floor((a_s + offset_s) / 3600.0) * 3600.0 + 3600.0 - offset_s
        if b_s <= hour_end:
            hour = _hour_of(a_s, offset_s)
            card.by_hour[hour] += sm / 100.0 * dur
            if s.power_w is not None:
                card.energy_by_hour[hour] += s.power_w * dur
        else:
            for hour, secs in _hour_split(a_s, b_s, offset_s):
                card.by_hour[hour] += sm / 100.0 * secs
                if s.power_w is not None:
                    card.energy_by_hour[hour] += s.power_w * secs
        weights = []
        for a in active:
            ov = min(b_s, a.end_s) - max(a_s, a.start_s)
            if ov > 0:
                weights.append((a, ov, a.share_milli * ov))
        total_w = sum(w for _, _, w in weights)
        for a, ov, w in weights:
            phi = w / total_w if total_w > 0 else 0.0
            u = uses[a.job_id]
            u.overlap_s += ov
            u.used_gpu_s += phi * sm / 100.0 * dur
            u.sm_weighted += phi * sm * ov
            u.mem_weighted += phi * mem * ov
            u.peak_sm = max(u.peak_sm, phi * sm)
            u.peak_mem = max(u.peak_mem, phi * mem)
            u.samples += 1


# ---- recommendations ---------------------------------------------------------------------
def _planner_suggestion(job: JobReview) -> str:
    """`gpupool plan`'s cheapest option that fits, for a job naming a known model; else ''."""
    if not job.model:
        return ""
    task = "training" if job.kind == "training" else "inference"
    return _planned(job.model, task, max(1, job.gpu_count))


@functools.lru_cache(maxsize=256)
def _planned(model: str, task: str, count: int) -> str:
    """One planner run per (model, task, count): a month has many jobs of one model."""
    try:
        from gpupool.sizing.planner import PlanRequest, plan
        from gpupool.sizing.shapes import get_shape

        shape = get_shape(model)
        options = plan(PlanRequest(shape=shape, task=task, counts=(count,)))
    except GpupoolError:
        return ""
    fitting = [o for o in options if o.fits]
    if not fitting:
        return ""
    best = fitting[0]
    return (
        f"`gpupool plan --model {shape.name} --task {task}` suggests {best.count} x "
        f"{best.gpu} at {best.mem_per_gpu_gib:.1f} GiB per GPU "
        f"(${best.cost_per_hour_usd:.2f}/h, for batch 1 at context 4096); "
    )


def _drift(
    points: Sequence[tuple[float, float]], rules: ReviewRules
) -> tuple[float, float, float] | None:
    """(changed_at_s, before_ms, after_ms) of the largest lasting p99 level change, or None."""
    import numpy as np
    import ruptures as rpt  # type: ignore[import-untyped]

    n = len(points)
    if n < 2 * rules.drift_min_points:
        return None
    ts = np.array([p[0] for p in points], dtype=float)
    ys = np.array([p[1] for p in points], dtype=float)
    # Average long series into buckets so the search stays fast; refine the date on raw points.
    k = max(1, math.ceil(n / rules.drift_max_points))
    m = n // k
    if m < 2 * rules.drift_min_points:
        return None
    yb = ys[: m * k].reshape(m, k).mean(axis=1)
    diffs = np.diff(yb)
    sigma = 1.4826 * float(np.median(np.abs(diffs - np.median(diffs)))) / math.sqrt(2.0)
    floor = 0.01 * float(np.median(yb))
    var = max(sigma, floor, 1e-9) ** 2
    pen = rules.drift_penalty * var * math.log(m)
    algo = rpt.KernelCPD(kernel="linear", min_size=rules.drift_min_points).fit(yb.reshape(-1, 1))
    bkps = [b for b in algo.predict(pen=pen) if b < m]
    best: tuple[float, float, float, float] | None = None
    edges = [0, *bkps, m]
    for i, b in enumerate(bkps, start=1):
        before = float(np.median(yb[edges[i - 1] : b]))
        after = float(np.median(yb[b : edges[i + 1]]))
        history = float(np.median(yb[:b]))
        rest = float(np.median(yb[b:]))
        if before <= 0 or history <= 0:
            continue
        # It moved (segment to segment) and stayed (all before against all after): a spike
        # that comes back moves but does not stay.
        move = (after - before) / before
        stays = (rest - history) / history
        if abs(move) < rules.drift_min_change_frac or abs(stays) < rules.drift_min_change_frac:
            continue
        if (move > 0) != (stays > 0):
            continue
        # Refine: the best single split of the raw points in the two buckets around b.
        lo, hi = max(0, (b - 1) * k), min(n, (b + 1) * k)
        seg = ys[lo:hi]
        split = b * k
        if len(seg) >= 2:
            c1 = np.cumsum(seg)
            c2 = np.cumsum(seg**2)
            best_cost = math.inf
            for j in range(1, len(seg)):
                left = c2[j - 1] - c1[j - 1] ** 2 / j
                rn = len(seg) - j
                right = (c2[-1] - c2[j - 1]) - (c1[-1] - c1[j - 1]) ** 2 / rn
                cost = float(left + right)
                if cost < best_cost - 1e-12:
                    best_cost, split = cost, lo + j
        if best is None or abs(move) > abs(best[3]):
            best = (float(ts[split]), before, after, move)
    if best is None:
        return None
    return best[0], best[1], best[2]


# ---- the review --------------------------------------------------------------------------
def absolute(data: ReviewData) -> ReviewData:
    """`data` with every time in Unix seconds: a simulation's times shifted by its origin."""
    o = data.origin_s
    if o == 0:
        return data
    return replace(
        data,
        start_s=data.start_s + o,
        end_s=data.end_s + o,
        allocations=tuple(
            replace(a, start_s=a.start_s + o, end_s=a.end_s + o) for a in data.allocations
        ),
        down=tuple(replace(d, start_s=d.start_s + o, end_s=d.end_s + o) for d in data.down),
        jobs=tuple(
            replace(
                j,
                submit_s=j.submit_s + o,
                first_start_s=None if j.first_start_s is None else j.first_start_s + o,
                end_s=None if j.end_s is None else j.end_s + o,
            )
            for j in data.jobs
        ),
        usage=tuple(replace(u, t_s=u.t_s + o) for u in data.usage),
        latency=tuple(replace(x, t_s=x.t_s + o) for x in data.latency),
        origin_s=0.0,
    )


def card_mem_mib(gpu: GpuRecord) -> int:
    """The card's memory: as recorded, else the catalogue's for its type (0: unknown)."""
    if gpu.mem_total_mib > 0:
        return gpu.mem_total_mib
    return _catalogue_mem_mib(gpu.gpu_type)


@functools.lru_cache(maxsize=64)
def _catalogue_price(gpu_type: str) -> float:
    """The catalogue's typical on-demand USD per GPU-hour, for types the data has no price
    for (0 for a type the catalogue does not know)."""
    from gpupool.sizing.catalog import load_catalog

    catalog = load_catalog()
    return float(catalog[gpu_type].price_usd_per_hour) if gpu_type in catalog else 0.0


@functools.lru_cache(maxsize=64)
def _catalogue_mem_mib(gpu_type: str) -> int:
    from gpupool.sizing.catalog import load_catalog

    catalog = load_catalog()
    return round(catalog[gpu_type].memory_gib * 1024) if gpu_type in catalog else 0


def _check_not_overfull(
    gpu_id: str, allocs: Sequence[Allocation], start_ms: int, end_ms: int
) -> None:
    """SpecError where the card's shares add up to more than the card for over a GPU-second
    in all: double-counted allocations would inflate every number (rounding-sized overlaps
    of one job ending as the next starts are let through)."""
    events: dict[int, int] = defaultdict(int)
    for a in allocs:
        a0, b0 = max(_ms(a.start_s), start_ms), min(_ms(a.end_s), end_ms)
        if b0 > a0:
            events[a0] += a.share_milli
            events[b0] -= a.share_milli
    level = excess = 0
    first: int | None = None
    prev = start_ms
    for t in sorted(events):
        if level > MILLI:
            excess += (level - MILLI) * (t - prev)
            first = prev if first is None else first
        level += events[t]
        prev = t
    if excess > MILLI * 1000 and first is not None:
        raise SpecError(
            f"GPU {gpu_id} is allocated more than the whole card from {iso(first / 1000)} "
            f"({excess / (MILLI * 1000):.0f} GPU-seconds over in all): the review data's "
            "allocations overlap; check their intervals and share_milli"
        )


def build_review(data: ReviewData, rules: ReviewRules | None = None) -> Review:
    """The review of `data` over its own period (see the module docstring). Times are read
    as Unix seconds after adding `data.origin_s` (a simulation's t=0)."""
    rules = ReviewRules() if rules is None else rules
    data = absolute(data)
    start_ms, end_ms = _ms(data.start_s), _ms(data.end_s)
    start_s, end_s = start_ms / 1000.0, end_ms / 1000.0
    offset_s = data.utc_offset_h * 3600.0
    gpus = sorted(data.gpus, key=lambda g: g.gpu_id)
    by_id: dict[str, GpuRecord] = {}
    for g in gpus:
        if g.gpu_id in by_id:
            raise SpecError(f"review data lists GPU {g.gpu_id} twice; each card once")
        by_id[g.gpu_id] = g
    jobs = {j.job_id: j for j in data.jobs}

    down_by_gpu: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for d in data.down:
        if d.gpu_id in by_id:
            down_by_gpu[d.gpu_id].append((max(_ms(d.start_s), start_ms), min(_ms(d.end_s), end_ms)))
    merged_down = {gid: _merge(v) for gid, v in down_by_gpu.items()}

    allocs_by_gpu: dict[str, list[Allocation]] = defaultdict(list)
    for a in data.allocations:
        if a.gpu_id not in by_id:
            raise SpecError(
                f"allocation of job {a.job_id} names GPU {a.gpu_id}, which the review data "
                "does not list; add the card to `gpus`"
            )
        if not 0 < a.share_milli <= MILLI:
            raise SpecError(
                f"allocation of job {a.job_id}: share_milli {a.share_milli} not in 1..1000"
            )
        allocs_by_gpu[a.gpu_id].append(a)

    # Exact split, per allocation (clipped to the period, less the card's down time).
    job_alloc: dict[str, int] = defaultdict(int)
    team_alloc: dict[str, int] = defaultdict(int)
    job_gpus: dict[str, set[str]] = defaultdict(set)
    job_held_ms: dict[str, int] = defaultdict(int)
    gpu_alloc: dict[str, int] = defaultdict(int)
    alloc_hours: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for gid, allocs in allocs_by_gpu.items():
        md = merged_down.get(gid, [])
        for a in allocs:
            a0, b0 = max(_ms(a.start_s), start_ms), min(_ms(a.end_s), end_ms)
            if b0 <= a0:
                continue
            held = (b0 - a0) - _overlap_with(md, a0, b0)
            amount = a.share_milli * held
            job_alloc[a.job_id] += amount
            gpu_alloc[gid] += amount
            job = jobs.get(a.job_id)
            team_alloc[job.team if job else UNKNOWN_TEAM] += amount
            job_gpus[a.job_id].add(gid)
            job_held_ms[a.job_id] += held
            for x, y in _up_parts(md, a0, b0):
                for hour, secs in _hour_split(x / 1000.0, y / 1000.0, offset_s):
                    alloc_hours[a.job_id][hour] += secs * a.share_milli / MILLI

    gpu_rows: list[GpuRow] = []
    cap_total = alloc_total = down_total = 0
    cards: dict[str, _CardUse] = {}
    uses: dict[str, _Use] = defaultdict(_Use)
    samples_by_gpu: dict[str, list[UsageSample]] = defaultdict(list)
    for s in data.usage:
        if s.gpu_id in by_id:
            samples_by_gpu[s.gpu_id].append(s)
    cap_hours: dict[int, float] = defaultdict(float)
    for g in gpus:
        md = merged_down.get(g.gpu_id, [])
        capacity = MILLI * (end_ms - start_ms)
        down = MILLI * sum(b - a for a, b in md)
        allocated = gpu_alloc.get(g.gpu_id, 0)
        idle = capacity - down - allocated
        _check_not_overfull(g.gpu_id, allocs_by_gpu.get(g.gpu_id, []), start_ms, end_ms)
        card = _CardUse()
        _attribute(
            samples_by_gpu.get(g.gpu_id, []),
            allocs_by_gpu.get(g.gpu_id, []),
            start_s,
            end_s,
            offset_s,
            uses,
            card,
        )
        cards[g.gpu_id] = card
        up_s = (capacity - down) / MILLI / 1000.0
        for x, y in _up_parts(md, start_ms, end_ms):
            for hour, secs in _hour_split(x / 1000.0, y / 1000.0, offset_s):
                cap_hours[hour] += secs
        cap_total += capacity
        alloc_total += allocated
        down_total += down
        gpu_rows.append(
            GpuRow(
                gpu_id=g.gpu_id,
                gpu_type=g.gpu_type,
                capacity_mgpu_ms=capacity,
                allocated_mgpu_ms=allocated,
                idle_mgpu_ms=idle,
                down_mgpu_ms=down,
                capacity_gpu_h=_h(capacity),
                allocated_gpu_h=_h(allocated),
                idle_gpu_h=_h(idle),
                down_gpu_h=_h(down),
                used_gpu_h=_r(card.used_gpu_s / 3600.0),
                allocated_pct=_pct(allocated, capacity - down),
                mean_sm_pct=_r(100.0 * card.used_gpu_s / up_s, 3) if up_s > 0 else 0.0,
                sampled_pct=_r(min(100.0, 100.0 * card.sampled_s / up_s), 3) if up_s > 0 else 0.0,
            )
        )
    recon = Reconciliation(
        capacity=cap_total,
        allocated=alloc_total,
        idle=cap_total - alloc_total - down_total,
        down=down_total,
        by_team=tuple(sorted(team_alloc.items())),
    )

    # Per job: allocated vs used.
    prices = {
        g.gpu_type: data.gpu_price_per_hour.get(g.gpu_type, _catalogue_price(g.gpu_type))
        for g in gpus
    }
    job_rows: list[JobRow] = []
    job_row_by_id: dict[str, JobRow] = {}
    for job_id in sorted(set(job_alloc) | {j.job_id for j in data.jobs if j.job_id in job_alloc}):
        job = jobs.get(job_id)
        u = uses.get(job_id, _Use())
        gids = sorted(job_gpus[job_id])
        types = sorted({by_id[g].gpu_type for g in gids})
        card_mem = min((card_mem_mib(by_id[g]) for g in gids), default=0)
        alloc_h = _h(job_alloc[job_id])
        used_h = u.used_gpu_s / 3600.0
        price = statistics.fmean(prices.get(t, 0.0) for t in types) if types else 0.0
        shares = [a.share_milli for g in gids for a in allocs_by_gpu[g] if a.job_id == job_id]
        share = max(shares) if shares else MILLI
        if job is not None and job.gpu_mem_mib is not None:
            asked = int(job.gpu_mem_mib)
        else:
            asked = card_mem * share // MILLI
        sampled = u.samples > 0
        held_s = job_held_ms[job_id] / 1000.0
        covered = min(1.0, u.overlap_s / held_s) if held_s > 0 else 0.0
        never = (
            sampled
            and covered >= rules.min_sampled_frac
            and card_mem > 0
            and u.peak_sm < rules.never_used_sm_pct
            and u.peak_mem < rules.never_used_mem_frac * card_mem
        )
        row = JobRow(
            job_id=job_id,
            team=job.team if job else UNKNOWN_TEAM,
            kind=job.kind if job else "",
            gpu_count=job.gpu_count if job else len(gids),
            gpu_type=",".join(types),
            allocated_gpu_h=alloc_h,
            used_gpu_h=_r(used_h),
            used_pct=_pct(used_h, alloc_h),
            mean_sm_pct=_r(u.sm_weighted / u.overlap_s, 3) if sampled else -1.0,
            peak_sm_pct=_r(u.peak_sm, 3) if sampled else -1.0,
            mean_mem_mib=_r(u.mem_weighted / u.overlap_s, 1) if sampled else -1.0,
            peak_mem_mib=_r(u.peak_mem, 1) if sampled else -1.0,
            asked_mem_mib=asked,
            card_mem_mib=card_mem,
            sampled_h=_r(u.overlap_s / 3600.0),
            sampled_pct=_r(100.0 * covered, 3),
            idle_cost=_r(max(0.0, alloc_h - used_h) * price, 2) if sampled else 0.0,
            never_used=bool(never),
        )
        job_rows.append(row)
        job_row_by_id[job_id] = row

    # Teams.
    team_names = sorted(set(team_alloc) | {j.team for j in data.jobs})
    team_rows = []
    for t in team_names:
        rows = [r for r in job_rows if r.team == t]
        used = sum(r.used_gpu_h for r in rows)
        alloc_h = _h(team_alloc.get(t, 0))
        team_rows.append(
            TeamRow(
                team=t,
                jobs=len(
                    {r.job_id for r in rows}
                    | {j.job_id for j in data.jobs if j.team == t and start_s <= j.submit_s < end_s}
                ),
                allocated_mgpu_ms=team_alloc.get(t, 0),
                allocated_gpu_h=alloc_h,
                allocated_share_pct=_pct(team_alloc.get(t, 0), alloc_total),
                used_gpu_h=_r(used),
                used_pct=_pct(used, alloc_h),
                idle_cost=_r(sum(r.idle_cost for r in rows), 2),
            )
        )

    # GPU types.
    type_rows = []
    cost_rows = []
    for gt in sorted({g.gpu_type for g in gpus}):
        rows_t = [r for r in gpu_rows if r.gpu_type == gt]
        cap = sum(r.capacity_mgpu_ms for r in rows_t)
        dn = sum(r.down_mgpu_ms for r in rows_t)
        al = sum(r.allocated_mgpu_ms for r in rows_t)
        used = sum(cards[r.gpu_id].used_gpu_s for r in rows_t) / 3600.0
        type_rows.append(
            TypeRow(
                gpu_type=gt,
                gpus=len(rows_t),
                capacity_gpu_h=_h(cap),
                down_gpu_h=_h(dn),
                allocated_gpu_h=_h(al),
                used_gpu_h=_r(used),
                allocated_pct=_pct(al, cap - dn),
                used_pct=_pct(used, _h(cap - dn)),
            )
        )
        price = prices.get(gt, 0.0)
        held_used = sum(min(r.used_gpu_h, r.allocated_gpu_h) for r in job_rows if r.gpu_type == gt)
        cost_rows.append(
            CostRow(
                gpu_type=gt,
                gpus=len(rows_t),
                price_per_gpu_h=price,
                price_from=(
                    "data"
                    if gt in data.gpu_price_per_hour
                    else ("catalogue" if price > 0 else "none")
                ),
                capacity_gpu_h=_h(cap),
                allocated_gpu_h=_h(al),
                used_gpu_h=_r(used),
                capacity_cost=_r(_h(cap) * price, 2),
                allocated_cost=_r(_h(al) * price, 2),
                held_unused_cost=_r(max(0.0, _h(al) - held_used) * price, 2),
                unallocated_cost=_r(_h(cap - dn - al) * price, 2),
            )
        )

    # Hours of the day.
    alloc_by_hour: dict[int, float] = defaultdict(float)
    for per in alloc_hours.values():
        for hour, secs in per.items():
            alloc_by_hour[hour] += secs
    used_by_hour: dict[int, float] = defaultdict(float)
    for card in cards.values():
        for hour, secs in card.by_hour.items():
            used_by_hour[hour] += secs
    hour_rows = tuple(
        HourRow(
            hour=h,
            window="day" if _in_day(h, data.day_window) else "night",
            capacity_gpu_h=_r(cap_hours[h] / 3600.0),
            allocated_gpu_h=_r(alloc_by_hour[h] / 3600.0),
            used_gpu_h=_r(used_by_hour[h] / 3600.0),
            allocated_pct=_pct(alloc_by_hour[h], cap_hours[h]),
            used_pct=_pct(used_by_hour[h], cap_hours[h]),
        )
        for h in range(24)
    )

    # Latency.
    series_by: dict[str, list[LatencySample]] = defaultdict(list)
    for ls in data.latency:
        if start_s <= ls.t_s < end_s:
            series_by[ls.service].append(ls)
    latency_rows = []
    latency_series = []
    drifts: dict[str, tuple[float, float, float]] = {}
    for svc in sorted(series_by):
        pts = tuple((p.t_s, p.p99_ms) for p in sorted(series_by[svc], key=lambda p: p.t_s))
        latency_series.append((svc, pts))
        found = _drift(pts, rules)
        mean = statistics.fmean(p for _, p in pts)
        if found is not None:
            drifts[svc] = found
            at, before, after = found
            latency_rows.append(
                LatencyRow(
                    svc,
                    len(pts),
                    _r(mean, 3),
                    _r(before, 3),
                    _r(after, 3),
                    _pct(after - before, before),
                    iso(at),
                    True,
                )
            )
        else:
            med = statistics.median(p for _, p in pts)
            latency_rows.append(
                LatencyRow(svc, len(pts), _r(mean, 3), _r(med, 3), _r(med, 3), 0.0, "", False)
            )

    recs = _recommend(data, rules, gpu_rows, job_rows, allocs_by_gpu, by_id, jobs, drifts)

    # Queueing.
    in_period = [j for j in data.jobs if start_s <= j.submit_s < end_s]
    waits: dict[tuple[str, str], list[float]] = defaultdict(list)
    started: dict[tuple[str, str], int] = defaultdict(int)
    for j in in_period:
        until = j.first_start_s if j.first_start_s is not None else end_s
        w = max(0.0, min(until, end_s) - j.submit_s)
        for key in ((j.kind, j.team), (j.kind, "(all)")):
            waits[key].append(w)
            started[key] += j.first_start_s is not None
    wait_rows = tuple(
        WaitRow(
            kind=k,
            team=t,
            jobs=len(ws),
            started=started[(k, t)],
            mean_wait_s=_r(statistics.fmean(ws), 3),
            p95_wait_s=_r(_p95(ws), 3),
            max_wait_s=_r(max(ws), 3),
        )
        for (k, t), ws in sorted(waits.items())
    )
    pre_rows = []
    for t in sorted({j.team for j in in_period}):
        tj = [j for j in in_period if j.team == t]
        pre_rows.append(
            PreemptionRow(
                team=t,
                jobs=len(tj),
                preempted_jobs=sum(1 for j in tj if j.preemptions > 0),
                preemptions=sum(j.preemptions for j in tj),
                lost_gpu_h=_r(sum(j.lost_gpu_s for j in tj) / 3600.0),
            )
        )
    reason_s: dict[str, float] = defaultdict(float)
    reason_jobs: dict[str, int] = defaultdict(int)
    for j in in_period:
        for reason, secs in j.wait_s_by_reason.items():
            reason_s[reason] += secs
            reason_jobs[reason] += 1
    reason_total = sum(reason_s.values())
    reason_rows = tuple(
        ReasonRow(r, reason_jobs[r], _r(reason_s[r] / 3600.0), _pct(reason_s[r], reason_total))
        for r in sorted(reason_s, key=lambda r: (-reason_s[r], r))
    )

    # Energy.
    tariff = data.tariff
    energy_j: dict[int, float] = defaultdict(float)
    has_power = any(s.power_w is not None for s in data.usage)
    energy_source = "none"
    pue = tariff.pue if tariff is not None else 1.0
    kwh_by_hour: dict[int, float] = defaultdict(float)
    if has_power:
        energy_source = "samples"
        for card in cards.values():
            for hour, joules in card.energy_by_hour.items():
                energy_j[hour] += joules
        for hour, joules in energy_j.items():
            kwh_by_hour[hour] = joules / 3.6e6 * pue
    elif any(j.energy_kwh is not None for j in data.jobs):
        energy_source = "jobs"
        for j in data.jobs:
            if j.energy_kwh is None:
                continue
            per = alloc_hours.get(j.job_id, {})
            total = sum(per.values())
            if total <= 0:
                continue
            for hour, secs in per.items():
                kwh_by_hour[hour] += j.energy_kwh * secs / total
    energy_rows = []
    for h in range(24):
        price = _hourly(tariff.price_per_kwh, h) if tariff is not None else 0.0
        carbon = _hourly(tariff.carbon_g_per_kwh, h) if tariff is not None else 0.0
        kwh = kwh_by_hour.get(h, 0.0)
        energy_rows.append(
            EnergyRow(h, _r(kwh), price, _r(kwh * price, 4), _r(kwh * carbon / 1000.0, 4))
        )

    capacity_h = _h(cap_total)
    window: dict[str, list[float]] = {"day": [0.0, 0.0, 0.0], "night": [0.0, 0.0, 0.0]}
    for h in range(24):
        part = window["day" if _in_day(h, data.day_window) else "night"]
        part[0] += cap_hours[h]
        part[1] += alloc_by_hour[h]
        part[2] += used_by_hour[h]
    up_h = _h(cap_total - down_total)
    used_total = sum(c.used_gpu_s for c in cards.values()) / 3600.0
    summary = Summary(
        source=data.source,
        period_from=iso(start_s),
        period_to=iso(end_s),
        days=_r((end_s - start_s) / 86400.0, 3),
        gpus=len(gpus),
        capacity_gpu_h=capacity_h,
        allocated_pct=_pct(alloc_total, cap_total - down_total),
        used_pct=_pct(used_total, up_h),
        down_pct=_pct(down_total, cap_total),
        gpu_cost=_r(sum(c.capacity_cost for c in cost_rows), 2),
        held_unused_cost=_r(sum(c.held_unused_cost for c in cost_rows), 2),
        energy_kwh=_r(sum(e.kwh for e in energy_rows), 3),
        energy_cost=_r(sum(e.cost for e in energy_rows), 2),
        currency=tariff.currency if tariff is not None else "USD",
        carbon_kg=(
            _r(sum(e.carbon_kg for e in energy_rows), 3)
            if tariff is not None and tariff.carbon_g_per_kwh
            else None
        ),
        energy_source=energy_source,
        recommendations=len(recs),
        tariff=tariff.name if tariff is not None else "",
        day_window=f"{data.day_window[0]:02d}:00-{data.day_window[1]:02d}:00",
        utc_offset_h=data.utc_offset_h,
        day_allocated_pct=_pct(window["day"][1], window["day"][0]),
        day_used_pct=_pct(window["day"][2], window["day"][0]),
        night_allocated_pct=_pct(window["night"][1], window["night"][0]),
        night_used_pct=_pct(window["night"][2], window["night"][0]),
    )
    return Review(
        summary=summary,
        reconciliation=recon,
        gpus=tuple(gpu_rows),
        teams=tuple(team_rows),
        by_type=tuple(type_rows),
        by_hour=hour_rows,
        jobs=tuple(job_rows),
        recommendations=recs,
        latency=tuple(latency_rows),
        latency_series=tuple(latency_series),
        queue_wait=wait_rows,
        preemptions=tuple(pre_rows),
        wait_reasons=reason_rows,
        cost_by_type=tuple(cost_rows),
        energy_by_hour=tuple(energy_rows),
        rules=rules,
    )


def _hourly(values: Sequence[float], hour: int) -> float:
    if not values:
        return 0.0
    return float(values[hour % len(values)]) if len(values) == 24 else float(values[0])


def _recommend(
    data: ReviewData,
    rules: ReviewRules,
    gpu_rows: Sequence[GpuRow],
    job_rows: Sequence[JobRow],
    allocs_by_gpu: dict[str, list[Allocation]],
    by_id: dict[str, GpuRecord],
    jobs: dict[str, JobReview],
    drifts: dict[str, tuple[float, float, float]],
) -> tuple[Recommendation, ...]:
    out: list[Recommendation] = []
    # Never used: measured, yet below the SM and memory floors on every sample.
    for r in job_rows:
        if r.never_used:
            out.append(
                Recommendation(
                    "never-used",
                    (r.job_id,),
                    f"job {r.job_id} ({r.team}) held {r.allocated_gpu_h:.1f} GPU-hours on "
                    f"{r.gpu_type}; over {r.sampled_h:.1f} measured hours its SM peaked at "
                    f"{r.peak_sm_pct:.1f} % and memory at {r.peak_mem_mib:.0f} MiB of "
                    f"{r.card_mem_mib} MiB: it never used its GPU (cost "
                    f"{r.idle_cost:.2f} held idle)",
                )
            )
    # Reclaimable cards: low mean SM over the up time.
    for g in gpu_rows:
        up_h = g.capacity_gpu_h - g.down_gpu_h
        if up_h <= 0 or g.mean_sm_pct >= rules.reclaimable_mean_sm_pct:
            continue
        holders = sorted({a.job_id for a in allocs_by_gpu.get(g.gpu_id, [])})
        held = f"; held by {', '.join(holders[:4])}{' ...' if len(holders) > 4 else ''}"
        out.append(
            Recommendation(
                "reclaimable-card",
                (g.gpu_id,),
                f"GPU {g.gpu_id} ({g.gpu_type}) averaged {g.mean_sm_pct:.1f} % SM over "
                f"{up_h:.0f} up hours (under {rules.reclaimable_mean_sm_pct:.0f} %), "
                f"allocated {g.allocated_pct:.1f} % of the time"
                + (held if holders else "; nobody held it"),
            )
        )
    # Share a card: two single-card, whole-card jobs that ran together and fit one card.
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    whole: dict[str, bool] = defaultdict(lambda: True)
    for allocs in allocs_by_gpu.values():
        for a in allocs:
            spans[a.job_id].append((max(a.start_s, data.start_s), min(a.end_s, data.end_s)))
            if a.share_milli != MILLI:
                whole[a.job_id] = False
    cands = [
        r
        for r in job_rows
        if r.gpu_count == 1
        and whole[r.job_id]
        and not r.never_used
        and r.peak_mem_mib >= 0
        and r.sampled_pct >= 100.0 * rules.min_sampled_frac
        and r.card_mem_mib > 0
    ]
    spans = {k: [(x, y) for x, y in v if y > x] for k, v in spans.items()}
    reach = {
        r.job_id: (min(x for x, _ in spans[r.job_id]), max(y for _, y in spans[r.job_id]))
        for r in cands
        if spans.get(r.job_id)
    }
    cands = sorted(
        (r for r in cands if r.job_id in reach), key=lambda r: (reach[r.job_id], r.job_id)
    )
    pairs: list[tuple[float, str, str, str]] = []
    for i, first in enumerate(cands):
        # Sweep: only jobs that start before this one ends can have run together with it.
        for second in cands[i + 1 :]:
            if reach[second.job_id][0] >= reach[first.job_id][1]:
                break
            ja, jb = sorted((first, second), key=lambda r: r.job_id)
            if (ja.kind == ONLINE_KIND) != (jb.kind == ONLINE_KIND):
                continue  # the core's co-location rule: online shares only with online
            card = min(ja.card_mem_mib, jb.card_mem_mib)
            limit = card * (1.0 - rules.share_mem_headroom_frac)
            if ja.peak_mem_mib + jb.peak_mem_mib > limit:
                continue
            if ja.mean_sm_pct + jb.mean_sm_pct > rules.share_sm_sum_pct:
                continue
            together = sum(
                max(0.0, min(y1, y2) - max(x1, x2))
                for x1, y1 in spans[ja.job_id]
                for x2, y2 in spans[jb.job_id]
            )
            shorter = min(
                sum(y - x for x, y in spans[ja.job_id]), sum(y - x for x, y in spans[jb.job_id])
            )
            if shorter <= 0 or together < rules.share_min_overlap_frac * shorter:
                continue
            text = (
                f"jobs {ja.job_id} and {jb.job_id} each held a whole {ja.gpu_type or 'card'} for "
                f"{together / 3600:.1f} hours together; peak memory {ja.peak_mem_mib:.0f} + "
                f"{jb.peak_mem_mib:.0f} MiB <= {limit:.0f} MiB ({card} MiB less "
                f"{rules.share_mem_headroom_frac:.0%} headroom), mean SM "
                f"{ja.mean_sm_pct:.1f} + {jb.mean_sm_pct:.1f} % <= "
                f"{rules.share_sm_sum_pct:.0f} %: one card would hold both"
            )
            pairs.append((together, ja.job_id, jb.job_id, text))
    taken: set[str] = set()
    for _together, a_id, b_id, text in sorted(pairs, key=lambda p: (-p[0], p[1], p[2])):
        if a_id in taken or b_id in taken:
            continue
        taken.update((a_id, b_id))
        out.append(Recommendation("share-a-card", (a_id, b_id), text))
    # Right-size: asked for at least `ratio` x the measured peak memory.
    for r in job_rows:
        if r.never_used or r.peak_mem_mib < 0 or r.asked_mem_mib <= 0:
            continue
        if r.sampled_pct < 100.0 * rules.min_sampled_frac:
            continue
        peak = max(r.peak_mem_mib, 1.0)
        if r.asked_mem_mib < rules.right_size_ratio * peak:
            continue
        job = jobs.get(r.job_id)
        ask_gib = max(1, math.ceil(peak * (1 + rules.right_size_headroom_frac) / 1024))
        suggestion = _planner_suggestion(job) if job is not None else ""
        out.append(
            Recommendation(
                "right-size",
                (r.job_id,),
                f"job {r.job_id} asks {_gib(r.asked_mem_mib)} per GPU, peaks at "
                f"{_gib(r.peak_mem_mib)} ({r.asked_mem_mib / peak:.1f}x): {suggestion}"
                f"ask {ask_gib} GiB (--gpu-mem {ask_gib}GiB), or quantise the model",
            )
        )
    # Latency drift.
    for svc in sorted(drifts):
        at, before, after = drifts[svc]
        out.append(
            Recommendation(
                "latency-drift",
                (svc,),
                f"service {svc}'s p99 moved from {before:.1f} ms to {after:.1f} ms "
                f"({(after - before) / before:+.0%}) at {iso(at)} and stayed: look at what "
                "changed then (a model or image update, a new replica placement)",
            )
        )
    order = {k: i for i, k in enumerate(RECOMMENDATION_KINDS)}
    return tuple(sorted(out, key=lambda r: (order[r.kind], r.subjects)))

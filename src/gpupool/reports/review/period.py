"""The review's period and its exact split: the data checked and indexed once (cards by
id, down time merged, allocations by card), then every allocation clipped to the period,
less its card's down time, in integer milli-GPU x milliseconds."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

from gpupool.errors import SpecError
from gpupool.reports.review.rules import MILLI, UNKNOWN_TEAM
from gpupool.reports.review.units import hour_split, merge_intervals, overlap_ms, to_ms, up_parts
from gpupool.reports.review_data import Allocation, GpuRecord, JobReview, ReviewData


@dataclass(frozen=True)
class Period:
    """The review's data with times absolute, and the indexes every section reads."""

    data: ReviewData
    start_ms: int
    end_ms: int
    start_s: float
    end_s: float
    offset_s: float
    """The local time's offset from UTC (hour-of-day charts are in local hours)."""
    gpus: list[GpuRecord]
    """Sorted by id."""
    by_id: dict[str, GpuRecord]
    jobs: dict[str, JobReview]
    merged_down: dict[str, list[tuple[int, int]]]
    """Per card, its down intervals clipped to the period and merged (ms)."""
    allocs_by_gpu: dict[str, list[Allocation]]


@dataclass(frozen=True)
class Split:
    """Allocated milli-GPU x ms, per job, team and card; and per job, its cards, the time
    it held them and its allocated seconds by local hour."""

    job_alloc: dict[str, int]
    team_alloc: dict[str, int]
    job_gpus: dict[str, set[str]]
    job_held_ms: dict[str, int]
    gpu_alloc: dict[str, int]
    alloc_hours: dict[str, dict[int, float]]


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


def period_of(data: ReviewData) -> Period:
    """`data` made absolute, checked (each card once; allocations on listed cards with a
    share in 1..1000) and indexed."""
    data = absolute(data)
    start_ms, end_ms = to_ms(data.start_s), to_ms(data.end_s)
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
            down_by_gpu[d.gpu_id].append(
                (max(to_ms(d.start_s), start_ms), min(to_ms(d.end_s), end_ms))
            )
    merged_down = {gid: merge_intervals(v) for gid, v in down_by_gpu.items()}

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
    return Period(
        data=data,
        start_ms=start_ms,
        end_ms=end_ms,
        start_s=start_ms / 1000.0,
        end_s=end_ms / 1000.0,
        offset_s=data.utc_offset_h * 3600.0,
        gpus=gpus,
        by_id=by_id,
        jobs=jobs,
        merged_down=merged_down,
        allocs_by_gpu=allocs_by_gpu,
    )


def split_allocations(p: Period) -> Split:
    """Exact split, per allocation (clipped to the period, less the card's down time)."""
    job_alloc: dict[str, int] = defaultdict(int)
    team_alloc: dict[str, int] = defaultdict(int)
    job_gpus: dict[str, set[str]] = defaultdict(set)
    job_held_ms: dict[str, int] = defaultdict(int)
    gpu_alloc: dict[str, int] = defaultdict(int)
    alloc_hours: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for gid, allocs in p.allocs_by_gpu.items():
        md = p.merged_down.get(gid, [])
        for a in allocs:
            a0, b0 = max(to_ms(a.start_s), p.start_ms), min(to_ms(a.end_s), p.end_ms)
            if b0 <= a0:
                continue
            held = (b0 - a0) - overlap_ms(md, a0, b0)
            amount = a.share_milli * held
            job_alloc[a.job_id] += amount
            gpu_alloc[gid] += amount
            job = p.jobs.get(a.job_id)
            team_alloc[job.team if job else UNKNOWN_TEAM] += amount
            job_gpus[a.job_id].add(gid)
            job_held_ms[a.job_id] += held
            for x, y in up_parts(md, a0, b0):
                for hour, secs in hour_split(x / 1000.0, y / 1000.0, p.offset_s):
                    alloc_hours[a.job_id][hour] += secs * a.share_milli / MILLI
    return Split(job_alloc, team_alloc, job_gpus, job_held_ms, gpu_alloc, alloc_hours)

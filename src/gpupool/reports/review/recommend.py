"""Recommendations: what to change, about whom, with the measured evidence in the
sentence (never-used jobs, reclaimable cards, pairs that could share a card, jobs asking
far more memory than they use, services whose latency drifted)."""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Sequence

from gpupool.errors import GpupoolError
from gpupool.reports.review.rows import GpuRow, JobUsageRow, Recommendation
from gpupool.reports.review.rules import MILLI, ONLINE_KIND, RECOMMENDATION_KINDS, ReviewRules
from gpupool.reports.review.units import iso
from gpupool.reports.review_data import Allocation, GpuRecord, JobReview, ReviewData


def recommend(
    data: ReviewData,
    rules: ReviewRules,
    gpu_rows: Sequence[GpuRow],
    job_rows: Sequence[JobUsageRow],
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
                f"{rules.share_sm_sum_pct:.0f} % (measured over {ja.sampled_h:.1f} and "
                f"{jb.sampled_h:.1f} h each held its card whole): one card would hold both"
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
                f"{_gib(r.peak_mem_mib)} ({r.asked_mem_mib / peak:.1f}x) over the "
                f"{r.sampled_h:.1f} h measured while it held its cards whole "
                f"({r.sampled_pct:.0f} % of its time): {suggestion}"
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


def _gib(mib: float) -> str:
    return f"{mib / 1024:.1f} GiB"

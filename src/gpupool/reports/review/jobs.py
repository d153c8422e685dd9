"""Allocated against used, per job and per team: what each was given (exact) and what its
jobs measurably used (SM-weighted), with the idle cost of the difference."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from gpupool.reports.review.capacity import Cards
from gpupool.reports.review.catalogue import card_mem_mib
from gpupool.reports.review.period import Period, Split
from gpupool.reports.review.rows import JobUsageRow, TeamRow
from gpupool.reports.review.rules import MILLI, UNKNOWN_TEAM, ReviewRules
from gpupool.reports.review.units import gpu_h, pct, rounded
from gpupool.reports.review.usage import JobUse


def job_usage_rows(
    p: Period, split: Split, cards: Cards, prices: dict[str, float], rules: ReviewRules
) -> list[JobUsageRow]:
    """One row per job that held a card in the period."""
    job_rows: list[JobUsageRow] = []
    for job_id in sorted(
        set(split.job_alloc) | {j.job_id for j in p.data.jobs if j.job_id in split.job_alloc}
    ):
        job = p.jobs.get(job_id)
        u = cards.uses.get(job_id, JobUse())
        gids = sorted(split.job_gpus[job_id])
        types = sorted({p.by_id[g].gpu_type for g in gids})
        card_mem = min((card_mem_mib(p.by_id[g]) for g in gids), default=0)
        alloc_h = gpu_h(split.job_alloc[job_id])
        used_h = u.used_gpu_s / 3600.0
        price = statistics.fmean(prices.get(t, 0.0) for t in types) if types else 0.0
        shares = [a.share_milli for g in gids for a in p.allocs_by_gpu[g] if a.job_id == job_id]
        share = max(shares) if shares else MILLI
        if job is not None and job.gpu_mem_mib is not None:
            asked = int(job.gpu_mem_mib)
        else:
            asked = card_mem * share // MILLI
        sampled = u.samples > 0
        held_s = split.job_held_ms[job_id] / 1000.0
        covered = min(1.0, u.overlap_s / held_s) if held_s > 0 else 0.0
        never = (
            sampled
            and covered >= rules.min_sampled_frac
            and card_mem > 0
            and u.peak_sm < rules.never_used_sm_pct
            and u.peak_mem < rules.never_used_mem_frac * card_mem
        )
        row = JobUsageRow(
            job_id=job_id,
            team=job.team if job else UNKNOWN_TEAM,
            kind=job.kind if job else "",
            gpu_count=job.gpu_count if job else len(gids),
            gpu_type=",".join(types),
            allocated_gpu_h=alloc_h,
            used_gpu_h=rounded(used_h),
            used_pct=pct(used_h, alloc_h),
            mean_sm_pct=rounded(u.sm_weighted / u.overlap_s, 3) if sampled else -1.0,
            peak_sm_pct=rounded(u.peak_sm, 3) if sampled else -1.0,
            mean_mem_mib=rounded(u.mem_weighted / u.overlap_s, 1) if sampled else -1.0,
            peak_mem_mib=rounded(u.peak_mem, 1) if sampled else -1.0,
            asked_mem_mib=asked,
            card_mem_mib=card_mem,
            sampled_h=rounded(u.overlap_s / 3600.0),
            sampled_pct=rounded(100.0 * covered, 3),
            idle_cost=rounded(max(0.0, alloc_h - used_h) * price, 2) if sampled else 0.0,
            never_used=bool(never),
        )
        job_rows.append(row)
    return job_rows


def team_rows(
    p: Period, split: Split, job_rows: Sequence[JobUsageRow], alloc_total: int
) -> list[TeamRow]:
    """One row per team that held a card or submitted a job."""
    team_names = sorted(set(split.team_alloc) | {j.team for j in p.data.jobs})
    out = []
    for t in team_names:
        rows = [r for r in job_rows if r.team == t]
        used = sum(r.used_gpu_h for r in rows)
        alloc_h = gpu_h(split.team_alloc.get(t, 0))
        out.append(
            TeamRow(
                team=t,
                jobs=len(
                    {r.job_id for r in rows}
                    | {
                        j.job_id
                        for j in p.data.jobs
                        if j.team == t and p.start_s <= j.submit_s < p.end_s
                    }
                ),
                allocated_mgpu_ms=split.team_alloc.get(t, 0),
                allocated_gpu_h=alloc_h,
                allocated_share_pct=pct(split.team_alloc.get(t, 0), alloc_total),
                used_gpu_h=rounded(used),
                used_pct=pct(used, alloc_h),
                idle_cost=rounded(sum(r.idle_cost for r in rows), 2),
            )
        )
    return out

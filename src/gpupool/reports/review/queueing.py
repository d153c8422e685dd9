"""Queueing: how long jobs waited to start (by kind and team), what preemption cost each
team, and why jobs waited (seconds by the scheduler's reason code)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from gpupool.reports.review.period import Period
from gpupool.reports.review.rows import PreemptionRow, ReasonRow, WaitRow
from gpupool.reports.review.units import p95, pct, rounded


@dataclass(frozen=True)
class Queueing:
    waits: tuple[WaitRow, ...]
    preemptions: list[PreemptionRow]
    reasons: tuple[ReasonRow, ...]


def queue_section(p: Period) -> Queueing:
    """Over the jobs submitted in the period."""
    in_period = [j for j in p.data.jobs if p.start_s <= j.submit_s < p.end_s]
    waits: dict[tuple[str, str], list[float]] = defaultdict(list)
    started: dict[tuple[str, str], int] = defaultdict(int)
    for j in in_period:
        until = j.first_start_s if j.first_start_s is not None else p.end_s
        w = max(0.0, min(until, p.end_s) - j.submit_s)
        for key in ((j.kind, j.team), (j.kind, "(all)")):
            waits[key].append(w)
            started[key] += j.first_start_s is not None
    wait_rows = tuple(
        WaitRow(
            kind=k,
            team=t,
            jobs=len(ws),
            started=started[(k, t)],
            mean_wait_s=rounded(statistics.fmean(ws), 3),
            p95_wait_s=rounded(p95(ws), 3),
            max_wait_s=rounded(max(ws), 3),
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
                lost_gpu_h=rounded(sum(j.lost_gpu_s for j in tj) / 3600.0),
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
        ReasonRow(r, reason_jobs[r], rounded(reason_s[r] / 3600.0), pct(reason_s[r], reason_total))
        for r in sorted(reason_s, key=lambda r: (-reason_s[r], r))
    )
    return Queueing(wait_rows, pre_rows, reason_rows)

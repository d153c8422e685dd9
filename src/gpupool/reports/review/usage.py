"""Measured use: each card's usage samples swept against the allocations holding it, and
attributed to those jobs in proportion to share x overlap.

A sample is a mean over its bucket. Where the card changed hands inside the bucket (a job
started or ended in it, or the card stood idle part of it) that mean mixes the job with
its neighbours or with idle time: a job holding 43 GiB for six minutes of an hour reads
as 4.3 GiB. Such a sample still counts toward the GPU time used (an integral, exact
whatever the split), but a job's means and peaks come only from samples its holders held
whole: those are the job's own figures."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpupool.reports.review.units import hour_of, hour_split
from gpupool.reports.review_data import Allocation, UsageSample


@dataclass
class JobUse:
    """Running sums of one job's attributed measurements. overlap_s, the means and the
    peaks count only samples held whole (see the module doc); used_gpu_s counts all."""

    overlap_s: float = 0.0
    used_gpu_s: float = 0.0
    sm_weighted: float = 0.0
    mem_weighted: float = 0.0
    peak_sm: float = 0.0
    peak_mem: float = 0.0
    samples: int = 0


@dataclass
class CardUse:
    """Running sums of one card's measurements: SM-weighted GPU-seconds, time sampled,
    and both by local hour of the day."""

    used_gpu_s: float = 0.0
    sampled_s: float = 0.0
    by_hour: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    energy_by_hour: dict[int, float] = field(default_factory=lambda: defaultdict(float))


def attribute(
    gpu_samples: Sequence[UsageSample],
    gpu_allocs: Sequence[Allocation],
    start_s: float,
    end_s: float,
    offset_s: float,
    uses: dict[str, JobUse],
    card: CardUse,
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
            hour = hour_of(a_s, offset_s)
            card.by_hour[hour] += sm / 100.0 * dur
            if s.power_w is not None:
                card.energy_by_hour[hour] += s.power_w * dur
        else:
            for hour, secs in hour_split(a_s, b_s, offset_s):
                card.by_hour[hour] += sm / 100.0 * secs
                if s.power_w is not None:
                    card.energy_by_hour[hour] += s.power_w * secs
        weights = []
        whole = True  # the same holders all through the sample
        for a in active:
            ov = min(b_s, a.end_s) - max(a_s, a.start_s)
            if ov > 0:
                weights.append((a, ov, a.share_milli * ov))
                whole = whole and a.start_s <= a_s and a.end_s >= b_s
        total_w = sum(w for _, _, w in weights)
        # the highest memory in the bucket, where the source kept it: a peak, not diluted
        peak_mem = mem if s.mem_peak_mib is None else max(mem, s.mem_peak_mib)
        for a, ov, w in weights:
            phi = w / total_w if total_w > 0 else 0.0
            u = uses[a.job_id]
            u.used_gpu_s += phi * sm / 100.0 * dur
            if not whole:
                continue
            u.overlap_s += ov
            u.sm_weighted += phi * sm * ov
            u.mem_weighted += phi * mem * ov
            u.peak_sm = max(u.peak_sm, phi * sm)
            u.peak_mem = max(u.peak_mem, phi * peak_mem)
            u.samples += 1

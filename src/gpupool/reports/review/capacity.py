"""Capacity per card: each card's period split exactly into allocated, idle and down, its
measured use, and the reconciliation that sums the cards (and the teams) without rounding."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from gpupool.errors import SpecError
from gpupool.reports.review.period import Period, Split
from gpupool.reports.review.rows import GpuRow, Reconciliation
from gpupool.reports.review.rules import MILLI
from gpupool.reports.review.units import gpu_h, hour_split, iso, pct, rounded, to_ms, up_parts
from gpupool.reports.review.usage import CardUse, JobUse, attribute
from gpupool.reports.review_data import Allocation, UsageSample


@dataclass(frozen=True)
class Cards:
    """Every card's row and measured use, the jobs' attributed use, and the totals."""

    rows: list[GpuRow]
    reconciliation: Reconciliation
    card_use: dict[str, CardUse]
    uses: dict[str, JobUse]
    cap_hours: dict[int, float]
    """Up card-seconds per local hour of the day."""
    cap_total: int
    alloc_total: int
    down_total: int


def check_not_overfull(
    gpu_id: str, allocs: Sequence[Allocation], start_ms: int, end_ms: int
) -> None:
    """SpecError where the card's shares add up to more than the card for over a GPU-second
    in all: double-counted allocations would inflate every number (rounding-sized overlaps
    of one job ending as the next starts are let through)."""
    events: dict[int, int] = defaultdict(int)
    for a in allocs:
        a0, b0 = max(to_ms(a.start_s), start_ms), min(to_ms(a.end_s), end_ms)
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


def card_section(p: Period, split: Split) -> Cards:
    """Each card's exact split and measured use (SpecError where a card is overfull)."""
    start_ms, end_ms = p.start_ms, p.end_ms
    gpu_rows: list[GpuRow] = []
    cap_total = alloc_total = down_total = 0
    cards: dict[str, CardUse] = {}
    uses: dict[str, JobUse] = defaultdict(JobUse)
    samples_by_gpu: dict[str, list[UsageSample]] = defaultdict(list)
    for s in p.data.usage:
        if s.gpu_id in p.by_id:
            samples_by_gpu[s.gpu_id].append(s)
    cap_hours: dict[int, float] = defaultdict(float)
    for g in p.gpus:
        md = p.merged_down.get(g.gpu_id, [])
        capacity = MILLI * (end_ms - start_ms)
        down = MILLI * sum(b - a for a, b in md)
        allocated = split.gpu_alloc.get(g.gpu_id, 0)
        idle = capacity - down - allocated
        check_not_overfull(g.gpu_id, p.allocs_by_gpu.get(g.gpu_id, []), start_ms, end_ms)
        card = CardUse()
        attribute(
            samples_by_gpu.get(g.gpu_id, []),
            p.allocs_by_gpu.get(g.gpu_id, []),
            p.start_s,
            p.end_s,
            p.offset_s,
            uses,
            card,
        )
        cards[g.gpu_id] = card
        up_s = (capacity - down) / MILLI / 1000.0
        for x, y in up_parts(md, start_ms, end_ms):
            for hour, secs in hour_split(x / 1000.0, y / 1000.0, p.offset_s):
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
                capacity_gpu_h=gpu_h(capacity),
                allocated_gpu_h=gpu_h(allocated),
                idle_gpu_h=gpu_h(idle),
                down_gpu_h=gpu_h(down),
                used_gpu_h=rounded(card.used_gpu_s / 3600.0),
                allocated_pct=pct(allocated, capacity - down),
                mean_sm_pct=rounded(100.0 * card.used_gpu_s / up_s, 3) if up_s > 0 else 0.0,
                sampled_pct=rounded(min(100.0, 100.0 * card.sampled_s / up_s), 3)
                if up_s > 0
                else 0.0,
            )
        )
    recon = Reconciliation(
        capacity=cap_total,
        allocated=alloc_total,
        idle=cap_total - alloc_total - down_total,
        down=down_total,
        by_team=tuple(sorted(split.team_alloc.items())),
    )
    return Cards(gpu_rows, recon, cards, uses, cap_hours, cap_total, alloc_total, down_total)

"""Utilisation by local hour of the day, summed over the period: up capacity, allocated
and used per hour, each hour labelled day or night by the data's day window."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from gpupool.reports.review.capacity import Cards
from gpupool.reports.review.period import Period, Split
from gpupool.reports.review.rows import HourRow
from gpupool.reports.review.units import in_day, pct, rounded


@dataclass(frozen=True)
class Hours:
    """The 24 rows, and the allocated and used card-seconds per hour they are made of."""

    rows: tuple[HourRow, ...]
    alloc_by_hour: dict[int, float]
    used_by_hour: dict[int, float]


def hour_section(p: Period, split: Split, cards: Cards) -> Hours:
    alloc_by_hour: dict[int, float] = defaultdict(float)
    for per in split.alloc_hours.values():
        for hour, secs in per.items():
            alloc_by_hour[hour] += secs
    used_by_hour: dict[int, float] = defaultdict(float)
    for card in cards.card_use.values():
        for hour, secs in card.by_hour.items():
            used_by_hour[hour] += secs
    hour_rows = tuple(
        HourRow(
            hour=h,
            window="day" if in_day(h, p.data.day_window) else "night",
            capacity_gpu_h=rounded(cards.cap_hours[h] / 3600.0),
            allocated_gpu_h=rounded(alloc_by_hour[h] / 3600.0),
            used_gpu_h=rounded(used_by_hour[h] / 3600.0),
            allocated_pct=pct(alloc_by_hour[h], cards.cap_hours[h]),
            used_pct=pct(used_by_hour[h], cards.cap_hours[h]),
        )
        for h in range(24)
    )
    return Hours(hour_rows, alloc_by_hour, used_by_hour)

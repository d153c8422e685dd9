"""The numbers at the top of the review, from its sections: capacity and use, cost,
energy, the day and night windows."""

from __future__ import annotations

from collections.abc import Sequence

from gpupool.reports.review.capacity import Cards
from gpupool.reports.review.energy import Energy
from gpupool.reports.review.hours import Hours
from gpupool.reports.review.period import Period
from gpupool.reports.review.rows import CostRow, Recommendation, Summary
from gpupool.reports.review.units import gpu_h, in_day, iso, pct, rounded


def summary_of(
    p: Period,
    cards: Cards,
    hours: Hours,
    cost_rows: Sequence[CostRow],
    energy: Energy,
    recs: Sequence[Recommendation],
) -> Summary:
    data = p.data
    tariff = data.tariff
    capacity_h = gpu_h(cards.cap_total)
    window: dict[str, list[float]] = {"day": [0.0, 0.0, 0.0], "night": [0.0, 0.0, 0.0]}
    for h in range(24):
        part = window["day" if in_day(h, data.day_window) else "night"]
        part[0] += cards.cap_hours[h]
        part[1] += hours.alloc_by_hour[h]
        part[2] += hours.used_by_hour[h]
    up_h = gpu_h(cards.cap_total - cards.down_total)
    used_total = sum(c.used_gpu_s for c in cards.card_use.values()) / 3600.0
    return Summary(
        source=data.source,
        period_from=iso(p.start_s),
        period_to=iso(p.end_s),
        days=rounded((p.end_s - p.start_s) / 86400.0, 3),
        gpus=len(p.gpus),
        capacity_gpu_h=capacity_h,
        allocated_pct=pct(cards.alloc_total, cards.cap_total - cards.down_total),
        used_pct=pct(used_total, up_h),
        down_pct=pct(cards.down_total, cards.cap_total),
        gpu_cost=rounded(sum(c.capacity_cost for c in cost_rows), 2),
        held_unused_cost=rounded(sum(c.held_unused_cost for c in cost_rows), 2),
        energy_kwh=rounded(sum(e.kwh for e in energy.rows), 3),
        energy_cost=rounded(sum(e.cost for e in energy.rows), 2),
        currency=tariff.currency if tariff is not None else "USD",
        carbon_kg=(
            rounded(sum(e.carbon_kg for e in energy.rows), 3)
            if tariff is not None and tariff.carbon_g_per_kwh
            else None
        ),
        energy_source=energy.source,
        recommendations=len(recs),
        tariff=tariff.name if tariff is not None else "",
        day_window=f"{data.day_window[0]:02d}:00-{data.day_window[1]:02d}:00",
        utc_offset_h=data.utc_offset_h,
        day_allocated_pct=pct(window["day"][1], window["day"][0]),
        day_used_pct=pct(window["day"][2], window["day"][0]),
        night_allocated_pct=pct(window["night"][1], window["night"][0]),
        night_used_pct=pct(window["night"][2], window["night"][0]),
    )

"""Electricity by local hour of the day: kWh from the cards' power samples (x PUE) or,
without samples, from the jobs' own energy spread over their allocated hours; priced and
weighed in carbon at the tariff's hourly values."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from gpupool.reports.review.capacity import Cards
from gpupool.reports.review.period import Period, Split
from gpupool.reports.review.rows import EnergyRow
from gpupool.reports.review.units import rounded


@dataclass(frozen=True)
class Energy:
    rows: list[EnergyRow]
    source: str
    """"samples", "jobs" or "none" (Summary.energy_source)."""


def energy_section(p: Period, split: Split, cards: Cards) -> Energy:
    tariff = p.data.tariff
    energy_j: dict[int, float] = defaultdict(float)
    has_power = any(s.power_w is not None for s in p.data.usage)
    energy_source = "none"
    pue = tariff.pue if tariff is not None else 1.0
    kwh_by_hour: dict[int, float] = defaultdict(float)
    if has_power:
        energy_source = "samples"
        for card in cards.card_use.values():
            for hour, joules in card.energy_by_hour.items():
                energy_j[hour] += joules
        for hour, joules in energy_j.items():
            kwh_by_hour[hour] = joules / 3.6e6 * pue
    elif any(j.energy_kwh is not None for j in p.data.jobs):
        energy_source = "jobs"
        for j in p.data.jobs:
            if j.energy_kwh is None:
                continue
            per = split.alloc_hours.get(j.job_id, {})
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
            EnergyRow(
                h, rounded(kwh), price, rounded(kwh * price, 4), rounded(kwh * carbon / 1000.0, 4)
            )
        )

    return Energy(energy_rows, energy_source)


def _hourly(values: Sequence[float], hour: int) -> float:
    if not values:
        return 0.0
    return float(values[hour % len(values)]) if len(values) == 24 else float(values[0])

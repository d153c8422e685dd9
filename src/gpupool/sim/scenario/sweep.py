"""Time against money: a scenario run at several values of `energy.value_of_time`, each
against the same scenario run blind (no price-aware deferral, no power caps).

One point per value: electricity and carbon saved, mean and p95 JCT increase, deadline
misses, GPU-hours, and the total bill (GPU-hours at the catalogue price, in the tariff's
currency, plus electricity). The runs are independent, so they may run in parallel; each
is deterministic by the scenario's seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from gpupool.energy.tariff import per_usd
from gpupool.errors import SpecError
from gpupool.sim.scenario.config import ScenarioConfig
from gpupool.sim.scenario.runner import run_scenario

BLIND = "blind"
PRICE_ONLY = "price only"


@dataclass(frozen=True)
class CurvePoint:
    """One run of the sweep: `label` is blind, price only (no value of time) or the value."""

    label: str
    value_of_time: float | None
    electricity_cost: float
    carbon_kg: float | None
    mean_jct_s: float
    p95_jct_s: float
    deadline_misses: int
    gpu_hours: float
    gpu_cost: float
    """GPU-hours at the catalogue price, in the tariff's currency."""
    currency: str

    @property
    def total_cost(self) -> float:
        return self.gpu_cost + self.electricity_cost


def parse_values(text: str) -> list[float]:
    """'0,0.1,0.5': the values of time to sweep (the tariff's currency per GPU-hour)."""
    values = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise SpecError(
                f"--value-of-time: {part.strip()!r} is not a number; give values such as "
                "0,0.1,0.5 (the tariff's currency per GPU-hour of delay)"
            ) from None
        if not value >= 0 or value == float("inf"):
            raise SpecError(f"--value-of-time: {part.strip()} must be a finite number >= 0")
        values.append(value)
    return values


def _variant(cfg: ScenarioConfig, label: str, value: float | None) -> ScenarioConfig:
    energy = cfg.scheduling.energy
    if label == BLIND:
        energy = replace(energy, price_aware=False, power_capping=False)
    else:
        energy = replace(energy, value_of_time=value, team_value_of_time={}, kind_value_of_time={})
    return replace(cfg, scheduling=replace(cfg.scheduling, energy=energy))


def _run(item: tuple[ScenarioConfig, Path | None, str, float | None]) -> CurvePoint:
    cfg, traces, label, value = item
    result = run_scenario(_variant(cfg, label, value), traces)
    s = result.summary
    jct = [j["end_s"] - j["submit_s"] for j in result.jobs if j["state"] == "finished"]
    currency = str(s["electricity_currency"] or "USD")
    return CurvePoint(
        label,
        value,
        float(s["electricity_cost"]),
        s["carbon_kg"],
        float(np.mean(jct)) if jct else 0.0,
        float(np.percentile(jct, 95)) if jct else 0.0,
        int(s["deadline_misses"]),
        float(sum(j["gpu_hours"] for j in result.jobs)),
        float(s["cost_usd"]) * per_usd(currency),
        currency,
    )


def value_of_time_curve(
    cfg: ScenarioConfig,
    values: Sequence[float],
    traces: Path | None = None,
    workers: int = 1,
) -> list[CurvePoint]:
    """Blind, price only, then one point per value, in that order."""
    if not cfg.scheduling.energy.price_aware and not cfg.scheduling.energy.power_capping:
        raise SpecError(
            f"scenario {cfg.name}: energy.price_aware and energy.power_capping are off, so "
            "the value of time changes nothing; sweep a price-aware scenario"
        )
    items: list[tuple[ScenarioConfig, Path | None, str, float | None]] = [
        (cfg, traces, BLIND, None),
        (cfg, traces, PRICE_ONLY, None),
    ]
    items += [(cfg, traces, f"{v:g}", v) for v in values]
    if workers <= 1:
        return [_run(i) for i in items]
    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(_run, items))


def _pct(value: float, base: float) -> float | None:
    return None if not base else round(100.0 * (value / base - 1.0), 1) + 0.0  # no -0.0


def curve_rows(points: Sequence[CurvePoint]) -> list[dict[str, Any]]:
    """Each point against the first (blind): the figures the table and --json show."""
    blind = points[0]
    rows = []
    for p in points:
        saved = _pct(p.electricity_cost, blind.electricity_cost)
        carbon = (
            None
            if p.carbon_kg is None or not blind.carbon_kg
            else _pct(p.carbon_kg, blind.carbon_kg)
        )
        rows.append(
            {
                "point": p.label,
                "value_of_time": p.value_of_time,
                "electricity_cost": round(p.electricity_cost, 2),
                "electricity_saving_pct": None if saved is None else 0.0 - saved,
                "carbon_saving_pct": None if carbon is None else 0.0 - carbon,
                "mean_jct_h": round(p.mean_jct_s / 3600, 2),
                "mean_jct_increase_pct": _pct(p.mean_jct_s, blind.mean_jct_s),
                "p95_jct_increase_pct": _pct(p.p95_jct_s, blind.p95_jct_s),
                "deadline_misses": p.deadline_misses,
                "gpu_hours": round(p.gpu_hours, 1),
                "total_cost": round(p.total_cost, 2),
                "total_cost_vs_blind_pct": _pct(p.total_cost, blind.total_cost),
                "currency": p.currency,
            }
        )
    return rows

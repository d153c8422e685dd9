"""Energy, price, carbon and heat models of the scheduler: pure and deterministic.

power     what a GPU draws per load (H200-calibrated fractions of TDP), kWh with PUE
tariff    prices and carbon intensity by local hour and month, from YAML data
thermal   first-order RC temperature per GPU, stepped exactly
powercap  speed and power under a power limit or clock lock; the SetPowerCap command
deferral  start deadline-bound work in cheap hours without missing deadlines
"""

from __future__ import annotations

from gpupool.energy.deferral import DeferrableJob, DeferralPlan, peak_alive_gpus, plan_starts
from gpupool.energy.power import (
    DEFAULT_PUE,
    HYPERSCALE_PUE,
    Load,
    PowerModel,
    carbon_kg,
    energy_kwh,
    load_of,
)
from gpupool.energy.powercap import (
    CapCurve,
    CapPoint,
    SetPowerCap,
    best_cap,
    cap_curve,
    power_frac_at,
    speed_at,
)
from gpupool.energy.tariff import Tariff, load_tariff, parse_tariff, shipped_tariffs
from gpupool.energy.thermal import ThermalModel, fit_step, fit_thermal

__all__ = [
    "DEFAULT_PUE",
    "HYPERSCALE_PUE",
    "CapCurve",
    "CapPoint",
    "DeferrableJob",
    "DeferralPlan",
    "Load",
    "PowerModel",
    "SetPowerCap",
    "Tariff",
    "ThermalModel",
    "best_cap",
    "cap_curve",
    "carbon_kg",
    "energy_kwh",
    "fit_step",
    "fit_thermal",
    "load_of",
    "load_tariff",
    "parse_tariff",
    "peak_alive_gpus",
    "plan_starts",
    "power_frac_at",
    "shipped_tariffs",
    "speed_at",
]

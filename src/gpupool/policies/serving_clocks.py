"""Clocks that follow load for online inference: while a service's pressure stays well
under its SLO its cards' SM clock comes down a step; it goes back to full before the SLO is
at risk.

Pressure is the larger of the service's demand over its replicas' capacity and its
measured p99 over its SLO, both read at full clocks (a replica at clock point k serves at
`speed` of full, and its latency grows by 1/speed). The steps are the serving load's
clock-locked points (data/energy.json: decode's points, an assumption until a lent GPU
measures them), fastest first after full clocks. Lowering waits `hold_s` of low pressure
for each step; raising goes straight to full clocks (asymmetric on purpose: a missed
SLO costs more than a few minutes at full power).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from gpupool.energy.power import Load
from gpupool.energy.powercap import CapPoint, cap_curve

FULL = CapPoint(1.0, 1.0, 1.0)


@dataclass(frozen=True)
class OnlineClocks:
    """Clocks that follow load for online inference (policies/serving_clocks.py). A
    service's pressure is the larger of its demand over its replicas' capacity and its
    measured p99 over its SLO. Its cards' SM clock comes down one step when the pressure
    at the lower clock stays under `lower_below` for `hold_s`, and goes back to full as
    soon as it is over `raise_above`: before the SLO (pressure 1) is at risk."""

    enabled: bool = False
    lower_below: float = 0.7
    raise_above: float = 0.85
    hold_s: float = 900.0


@dataclass(frozen=True)
class ServiceClock:
    """Where one service's clocks are: `level` 0 is full clocks, k the k-th step down;
    `low_since_s`: since when the pressure has allowed the next step down (None: it does
    not)."""

    level: int = 0
    low_since_s: float | None = None


@cache
def clock_levels() -> tuple[CapPoint, ...]:
    """Full clocks, then the serving curve's clock-locked points from fastest to slowest."""
    locked = [p for p in cap_curve(Load.LATENCY).points if p.locked_sm_frac is not None]
    return (FULL, *sorted(locked, key=lambda p: -p.speed))


def pressure(demand_rps: float, capacity_rps: float, p99_ms: float | None, slo_ms: float) -> float:
    """A service's pressure at full clocks (1: at its SLO). No capacity: infinite."""
    load = demand_rps / capacity_rps if capacity_rps > 0 else float("inf")
    latency = p99_ms / slo_ms if p99_ms is not None and slo_ms > 0 else 0.0
    return max(load, latency)


def next_clock(
    state: ServiceClock, pressure_full: float, now_s: float, rules: OnlineClocks
) -> ServiceClock:
    """The service's clock after this cycle, given its pressure at full clocks."""
    levels = clock_levels()
    level = min(state.level, len(levels) - 1)
    if pressure_full / levels[level].speed > rules.raise_above:
        return ServiceClock(0, None)  # back to full before the SLO is at risk
    down = level + 1
    if down < len(levels) and pressure_full / levels[down].speed <= rules.lower_below:
        since = now_s if state.low_since_s is None else state.low_since_s
        if now_s - since >= rules.hold_s - 1e-9:
            return ServiceClock(down, now_s)  # and wait again before the next step
        return ServiceClock(level, since)
    return ServiceClock(level, None)

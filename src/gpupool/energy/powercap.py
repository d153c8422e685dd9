"""Trading speed for power: a curve per load, and the command that sets a cap on a GPU.

A CapPoint says what a job of some load does under a power limit of `cap_frac` × TDP:
its speed and its average draw, both relative to running uncapped. Energy per unit of
work is power / speed, so a cap saves energy when power falls faster than speed.

* Compute-bound: the Zeus A40 trace (facts.md §3.1). The card sits at its limit, so every
  cap binds; energy is lowest near 2/3 of TDP for about 7% slowdown.
* Memory-bound (decode): power caps rarely bind (H200 decode draws 137-300 W of 700 W)
  and locking the SM clock does better (arXiv 2605.11999: up to 32% of decode energy at
  minimal throughput loss; arXiv 2501.08219: 42% for 1-6% latency). Below the load's
  draw the curve is that clock-locking frontier; its points carry `locked_sm_frac`.
* Latency and idle: no published curve; a cap above the draw does nothing.
Below a curve's lowest point, speed and power fall in proportion to the cap.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Any

import numpy as np

from gpupool.energy.power import Load, PowerModel, energy_data
from gpupool.errors import SpecError


@dataclass(frozen=True)
class CapPoint:
    """Speed and average draw (relative to uncapped) at a power limit of cap_frac × TDP."""

    cap_frac: float
    speed: float
    power_frac_of_uncapped: float
    locked_sm_frac: float | None = None
    """Reach this point by locking the SM clock to this fraction of its maximum instead of
    setting a power limit (cap_frac is then the draw that results, for power budgets)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.cap_frac <= 1.0:
            raise SpecError(f"cap point: cap_frac must lie in (0, 1], got {self.cap_frac}")
        if not (0.0 < self.speed <= 1.0 and self.power_frac_of_uncapped > 0.0):
            raise SpecError(
                f"cap point: need 0 < speed <= 1 and power > 0, got {self.speed}, "
                f"{self.power_frac_of_uncapped}"
            )
        if self.locked_sm_frac is not None and not 0.0 < self.locked_sm_frac <= 1.0:
            raise SpecError(
                f"cap point: locked_sm_frac must lie in (0, 1], got {self.locked_sm_frac}"
            )

    @property
    def energy_frac(self) -> float:
        """Energy per unit of work relative to uncapped."""
        return self.power_frac_of_uncapped / self.speed

    @property
    def slowdown(self) -> float:
        """Extra run time relative to uncapped (0.08: 8% longer)."""
        return 1.0 / self.speed - 1.0

    def command(
        self,
        node: int,
        gpu: int,
        tdp_w: float,
        max_sm_mhz: int,
        reason: str,
        min_limit_w: float = 0.0,
    ) -> SetPowerCap:
        """The command that puts one GPU at this point (uncapped: reset to the defaults).

        min_limit_w is the card's lowest settable limit (NVML constraints; 200 W on the H200).
        """
        if self.locked_sm_frac is not None:
            mhz = max(1, round(self.locked_sm_frac * max_sm_mhz))
            return SetPowerCap(node, gpu, None, mhz, reason)
        if self.cap_frac >= 1.0:
            return SetPowerCap(node, gpu, None, None, reason)
        return SetPowerCap(node, gpu, max(self.cap_frac * tdp_w, min_limit_w), None, reason)


@dataclass(frozen=True)
class CapCurve:
    """Measured or derived points of one load, by ascending cap_frac, ending uncapped."""

    load: Load
    points: tuple[CapPoint, ...]
    source: str = ""

    def __post_init__(self) -> None:
        caps = [p.cap_frac for p in self.points]
        if not caps or caps[-1] != 1.0:
            raise SpecError(f"cap curve {self.load}: needs a point at cap_frac 1.0 (uncapped)")
        if any(b <= a for a, b in itertools.pairwise(caps)):
            raise SpecError(f"cap curve {self.load}: cap_frac must strictly increase, got {caps}")

    def _at(self, cap_frac: float) -> tuple[float, float]:
        if not cap_frac > 0 or math.isnan(cap_frac):
            raise SpecError(f"cap curve {self.load}: cap_frac must be > 0, got {cap_frac}")
        c = min(cap_frac, 1.0)
        low = self.points[0]
        if c < low.cap_frac:
            f = c / low.cap_frac
            return low.speed * f, low.power_frac_of_uncapped * f
        caps = [p.cap_frac for p in self.points]
        speed = float(np.interp(c, caps, [p.speed for p in self.points]))
        power = float(np.interp(c, caps, [p.power_frac_of_uncapped for p in self.points]))
        return speed, power

    def speed_at(self, cap_frac: float) -> float:
        return self._at(cap_frac)[0]

    def power_frac_at(self, cap_frac: float) -> float:
        return self._at(cap_frac)[1]

    def energy_frac_at(self, cap_frac: float) -> float:
        speed, power = self._at(cap_frac)
        return power / speed

    def best(self, max_slowdown: float) -> CapPoint:
        """The point with the least energy per unit of work whose slowdown is within
        max_slowdown; ties go to the faster, then the higher cap. Only listed points are
        candidates: they are what was measured."""
        if not max_slowdown >= 0:
            raise SpecError(f"best cap: max_slowdown must be >= 0, got {max_slowdown}")
        ok = [p for p in self.points if p.slowdown <= max_slowdown + 1e-12]
        return min(ok, key=lambda p: (round(p.energy_frac, 12), -p.speed, -p.cap_frac))


@dataclass(frozen=True)
class SetPowerCap:
    """Command: set one GPU's power limit and SM clock lock.

    power_limit_w None resets the limit to the card's default, locked_sm_mhz None resets
    the clocks. The live service runs it through NVML: nvmlDeviceSetPowerManagementLimit
    (milliwatts, see power_limit_mw), nvmlDeviceSetGpuLockedClocks(min, max) /
    nvmlDeviceResetGpuLockedClocks; both need root.
    """

    node: int
    gpu: int
    power_limit_w: float | None
    locked_sm_mhz: int | None
    reason: str

    def __post_init__(self) -> None:
        if self.node < 0 or self.gpu < 0:
            raise SpecError(
                f"set power cap: node and gpu must be >= 0, got {self.node}, {self.gpu}"
            )
        if self.power_limit_w is not None and not self.power_limit_w > 0:
            raise SpecError(f"set power cap: power_limit_w must be > 0, got {self.power_limit_w}")
        if self.locked_sm_mhz is not None and self.locked_sm_mhz <= 0:
            raise SpecError(f"set power cap: locked_sm_mhz must be > 0, got {self.locked_sm_mhz}")

    @property
    def power_limit_mw(self) -> int | None:
        """The limit as nvmlDeviceSetPowerManagementLimit takes it (milliwatts)."""
        return None if self.power_limit_w is None else round(self.power_limit_w * 1000)

    @property
    def is_reset(self) -> bool:
        return self.power_limit_w is None and self.locked_sm_mhz is None


def _points(raw: list[dict[str, Any]], draw_frac: float) -> list[CapPoint]:
    """Clock-locked points: energy and time from the papers; the draw they lead to."""
    out = []
    for p in raw:
        time, energy = float(p["time"]), float(p["energy"])
        power = energy / time
        out.append(CapPoint(draw_frac * power, 1.0 / time, power, float(p["locked_sm_frac"])))
    return out


@lru_cache(maxsize=1)
def cap_curves() -> Mapping[Load, CapCurve]:
    """Every load's curve from data/energy.json (and the calibrated draws)."""
    raw = energy_data()["power_caps"]
    draws = PowerModel.calibrated()
    zeus = raw["compute_bound"]
    tdp = float(zeus["tdp_w"])
    compute = sorted(
        (
            CapPoint(
                float(p["limit_w"]) / tdp,
                1.0 / float(p["time"]),
                float(p["energy"]) / float(p["time"]),
            )
            for p in zeus["points"]
        ),
        key=lambda p: p.cap_frac,
    )
    curves = {Load.COMPUTE_BOUND: CapCurve(Load.COMPUTE_BOUND, tuple(compute), zeus["source"])}
    for load, key in (
        (Load.MEMORY_BOUND, "memory_bound"),
        (Load.LATENCY, "latency"),
        (Load.IDLE, "idle"),
    ):
        draw = draws.frac(load)
        below = _points(raw[key]["clock_points"], draw)
        uncapped = (CapPoint(draw, 1.0, 1.0), CapPoint(1.0, 1.0, 1.0))
        pts = [*sorted(below, key=lambda p: p.cap_frac), *uncapped]
        curves[load] = CapCurve(load, tuple(pts), raw[key]["source"])
    return MappingProxyType(curves)


def cap_curve(load: Load) -> CapCurve:
    return cap_curves()[load]


def speed_at(load: Load, cap_frac: float) -> float:
    """Speed relative to uncapped under a limit of cap_frac × TDP (interpolated)."""
    return cap_curve(load).speed_at(cap_frac)


def power_frac_at(load: Load, cap_frac: float) -> float:
    """Average draw relative to uncapped under a limit of cap_frac × TDP (interpolated)."""
    return cap_curve(load).power_frac_at(cap_frac)


def best_cap(load: Load, max_slowdown: float) -> CapPoint:
    """The least-energy point of this load that slows it by at most max_slowdown."""
    return cap_curve(load).best(max_slowdown)

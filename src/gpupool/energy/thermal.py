"""First-order (RC) thermal model of every GPU, stepped exactly so any time step is stable.

    dT/dt = (T_ss − T) / tau,   T_ss = inlet + P·R
    T(t+dt) = T_ss + (T − T_ss)·exp(−dt/tau)        (P and inlet constant over dt)

The defaults are ASSUMPTIONS (data/energy.json "thermal"): a 700 W card settles at 80 C
with 30 C inlet air (R = 50/700 C/W) with tau = 120 s, typical of air-cooled HGX boards.
The H200 calibration ran 6 s windows only (max 56 C), so it cannot fix R or tau;
shared/calibration/scripts/thermal.py measures the step response, and `fit_thermal`
turns its output into a model (docs/energy.md says how).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import overload

import numpy as np
import numpy.typing as npt

from gpupool.energy.power import energy_data
from gpupool.errors import SpecError

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class ThermalModel:
    """One thermal node per GPU: inlet air, a thermal resistance and a time constant."""

    ambient_c: float = 30.0
    """Inlet air temperature used when `step` is given none."""
    r_c_per_w: float = 50.0 / 700.0
    """Steady-state rise over inlet per watt (assumed: 700 W -> +50 C)."""
    tau_s: float = 120.0
    """Time constant of the heat sink (assumed; air-cooled HGX is typically 90-180 s)."""
    throttle_c: float = 89.0
    """Where the card slows itself down (the H200's NVML slowdown temperature)."""

    def __post_init__(self) -> None:
        if not (self.r_c_per_w > 0 and self.tau_s > 0):
            raise SpecError(
                f"thermal model: r_c_per_w and tau_s must be > 0, got {self.r_c_per_w}, "
                f"{self.tau_s}"
            )
        if not all(math.isfinite(v) for v in (self.ambient_c, self.throttle_c)):
            raise SpecError("thermal model: ambient_c and throttle_c must be finite")

    @staticmethod
    def calibrated() -> ThermalModel:
        """The constants in data/energy.json (assumed until thermal.py has run)."""
        t = energy_data()["thermal"]
        return ThermalModel(
            float(t["ambient_c"]), float(t["r_c_per_w"]), float(t["tau_s"]), float(t["throttle_c"])
        )

    def _inlet(self, inlet_c: npt.ArrayLike | None) -> FloatArray | float:
        return self.ambient_c if inlet_c is None else np.asarray(inlet_c, dtype=np.float64)

    @overload
    def steady_c(self, power_w: float, inlet_c: float | None = None) -> float: ...

    @overload
    def steady_c(
        self, power_w: FloatArray, inlet_c: FloatArray | float | None = None
    ) -> FloatArray: ...

    def steady_c(
        self, power_w: FloatArray | float, inlet_c: FloatArray | float | None = None
    ) -> FloatArray | float:
        """Where the temperature settles under constant power: inlet + P·R."""
        inlet = self.ambient_c if inlet_c is None else inlet_c
        if isinstance(power_w, float | int) and isinstance(inlet, float | int):
            return float(inlet + power_w * self.r_c_per_w)
        return np.asarray(inlet + np.asarray(power_w, dtype=np.float64) * self.r_c_per_w)

    def step(
        self,
        temps_c: npt.ArrayLike,
        power_w: npt.ArrayLike,
        dt_s: float,
        inlet_c: npt.ArrayLike | None = None,
    ) -> FloatArray:
        """Temperatures after dt_s at constant power; arrays broadcast (e.g. node × GPU)."""
        if not dt_s >= 0:
            raise SpecError(f"thermal step: dt_s must be >= 0, got {dt_s}")
        temps = np.asarray(temps_c, dtype=np.float64)
        steady = self._inlet(inlet_c) + np.asarray(power_w, dtype=np.float64) * self.r_c_per_w
        decay = math.exp(-dt_s / self.tau_s)
        out: FloatArray = np.asarray(steady + (temps - steady) * decay, dtype=np.float64)
        return out

    def throttled(self, temps_c: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """Which GPUs are at or above their slowdown temperature."""
        return np.asarray(temps_c, dtype=np.float64) >= self.throttle_c

    def sustainable_power_w(self, inlet_c: float | None = None) -> float:
        """The highest constant power that never reaches the throttle temperature."""
        inlet = self.ambient_c if inlet_c is None else inlet_c
        return max(0.0, (self.throttle_c - inlet) / self.r_c_per_w)

    def time_to_c(
        self,
        temps_c: npt.ArrayLike,
        power_w: npt.ArrayLike,
        target_c: float,
        inlet_c: npt.ArrayLike | None = None,
    ) -> FloatArray:
        """Seconds until each GPU reaches target_c at constant power (0: already past it in
        the direction it is moving; inf: it settles short of the target)."""
        temps = np.asarray(temps_c, dtype=np.float64)
        steady = self._inlet(inlet_c) + np.asarray(power_w, dtype=np.float64) * self.r_c_per_w
        temps, steady = np.broadcast_arrays(temps, steady)
        gap_now = temps - steady
        gap_target = target_c - steady
        heading = np.sign(-gap_now)  # +1 heating, -1 cooling, 0 settled
        reached = ((heading != 0) & (heading * (temps - target_c) >= 0)) | (temps == target_c)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = gap_now / gap_target
            t = np.where(ratio > 1.0, self.tau_s * np.log(ratio), np.inf)
        out: FloatArray = np.where(reached, 0.0, t).astype(np.float64)
        return out


def fit_step(t_s: npt.ArrayLike, temp_c: npt.ArrayLike, skip_s: float = 5.0) -> tuple[float, float]:
    """(asymptote C, tau s) of T(t) = A + B·exp(−t/tau) fitted by least squares.

    The first skip_s seconds are dropped: the die jumps within about a second of a power
    step (seen on the H200) before the slow heat-sink stage this model describes.
    """
    t = np.asarray(t_s, dtype=np.float64)
    y = np.asarray(temp_c, dtype=np.float64)
    if t.shape != y.shape or t.ndim != 1:
        raise SpecError("fit_step: t_s and temp_c must be 1-D arrays of the same length")
    keep = t >= t[0] + skip_s if t.size else t.astype(bool)
    t, y = t[keep] - t[keep][:1], y[keep]
    if t.size < 4 or float(t[-1]) <= 0:
        raise SpecError("fit_step: need at least 4 samples spanning some time after skip_s")
    best = (math.inf, 0.0, 0.0)
    taus = np.geomspace(0.5, 20_000.0, 600)
    for _ in range(3):  # a coarse log grid, then two finer grids around the best tau
        e = np.exp(-t[None, :] / taus[:, None])
        em = e.mean(axis=1, keepdims=True)
        ym = y.mean()
        var = ((e - em) ** 2).sum(axis=1)
        slope = np.where(var > 0, ((e - em) * (y - ym)).sum(axis=1) / np.maximum(var, 1e-300), 0)
        icpt = ym - slope * em[:, 0]
        sse = ((y[None, :] - icpt[:, None] - slope[:, None] * e) ** 2).sum(axis=1)
        k = int(np.argmin(sse))
        if sse[k] < best[0]:
            best = (float(sse[k]), float(icpt[k]), float(taus[k]))
        lo, hi = taus[max(k - 1, 0)], taus[min(k + 1, taus.size - 1)]
        taus = np.linspace(lo, hi, 200)
    return best[1], best[2]


def fit_thermal(
    heat_t_s: npt.ArrayLike,
    heat_temp_c: npt.ArrayLike,
    heat_power_w: float,
    cool_t_s: npt.ArrayLike,
    cool_temp_c: npt.ArrayLike,
    cool_power_w: float,
    throttle_c: float = 89.0,
    skip_s: float = 5.0,
) -> ThermalModel:
    """A model from one heat-up and one cool-down phase (thermal.py's compute and idle1).

    Each phase gives its asymptote; R = (A_heat − A_cool) / (P_heat − P_cool), the inlet
    is A_cool − P_cool·R, and tau is the mean of the two fitted time constants.
    """
    if heat_power_w <= cool_power_w:
        raise SpecError("fit_thermal: the heat-up phase must draw more than the cool-down one")
    a_heat, tau_heat = fit_step(heat_t_s, heat_temp_c, skip_s)
    a_cool, tau_cool = fit_step(cool_t_s, cool_temp_c, skip_s)
    r = (a_heat - a_cool) / (heat_power_w - cool_power_w)
    if r <= 0:
        raise SpecError("fit_thermal: the heat-up phase did not settle above the cool-down one")
    return ThermalModel(a_cool - cool_power_w * r, r, (tau_heat + tau_cool) / 2.0, throttle_c)

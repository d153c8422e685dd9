"""What a GPU draws under each kind of load, calibrated on a real H200.

The numbers live in gpupool/data/energy.json with their source. Power is kept as a
fraction of the card's TDP so one calibration serves every GPU type: a card of another
TDP is assumed to draw the same fractions (an assumption; only the H200 was measured).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from importlib import resources
from typing import Any, Final

from gpupool.domain.model import JobKind
from gpupool.errors import SpecError

J_PER_KWH: Final = 3.6e6


@lru_cache(maxsize=1)
def energy_data() -> dict[str, Any]:
    """The calibration constants of the energy models (data/energy.json), read once."""
    text = (resources.files("gpupool") / "data" / "energy.json").read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


DEFAULT_PUE: Final[float] = float(energy_data()["pue"]["generic"])
"""Facility power over IT power for a generic or colocation site (facts.md §4.3)."""
HYPERSCALE_PUE: Final[float] = float(energy_data()["pue"]["hyperscale"])
"""Facility power over IT power for a hyperscale site (facts.md §4.3)."""


class Load(StrEnum):
    """How hard a job drives its GPU; each level has its own draw and power-cap curve."""

    IDLE = "idle"
    LATENCY = "latency"
    """Online request serving at small batch: the GPU mostly waits on requests."""
    MEMORY_BOUND = "memory-bound"
    """Decode and offline (throughput) inference: streaming weights from HBM."""
    COMPUTE_BOUND = "compute-bound"
    """Training and prefill: tensor cores busy, the card sits at its power limit."""


_LOAD_OF: Final = {
    JobKind.TRAINING: Load.COMPUTE_BOUND,
    JobKind.BATCH: Load.COMPUTE_BOUND,
    JobKind.OFFLINE: Load.MEMORY_BOUND,
    JobKind.ONLINE: Load.LATENCY,
}


def load_of(kind: JobKind) -> Load:
    """The load a job of this kind puts on its GPUs.

    Online inference is LATENCY, not MEMORY_BOUND: replicas are sized with headroom for a
    p99 SLO so they run at small batch, the calibration's online workload (`latency`, one
    request at a time) drew 259 W, and real LLM decode on an H200 draws 137-300 W
    (arXiv 2605.11999), which brackets 259 W; the synthetic memory-bound level (452 W)
    would overstate a serving replica by about 75%. Offline inference batches as deep as
    memory allows, so it is MEMORY_BOUND; training and batch jobs are COMPUTE_BOUND.
    """
    return _LOAD_OF[kind]


@dataclass(frozen=True)
class PowerModel:
    """Draw per load as a fraction of TDP; a time-sliced share adds its part above idle.

    Calibrated fractions (H200, 700 W): idle 103/700, latency 259/700, memory-bound
    452/700 (middle of 394-510 W), compute-bound 620/700 (middle of 607-633 W).
    """

    idle_frac: float
    latency_frac: float
    memory_bound_frac: float
    compute_bound_frac: float

    def __post_init__(self) -> None:
        fracs = tuple(self.frac(load) for load in Load)
        if not all(0.0 <= f <= 1.0 for f in fracs):
            raise SpecError(f"power model: fractions of TDP must lie in [0, 1], got {fracs}")
        if any(f < self.idle_frac for f in fracs):
            raise SpecError("power model: no load may draw less than idle")

    @staticmethod
    def calibrated() -> PowerModel:
        p = energy_data()["power"]
        tdp = float(p["tdp_w"])

        def mid(r: list[float]) -> float:
            return (float(r[0]) + float(r[1])) / 2.0 / tdp

        return PowerModel(
            float(p["idle_w"]) / tdp,
            float(p["latency_w"]) / tdp,
            mid(p["memory_bound_w"]),
            mid(p["compute_bound_w"]),
        )

    def frac(self, load: Load) -> float:
        """The draw of a GPU running this load alone, as a fraction of its TDP."""
        if load is Load.IDLE:
            return self.idle_frac
        if load is Load.LATENCY:
            return self.latency_frac
        if load is Load.MEMORY_BOUND:
            return self.memory_bound_frac
        return self.compute_bound_frac

    def gpu_power_w(
        self, tdp_w: float, load: Load, cap_w: float | None = None, share: float = 1.0
    ) -> float:
        """One GPU's draw: idle plus `share` of the step to `load`, at most `cap_w`.

        `share` < 1 is the time-sliced fraction a job holds; the card idles the rest of
        the time (or runs other sharers: see `shared_gpu_power_w`).
        """
        return self.shared_gpu_power_w(tdp_w, ((load, share),), cap_w)

    def shared_gpu_power_w(
        self, tdp_w: float, shares: tuple[tuple[Load, float], ...], cap_w: float | None = None
    ) -> float:
        """One GPU time-sliced between sharers: idle + Σ share·(load − idle), capped."""
        if tdp_w < 0:
            raise SpecError(f"power: tdp_w must be >= 0, got {tdp_w}")
        if cap_w is not None and cap_w <= 0:
            raise SpecError(f"power: cap_w must be > 0 (None: no cap), got {cap_w}")
        total_share = 0.0
        idle = self.idle_frac * tdp_w
        power = idle
        for load, share in shares:
            if not 0.0 <= share <= 1.0:
                raise SpecError(f"power: share must lie in [0, 1], got {share}")
            total_share += share
            power += share * (self.frac(load) * tdp_w - idle)
        if total_share > 1.0 + 1e-9:
            raise SpecError(f"power: shares of one GPU add up to {total_share:.3f} > 1")
        return power if cap_w is None else min(power, cap_w)


def energy_kwh(power_w: float, duration_s: float, pue: float = DEFAULT_PUE) -> float:
    """Facility energy of an IT load: power × time × PUE, in kWh."""
    if power_w < 0 or duration_s < 0:
        raise SpecError(f"energy: power_w and duration_s must be >= 0, got {power_w}, {duration_s}")
    if pue < 1.0:
        raise SpecError(f"energy: PUE {pue} is below 1; PUE is facility power over IT power")
    return power_w * duration_s * pue / J_PER_KWH


def carbon_kg(energy_kwh: float, carbon_g_per_kwh: float) -> float:
    """Emissions of this much energy at this grid intensity, in kg CO2-equivalent."""
    return energy_kwh * carbon_g_per_kwh / 1000.0

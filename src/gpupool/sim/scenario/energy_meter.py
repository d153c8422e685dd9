"""What a scenario's GPUs draw, what that costs and emits, and how hot the cards get.

Every GPU of a node that is up draws idle power; a job adds its load's power on the GPUs
(or GPU shares) it holds while it works, and idle power while it starts, restores or
moves data. Energy is charged at the price and carbon intensity of the hour it is drawn
in, times the site's PUE. A job is charged for its share of its GPUs (idle part
included); what nobody holds is the cluster's idle energy. Cloud sites pay for power in
their price, so their energy and carbon are counted but not their electricity cost.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from gpupool.domain.model import MILLI_PER_GPU, JobKind
from gpupool.domain.state import ClusterState
from gpupool.energy.power import Load, PowerModel, load_of
from gpupool.energy.powercap import power_frac_at
from gpupool.energy.tariff import Tariff
from gpupool.energy.thermal import ThermalModel

J_PER_KWH = 3.6e6


@dataclass
class Ledger:
    energy_kwh: float = 0.0
    electricity_cost: float = 0.0
    carbon_kg: float = 0.0

    def add(self, kwh: float, price: float, carbon_g_per_kwh: float | None) -> None:
        self.energy_kwh += kwh
        self.electricity_cost += kwh * price
        if carbon_g_per_kwh is not None:
            self.carbon_kg += kwh * carbon_g_per_kwh / 1000.0

    def rounded(self) -> dict[str, float]:
        return {
            "energy_kwh": round(self.energy_kwh, 2),
            "electricity_cost": round(self.electricity_cost, 2),
            "carbon_kg": round(self.carbon_kg, 2),
        }


@dataclass
class EnergyMeter:
    state: ClusterState
    tdp_w: np.ndarray
    """Per node: its GPU type's TDP (0 where the catalogue does not know the type)."""
    node_site: tuple[str, ...]
    tariffs: Mapping[str, Tariff | None]
    pue: float
    cloud_sites: frozenset[str] = frozenset()
    power: PowerModel = field(default_factory=PowerModel.calibrated)
    jobs: dict[str, Ledger] = field(default_factory=lambda: defaultdict(Ledger))
    teams: dict[str, Ledger] = field(default_factory=lambda: defaultdict(Ledger))
    sites: dict[str, Ledger] = field(default_factory=lambda: defaultdict(Ledger))
    idle: dict[str, Ledger] = field(default_factory=lambda: defaultdict(Ledger))
    _draws: dict[tuple[int, JobKind, float | None], tuple[float, float, float]] = field(
        default_factory=dict, init=False, repr=False
    )

    def _rates(self, site: str, t_s: float) -> tuple[float, float | None]:
        tariff = self.tariffs.get(site)
        if tariff is None:
            return 0.0, None
        price = 0.0 if site in self.cloud_sites else tariff.price_at(t_s)
        return price, tariff.carbon_at(t_s)

    def job_power_w(self, node: int, kind: JobKind, cap_frac: float | None) -> float:
        """One whole GPU's draw for a job of this kind, at a point of its cap curve if
        capped (a power limit or a locked clock, facts.md §3)."""
        return self.draw_w(node, kind, cap_frac)[2]

    def draw_w(
        self, node: int, kind: JobKind, cap_frac: float | None
    ) -> tuple[float, float, float]:
        """(TDP, idle draw, working draw) of one whole GPU of `node` for a job of this kind.
        Worked out once per key: the simulator charges every running job every cycle, and
        the power model and the fleet's TDPs do not change during a run."""
        key = (node, kind, cap_frac)
        got = self._draws.get(key)
        if got is None:
            tdp = float(self.tdp_w[node])
            load = load_of(kind)
            draw = self.power.gpu_power_w(tdp, load)
            busy = draw if cap_frac is None else draw * power_frac_at(load, cap_frac)
            got = self._draws[key] = (tdp, self.power.gpu_power_w(tdp, Load.IDLE), busy)
        return got

    def charge_job(
        self,
        job_id: str,
        team: str,
        node: int,
        gpus: float,
        kind: JobKind,
        cap_frac: float | None,
        t_s: float,
        idle_s: float,
        busy_s: float,
    ) -> None:
        """`gpus` whole-GPU equivalents held for idle_s (starting) plus busy_s (working)."""
        if idle_s <= 0 and busy_s <= 0:
            return
        tdp, idle_w, busy_w = self.draw_w(node, kind, cap_frac)
        if tdp <= 0:
            return
        joules = gpus * (idle_w * idle_s + busy_w * busy_s)
        site = self.node_site[node]
        kwh = joules * self.pue / J_PER_KWH
        price, carbon = self._rates(site, t_s)
        for ledger in (self.jobs[job_id], self.teams[team], self.sites[site]):
            ledger.add(kwh, price, carbon)

    def charge_idle(self, t_s: float, dt_s: float, up: np.ndarray) -> None:
        """Idle draw of the unheld part of every GPU on nodes that are up."""
        free = np.clip(self.state.gpu_left, 0, None).sum(axis=1) / MILLI_PER_GPU
        watts = free * self.tdp_w * self.power.gpu_power_w(1.0, Load.IDLE)
        for site in set(self.node_site):
            mask = up & (np.asarray(self.node_site) == site)
            joules = float(watts[mask].sum()) * dt_s
            if joules <= 0:
                continue
            kwh = joules * self.pue / J_PER_KWH
            price, carbon = self._rates(site, t_s)
            self.idle[site].add(kwh, price, carbon)
            self.sites[site].add(kwh, price, carbon)

    def total(self) -> Ledger:
        out = Ledger()
        for ledger in self.sites.values():
            out.energy_kwh += ledger.energy_kwh
            out.electricity_cost += ledger.electricity_cost
            out.carbon_kg += ledger.carbon_kg
        return out


@dataclass
class HeatMap:
    """Modelled temperature of every GPU, stepped once per cycle from its power."""

    model: ThermalModel
    inlet_c: np.ndarray
    """Per node: the air the node breathes (hot-aisle nodes breathe warmer air)."""
    threshold_c: float
    temps_c: np.ndarray
    above_s: float = 0.0
    """GPU-seconds spent above the threshold."""
    hot_while_cool_idle_s: float = 0.0
    """GPU-seconds above the threshold while a cooler GPU of the same type sat idle."""
    max_c: float = 0.0

    def step(
        self, power_w: np.ndarray, dt_s: float, idle: np.ndarray, model_id: np.ndarray
    ) -> None:
        self.temps_c = self.model.step(self.temps_c, power_w, dt_s, self.inlet_c[:, None])
        real = power_w > 0
        hot = real & (self.temps_c > self.threshold_c)
        self.above_s += float(hot.sum()) * dt_s
        if hot.any():
            for m in np.unique(model_id):
                rows = model_id == m
                idle_cool = idle[rows] & (self.temps_c[rows] < self.threshold_c - 5.0)
                if idle_cool.any():
                    self.hot_while_cool_idle_s += float(hot[rows].sum()) * dt_s
        if real.any():
            self.max_c = max(self.max_c, float(self.temps_c[real].max()))

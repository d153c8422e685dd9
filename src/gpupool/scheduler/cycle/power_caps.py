"""Power caps: memory-bound clock locks, price and deadline caps where nobody waits for the
work, and caps on hot cards (thermal-aware); each card's command is sent when it changes,
and a reset when its job left. Built when `energy.power_capping` or thermal awareness is on;
it keeps the last GPU temperatures the driver measured (GpuTemps)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from gpupool.energy.power import PowerModel, load_of
from gpupool.energy.powercap import SetPowerCap
from gpupool.energy.tariff import per_usd
from gpupool.energy.thermal import ThermalModel
from gpupool.policies.power_caps import CapJob, plan_power_caps
from gpupool.scheduler.book import JobBook
from gpupool.scheduler.commands import Command
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.cycle.base import CycleContext
from gpupool.scheduler.events import GpuTemps
from gpupool.scheduler.fleet import Fleet

POWER = PowerModel.calibrated()
THERMAL = ThermalModel.calibrated()


class PowerCaps:
    name: ClassVar[str] = "power-caps"

    def __init__(self, config: SchedulerConfig, book: JobBook, fleet: Fleet) -> None:
        self.config = config
        self.book = book
        self.fleet = fleet
        self.caps: dict[tuple[int, int], SetPowerCap] = {}
        """The power command each card carries out now (absent: the card's defaults)."""
        self.temps_c: np.ndarray | None = None
        self.inlet_c: np.ndarray | None = None

    def observe(self, event: GpuTemps) -> None:
        self.temps_c, self.inlet_c = event.temps_c, event.inlet_c

    def gpu_price(self, pool: str, node: int) -> float:
        """A GPU-hour of the pool at its catalogue price, in the node's tariff currency."""
        tariff = self.fleet.tariffs.get(self.fleet.node_site[node])
        usd = self.fleet.pool_price.get(pool, 0.0)
        return usd * per_usd(tariff.currency) if tariff is not None and usd else 0.0

    def run(self, ctx: CycleContext) -> list[Command]:
        """SetPowerCap for every card whose command changes: memory-bound clock locks, price
        and deadline caps, hot cards; a reset for every card whose job left."""
        now = ctx.now_s
        e = self.config.energy
        jobs = []
        for r, placement in self.book.working():
            gpus = tuple((p.node, g) for p in placement.shares for g in p.gpus)
            left = ((r.spec.duration_s or 0.0) - r.done_s) / max(r.speed, 1e-9) * r.cap_speed
            tdp_w = float(self.fleet.tdp_w[gpus[0][0]]) if gpus else 0.0
            jobs.append(
                CapJob(
                    r.job_id,
                    r.spec.kind,
                    gpus,
                    tdp_w,
                    r.spec.deadline_s,
                    left + r.overhead_s,
                    POWER.gpu_power_w(tdp_w, load_of(r.spec.kind)) * e.pue,
                    e.value_of_time_for(r.spec.team, r.spec.kind.value),
                    self.gpu_price(r.gpu_type, gpus[0][0]) if gpus else 0.0,
                    ctx.published.serving_clocks.get(r.job_id),
                )
            )
        site_price = {}
        for site, tariff in self.fleet.tariffs.items():
            site_price[site] = (
                (tariff.price_at(now), tariff.mean_price()) if tariff is not None else None
            )
        hot: dict[tuple[int, int], float] = {}
        if e.thermal.aware and self.temps_c is not None and self.inlet_c is not None:
            # A card is capped when it runs hot or would settle above the threshold at its
            # job's power: to the power whose steady temperature sits 2 C under it.
            limit_c = e.thermal.threshold_c - 2.0
            r_c_per_w = THERMAL.r_c_per_w
            for job in jobs:
                for n, g in job.gpus:
                    inlet = float(self.inlet_c[n])
                    draw = POWER.gpu_power_w(float(self.fleet.tdp_w[n]), load_of(job.kind))
                    if self.temps_c[n, g] > limit_c or inlet + draw * r_c_per_w > limit_c:
                        hot[(n, g)] = max(0.0, (limit_c - inlet) / r_c_per_w)
        commands = plan_power_caps(
            jobs,
            now,
            {n: site_price.get(self.fleet.node_site[n]) for n in range(self.book.state.node_count)},
            hot,
            price_capping=e.power_capping,
        )
        out: list[Command] = []
        held = {(c.node, c.gpu) for c in commands}
        for key in [k for k in self.caps if k not in held]:  # cards whose job left: reset
            del self.caps[key]
            out.append(SetPowerCap(key[0], key[1], None, None, "its job left: defaults"))
        for c in commands:
            key = (c.node, c.gpu)
            if c.is_reset:
                if self.caps.pop(key, None) is not None:
                    out.append(c)
            elif self.caps.get(key) != c:
                self.caps[key] = c
                out.append(c)
        return out

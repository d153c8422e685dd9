"""Clocks that follow load (energy.online_clocks): each service's clock level from its
pressure (policies/serving_clocks.py), published per replica as the clock point its cards
should run at (`published.serving_clocks`, which PowerCaps turns into SetPowerCap). Reads
the autoscaler's demand and measured load; owns each service's level."""

from __future__ import annotations

from typing import ClassVar

from gpupool.domain.lifecycle import JobState
from gpupool.policies.serving_clocks import ServiceClock, clock_levels, next_clock, pressure
from gpupool.scheduler.book import JobBook
from gpupool.scheduler.commands import Command
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.cycle.autoscale import ServiceAutoscale
from gpupool.scheduler.cycle.base import CycleContext


class ServingClocks:
    name: ClassVar[str] = "serving-clocks"

    def __init__(self, config: SchedulerConfig, book: JobBook, services: ServiceAutoscale) -> None:
        self.rules = config.energy.online_clocks
        self.window_s = config.autoscale_load_window_s
        self.book = book
        self.services = services
        self.clocks: dict[str, ServiceClock] = {}

    def run(self, ctx: CycleContext) -> list[Command]:
        now = ctx.now_s
        levels = clock_levels()
        out = {}
        for name, svc in self.services.services.items():
            running = [r for r in self.book.replicas[name].values() if r.state is JobState.RUNNING]
            capacity = sum(svc.replica_rps * self.book.speed_of(r, 1.0) for r in running)
            state = self.clocks.get(name, ServiceClock())
            load = self.services.load.get(name)
            if load is not None and now - load.t_s > self.window_s + 1e-9:
                load = None  # measured before the window: stale
            demand = self.services.demand.get(name, 0.0)
            p99 = None
            if load is not None:
                demand = max(demand, load.rps)
                if load.p99_ms:  # read back at full clocks
                    p99 = load.p99_ms * levels[min(state.level, len(levels) - 1)].speed
            state = next_clock(
                state, pressure(demand, capacity, p99, svc.slo_p99_ms), now, self.rules
            )
            self.clocks[name] = state
            for r in running:
                out[r.job_id] = levels[state.level]
        ctx.published.serving_clocks = out
        return []

"""Parity of the autoscaler: one service and one load sequence through the live driver
(its scraper reading real Prometheus text from the replicas' registries) and through
the simulator's driver, fed the loads the live one measured, give the same scale
decisions at the same times with the same reasons. Both rules fire: the demand rule
(look-ahead peak of the measured rate) and the SLO rule (a p99 over the SLO)."""

from __future__ import annotations

import math
import re
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.scheduler import Event, Scale, ServiceLoad, ServiceRate
from gpupool.server.loop.config import LiveConfig
from gpupool.server.loop.driver import LiveService
from gpupool.server.store import NewService, Store, database_url
from gpupool.server.telemetry.replica_load import (
    LATENCY,
    LATENCY_BUCKETS_S,
    REQUESTS,
    Endpoint,
    LoadWindow,
    Scraper,
)
from gpupool.sim.scenario.config import parse_scenario
from gpupool.sim.scenario.workload import LoadCurve, ServiceSpec, Workload
from gpupool.sim.scenario.world import ScenarioSim

SCENARIO = {
    "name": "svc",
    "horizon_h": 1,
    "cluster": [{"gpu_type": "A100-80GB", "nodes": 1, "gpus_per_node": 8}],
    "teams": [{"name": "web"}],
    "workload": [],
    "cycle_s": 1.0,
    "online_reserve": 0.0,
    "share_cap": None,
    "autoscale": {
        "lookahead_s": 10,
        "down_stable_s": 8,
        "load_window_s": 4,
        "demand": "reactive",
    },
}
OFFERED = [5.0] * 10 + [10.0 + 4.0 * k for k in range(15)] + [64.0] * 15 + [8.0] * 40
"""Requests/s each second: up to 64 and back down."""
KNEE_RPS = 13.0
"""A replica's latency jumps (to 300 ms) above this rate: the SLO rule must act."""


class Replicas:
    """Each replica's real prometheus_client registry, advanced by a serving model: the
    offered load split evenly; 40 ms a request under the knee, 300 ms above it."""

    def __init__(self) -> None:
        self.registries: dict[int, tuple[CollectorRegistry, Counter, Histogram]] = {}

    def serve(self, ports: list[int], rps: float) -> None:
        for port in ports:
            if port not in self.registries:
                reg = CollectorRegistry()
                self.registries[port] = (
                    reg,
                    Counter(REQUESTS, "served", registry=reg),
                    Histogram(LATENCY, "latency", buckets=LATENCY_BUCKETS_S, registry=reg),
                )
        if not ports:
            return
        per = rps / len(ports)
        for port in ports:
            _, count, hist = self.registries[port]
            n = round(per)
            latency = 0.04 if per <= KNEE_RPS else 0.3
            count.inc(n)
            for _ in range(n):
                hist.observe(latency)

    def fetch(self, at: Endpoint, _timeout_s: float) -> str:
        return generate_latest(self.registries[at.port][0]).decode()


def test_live_and_simulated_drivers_scale_alike(tmp_path: Path) -> None:
    cfg = parse_scenario(SCENARIO)
    sched = cfg.scheduling
    store = Store(database_url(None, tmp_path / "db"))
    store.migrate()
    clock = ManualClock(0.0)
    model = Replicas()
    live = LiveService(
        LiveConfig(tmp_path / "state", sched, sample_s=1e9, host="h", scrape_s=1.0),
        store,
        FakeExecutor(),
        FakeTelemetry("8xA100-80GB"),
        clock,
        scraper=Scraper(LoadWindow(4.0), clock.now, fetch=model.fetch, background=False),
    )
    live.operations.create_service(
        NewService("chat", "web", ("serve",), 1, 8, slo_p99_ms=200.0, replica_rps=15.0)
    )
    fed: list[Event] = []
    observe = live.scheduler.observe

    def recording(event: Event) -> list[object]:
        if isinstance(event, ServiceRate | ServiceLoad):
            fed.append(event)
        return observe(event)  # type: ignore[return-value]

    live.scheduler.observe = recording  # type: ignore[assignment,method-assign]
    live.record.commands = []
    for k, rps in enumerate(OFFERED):
        if k:
            clock.advance(1.0)
        model.serve(sorted(at.port for at in live.scraper.targets.values()), rps)
        live.scraper.once()
        live.step()
    live_scales = [(t, c.from_replicas, c.to_replicas, c.reason) for t, c in live.record.commands
                   if isinstance(c, Scale)]  # fmt: skip
    live.stop()

    svc = ServiceSpec("chat", "web", LoadCurve((0.0,), (0.0,)), replica_rps=15.0, max_replicas=8)
    sim = ScenarioSim(cfg, Workload(services=(svc,)))
    sim.commands = []
    by_time: dict[float, list[Event]] = {}
    for e in fed:
        by_time.setdefault(e.t_s, []).append(e)
    for k in range(len(OFFERED)):
        now = float(k)
        for e in by_time.get(now, []):
            sim.feed(e)
        sim.carry_out(sim.cycle(now), now)
    sim_scales = [(t, c.from_replicas, c.to_replicas, c.reason) for t, c in sim.commands
                  if isinstance(c, Scale)]  # fmt: skip

    assert sim_scales == live_scales
    reasons = " | ".join(r for *_, r in live_scales)
    assert any(
        re.match(r"p99 2\d\d ms > 200 ms at \d+ rps/replica$", r) for *_, r in live_scales
    ), reasons
    assert any(r.startswith("measured peak") and b > 1 for _, a, b, r in live_scales), reasons
    assert any(b < a for _, a, b, _ in live_scales), reasons
    assert max(b for _, _, b, _ in live_scales) >= math.ceil(64 / KNEE_RPS)

"""Parity with every feature on (scenarios/parity-all.yaml): sites and a cloud, team
guarantees with a night window, priority-quota, the online reserve and shared replicas,
cost- and locality-aware placement, two tariffs with price deferral and power caps,
thermal placement, burst, deadline jobs, sized jobs and an autoscaled service.

Leg A: the events the simulator fed the core, replayed into a fresh core, give the same
decision log, byte for byte, and the same commands: the core depends on its inputs only
(no side channel from the simulated world)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from gpupool.errors import GpupoolError
from gpupool.scheduler import Burst, Defer, Launch, Reclaim, ServiceDemand, SetPowerCap, Stop
from gpupool.sim.eventsim import replay
from gpupool.sim.generators import GenContext, build_workload
from gpupool.sim.scenario import ScenarioSim
from gpupool.sim.scenario_config import load_scenario

SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "parity-all.yaml"


@pytest.fixture(scope="module")
def recorded() -> ScenarioSim:
    cfg = load_scenario(SCENARIO)
    sim = ScenarioSim(cfg, build_workload(cfg.workload, cfg.seed, GenContext(cfg.horizon_s, None)))
    sim.recorded, sim.commands = [], []
    sim.run()
    return sim


def test_every_feature_acts_in_the_parity_scenario(recorded: ScenarioSim) -> None:
    kinds = Counter(type(c).__name__ for _, c in recorded.commands or [])
    for kind in (Launch, Stop, SetPowerCap, Burst, Reclaim, Defer):
        assert kinds[kind.__name__] > 0, f"no {kind.__name__} in {dict(kinds)}"
    assert any(isinstance(c, SetPowerCap) and c.is_reset for _, c in recorded.commands or [])
    notes = [d.action for d in recorded.engine.log.decisions]
    assert any(n.startswith("remote refused") for n in notes)
    assert any(r.service is not None for r in recorded.core.records.values())
    assert recorded.sized and all(j in recorded.core.records for j in recorded.sized)


def test_replayed_events_give_the_same_log_and_commands(recorded: ScenarioSim) -> None:
    assert recorded.recorded and recorded.commands
    fresh = recorded.new_core()
    commands = replay(fresh, recorded.recorded)
    names = tuple(n.name for n in recorded.cluster.nodes)
    assert fresh.log.render(names) == recorded.engine.log.render(names)
    assert commands == recorded.commands


def test_a_changed_input_changes_the_replay(recorded: ScenarioSim) -> None:
    """The comparison can fail: the service's demand doubled once gives other commands."""
    stream = list(recorded.recorded or [])
    k = next(k for k, e in enumerate(stream) if isinstance(e, ServiceDemand) and e.peak_rps > 0)
    demand = stream[k]
    assert isinstance(demand, ServiceDemand)
    stream[k] = dataclasses.replace(demand, peak_rps=demand.peak_rps * 4)
    fresh = recorded.new_core()
    try:
        commands = replay(fresh, stream)
    except GpupoolError:  # it decided differently, then could not follow the world's events
        return
    assert commands != recorded.commands

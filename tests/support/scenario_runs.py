"""Scenario runs that several test modules read, made once per test process.

A scenario run is deterministic, so the module that asserts on a pair's acceptance figures
(test_resource_scenarios.py) and the one that compares them with bench/results
(test_scenario_figures.py) read the same run instead of making it twice. Under xdist both
modules are in one group (conftest.SHARED_RUNS), so they share it there too. Readers must
not change the result they get.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from gpupool.sim.scenario.config import load_scenario
from gpupool.sim.scenario.runner import ScenarioResult, run_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


@cache
def scenario_run(name: str) -> ScenarioResult:
    """scenarios/NAME.yaml run as it is, as bench/bench_resources.py runs it."""
    return run_scenario(load_scenario(SCENARIOS / f"{name}.yaml"))

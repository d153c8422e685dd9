"""Clocks that follow load for online inference: the rule (policies/serving_clocks.py), its
configuration, and the online-clocks scenario with it off and on."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from gpupool.domain.model import JobKind
from gpupool.errors import SpecError
from gpupool.policies.power_caps import CapJob, plan_power_caps
from gpupool.policies.serving_clocks import (
    OnlineClocks,
    ServiceClock,
    clock_levels,
    next_clock,
    pressure,
)
from gpupool.sim.scenario.config import parse_scenario
from gpupool.sim.scenario.runner import ScenarioResult, run_scenario
from gpupool.traces.location import find_traces_dir

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
RULES = OnlineClocks(True, lower_below=0.7, raise_above=0.85, hold_s=900.0)


def test_the_levels_are_full_clocks_then_decodes_points() -> None:
    levels = clock_levels()
    assert [p.locked_sm_frac for p in levels] == [None, 0.5, 0.3]
    assert [round(p.speed, 3) for p in levels] == [1.0, 0.971, 0.943]  # time 1.03, 1.06


def test_pressure_is_the_larger_of_load_and_latency() -> None:
    assert pressure(40.0, 100.0, 50.0, 200.0) == 0.4
    assert pressure(10.0, 100.0, 150.0, 200.0) == 0.75
    assert pressure(10.0, 100.0, None, 200.0) == 0.1
    assert pressure(10.0, 0.0, None, 200.0) == float("inf")  # nothing serves it


def test_a_step_down_waits_its_hold_and_a_rise_is_at_once() -> None:
    s = ServiceClock()
    s = next_clock(s, 0.5, 0.0, RULES)  # 0.5 / 0.971 = 0.515 <= 0.7: the hold starts
    assert s == ServiceClock(0, 0.0)
    s = next_clock(s, 0.5, 899.0, RULES)
    assert s.level == 0
    s = next_clock(s, 0.5, 900.0, RULES)
    assert s == ServiceClock(1, 900.0)  # one step, and the next hold starts now
    s = next_clock(s, 0.5, 1800.0, RULES)
    assert s.level == 2 and next_clock(s, 0.5, 9000.0, RULES).level == 2  # the lowest
    # 0.66 at full is 0.70 at 0.943: still allowed; 0.81 is 0.86 there: back to full at once
    assert next_clock(s, 0.66, 9060.0, RULES).level == 2
    assert next_clock(s, 0.81, 9060.0, RULES) == ServiceClock(0, None)
    # in between (0.72 at full): neither lower nor raise, and the hold is forgotten
    assert next_clock(ServiceClock(1, 0.0), 0.72, 5000.0, RULES) == ServiceClock(1, None)


def test_a_lowered_service_gets_a_clock_lock_and_nothing_else() -> None:
    low = clock_levels()[2]
    job = CapJob("svc", JobKind.ONLINE, ((0, 0), (0, 1)), 700.0, None, 0.0, serving_clock=low)
    out = plan_power_caps([job], 0.0, {}, hot={}, price_capping=False)
    assert [(c.gpu, c.locked_sm_mhz, c.power_limit_w) for c in out] == [
        (0, 594, None),  # 0.3 x 1980 MHz
        (1, 594, None),
    ]
    assert "within its SLO" in out[0].reason
    full = replace(job, serving_clock=clock_levels()[0])
    back = plan_power_caps([full], 0.0, {}, hot={})
    assert all(c.is_reset and "full clocks" in c.reason for c in back)


def _raw(online_clocks: object, hours: int = 24) -> dict[str, object]:
    raw: dict[str, object] = yaml.safe_load((SCENARIOS / "online-clocks.yaml").read_text())
    raw["horizon_h"] = hours
    raw["energy"] = {**raw["energy"], "online_clocks": online_clocks}  # type: ignore[dict-item]
    return raw


def test_the_config_takes_a_switch_or_its_thresholds() -> None:
    assert parse_scenario(_raw(True)).scheduling.energy.online_clocks.enabled
    assert not parse_scenario(_raw(False)).scheduling.energy.online_clocks.enabled
    given = {"lower_below": 0.5, "raise_above": 0.9, "hold_min": 5}
    clocks = parse_scenario(_raw(given)).scheduling.energy.online_clocks
    assert clocks == OnlineClocks(True, 0.5, 0.9, 300.0)
    with pytest.raises(SpecError, match="lower_below < raise_above"):
        parse_scenario(_raw({"lower_below": 0.9, "raise_above": 0.8}))
    with pytest.raises(SpecError, match="online_clocks"):
        parse_scenario(_raw({"lower": 0.5}))


def _run(on: bool) -> ScenarioResult:
    cfg = parse_scenario(_raw(on), str(SCENARIOS / "online-clocks.yaml"))
    return run_scenario(cfg, find_traces_dir(SCENARIOS), review=True)


def test_a_day_of_two_services_uses_less_energy_within_the_slo() -> None:
    off, on = _run(False), _run(True)
    energy = [r.summary["teams"]["serving"]["energy_kwh"] for r in (off, on)]
    assert energy[1] < 0.97 * energy[0]
    # clocks came down at night and went back up for the day
    assert off.summary["clock_locks"] == 0
    assert on.summary["clock_locks"] > 0 and on.summary["clock_unlocks"] > 0
    for r in (off, on):
        assert r.review is not None
        assert all(w.p99_ms <= 200.0 for w in r.review.latency)
    assert on.summary["online_slo_attainment"] == off.summary["online_slo_attainment"]

"""energy.value_of_time: deferral and power caps weigh the electricity they save against the
time they cost; the sweep prints the curve. Figures worked out by hand in each test."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.cli.main import main
from gpupool.domain.model import JobKind
from gpupool.energy import DeferrableJob, Load, plan_starts
from gpupool.energy.powercap import best_cap
from gpupool.energy.tariff import per_usd
from gpupool.errors import NotFoundError, SpecError
from gpupool.policies.power_caps import CapJob, plan_power_caps
from gpupool.sim.scenario.config import parse_scenario

H = 3600.0


def two_prices(t: float) -> float:
    """1.0 per kWh for the first two hours, 0.2 after."""
    return 1.0 if t < 2 * H else 0.2


def _job(value: float, gpus: int = 1, power_w: float = 1000.0) -> DeferrableJob:
    return DeferrableJob("a", gpus, 1 * H, 0.0, 10 * H, power_w, value)


@pytest.mark.parametrize("gpus", [1, 4])
def test_a_job_waits_exactly_while_the_saving_is_worth_the_delay(gpus: int) -> None:
    # Now: 1 kW x 1 h x 1.0 = 1.0 per GPU. At 02:00: 1 kW x 1 h x 0.2 = 0.2, two hours
    # later: worth it while 2 h x value < 0.8, so the value of time breaks even at 0.4.
    # (Starts between cost more: at 01:30 half the hour is dear, 0.6 + 1.5 h x value.)
    waits = plan_starts(0.0, [_job(0.39, gpus)], 8, [], two_prices, margin_s=0.0)
    assert waits.planned_start_s["a"] == pytest.approx(2 * H) and waits.deferred == {"a"}
    starts = plan_starts(0.0, [_job(0.41, gpus)], 8, [], two_prices, margin_s=0.0)
    assert starts.start_now == {"a"}
    # price alone (value 0): the cheapest window, as before the knob
    assert plan_starts(0.0, [_job(0.0)], 8, [], two_prices, margin_s=0.0).deferred == {"a"}


def test_the_break_even_follows_the_cards_draw() -> None:
    # at 500 W the saving halves (0.4 per GPU over 2 h): the break-even value is 0.2
    half = [DeferrableJob("a", 1, H, 0.0, 10 * H, 500.0, v) for v in (0.19, 0.21)]
    low, high = (plan_starts(0.0, [j], 8, [], two_prices, margin_s=0.0) for j in half)
    assert low.deferred == {"a"} and high.start_now == {"a"}
    # a card that draws nothing saves nothing by waiting
    none = DeferrableJob("a", 1, H, 0.0, 10 * H, 0.0, 0.01)
    assert plan_starts(0.0, [none], 8, [], two_prices, margin_s=0.0).start_now == {"a"}


def test_a_value_of_time_never_costs_a_deadline() -> None:
    # the deadline leaves no room for the cheap hours: forced whatever the value
    tight = DeferrableJob("a", 1, H, 0.0, 1.2 * H, 1000.0, 0.0)
    assert plan_starts(0.0, [tight], 8, [], two_prices, margin_s=0.0).forced == {"a"}


def test_bad_values_of_time_are_refused() -> None:
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(SpecError, match="value"):
            DeferrableJob("a", 1, H, 0.0, 10 * H, 1000.0, bad)


COMPUTE = best_cap(Load.COMPUTE_BOUND, 0.08)  # 2/3 TDP: energy x 0.809, time x 1.072


def _train(value: float | None, price: float = 0.0, deadline_s: float | None = 1e9) -> CapJob:
    return CapJob(
        "t", JobKind.TRAINING, ((0, 0),), 700.0, deadline_s, 36_000.0, 1000.0, value, price
    )


def test_a_cap_is_set_exactly_while_its_energy_is_worth_more_than_its_hours() -> None:
    saved_per_kwh = 1.0 - COMPUTE.energy_frac  # kWh saved per GPU-hour of work at 1 kW
    slowdown = COMPUTE.slowdown  # GPU-hours added per GPU-hour of work
    assert (saved_per_kwh, slowdown) == pytest.approx((0.191, 0.072))
    price = 2.0  # price now; the tariff's mean is 3.0 (cheaper than average)
    even = price * saved_per_kwh / slowdown  # break-even (value of time + GPU price)
    rates = {0: (price, 3.0)}
    capped = plan_power_caps([_train(0.0, even * 0.99)], 0.0, rates, hot={})
    assert capped[0].power_limit_w == pytest.approx(700.0 * COMPUTE.cap_frac)
    assert "worth more" in capped[0].reason
    assert plan_power_caps([_train(0.0, even * 1.01)], 0.0, rates, hot={})[0].is_reset
    # the value of time and the GPU's price add up
    assert plan_power_caps([_train(even * 0.5, even * 0.51)], 0.0, rates, hot={})[0].is_reset
    # with a value of time, work without a deadline may be capped too
    no_deadline = _train(0.0, 0.0, deadline_s=None)
    assert not plan_power_caps([no_deadline], 0.0, rates, hot={})[0].is_reset
    # without one, price alone decides: cheaper than the mean, no cap
    assert plan_power_caps([_train(None)], 0.0, rates, hot={})[0].is_reset


def test_exchange_rates_are_data() -> None:
    assert per_usd("USD") == 1.0
    assert 6.0 < per_usd("CNY") < 8.0
    with pytest.raises(NotFoundError, match=r"currencies\.csv"):
        per_usd("EUR")


SCENARIO = """
name: vot
seed: 3
horizon_h: 72
cycle_s: 300
mode: pool
policy: backfill
online_reserve: 0.0
cluster: [{gpu_type: A100-80GB, nodes: 1, gpus_per_node: 8}]
teams: [{name: research}]
energy: {tariff: guangdong-tou, price_aware: true, power_capping: true, deferral_margin_h: 1}
workload:
  - {generator: backlog, name: train, team: research, count: 24, submit_h: 0, spread_h: 40,
     gpu_choices: [1, 2], gpu_weights: [0.5, 0.5], work_h_min: 1, work_h_max: 4,
     state_gib_per_gpu: 8, deadline_slack: [1.5, 3.0], min_deadline_h: 24}
"""


def _scenario(value: object) -> dict[str, object]:
    """A day-and-a-half backlog with deadlines on one 8-GPU node, at `value` of time."""
    raw: dict[str, Any] = yaml.safe_load(SCENARIO)
    raw["energy"]["value_of_time"] = value
    return raw


def test_the_config_takes_a_value_per_team_and_refuses_bad_ones() -> None:
    energy = parse_scenario(_scenario(0.3)).scheduling.energy
    assert energy.value_of_time == 0.3 and energy.value_of_time_for("anyone") == 0.3
    energy = parse_scenario(_scenario({"default": 0.1, "teams": {"prod": 2}})).scheduling.energy
    assert energy.value_of_time_for("prod") == 2.0 and energy.value_of_time_for("x") == 0.1
    given = {"default": 0.1, "teams": {"prod": 2}, "kinds": {"batch": 0.5}}
    energy = parse_scenario(_scenario(given)).scheduling.energy
    assert energy.value_of_time_for("x", "batch") == 0.5  # the kind's
    assert energy.value_of_time_for("prod", "batch") == 2.0  # the team's first
    assert energy.value_of_time_for("x", "training") == 0.1  # the default
    with pytest.raises(SpecError, match="kinds"):
        parse_scenario(_scenario({"kinds": {"online-inference": 1}}))
    assert parse_scenario(_scenario(None)).scheduling.energy.value_of_time is None
    for bad in (-1, "cheap", {"dflt": 1}):
        with pytest.raises(SpecError, match="value_of_time"):
            parse_scenario(_scenario(bad))


def test_the_sweep_prints_the_curve_against_blind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "vot.yaml"
    path.write_text(yaml.safe_dump(_scenario(None)))
    out = tmp_path / "curve.json"
    assert (
        main(["simulate", "scenario", str(path), "--value-of-time", "0,100", "--json", str(out)])
        == 0
    )
    rows = json.loads(out.read_text())["vot"]
    assert [r["point"] for r in rows] == ["blind", "price only", "0", "100"]
    blind, _, free, dear = rows
    assert blind["electricity_saving_pct"] == 0 and blind["mean_jct_increase_pct"] == 0
    # time worth nothing: jobs wait for the night and save; worth a lot: nobody waits
    assert free["electricity_saving_pct"] > 5 and free["mean_jct_increase_pct"] > 0
    assert dear["mean_jct_h"] == blind["mean_jct_h"] and dear["gpu_hours"] == blind["gpu_hours"]
    assert all(r["deadline_misses"] == 0 for r in rows)
    assert dear["total_cost"] == pytest.approx(blind["total_cost"], rel=0.01)
    text = capsys.readouterr().out
    assert "value of time (CNY/GPU-h)" in text and "total vs blind %" in text
    assert main(["simulate", "scenario", str(path), "--value-of-time", "0,cheap"]) == 2
    assert "'cheap' is not a number" in capsys.readouterr().err

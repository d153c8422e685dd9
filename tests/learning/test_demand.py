"""The demand forecaster the autoscaler scales on: measured rates, the reactive peak, the
learned forecast, its guard (cold start, fallback on a drift, recovery), and what the core
does with it."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from gpupool.errors import SpecError
from gpupool.learning.demand import (
    COLD,
    FALLBACK,
    TRUSTED,
    DemandForecastConfig,
    DemandForecaster,
    DemandGuardChange,
)
from gpupool.learning.forecast import ForecastSettings
from gpupool.scheduler.commands import LearnGuard, Scale
from gpupool.scheduler.config_schema import parse_scheduling
from gpupool.sim.scenario.config import parse_scenario
from gpupool.sim.scenario.workload import LoadCurve, ServiceSpec, Workload
from gpupool.sim.scenario.world import ScenarioSim

HOUR_S = 3600.0
DAY_S = 86_400.0
FAST = ForecastSettings(num_boost_round=40)
"""Fewer boosting rounds than the default 120: the tests' hourly series are short."""
HOURLY = DemandForecastConfig(step_s=HOUR_S, settings=FAST)


def weekly_rate(t_s: float, phase_h: float = 0.0, seed_noise: float = 0.0) -> float:
    """A day's sine, weekends at 60%: a pattern the simple opponents do not know whole."""
    day = int(t_s // DAY_S)
    weekend = 0.6 if day % 7 >= 5 else 1.0
    hour = (t_s / HOUR_S + phase_h) % 24
    return weekend * (100.0 + 80.0 * math.sin(2 * math.pi * hour / 24)) + seed_noise


def feed(
    f: DemandForecaster, days: float, rate=weekly_rate, seed: int = 0
) -> list[DemandGuardChange]:
    """One sample an hour (the step), judged after each; the guard's changes."""
    rng = np.random.default_rng(seed)
    changes = []
    for k in range(round(days * 24)):
        t = k * HOUR_S
        f.observe(t, max(0.0, rate(t) + rng.normal(0.0, 3.0)))
        c = f.advance(t)
        if c is not None:
            changes.append(c)
    return changes


def forecast_sim(days: int, forecast: dict[str, object]) -> ScenarioSim:
    """One service ("chat") on a noisy weekly rate, scaled with `autoscale.demand:
    forecast` and this `autoscale.forecast` section, run for `days` (commands kept)."""
    t = np.arange(days * 24) * HOUR_S
    noise = np.random.default_rng(0).normal(0.0, 3.0, t.size)  # a measured rate is noisy
    rates = [weekly_rate(x) + e for x, e in zip(t, noise, strict=True)]
    curve = LoadCurve(tuple(t.tolist()), tuple(rates))
    cfg = parse_scenario(
        {
            "name": "forecast",
            "horizon_h": days * 24,
            "cluster": [{"gpu_type": "H100-80GB", "nodes": 4, "gpus_per_node": 8}],
            "teams": [{"name": "web"}],
            "workload": [],
            "cycle_s": HOUR_S,
            "online_reserve": 0.0,
            "autoscale": {"demand": "forecast", "forecast": forecast},
        }
    )
    sim = ScenarioSim(cfg, Workload(services=(ServiceSpec("chat", "web", curve, 10.0),)))
    sim.commands = []
    sim.run()
    return sim


def test_reactive_peak_is_the_highest_rate_over_the_lookahead() -> None:
    f = DemandForecaster(HOURLY, lookahead_s=600.0, learn=False)
    for t, r in [(0, 5.0), (300, 40.0), (600, 10.0), (900, 12.0)]:
        f.observe(float(t), r)
    assert f.reactive_peak() == 40.0  # 300 s is within 600 s of 900 s
    f.observe(1000.0, 11.0)
    assert f.reactive_peak() == 12.0  # 300 s has left the window
    assert f.bins == [] and f.advance(1000.0) is None  # learn=False keeps no series


def test_steps_hold_mean_rates_and_a_gap_repeats_the_last() -> None:
    f = DemandForecaster(HOURLY, lookahead_s=600.0, learn=True)
    f.observe(0.0, 10.0)
    f.observe(1800.0, 30.0)
    f.observe(3 * HOUR_S + 5, 7.0)  # hour 1 and 2 had no sample
    assert f.bins == [20.0, 20.0, 20.0]
    assert f.ahead == 2  # the look-ahead's step and one more
    assert f.peaks == [20.0, 20.0, 20.0]


def test_cold_start_then_trusted_on_a_weekly_pattern() -> None:
    f = DemandForecaster(HOURLY, lookahead_s=600.0, learn=True)
    changes = feed(f, 20)
    assert changes[0].state == COLD and changes[0].t_s == 0.0
    assert changes[0].reason == "0.0 of 14 days of history: the reactive rule scales the service"
    assert changes[-1].state == TRUSTED, [c.reason for c in changes]
    assert changes[1].t_s >= 14 * DAY_S  # never before the cold start's end
    status = f.status()
    assert status.state == TRUSTED and status.model_version >= 1
    assert status.learned_rel_mae is not None
    assert status.learned_rel_mae < min(status.opponents_rel_mae.values())
    assert 0.6 <= (status.p90_coverage or 0) <= 1.0
    assert f.trusted_peak() is not None and f.trusted_peak() >= f.latest()


def test_no_forecast_reads_a_rate_after_its_origin() -> None:
    """A forecaster that is fed every rate first and asked once at the end (a driver
    catching up) has the whole future at hand while it forecasts each origin; its forecasts
    up to day 17 must still equal those made hour by hour, even with every rate after day
    17 tripled. Fails if a feature or a training pair reaches past its origin."""
    cut = 17 * DAY_S

    def later_tripled(t: float) -> float:
        return weekly_rate(t) * (3.0 if t > cut else 1.0)

    def issued(rate, catch_up: bool) -> dict[int, tuple[float, float, tuple[float, ...]]]:
        f = DemandForecaster(HOURLY, lookahead_s=600.0, learn=True)
        seen: dict[int, tuple[float, float, tuple[float, ...]]] = {}
        original = f.forecast

        def keep(origin: int) -> None:
            original(origin)
            if origin in f.issued:
                seen[origin] = f.issued[origin]

        f.forecast = keep  # type: ignore[method-assign]
        rng = np.random.default_rng(0)
        for k in range(19 * 24):
            f.observe(k * HOUR_S, max(0.0, rate(k * HOUR_S) + rng.normal(0.0, 3.0)))
            if not catch_up:
                f.advance(k * HOUR_S)
        f.advance(19 * DAY_S)
        return {o: v for o, v in seen.items() if (o + f.ahead) * HOUR_S <= cut}

    hourly = issued(weekly_rate, catch_up=False)
    assert len(hourly) > 3 * 24
    assert issued(later_tripled, catch_up=True) == hourly


def test_a_wrong_model_is_kept_out() -> None:
    f = DemandForecaster(
        DemandForecastConfig(step_s=HOUR_S, fault="shifted-12h", settings=FAST),
        lookahead_s=600.0,
        learn=True,
    )
    changes = feed(f, 20)
    assert [c.state for c in changes] == [COLD, FALLBACK], [c.reason for c in changes]
    assert "reactive rule" in changes[1].reason
    assert f.trusted_peak() is None


def test_the_guard_falls_back_on_a_drift_and_recovers() -> None:
    """The day turns round on day 18 (peak 12 hours later): the model trained on the old
    phase errs more than the last value, the reactive rule takes over; once the new phase
    is a week old and retrained on, the forecast comes back."""

    def drifting(t: float) -> float:
        return weekly_rate(t, phase_h=12.0 if t >= 18 * DAY_S else 0.0)

    f = DemandForecaster(HOURLY, lookahead_s=600.0, learn=True)
    changes = feed(f, 34, drifting)
    states = [(round(c.t_s / DAY_S, 1), c.state) for c in changes]
    trusted = [c.t_s for c in changes if c.state == TRUSTED]
    assert trusted and trusted[0] < 18 * DAY_S, states  # trusted before the drift
    fell = [c.t_s for c in changes if c.state == FALLBACK and c.t_s >= 18 * DAY_S]
    assert fell and fell[0] < 21 * DAY_S, states  # noticed within 3 days
    assert changes[-1].state == TRUSTED and changes[-1].t_s > fell[0], states  # and back


def test_config_section_and_its_errors() -> None:
    cfg = parse_scheduling(
        {"autoscale": {"demand": "forecast", "forecast": {"step_s": 300, "judge_days": 2}}},
        "x.yaml",
    )
    assert cfg.autoscale_demand == "forecast"
    assert cfg.autoscale_forecast.step_s == 300 and cfg.autoscale_forecast.judge_days == 2
    with pytest.raises(SpecError, match=r"autoscale\.demand"):
        parse_scheduling({"autoscale": {"demand": "psychic"}}, "x.yaml")
    with pytest.raises(SpecError, match="divide a day"):
        parse_scheduling({"autoscale": {"forecast": {"step_s": 7}}}, "x.yaml")
    with pytest.raises(SpecError, match="cold_start_days"):
        DemandForecastConfig(cold_start_days=3)
    with pytest.raises(SpecError, match="fault"):
        DemandForecastConfig(fault="upside-down")


def test_the_simulated_core_scales_on_the_forecast_and_says_so() -> None:
    """The world feeds the offered rate; the core's autoscaler goes from the reactive rule
    (cold start) to the forecast, and its Scale reasons and the guard's record say which."""
    sim = forecast_sim(22, {"step_s": HOUR_S})
    guard = [c for c in sim.learn_records if isinstance(c, LearnGuard)]
    assert guard[0].state == COLD and guard[0].t_s == 0.0
    guard = guard[1:]
    assert guard and guard[0].t_s >= 14 * DAY_S, guard  # the cold start's 14 days
    assert all(g.learner == "forecast chat" for g in guard) and guard[-1].state == TRUSTED
    assert guard[-1].text.startswith("forecast chat trusted: the forecast scales")
    assert sim.core.autoscale.rates["chat"].state == TRUSTED
    assert COLD not in [g.state for g in guard]  # once out of the cold start, never back
    reasons = [(t, c.reason) for t, c in sim.commands if isinstance(c, Scale)]
    before = [r for t, r in reasons if t < guard[0].t_s]
    after = [r for t, r in reasons if t >= guard[-1].t_s]
    assert before and all(r.startswith("measured peak") for r in before)
    assert after and all(r.startswith("forecast peak") for r in after)


def test_a_shadow_forecast_is_judged_never_acted_on_until_promoted() -> None:
    """In shadow the forecaster trains and its guard judges it as in active, but the
    reactive rule scales; the promotion check reads that record (refused while cold), and
    once promoted the same forecaster scales the service."""
    cold = DemandForecaster(replace(HOURLY, mode="shadow"), lookahead_s=600.0, learn=True)
    feed(cold, 5)
    assert cold.promotion_problem() == (
        "5.0 of 14 days of history: the reactive rule scales the service"
    )
    days = 22
    sim = forecast_sim(days, {"step_s": HOUR_S, "mode": "shadow"})
    core = sim.core
    guard = [c for c in sim.learn_records if isinstance(c, LearnGuard)]
    assert guard[-1].state == TRUSTED, guard
    assert "would scale the service (shadow" in guard[-1].reason
    reasons = [c.reason for _, c in sim.commands if isinstance(c, Scale)]
    assert reasons and all(r.startswith("measured peak") for r in reasons)
    assert core.learners.mode("forecast") == "shadow"
    assert core.demand_status()["chat"].mode == "shadow"
    assert core.learners.promotion_problem("forecast") is None
    evidence = core.learners.evidence("forecast")
    assert evidence["services"]["chat"]["state"] == TRUSTED
    assert "trusted by its guard for 1 of 1 services" in evidence["summary"]
    now = days * DAY_S
    promoted = core.learners.set_mode("forecast", "active", now, "promoted by a test")
    assert (promoted.state, promoted.learner) == ("promoted", "forecast")
    peak, why = core.autoscale.demand_peak("chat", now, [])
    assert why.startswith("forecast peak") and peak >= core.autoscale.rates["chat"].latest()
    core.learners.set_mode("forecast", "shadow", now, "demoted by a test")
    assert core.autoscale.demand_peak("chat", now, [])[1].startswith("measured peak")
    with pytest.raises(SpecError, match="forecast mode must be one of"):
        core.learners.set_mode("forecast", "off", now, "")
    with pytest.raises(SpecError, match="unknown learner"):
        core.learners.set_mode("tea-leaves", "active", now, "")


def test_promotion_of_the_forecast_is_refused_while_its_guard_does_not_trust_it() -> None:
    f = DemandForecaster(replace(HOURLY, mode="shadow"), lookahead_s=600.0, learn=True)
    feed(f, 20, rate=lambda t: weekly_rate(t, phase_h=12.0 if t >= 15 * DAY_S else 0.0))
    assert f.state == FALLBACK
    problem = f.promotion_problem()
    assert problem is not None and "above" in problem and "best simple opponent" in problem
    with pytest.raises(SpecError, match=r"autoscale\.forecast\.mode"):
        parse_scheduling({"autoscale": {"forecast": {"mode": "sometimes"}}}, "x.yaml")

"""A service's demand, measured and forecast: what the autoscaler provisions replicas for.

The core is fed each service's request rate (`ServiceRate`: the simulator's offered load,
the live service's scraped rate). Two rules read it:

* **reactive**: the highest rate measured over the last look-ahead window. Every autoscaler
  has it; it lags a ramp by the time a replica takes to come up and holds a fall for its
  whole window.
* **forecast**: the learned 90th percentile (`learning.forecast`'s LightGBM quantiles) of
  the highest `step_s` mean rate over the look-ahead window and one step more (a replica
  asked for now must be up when the ramp comes), never below the rate being served now.

The forecast is judged like any learner: every origin's forecast is scored once its target
is measured, against the simple opponents (last value, same hour yesterday, median of the
same hour over 7 days) on the same target. The service scales on the forecast only while
its error over the last `judge_days` is no worse than the best opponent's; otherwise, and
for the first `cold_start_days` of the service's history, the reactive rule decides, and
each change of standing is said (`DemandGuardChange`). Nothing here reads a clock: the same
rates at the same times give the same forecasts, byte for byte.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import lightgbm

from gpupool.errors import SpecError
from gpupool.learning.forecast import (
    OPPONENTS,
    WEEK_S,
    FloatArray,
    ForecastSettings,
    features_at,
    opponent_forecasts,
    quantile_params,
)
from gpupool.traces.series import DAY_S, Series

DEMAND_SOURCES = ("declared", "reactive", "forecast")
"""declared: the peak the driver declares (ServiceDemand; the scenarios' load curves);
reactive and forecast: the core's own rules on the measured rates (ServiceRate)."""
FAULTS = ("none", "shifted-12h")
"""shifted-12h: every forecast is the one made 12 hours earlier (a wrong model, on purpose,
to show the guard keeps it out); never for a real service."""
COLD, TRUSTED, FALLBACK = "cold", "trusted", "fallback"
FORECAST_MODES = ("active", "shadow")
"""active: a trusted forecast scales the service; shadow: the forecasts are made and judged
as in active, but the reactive rule always scales (until `gpupool learn promote`)."""
FORECAST_KEYS = frozenset(
    {
        "mode",
        "step_s",
        "cold_start_days",
        "retrain_every_days",
        "judge_days",
        "min_judged_days",
        "recover_margin",
        "max_train_days",
        "fault",
    }
)
"""The keys of a configuration file's `autoscale.forecast:` section."""
QUANTILES = (0.5, 0.9)
YOUNG_DAYS = 28.0
"""Until a service has this much history its forecaster is retrained daily (then on
`retrain_every_s`): the first models train on a few days and gain most from each new one."""


@dataclass(frozen=True)
class DemandForecastConfig:
    step_s: float = 600.0
    """The rate series' step: each step's mean rate is one value the forecaster learns."""
    cold_start_days: float = 14.0
    """The reactive rule decides until a service has this much history."""
    retrain_every_s: float = WEEK_S
    judge_days: float = 7.0
    """The guard compares errors over the forecasts whose targets fell in this window: a
    whole week, so that which days of the week it holds does not decide (a weekday-only
    window favours the 7-day median, a weekend the model that knows the day)."""
    min_judged_days: float = 2.0
    """Forecasts scored before the guard may trust the model."""
    recover_margin: float = 0.02
    """A model not trusted comes in once its error is this share below the best opponent's."""
    max_train_days: float = 56.0
    fault: str = "none"
    mode: str = "active"
    """One of FORECAST_MODES: where the forecast may scale services at start (a promotion or
    demotion, stored by the live service, wins over it)."""
    settings: ForecastSettings = field(default_factory=ForecastSettings)
    """The LightGBM settings and features (those of `gpupool learn forecast`)."""

    def __post_init__(self) -> None:
        if not self.step_s > 0 or abs(DAY_S / self.step_s - round(DAY_S / self.step_s)) > 1e-6:
            raise SpecError(
                f"autoscale.forecast.step_s must divide a day (e.g. 300, 600, 3600), "
                f"got {self.step_s:g}"
            )
        if self.cold_start_days < 8:
            raise SpecError(
                "autoscale.forecast.cold_start_days must be at least 8: the forecaster's "
                "features need a week of history and a day to train on, got "
                f"{self.cold_start_days:g}"
            )
        if not 0 < self.min_judged_days <= self.judge_days:
            raise SpecError(
                "autoscale.forecast needs 0 < min_judged_days <= judge_days, got "
                f"{self.min_judged_days:g} and {self.judge_days:g}"
            )
        if self.retrain_every_s <= 0 or self.max_train_days <= 0 or self.recover_margin < 0:
            raise SpecError(
                "autoscale.forecast: retrain_every_days and max_train_days must be > 0 "
                "and recover_margin >= 0"
            )
        if self.mode not in FORECAST_MODES:
            raise SpecError(
                f"autoscale.forecast.mode must be one of {', '.join(FORECAST_MODES)}, "
                f"got {self.mode!r}"
            )
        if self.fault not in FAULTS:
            raise SpecError(
                f"autoscale.forecast.fault must be one of {', '.join(FAULTS)}, got {self.fault!r}"
            )

    @classmethod
    def from_mapping(cls, raw: Mapping[str, object]) -> DemandForecastConfig:
        """The `autoscale.forecast:` section of a configuration file."""
        unknown = sorted(set(raw) - FORECAST_KEYS)
        if unknown:
            raise SpecError(
                f"autoscale.forecast: unknown key(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(FORECAST_KEYS))}"
            )
        d = cls()

        def num(key: str, default: float) -> float:
            v = raw.get(key, default)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise SpecError(f"autoscale.forecast.{key} must be a number, got {v!r}")
            return float(v)

        return cls(
            step_s=num("step_s", d.step_s),
            cold_start_days=num("cold_start_days", d.cold_start_days),
            retrain_every_s=num("retrain_every_days", d.retrain_every_s / DAY_S) * DAY_S,
            judge_days=num("judge_days", d.judge_days),
            min_judged_days=num("min_judged_days", d.min_judged_days),
            recover_margin=num("recover_margin", d.recover_margin),
            max_train_days=num("max_train_days", d.max_train_days),
            fault=str(raw.get("fault", d.fault)),
            mode=str(raw.get("mode", d.mode)),
        )


def best_opponent(errors: Mapping[str, float]) -> str:
    """The simple opponent with the lowest error (ties by name: deterministic)."""
    return min(errors, key=lambda k: (errors[k], k))


@dataclass(frozen=True)
class DemandGuardChange:
    """The forecast's standing for a service changed, with the figures that decided it."""

    t_s: float
    state: str
    reason: str


@dataclass(frozen=True)
class DemandStatus:
    """What `gpupool learn status` shows of one service's forecaster."""

    history_days: float
    state: str
    mode: str
    """active or shadow (FORECAST_MODES): whether a trusted forecast may scale."""
    model_version: int
    judged: int
    learned_rel_mae: float | None
    opponents_rel_mae: dict[str, float]
    p90_coverage: float | None
    forecast_rps: float | None


@dataclass(frozen=True)
class Scored:
    """One forecast whose target has been measured: absolute errors, and the actual."""

    origin: int
    actual: float
    learned_err: float
    covered: bool
    opponent_err: tuple[float, ...]


class DemandForecaster:
    """One service's measured rates, its forecaster and the forecaster's guard."""

    def __init__(self, config: DemandForecastConfig, lookahead_s: float, learn: bool) -> None:
        self.cfg = config
        self.lookahead_s = lookahead_s
        self.learn = learn
        """False: the reactive rule only (no series kept, nothing trained)."""
        self.ahead = math.ceil(lookahead_s / config.step_s - 1e-9) + 1
        """Steps ahead the forecast covers: the look-ahead window and one step more."""
        self.per_day = round(DAY_S / config.step_s)
        self.samples: deque[tuple[float, float]] = deque()
        self.first_bin: int | None = None
        self.open_bin = 0
        self.open_sum = 0.0
        self.open_n = 0
        self.offset = 0
        """Index of bins[0] counted from first_bin (old bins are dropped)."""
        self.bins: list[float] = []
        self.peaks: list[float] = []
        """peaks[i]: the highest bin mean in bins[i - ahead + 1 .. i] (the forecast target)."""
        self.done = 0
        """Bins (from first_bin) already turned into forecasts and scores."""
        self.boosters: dict[float, lightgbm.Booster] = {}
        self.version = 0
        self.trained_at = -1
        self.issued: dict[int, tuple[float, float, tuple[float, ...]]] = {}
        """origin -> (p50, p90, each opponent's forecast) of the peak `ahead` steps on."""
        self.raw: dict[int, tuple[float, float]] = {}
        """origin -> the model's own (p50, p90), kept 12 hours for the shifted fault."""
        self.scored: deque[Scored] = deque()
        self.state = ""
        """Empty until the first judgement, which says (cold) who scales the service."""
        self.mode = config.mode
        """active or shadow: in shadow a trusted forecast is recorded, never acted on."""
        self.forecast_rps: float | None = None

    # ---- measurements --------------------------------------------------------------------------
    def observe(self, t_s: float, rps: float) -> None:
        self.samples.append((t_s, rps))
        while self.samples and self.samples[0][0] < t_s - self.lookahead_s - 1e-9:
            self.samples.popleft()
        if not self.learn:
            return
        b = math.floor(t_s / self.cfg.step_s + 1e-9)
        if self.first_bin is None:
            self.first_bin = self.open_bin = b
        if b < self.open_bin:
            return  # late: its step is closed
        while b > self.open_bin:
            # a step without a sample (a restart, a scrape gap) repeats the last mean
            mean = self.open_sum / self.open_n if self.open_n else (self.bins or [rps])[-1]
            self.close(mean)
            self.open_bin += 1
            self.open_sum, self.open_n = 0.0, 0
        self.open_sum += rps
        self.open_n += 1

    def close(self, mean: float) -> None:
        self.bins.append(mean)
        lo = max(0, len(self.bins) - self.ahead)
        self.peaks.append(max(self.bins[lo:]))
        keep = round((self.cfg.max_train_days + 8) * self.per_day)
        if len(self.bins) > keep + self.per_day:  # trim a day at a time
            cut = len(self.bins) - keep
            del self.bins[:cut], self.peaks[:cut]
            self.offset += cut

    def reactive_peak(self) -> float:
        """The highest rate measured over the last look-ahead window."""
        return max((r for _, r in self.samples), default=0.0)

    def latest(self) -> float:
        return self.samples[-1][1] if self.samples else 0.0

    # ---- the forecaster ------------------------------------------------------------------------
    def advance(self, now_s: float) -> DemandGuardChange | None:
        """Forecast from every step closed since the last call, score the forecasts whose
        targets are now measured, retrain on schedule, and judge: the guard's change, if any."""
        if not self.learn or self.first_bin is None:
            return None
        closed = self.offset + len(self.bins)
        if self.done == closed and self.state:
            return None  # nothing new measured: the standing holds
        while self.done < closed:
            origin = self.done
            self.score(origin)
            self.maybe_train(origin)
            self.forecast(origin)
            self.done += 1
        return self.judge(now_s)

    def series(self) -> tuple[FloatArray, FloatArray, Series]:
        """The targets as measured, on log1p (what the model learns), and their grid."""
        assert self.first_bin is not None
        peaks = np.asarray(self.peaks, dtype=np.float64)
        start = (self.first_bin + self.offset) * self.cfg.step_s
        return peaks, np.log1p(peaks), Series(start, self.cfg.step_s, ())

    def maybe_train(self, origin: int) -> None:
        cfg = self.cfg
        first = round(max(8.0, cfg.cold_start_days - cfg.judge_days) * self.per_day)
        every = max(1, round(cfg.retrain_every_s / cfg.step_s))
        if origin < round(YOUNG_DAYS * self.per_day):
            every = min(every, self.per_day)  # a young model gains most from each new day
        if origin < first or (self.boosters and origin - self.trained_at < every):
            return
        _, z, series = self.series()
        hi = origin - self.ahead - self.offset  # the newest pair whose target is known
        lo = max(7 * self.per_day - self.offset, hi - round(cfg.max_train_days * self.per_day))
        if hi - lo < 2 * cfg.settings.min_data_in_leaf:
            return
        s = np.arange(max(lo, 0), hi + 1, dtype=np.int64)
        x, base = features_at(z, s, self.ahead, series, cfg.settings.lags)
        label = z[s + self.ahead] - base
        import lightgbm  # lazily: services that never train a forecast do not load it

        self.boosters = {
            q: lightgbm.train(
                quantile_params(cfg.settings, q),
                lightgbm.Dataset(x, label, free_raw_data=True),
                num_boost_round=cfg.settings.num_boost_round,
            )
            for q in QUANTILES
        }
        self.version += 1
        self.trained_at = origin

    def forecast(self, origin: int) -> None:
        if not self.boosters:
            return
        peaks, z, series = self.series()
        t = np.array([origin - self.offset], dtype=np.int64)
        x, base = features_at(z, t, self.ahead, series, self.cfg.settings.lags)
        p50, p90 = (
            float(np.expm1(self.boosters[q].predict(x, num_threads=1)[0] + base[0]))
            for q in QUANTILES
        )
        self.raw[origin] = (p50, max(p50, p90))
        shift = round(DAY_S / 2 / self.cfg.step_s)
        self.raw.pop(origin - shift - 1, None)
        if self.cfg.fault == "shifted-12h":
            p50, p90 = self.raw.get(origin - shift, self.raw[origin])
        opp = opponent_forecasts(peaks, t, self.ahead, self.per_day)
        self.issued[origin] = (p50, max(p50, p90), tuple(float(opp[o][0]) for o in OPPONENTS))
        self.forecast_rps = max(p50, p90)

    def score(self, origin: int) -> None:
        """The forecast made `ahead` steps before `origin` meets its target, peaks[origin]."""
        made = self.issued.pop(origin - self.ahead, None)
        if made is None:
            return
        actual = self.peaks[origin - self.offset]
        p50, p90, opp = made
        self.scored.append(
            Scored(
                origin,
                actual,
                abs(p50 - actual),
                actual <= p90,
                tuple(abs(f - actual) for f in opp),
            )
        )
        window = round(self.cfg.judge_days * self.per_day)
        while self.scored and self.scored[0].origin <= origin - window:
            self.scored.popleft()

    def errors(self) -> tuple[float | None, dict[str, float]]:
        """Relative MAE (over the mean actual) of the learned median and each opponent."""
        if not self.scored:
            return None, {}
        total = sum(abs(s.actual) for s in self.scored) or 1.0
        learned = sum(s.learned_err for s in self.scored) / total
        opp = {
            name: sum(s.opponent_err[j] for s in self.scored) / total
            for j, name in enumerate(OPPONENTS)
        }
        return learned, opp

    def judge(self, now_s: float) -> DemandGuardChange | None:
        cfg = self.cfg
        history_days = self.done / self.per_day
        learned, opp = self.errors()
        enough = len(self.scored) >= cfg.min_judged_days * self.per_day
        if history_days < cfg.cold_start_days or learned is None or not enough:
            return self.change(now_s, COLD, self.cold_reason(history_days))
        best = best_opponent(opp)
        figures = (
            f"relative error {learned:.3f} over the last {cfg.judge_days:g} days against "
            f"{opp[best]:.3f} for the best simple opponent ({best})"
        )
        bar = opp[best] if self.state == TRUSTED else opp[best] * (1 - cfg.recover_margin)
        if learned <= bar + 1e-12:
            return self.change(now_s, TRUSTED, f"{self.trusted_phrase()}: {figures}")
        return self.change(now_s, FALLBACK, f"the reactive rule scales the service: {figures}")

    def trusted_phrase(self) -> str:
        if self.mode == "active":
            return "the forecast scales the service"
        return "the forecast would scale the service (shadow: the reactive rule scales it)"

    def cold_reason(self, history_days: float) -> str:
        cfg = self.cfg
        if history_days < cfg.cold_start_days:
            return (
                f"{history_days:.1f} of {cfg.cold_start_days:g} days of history: "
                "the reactive rule scales the service"
            )
        return (
            f"{len(self.scored)} forecasts judged, {cfg.min_judged_days * self.per_day:.0f} "
            "needed: the reactive rule scales the service"
        )

    def change(self, now_s: float, state: str, reason: str) -> DemandGuardChange | None:
        if state == self.state:
            return None
        self.state = state
        return DemandGuardChange(now_s, state, reason)

    def trusted_peak(self) -> float | None:
        """The forecast peak to provision for (never below the rate served now), or None
        while the reactive rule decides."""
        if self.state != TRUSTED or self.mode != "active" or self.forecast_rps is None:
            return None
        return max(self.forecast_rps, self.latest())

    def promotion_problem(self) -> str | None:
        """Why this forecast may not scale its service now (None: its guard trusts it)."""
        if self.state == TRUSTED:
            return None
        learned, opp = self.errors()
        history_days = self.done / self.per_day
        if self.state in ("", COLD) or learned is None:
            return self.cold_reason(history_days)
        best = best_opponent(opp)
        return (
            f"its relative error {learned:.3f} over the last {self.cfg.judge_days:g} days is "
            f"above {opp[best]:.3f}, the best simple opponent's ({best})"
        )

    def status(self) -> DemandStatus:
        learned, opp = self.errors()
        cover = sum(s.covered for s in self.scored) / len(self.scored) if self.scored else None
        return DemandStatus(
            history_days=self.done / self.per_day,
            state=self.state or COLD,
            mode=self.mode,
            model_version=self.version,
            judged=len(self.scored),
            learned_rel_mae=learned,
            opponents_rel_mae=opp,
            p90_coverage=cover,
            forecast_rps=self.forecast_rps,
        )

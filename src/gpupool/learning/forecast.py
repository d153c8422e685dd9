"""Demand forecasts for a regular series (a service's load, a cluster's submissions).

Three simple opponents and a learned forecaster, all asked the same question: standing at
origin t, knowing the values up to and including t, what is the value at t + h?

* `last-value`: the value at t.
* `same-hour-yesterday`: the value one day before the target (t + h - 1 day), the newest
  one known at t (a horizon of a day or more goes back whole days until it is).
* `same-hour-7d-median`: the median of the values at the target's time of day on the last
  7 days known at t.
* `learned`: LightGBM quantile regressions (the median, and the 90th percentile an
  autoscaler would provision for) on lags, recent means, the same-time-of-day values of
  the last 7 days and the target's calendar (time of day, day of week). Counts and rates
  are learned on log1p (a quantile survives a monotone map), relative to the 7-day median
  of the target's time of day, so the trees learn corrections to the opponent that is
  usually best rather than the level itself.

The evaluation is rolling-origin: every step of the series after a warm-up is an origin;
the learned model used at an origin was trained on a schedule (weekly by default) and only
on pairs whose target was known when it was trained. Nothing here reads a clock: the same
series gives the same figures, byte for byte (LightGBM in its deterministic mode, one
thread).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gpupool.errors import SpecError
from gpupool.traces.series import DAY_S, Series

WEEK_S = 7 * DAY_S
OPPONENTS = ("last-value", "same-hour-yesterday", "same-hour-7d-median")
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class ForecastSettings:
    retrain_every_s: float = WEEK_S
    """How often the learned forecaster is retrained, on everything known by then."""
    warmup_days: float = 14.0
    """Origins before this much history are not scored (the cold start: with less, the
    service scales on the reactive rule); the first model is trained here."""
    max_train_days: float = 56.0
    """Training pairs: those with targets in the last this-many days."""
    lags: int = 6
    """The last values at and before the origin, one feature each."""
    quantiles: tuple[float, ...] = (0.5, 0.9)
    num_boost_round: int = 120
    learning_rate: float = 0.05
    num_leaves: int = 15
    min_data_in_leaf: int = 50
    lambda_l2: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.retrain_every_s <= 0 or self.warmup_days < 7 or self.max_train_days <= 0:
            raise SpecError(
                "retrain_every_s and max_train_days must be > 0 and warmup_days at least 7 "
                "(the 7-day medians need a week of history)"
            )
        if not {0.5, 0.9} <= set(self.quantiles) or any(not 0 < q < 1 for q in self.quantiles):
            raise SpecError(
                f"quantiles must be in (0, 1) and include 0.5 and 0.9, got {self.quantiles}"
            )
        if self.lags < 1:
            raise SpecError(f"lags must be at least 1, got {self.lags}")


@dataclass(frozen=True)
class HorizonScore:
    """One horizon's figures over the scored origins."""

    horizon_s: float
    origins: int
    rel_mae: dict[str, float]
    """Method -> mean absolute error over the mean of the actual values."""
    p90_coverage: float
    """Share of targets at or below the learned 90th percentile."""
    retrains: int
    forecasts: dict[str, FloatArray] = field(repr=False, compare=False)
    actual: FloatArray = field(repr=False, compare=False)
    p90: FloatArray = field(repr=False, compare=False)


def steps_of(series: Series, horizon_s: float) -> int:
    """The horizon in whole steps of the series."""
    k = horizon_s / series.step_s
    if k < 1 or abs(k - round(k)) > 1e-6:
        raise SpecError(
            f"horizon {horizon_s:g} s is not a whole number (>= 1) of the series' "
            f"{series.step_s:g} s steps"
        )
    return round(k)


# ---- the opponents -------------------------------------------------------------------------
def _same_time_back(
    y: FloatArray, t: npt.NDArray[np.int64], k: int, d: int, days: int
) -> FloatArray:
    """[len(t), days]: the values at the target's (t + k) time of day on the `days` latest
    days known at t (index <= t)."""
    first = -(-k // d)  # whole days back until the target's day is known
    back = (np.arange(days) + first) * d
    idx = (t + k)[:, None] - back[None, :]
    out: FloatArray = y[np.clip(idx, 0, None)]
    return out


def opponent_forecasts(
    y: FloatArray, t: npt.NDArray[np.int64], k: int, d: int
) -> dict[str, FloatArray]:
    """Each simple opponent's forecast of y[t + k] from y[: t + 1]."""
    return {
        "last-value": y[t],
        "same-hour-yesterday": _same_time_back(y, t, k, d, 1)[:, 0],
        "same-hour-7d-median": np.median(_same_time_back(y, t, k, d, 7), axis=1),
    }


# ---- the learned forecaster ----------------------------------------------------------------
FEATURES = (
    "lag_0..lag_{n-1}",
    "mean_1h",
    "mean_6h",
    "mean_24h",
    "same_time_1d..7d",
    "same_time_7d_mean",
    "time_of_day",
    "day_of_week",
)
"""What the learned forecaster sees at an origin (each from values at or before it)."""


class LogScale:
    """log1p for values that are never negative (counts, rates), identity otherwise."""

    def __init__(self, y: FloatArray) -> None:
        self.log = bool(np.all(y >= 0))

    def forward(self, y: FloatArray) -> FloatArray:
        return np.log1p(y) if self.log else y

    def back(self, z: FloatArray) -> FloatArray:
        return np.expm1(z) if self.log else z


def features_at(
    z: FloatArray, t: npt.NDArray[np.int64], k: int, series: Series, lags: int
) -> tuple[FloatArray, FloatArray]:
    """(features [len(t), n], base [len(t)]) at origins t for the target t + k, from z[: t + 1]
    only. `base` is the 7-day median of the target's time of day, which the model corrects."""
    d = series.per_day
    levels: list[FloatArray] = [z[np.clip(t - j, 0, None)] for j in range(lags)]
    csum = np.concatenate(([0.0], np.cumsum(z)))
    for span_s in (3600.0, 6 * 3600.0, DAY_S):
        n = max(1, round(span_s / series.step_s))
        lo = np.clip(t + 1 - n, 0, None)
        levels.append((csum[t + 1] - csum[lo]) / (t + 1 - lo))
    same = _same_time_back(z, t, k, d, 7)
    levels.extend(same[:, j] for j in range(7))
    levels.append(same.mean(axis=1))
    base = np.median(same, axis=1)
    target_s = series.start_s + (t + k) * series.step_s
    calendar = [(target_s % DAY_S) / DAY_S, np.floor(target_s / DAY_S) % 7]
    x = np.column_stack([*(c - base for c in levels), *calendar])
    return x, base


def quantile_params(settings: ForecastSettings, alpha: float) -> dict[str, object]:
    return {
        "objective": "quantile",
        "alpha": alpha,
        "learning_rate": settings.learning_rate,
        "num_leaves": settings.num_leaves,
        "min_data_in_leaf": settings.min_data_in_leaf,
        "lambda_l2": settings.lambda_l2,
        "seed": settings.seed,
        "deterministic": True,
        "force_row_wise": True,
        "num_threads": 1,
        "verbosity": -1,
    }


def learned_forecasts(
    series: Series,
    k: int,
    origins: npt.NDArray[np.int64],
    settings: ForecastSettings,
    on_retrain: Callable[[int], None] | None = None,
) -> tuple[dict[float, FloatArray], int]:
    """Quantile forecasts of y[t + k] at each origin t (ascending); the model used at t was
    trained at the last retrain time at or before t, on pairs whose target was <= it."""
    y = series.array()
    tf = LogScale(y)
    z = tf.forward(y)
    d = series.per_day
    every = max(1, round(settings.retrain_every_s / series.step_s))
    first_origin = 7 * d  # the first origin with a week of same-time values behind it
    # every origin's features once (each row reads only values at or before its origin);
    # the retrains and the forecasts take their rows from here
    x_all, base_all = features_at(
        z, np.arange(first_origin, len(y) - k, dtype=np.int64), k, series, settings.lags
    )
    out = {q: np.empty(len(origins)) for q in settings.quantiles}
    retrains = 0
    start = 0
    while start < len(origins):
        trained_at = int(origins[start])
        stop = int(np.searchsorted(origins, trained_at + every, side="left"))
        # training pairs: origin s with target s + k known at trained_at
        hi = trained_at - k
        lo = max(first_origin, hi - round(settings.max_train_days * d))
        batch = origins[start:stop]
        xb, base_b = x_all[batch - first_origin], base_all[batch - first_origin]
        if hi - lo < settings.min_data_in_leaf * 2:
            raise SpecError(
                f"too little history to train on before step {trained_at}: raise warmup_days"
            )
        s_idx = np.arange(lo, hi + 1, dtype=np.int64)
        xs, base_s = x_all[s_idx - first_origin], base_all[s_idx - first_origin]
        label = z[s_idx + k] - base_s
        import lightgbm  # lazily: the forecast's evaluation is the only user here

        for q in settings.quantiles:
            booster = lightgbm.train(
                quantile_params(settings, q),
                lightgbm.Dataset(xs, label, free_raw_data=True),
                num_boost_round=settings.num_boost_round,
            )
            pred = np.asarray(booster.predict(xb), dtype=np.float64) + base_b
            out[q][start:stop] = tf.back(pred)
        retrains += 1
        if on_retrain is not None:
            on_retrain(retrains)
        start = stop
    return out, retrains


# ---- the evaluation ------------------------------------------------------------------------
def evaluate(
    series: Series,
    horizons_s: Sequence[float],
    settings: ForecastSettings | None = None,
    on_retrain: Callable[[float, int], None] | None = None,
) -> dict[float, HorizonScore]:
    """Rolling-origin scores of the learned forecaster and each opponent, per horizon."""
    settings = settings or ForecastSettings()
    y = series.array()
    d = series.per_day
    warm = round(settings.warmup_days * d)
    out: dict[float, HorizonScore] = {}
    for h in horizons_s:
        k = steps_of(series, h)
        origins = np.arange(warm, len(y) - k, dtype=np.int64)
        if len(origins) < d:
            raise SpecError(
                f"the series has {len(y)} steps ({len(y) / d:.1f} days): the {h:g} s horizon "
                f"needs at least {settings.warmup_days:g} days of warm-up and a day to score"
            )
        actual = y[origins + k]
        forecasts = opponent_forecasts(y, origins, k, d)
        learned, retrains = learned_forecasts(
            series, k, origins, settings, _per_horizon(on_retrain, h)
        )
        forecasts["learned"] = learned[0.5]
        upper = learned[0.9]
        scale = float(np.mean(np.abs(actual))) or 1.0
        out[h] = HorizonScore(
            horizon_s=h,
            origins=len(origins),
            rel_mae={m: float(np.mean(np.abs(f - actual))) / scale for m, f in forecasts.items()},
            p90_coverage=float(np.mean(actual <= upper)),
            retrains=retrains,
            forecasts=forecasts,
            actual=actual,
            p90=upper,
        )
    return out


def _per_horizon(
    on_retrain: Callable[[float, int], None] | None, horizon_s: float
) -> Callable[[int], None] | None:
    if on_retrain is None:
        return None
    return lambda n: on_retrain(horizon_s, n)

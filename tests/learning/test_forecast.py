"""The demand forecaster and `gpupool learn forecast`: opponents as defined, no look at the
future, the learned model ahead of the opponents where the past says something, and the
command's output and errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpupool.cli.main import main
from gpupool.errors import SpecError
from gpupool.learning.forecast import (
    ForecastSettings,
    evaluate,
    features_at,
    opponent_forecasts,
)
from gpupool.traces.series import Series, read_series

HOUR = 3600.0


def weekly(days: int, seed: int = 0, step_s: float = HOUR) -> Series:
    """Requests with a daily cycle, quieter weekends, a slow trend and noise."""
    rng = np.random.default_rng(seed)
    n = int(days * 86_400 / step_s)
    t = np.arange(n) * step_s / HOUR
    y = 100 + 50 * np.sin(2 * np.pi * t / 24) - 30 * ((t // 24) % 7 >= 5) + 0.05 * t
    y += rng.normal(0, 10, n)
    return Series(0.0, step_s, tuple(np.maximum(y, 0.0).tolist()))


def test_the_opponents_are_what_they_say() -> None:
    d = 24
    y = np.arange(10 * d, dtype=np.float64)  # the value is its own index
    t = np.array([8 * d + 5])
    one_h = opponent_forecasts(y, t, 1, d)
    assert one_h["last-value"][0] == 8 * d + 5
    assert one_h["same-hour-yesterday"][0] == 8 * d + 6 - d
    # the target's hour on the 7 days before it: 7d+6 ... 1d+6 back from target 8d+6
    assert one_h["same-hour-7d-median"][0] == np.median([8 * d + 6 - j * d for j in range(1, 8)])
    # a day ahead: the newest same hour known at the origin is the origin itself
    day = opponent_forecasts(y, t, d, d)
    assert day["same-hour-yesterday"][0] == 8 * d + 5
    assert day["same-hour-7d-median"][0] == np.median([9 * d + 5 - j * d for j in range(1, 8)])


def test_no_feature_and_no_forecast_sees_the_future() -> None:
    series = weekly(30)
    y = series.array()
    z = np.log1p(y)
    origins = np.arange(7 * 24, len(y) - 24, dtype=np.int64)
    for k in (1, 24):
        x, base = features_at(z, origins, k, series, 6)
        for t in (7 * 24, 15 * 24 + 7, len(y) - 30):
            future = z.copy()
            future[t + 1 :] = 1e6  # anything after the origin
            x2, base2 = features_at(future, np.array([t]), k, series, 6)
            row = int(np.searchsorted(origins, t))
            np.testing.assert_array_equal(x2[0], x[row])
            assert base2[0] == base[row]
    # the whole evaluation: forecasts at origins up to T do not change with what follows T
    cut = 21 * 24 + 2  # just after the weekly retrain at day 21: its training pairs end here
    changed = y.copy()
    changed[cut + 1 :] = y[cut + 1 :][::-1] * 3.0
    settings = ForecastSettings(min_data_in_leaf=20)
    a = evaluate(series, [HOUR, 86_400.0], settings)
    b = evaluate(Series(0.0, HOUR, tuple(changed.tolist())), [HOUR, 86_400.0], settings)
    for h in a:
        upto = cut - 14 * 24 + 1  # origins 14 d .. cut
        for method in a[h].forecasts:
            np.testing.assert_array_equal(
                a[h].forecasts[method][:upto], b[h].forecasts[method][:upto], err_msg=method
            )
        np.testing.assert_array_equal(a[h].p90[:upto], b[h].p90[:upto])
        assert not np.array_equal(a[h].forecasts["learned"], b[h].forecasts["learned"])


def test_the_learned_forecaster_beats_the_opponents_on_a_weekly_pattern() -> None:
    scores = evaluate(weekly(42), [HOUR, 86_400.0])
    for h, sc in scores.items():
        best = min(v for m, v in sc.rel_mae.items() if m != "learned")
        assert sc.rel_mae["learned"] <= 0.9 * best, (h, sc.rel_mae)
        assert 0.8 <= sc.p90_coverage <= 0.97, (h, sc.p90_coverage)
        assert sc.retrains == -(-sc.origins // (7 * 24))  # weekly, from the first origin


def test_the_same_series_gives_the_same_figures() -> None:
    a = evaluate(weekly(24, seed=3), [HOUR])
    b = evaluate(weekly(24, seed=3), [HOUR])
    assert a[HOUR].rel_mae == b[HOUR].rel_mae
    assert a[HOUR].p90_coverage == b[HOUR].p90_coverage


def _write(path: Path, series: Series, start: str | None = None) -> Path:
    lines = ["time,rps"]
    for i, v in enumerate(series.values):
        at = series.start_s + i * series.step_s
        stamp = (
            f"{at:g}"
            if start is None
            else str(np.datetime64(start) + np.timedelta64(int(at), "s")).replace("T", " ")
        )
        lines.append(f"{stamp},{v:.3f}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_command_prints_and_writes_the_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    csv = _write(tmp_path / "s.csv", weekly(24), start="2024-05-10 00:00:00")
    out = tmp_path / "f.json"
    assert main(["learn", "forecast", "--series", str(csv), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "horizon 1h" in text and "horizon 24h" in text and "p90 coverage" in text
    body = json.loads(out.read_text())
    assert set(body["horizons"]) == {"1h", "24h"}
    for h in body["horizons"].values():
        assert set(h["learned"]) == {"rel_mae", "p90_coverage"}
        assert set(h["opponents"]) == {
            "last-value",
            "same-hour-yesterday",
            "same-hour-7d-median",
        }
        assert all(set(v) == {"rel_mae"} for v in h["opponents"].values())
    # dates and seconds read the same
    again = read_series(_write(tmp_path / "n.csv", weekly(24)))
    assert again.values == read_series(csv).values and again.step_s == HOUR


def test_bad_series_and_horizons_are_refused_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gap = tmp_path / "gap.csv"
    gap.write_text("time,rps\n0,1\n3600,2\n10800,3\n")
    with pytest.raises(SpecError, match=r"gap.csv:4: a step of 7200 s after 3600 s"):
        read_series(gap)
    two = tmp_path / "two.csv"
    two.write_text("time,a,b\n0,1,2\n3600,2,3\n")
    with pytest.raises(SpecError, match="name one with --column"):
        read_series(two)
    assert read_series(two, "b").values == (2.0, 3.0)
    csv = _write(tmp_path / "s.csv", weekly(20))
    assert main(["learn", "forecast", "--series", str(csv), "--horizons", "90m"]) == 2
    assert "not a whole number" in capsys.readouterr().err
    assert main(["learn", "forecast", "--series", str(csv), "--horizons", "soon"]) == 2
    short = _write(tmp_path / "short.csv", weekly(10))
    assert main(["learn", "forecast", "--series", str(short)]) == 2
    assert "warm-up" in capsys.readouterr().err

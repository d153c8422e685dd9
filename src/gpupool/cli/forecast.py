"""`gpupool learn forecast`: how well the demand forecaster would have done on a series.

Offline (no server): reads a CSV with a `time` column and a value column at any regular
step (a service's requests per second, a cluster's submissions per 10 minutes), and for
each horizon replays the series origin by origin: the learned forecaster (LightGBM
quantiles, retrained weekly on the past only) against three simple opponents. It prints
each one's relative mean absolute error (MAE over the mean actual value) and the learned
90th percentile's coverage (the share of actual values at or under it; an autoscaler that
provisions for the p90 is short that often the other way).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from gpupool.errors import SpecError

_UNIT_S = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86_400.0}
_HORIZON = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|min|m|h|d)?\s*$")


def add_forecast_parser(lsub: Any) -> None:
    f = lsub.add_parser(
        "forecast",
        help="evaluate the demand forecaster on a series (offline: no server needed)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    f.add_argument(
        "--series",
        required=True,
        type=Path,
        help="CSV with a `time` column (seconds, or a date and time, UTC unless it says) and "
        "one value column, at a regular step that divides a day",
    )
    f.add_argument("--column", help="the value column, when the file has several")
    f.add_argument(
        "--horizons",
        default="1h,24h",
        help="how far ahead, comma-separated: 10m, 1h, 24h, 1d or seconds (default 1h,24h); "
        "each a whole number of the series' steps",
    )
    f.add_argument(
        "--warmup-days",
        type=float,
        default=14.0,
        help="history before the first scored forecast, the cold start (default 14, at least 7)",
    )
    f.add_argument(
        "--retrain-days", type=float, default=7.0, help="retrain the model this often (default 7)"
    )
    f.add_argument("--json", dest="json_out", type=Path, help="also write the figures here")
    f.set_defaults(offline_handler=run_forecast)


def parse_horizon(text: str) -> float:
    """'1h' -> 3600.0; '600' -> 600.0."""
    m = _HORIZON.match(text)
    if not m:
        raise SpecError(f"horizon {text!r}: give a number with s, m, h or d (e.g. 1h, 24h)")
    return float(m.group(1)) * _UNIT_S[m.group(2) or "s"]


def run_forecast(args: argparse.Namespace) -> int:
    # imported here: LightGBM loads only for this command
    from gpupool.learning.forecast import ForecastSettings, evaluate
    from gpupool.traces.series import read_series

    labels = [h.strip() for h in str(args.horizons).split(",") if h.strip()]
    if not labels:
        raise SpecError("--horizons is empty; e.g. --horizons 1h,24h")
    horizons = {label: parse_horizon(label) for label in labels}
    series = read_series(args.series, args.column)
    settings = ForecastSettings(
        retrain_every_s=args.retrain_days * 86_400.0, warmup_days=args.warmup_days
    )
    days = len(series.values) / series.per_day
    print(
        f"{args.series}: {len(series.values)} steps of {series.step_s:g} s ({days:.1f} days) "
        f"of {series.name}",
        file=sys.stderr,
    )

    def progress(horizon_s: float, retrains: int) -> None:
        print(f"  horizon {horizon_s:g} s: model {retrains} trained", file=sys.stderr)

    scores = evaluate(series, list(horizons.values()), settings, progress)
    payload: dict[str, Any] = {
        "series": {
            "file": str(args.series),
            "column": series.name,
            "steps": len(series.values),
            "step_s": series.step_s,
        },
        "horizons": {},
    }
    lines = []
    for label, h in horizons.items():
        sc = scores[h]
        opponents = {m: v for m, v in sc.rel_mae.items() if m != "learned"}
        best = min(opponents, key=lambda m: opponents[m])
        payload["horizons"][label] = {
            "learned": {"rel_mae": sc.rel_mae["learned"], "p90_coverage": sc.p90_coverage},
            "opponents": {m: {"rel_mae": v} for m, v in opponents.items()},
            "best_opponent": best,
            "vs_best_opponent": sc.rel_mae["learned"] / opponents[best] - 1.0
            if opponents[best] > 0
            else None,
            "origins": sc.origins,
            "retrains": sc.retrains,
        }
        lines.append(f"horizon {label} ({sc.origins} forecasts, {sc.retrains} models):")
        for m, v in sorted(sc.rel_mae.items(), key=lambda kv: kv[1]):
            lines.append(f"  {m:22s} relative MAE {v:7.3f}")
        change = payload["horizons"][label]["vs_best_opponent"]
        if change is not None:
            lines.append(f"  learned vs best opponent ({best}): {change:+.1%}")
        lines.append(f"  learned p90 coverage: {sc.p90_coverage:.1%} (aim 85-95%)")
    print("\n".join(lines))
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return 0

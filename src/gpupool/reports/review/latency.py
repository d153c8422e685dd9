"""Service latency: each service's p99 history, and the lasting level change (a drift)
found in it by change-point search."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from gpupool.reports.review.period import Period
from gpupool.reports.review.rows import LatencyRow
from gpupool.reports.review.rules import ReviewRules
from gpupool.reports.review.units import iso, pct, rounded
from gpupool.reports.review_data import LatencySample


@dataclass(frozen=True)
class Latency:
    """Per service: its row, its (t_s, p99_ms) points, and its drift where one was found
    (changed_at_s, before_ms, after_ms)."""

    rows: list[LatencyRow]
    series: list[tuple[str, tuple[tuple[float, float], ...]]]
    drifts: dict[str, tuple[float, float, float]]


def drift(
    points: Sequence[tuple[float, float]], rules: ReviewRules
) -> tuple[float, float, float] | None:
    """(changed_at_s, before_ms, after_ms) of the largest lasting p99 level change, or None."""
    import numpy as np
    import ruptures as rpt  # type: ignore[import-untyped]

    n = len(points)
    if n < 2 * rules.drift_min_points:
        return None
    ts = np.array([p[0] for p in points], dtype=float)
    ys = np.array([p[1] for p in points], dtype=float)
    # Average long series into buckets so the search stays fast; refine the date on raw points.
    k = max(1, math.ceil(n / rules.drift_max_points))
    m = n // k
    if m < 2 * rules.drift_min_points:
        return None
    yb = ys[: m * k].reshape(m, k).mean(axis=1)
    diffs = np.diff(yb)
    sigma = 1.4826 * float(np.median(np.abs(diffs - np.median(diffs)))) / math.sqrt(2.0)
    floor = 0.01 * float(np.median(yb))
    var = max(sigma, floor, 1e-9) ** 2
    pen = rules.drift_penalty * var * math.log(m)
    algo = rpt.KernelCPD(kernel="linear", min_size=rules.drift_min_points).fit(yb.reshape(-1, 1))
    bkps = [b for b in algo.predict(pen=pen) if b < m]
    best: tuple[float, float, float, float] | None = None
    edges = [0, *bkps, m]
    for i, b in enumerate(bkps, start=1):
        before = float(np.median(yb[edges[i - 1] : b]))
        after = float(np.median(yb[b : edges[i + 1]]))
        history = float(np.median(yb[:b]))
        rest = float(np.median(yb[b:]))
        if before <= 0 or history <= 0:
            continue
        # It moved (segment to segment) and stayed (all before against all after): a spike
        # that comes back moves but does not stay.
        move = (after - before) / before
        stays = (rest - history) / history
        if abs(move) < rules.drift_min_change_frac or abs(stays) < rules.drift_min_change_frac:
            continue
        if (move > 0) != (stays > 0):
            continue
        # Refine: the best single split of the raw points in the two buckets around b.
        lo, hi = max(0, (b - 1) * k), min(n, (b + 1) * k)
        seg = ys[lo:hi]
        split = b * k
        if len(seg) >= 2:
            c1 = np.cumsum(seg)
            c2 = np.cumsum(seg**2)
            best_cost = math.inf
            for j in range(1, len(seg)):
                left = c2[j - 1] - c1[j - 1] ** 2 / j
                rn = len(seg) - j
                right = (c2[-1] - c2[j - 1]) - (c1[-1] - c1[j - 1]) ** 2 / rn
                cost = float(left + right)
                if cost < best_cost - 1e-12:
                    best_cost, split = cost, lo + j
        if best is None or abs(move) > abs(best[3]):
            best = (float(ts[split]), before, after, move)
    if best is None:
        return None
    return best[0], best[1], best[2]


def latency_section(period: Period, rules: ReviewRules) -> Latency:
    series_by: dict[str, list[LatencySample]] = defaultdict(list)
    for ls in period.data.latency:
        if period.start_s <= ls.t_s < period.end_s:
            series_by[ls.service].append(ls)
    latency_rows = []
    latency_series = []
    drifts: dict[str, tuple[float, float, float]] = {}
    for svc in sorted(series_by):
        pts = tuple((p.t_s, p.p99_ms) for p in sorted(series_by[svc], key=lambda p: p.t_s))
        latency_series.append((svc, pts))
        found = drift(pts, rules)
        mean = statistics.fmean(p for _, p in pts)
        if found is not None:
            drifts[svc] = found
            at, before, after = found
            latency_rows.append(
                LatencyRow(
                    svc,
                    len(pts),
                    rounded(mean, 3),
                    rounded(before, 3),
                    rounded(after, 3),
                    pct(after - before, before),
                    iso(at),
                    True,
                )
            )
        else:
            med = statistics.median(p for _, p in pts)
            latency_rows.append(
                LatencyRow(
                    svc,
                    len(pts),
                    rounded(mean, 3),
                    rounded(med, 3),
                    rounded(med, 3),
                    0.0,
                    "",
                    False,
                )
            )
    return Latency(latency_rows, latency_series, drifts)

"""Units and intervals the review's sections share: seconds to integer milliseconds,
milli-GPU x ms to GPU-hours, rounding, percentages, UTC times, interval sums and local
hours of the day."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from gpupool.reports.review.rules import MILLI, MS_PER_HOUR


def to_ms(t_s: float) -> int:
    """Seconds to whole milliseconds, the unit the exact split counts in."""
    return round(t_s * 1000)


def gpu_h(mgpu_ms: int) -> float:
    """Milli-GPU x milliseconds as GPU-hours, rounded for display."""
    return round(mgpu_ms / (MILLI * MS_PER_HOUR), 6)


def rounded(x: float, digits: int = 4) -> float:
    return round(x, digits)


def pct(part: float, whole: float) -> float:
    """Percent to 3 decimals; 0 of nothing."""
    return round(100.0 * part / whole, 3) if whole > 0 else 0.0


def iso(t_s: float) -> str:
    """UTC ISO time to the second, e.g. 2026-11-14T09:00:00Z."""
    return datetime.fromtimestamp(round(t_s), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_intervals(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def overlap_ms(merged: Sequence[tuple[int, int]], a: int, b: int) -> int:
    """Milliseconds of [a, b) covered by the sorted disjoint intervals `merged`."""
    total = 0
    for x, y in merged:
        if y <= a:
            continue
        if x >= b:
            break
        total += min(b, y) - max(a, x)
    return total


def up_parts(merged_down: Sequence[tuple[int, int]], a: int, b: int) -> list[tuple[int, int]]:
    """[a, b) minus the down intervals."""
    parts: list[tuple[int, int]] = []
    cur = a
    for x, y in merged_down:
        if y <= cur:
            continue
        if x >= b:
            break
        if x > cur:
            parts.append((cur, x))
        cur = max(cur, y)
    if cur < b:
        parts.append((cur, b))
    return parts


def hour_split(a_s: float, b_s: float, offset_s: float) -> Iterable[tuple[int, float]]:
    """(local hour of day, seconds) pieces of [a_s, b_s)."""
    t = a_s
    while t < b_s:
        local = t + offset_s
        hour_start = math.floor(local / 3600.0) * 3600.0
        nxt = min(b_s, hour_start + 3600.0 - offset_s)
        if nxt <= t:  # float guard
            nxt = b_s
        yield int((hour_start / 3600.0) % 24), nxt - t
        t = nxt


def hour_of(t_s: float, offset_s: float) -> int:
    return int(math.floor((t_s + offset_s) / 3600.0) % 24)


def p95(values: Sequence[float]) -> float:
    """Nearest-rank 95th percentile."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def in_day(hour: int, window: tuple[int, int]) -> bool:
    lo, hi = window
    return lo <= hour < hi if lo <= hi else (hour >= lo or hour < hi)

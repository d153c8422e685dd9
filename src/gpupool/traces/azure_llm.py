"""Azure LLM inference trace 2023 (Splitwise, ISCA '24): TIMESTAMP,ContextTokens,GeneratedTokens.

TIMESTAMP looks like "2023-11-16 18:17:03.9799600": 7 fractional digits, 100-ns resolution.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from gpupool.errors import SpecError, TraceFormatError
from gpupool.traces.common import ReadReport, int_field, open_rows

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

_TIMESTAMP = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?")
_EPOCH = datetime(1970, 1, 1)
_NS_PER_S = 1_000_000_000
_SECOND = timedelta(seconds=1)


@dataclass(frozen=True, slots=True)
class RequestArrival:
    """One inference request; arrival_s counts from the first row of its file."""

    request_id: str
    arrival_s: float
    context_tokens: int
    generated_tokens: int


def _timestamp_ns(text: str, path: str | Path, line: int) -> int:
    """Integer nanoseconds, because datetime keeps only 6 fractional digits."""
    match = _TIMESTAMP.fullmatch(text.strip())
    if not match:
        raise TraceFormatError(
            path, line, f"TIMESTAMP={text!r} is not 'YYYY-MM-DD HH:MM:SS[.fraction]'"
        )
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    try:
        moment = datetime(year, month, day, hour, minute, second)
    except ValueError as err:
        raise TraceFormatError(
            path, line, f"TIMESTAMP={text!r} is not a valid time: {err}"
        ) from None
    whole_s = (moment - _EPOCH) // _SECOND
    fraction = (match.group(7) or "").ljust(9, "0")
    return whole_s * _NS_PER_S + int(fraction)


def read_azure_llm(path: str | Path) -> tuple[list[RequestArrival], ReadReport]:
    """Arrivals relative to the first row, so a replay starts at 0 whatever the wall date."""
    stem = Path(path).stem
    report = ReadReport(str(path))
    arrivals: list[RequestArrival] = []
    start_ns: int | None = None
    for line, row in open_rows(path, COLUMNS):
        index = report.rows
        report.rows += 1
        stamp_ns = _timestamp_ns(row["TIMESTAMP"], path, line)
        context = int_field(row, "ContextTokens", path, line)
        generated = int_field(row, "GeneratedTokens", path, line)
        if start_ns is None:
            start_ns = stamp_ns
        if context < 0 or generated < 0:
            report.skip("negative token count")
            continue
        if stamp_ns < start_ns:
            report.skip("timestamp before trace start")
            continue
        arrivals.append(
            RequestArrival(
                request_id=f"{stem}-{index}",
                arrival_s=(stamp_ns - start_ns) / _NS_PER_S,
                context_tokens=context,
                generated_tokens=generated,
            )
        )
        report.used += 1
    arrivals.sort(key=lambda a: a.arrival_s)  # stable: ties keep file order
    return arrivals, report


def arrival_rate_per_s(arrivals: Sequence[RequestArrival], window_s: float) -> list[float]:
    """Requests per second in consecutive windows [k*w, (k+1)*w) from 0 to the last arrival.

    Empty windows are kept as 0.0 so the list index maps straight back to time.
    """
    if not window_s > 0 or not math.isfinite(window_s):
        raise SpecError(f"window_s must be a positive number of seconds, got {window_s}")
    if not arrivals:
        return []
    counts: list[int] = []
    for arrival in arrivals:
        if arrival.arrival_s < 0 or not math.isfinite(arrival.arrival_s):
            raise SpecError(
                f"request {arrival.request_id}: arrival_s must be finite and >= 0, "
                f"got {arrival.arrival_s}"
            )
        slot = int(arrival.arrival_s // window_s)
        if slot >= len(counts):
            counts.extend([0] * (slot + 1 - len(counts)))
        counts[slot] += 1
    return [n / window_s for n in counts]

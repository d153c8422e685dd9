"""A regular time series from a CSV: a `time` column and a value column.

`time` is either seconds (any origin, e.g. Unix time) or a date and time
("2020-04-01 00:10:00", ISO 8601; a time without a zone is taken as UTC). The steps must
all be equal: a forecast of "the same hour yesterday" counts steps, so a missing row would
shift every later value by one; the error names the first row out of step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt

from gpupool.errors import SpecError, TraceFormatError
from gpupool.traces.common import open_rows

DAY_S = 86_400.0
TIME_COLUMN = "time"


@dataclass(frozen=True)
class Series:
    """Values on a regular grid: `start_s` and `step_s` in seconds (epoch or any origin)."""

    start_s: float
    step_s: float
    values: tuple[float, ...]
    name: str = "value"

    def __post_init__(self) -> None:
        if not self.step_s > 0 or not math.isfinite(self.step_s):
            raise SpecError(f"a series needs a positive step, got {self.step_s} s")
        if abs(DAY_S / self.step_s - round(DAY_S / self.step_s)) > 1e-6:
            raise SpecError(
                f"a step of {self.step_s:g} s does not divide a day; the same-hour "
                f"forecasts need whole steps per day (e.g. 60, 600, 3600 s)"
            )
        if not all(math.isfinite(v) for v in self.values):
            raise SpecError("a series' values must be finite numbers (no gaps, no NaN)")

    @property
    def per_day(self) -> int:
        """Steps in a day."""
        return round(DAY_S / self.step_s)

    def array(self) -> npt.NDArray[np.float64]:
        return np.asarray(self.values, dtype=np.float64)


def _seconds(text: str, path: Path, line: int) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise TraceFormatError(
            path, line, f"time {text!r} is neither seconds nor a date and time (ISO 8601)"
        ) from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.timestamp()


def read_series(path: str | Path, column: str | None = None) -> Series:
    """The series in `path`: its `time` column and `column` (default: the one other column)."""
    p = Path(path)
    rows = open_rows(p, [TIME_COLUMN])
    times: list[float] = []
    values: list[float] = []
    chosen = column
    for line, row in rows:
        if chosen is None:
            others = [c for c in row if c != TIME_COLUMN]
            if len(others) != 1:
                raise SpecError(f"{p} has the value columns {others}; name one with --column")
            chosen = others[0]
        if chosen not in row:
            raise SpecError(f"{p} has no column {chosen!r}; its columns: {list(row)}")
        times.append(_seconds(row[TIME_COLUMN], p, line))
        try:
            values.append(float(row[chosen]))
        except ValueError:
            raise TraceFormatError(p, line, f"{chosen} {row[chosen]!r} is not a number") from None
        if not math.isfinite(values[-1]):
            raise TraceFormatError(p, line, f"{chosen} is {row[chosen]!r}: a gap is not a value")
    return _regular(p, times, values, chosen or "value")


def _regular(p: Path, times: Sequence[float], values: Sequence[float], name: str) -> Series:
    if len(times) < 2:
        raise SpecError(f"{p}: a series needs at least two rows, got {len(times)}")
    step = times[1] - times[0]
    if step <= 0:
        raise TraceFormatError(p, 3, "times must increase (sort the file by time)")
    for i in range(2, len(times)):
        if abs(times[i] - times[i - 1] - step) > 1e-6 * step:
            raise TraceFormatError(
                p,
                i + 2,  # the header is line 1
                f"a step of {times[i] - times[i - 1]:g} s after {step:g} s: the series must "
                f"be regular (fill a missing step, e.g. with 0 for a count)",
            )
    return Series(times[0], step, tuple(values), name)

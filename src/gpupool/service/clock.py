"""The clock behind a small interface, so tests drive time by hand."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...


class SystemClock:
    def now(self) -> float:
        return time.time()


class ManualClock:
    """Time moves only when a test says so."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.t = start_s

    def now(self) -> float:
        return self.t

    def advance(self, dt_s: float) -> float:
        self.t += dt_s
        return self.t

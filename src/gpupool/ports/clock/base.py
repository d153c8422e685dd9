"""The clock behind a small interface, so tests drive time by hand."""

from __future__ import annotations

import time
from typing import Protocol

from gpupool.errors import SpecError


class Clock(Protocol):
    def now(self) -> float: ...


class SystemClock:
    def now(self) -> float:
        return time.time()


class StartedClock:
    """The system clock, started at a chosen moment and optionally faster: to rehearse
    a schedule (a night window, a cheap hour) now instead of waiting for it."""

    def __init__(self, start_s: float, speed: float = 1.0) -> None:
        if not speed > 0:
            raise SpecError(f"clock speed must be > 0, got {speed}")
        self.start_s = start_s
        self.speed = speed
        self.real_start_s = time.time()

    def now(self) -> float:
        return self.start_s + (time.time() - self.real_start_s) * self.speed


class ManualClock:
    """Time moves only when a test says so."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.t = start_s

    def now(self) -> float:
        return self.t

    def advance(self, dt_s: float) -> float:
        self.t += dt_s
        return self.t

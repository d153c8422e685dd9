"""The clock port: what "now" is for the live driver (the core is given its times).

Contract: `now()` returns Unix seconds as a float, never blocks and never fails; it may
jump (a test's manual clock, a rehearsal's started clock) but a driver must not assume it
moves on its own between two calls of one step.
"""

from __future__ import annotations

import time
from typing import Protocol

from gpupool.errors import SpecError


class Clock(Protocol):
    def now(self) -> float:
        """Unix seconds."""
        ...


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

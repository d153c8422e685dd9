"""A clock that moves only when a test (or the simulator's world) moves it."""

from __future__ import annotations


class ManualClock:
    """Time moves only when a test says so."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.t = start_s

    def now(self) -> float:
        return self.t

    def advance(self, dt_s: float) -> float:
        self.t += dt_s
        return self.t

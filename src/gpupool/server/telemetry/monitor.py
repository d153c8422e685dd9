"""The monitoring rule: GPU samples over a window turned into the seed practice's periodic
signals (idle GPUs to reclaim, a busy fleet to grow)."""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.errors import SpecError
from gpupool.ports.telemetry.base import GpuSample


@dataclass(frozen=True)
class Signals:
    """What one monitoring window says: GPUs idle enough to take back, a fleet to grow."""

    reclaimable: tuple[int, ...]
    scale_out: bool
    mean_util_pct: float
    window_s: float


class MonitorRule:
    """The seed practice's rule: every `every_s` (5 minutes), GPUs averaging under
    `low_pct` utilisation are reclaimable, and a fleet averaging over `high_pct` should
    grow. Lost or faulty GPUs read 0% but are broken, not idle, so their samples are left
    out; the fleet mean is the mean of per-GPU means, so a GPU sampled more often does not
    weigh more.
    """

    def __init__(self, every_s: float = 300.0, low_pct: float = 30.0, high_pct: float = 90.0):
        if not every_s > 0:
            raise SpecError(f"monitor rule: every_s must be > 0, got {every_s}")
        if not 0.0 <= low_pct <= high_pct <= 100.0:
            raise SpecError(
                f"monitor rule: need 0 <= low_pct <= high_pct <= 100, got {low_pct}, {high_pct}"
            )
        self.every_s = float(every_s)
        self.low_pct = float(low_pct)
        self.high_pct = float(high_pct)
        self._start_s: float | None = None
        self._sums: dict[int, float] = {}
        self._counts: dict[int, int] = {}

    def observe(self, samples: list[GpuSample]) -> None:
        """Add samples to the window; the first ones start it if no evaluation has."""
        for s in samples:
            if self._start_s is None:
                self._start_s = s.at_s
            if not s.healthy:
                continue
            self._sums[s.index] = self._sums.get(s.index, 0.0) + s.util_pct
            self._counts[s.index] = self._counts.get(s.index, 0) + 1

    def due(self, now_s: float) -> bool:
        """True once a whole window has passed since it started."""
        return self._start_s is not None and now_s - self._start_s >= self.every_s

    def evaluate(self, now_s: float) -> Signals:
        """The window's signals; the next window starts at now_s."""
        means = {i: self._sums[i] / n for i, n in self._counts.items() if n > 0}
        window_s = 0.0 if self._start_s is None else max(0.0, now_s - self._start_s)
        fleet = sum(means.values()) / len(means) if means else 0.0
        signals = Signals(
            reclaimable=tuple(sorted(i for i, m in means.items() if m < self.low_pct)),
            scale_out=bool(means) and fleet > self.high_pct,
            mean_util_pct=fleet,
            window_s=window_s,
        )
        self._start_s = now_s
        self._sums.clear()
        self._counts.clear()
        return signals

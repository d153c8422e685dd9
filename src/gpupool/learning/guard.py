"""The guard: the learned order is used only while its predictions hold up.

Over a sliding window of finished jobs it compares what the model predicted at submit
with the GPU-time the job took: the share within a factor of 2, and Spearman's rank
correlation (ordering is what the policy uses predictions for). Below either threshold
the guard falls back to the rule policy; it returns once both recover past the
thresholds plus a margin (hysteresis, so it does not flap). Until the cluster has been
seen `cold_start_s` and `min_finished` jobs have finished, it stays cold: rules only.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

import numpy as np

from gpupool.errors import SpecError


class GuardState(enum.Enum):
    COLD = "cold"
    """Too little history: the rules decide."""
    TRUSTED = "trusted"
    """The model's order is used."""
    FALLBACK = "fallback"
    """The model drifted: the rules decide until it recovers."""


@dataclass(frozen=True)
class GuardConfig:
    window_jobs: int = 500
    min_within_2x: float = 0.15
    min_rank_corr: float = 0.05
    recover_margin: float = 0.05
    cold_start_s: float = 14 * 86_400.0
    """About two weeks of the cluster's history before the model is trusted at all."""
    min_finished: int = 200

    def __post_init__(self) -> None:
        if self.window_jobs < 10:
            raise SpecError(f"guard window_jobs must be at least 10, got {self.window_jobs}")
        for name in ("min_within_2x", "recover_margin"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise SpecError(f"guard {name} must be in 0..1, got {getattr(self, name)}")
        if not -1.0 <= self.min_rank_corr <= 1.0:
            raise SpecError(f"guard min_rank_corr must be in -1..1, got {self.min_rank_corr}")
        if self.cold_start_s < 0 or self.min_finished < 0:
            raise SpecError("guard cold_start_s and min_finished must be >= 0")


@dataclass(frozen=True)
class GuardChange:
    """A change of state, with the sentence the event log shows."""

    t_s: float
    before: GuardState
    after: GuardState
    reason: str


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Rank correlation with average ranks for ties; 0 when either side is constant."""
    if a.size < 2:
        return 0.0
    ra, rb = _ranks(a), _ranks(b)
    sa, sb = ra.std(), rb.std()
    if sa == 0 or sb == 0:
        return 0.0
    return float(((ra - ra.mean()) * (rb - rb.mean())).mean() / (sa * sb))


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks from 0, equal values sharing the average of their ranks."""
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    first = np.r_[True, sorted_x[1:] != sorted_x[:-1]]
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], x.size]
    average = (starts + ends - 1) / 2.0
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = average[np.cumsum(first) - 1]
    return ranks


class DriftGuard:
    def __init__(self, config: GuardConfig | None = None) -> None:
        self.config = config or GuardConfig()
        self.state = GuardState.COLD
        self._pairs: deque[tuple[float, float]] = deque(maxlen=self.config.window_jobs)
        self.changes: list[GuardChange] = []

    def observe(self, predicted_gpu_s: float, actual_gpu_s: float) -> None:
        """A finished job the model had predicted at its submit."""
        self._pairs.append((max(predicted_gpu_s, 1e-9), max(actual_gpu_s, 1e-9)))

    @property
    def window(self) -> int:
        return len(self._pairs)

    def within_2x(self) -> float:
        if not self._pairs:
            return 0.0
        p, a = self._arrays()
        ratio = p / a
        return float(np.mean((ratio <= 2.0) & (ratio >= 0.5)))

    def rank_corr(self) -> float:
        p, a = self._arrays()
        return spearman(p, a)

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        arr = np.asarray(self._pairs, dtype=np.float64).reshape(-1, 2)
        return arr[:, 0], arr[:, 1]

    def update(
        self, t_s: float, seen_s: float, finished: int, model_ready: bool
    ) -> GuardChange | None:
        """Decide the state at t_s; returns the change, if any (also kept in `changes`)."""
        cfg = self.config
        before = self.state
        after = before
        reason = ""
        if not model_ready or seen_s < cfg.cold_start_s or finished < cfg.min_finished:
            if before is GuardState.COLD:
                return None
            after, reason = GuardState.COLD, "no trained model: rules decide"
        elif self.window < min(cfg.window_jobs, cfg.min_finished, 30):
            # a model but too few judged predictions yet: trust it only after a first window
            if before is GuardState.COLD:
                return None
        else:
            w2, rho = self.within_2x(), self.rank_corr()
            figures = (
                f"{w2:.0%} of the last {self.window} predictions within 2x "
                f"(needs {cfg.min_within_2x:.0%}), rank correlation {rho:.2f} "
                f"(needs {cfg.min_rank_corr:.2f})"
            )
            bad = w2 < cfg.min_within_2x or rho < cfg.min_rank_corr
            good = (
                w2 >= cfg.min_within_2x + cfg.recover_margin
                and rho >= cfg.min_rank_corr + cfg.recover_margin
            )
            if before is GuardState.TRUSTED and bad:
                after, reason = GuardState.FALLBACK, f"model drifted, rules decide: {figures}"
            elif before is not GuardState.TRUSTED and good:
                after, reason = GuardState.TRUSTED, f"model trusted: {figures}"
            elif before is GuardState.COLD and not good:
                after, reason = GuardState.FALLBACK, f"model not good enough yet: {figures}"
        if after is before:
            return None
        self.state = after
        change = GuardChange(t_s, before, after, reason)
        self.changes.append(change)
        return change

"""The guard: the learned order is used only while it would have served recent jobs
better than the rule's own order.

Judge `order` (the default): over a sliding window of finished jobs, the order judge
(`judge.OrderJudge`) replays pairs of jobs that waited together under the model's order
and the rule's; below `min_advantage` the guard falls back to the rule, and returns once
the advantage is `advantage_margin` above it (hysteresis, so it does not flap). Judge
`accuracy` (the earlier guard): the share of predictions within a factor of 2 and
Spearman's rank correlation of predicted and taken GPU-time, with `min_within_2x`,
`min_rank_corr` and `recover_margin`; both figures are kept and shown either way. Until
the cluster has been seen `cold_start_s` and `min_finished` jobs have finished, it stays
cold: rules only.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

import numpy as np

from gpupool.errors import SpecError
from gpupool.learning.judge import OrderJudge

JUDGES = ("order", "accuracy")


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
    judge: str = "order"
    """order: the model's order against the rule's on pairs of recent jobs; accuracy: the
    predictions against the GPU-time taken (the thresholds above)."""
    min_advantage: float = 0.04
    """The order judge falls back when the model's order would not have made recent
    pairs' summed completion at least this much shorter than the rule's."""
    advantage_margin: float = 0.06
    """...and trusts the model from min_advantage + this (+10 %). The pair figure
    overstates what a whole cluster gains, most at high load, where a swapped pair delays
    the many jobs waiting behind it: with +2 % / +5 % the guard trusted the model on ITP
    cluster02 at +25 % load for 33 days and the mean JCT came out 6.2 % above the rule's;
    with +4 % / +10 % no ITP cell is more than 2.0 % above it (docs/learning.md)."""
    pairs_per_job: int = 16
    """Jobs each finished job is paired with (those that waited with it, newest first)."""

    def __post_init__(self) -> None:
        if self.judge not in JUDGES:
            raise SpecError(f"guard judge must be one of {', '.join(JUDGES)}, got {self.judge!r}")
        if not -1.0 <= self.min_advantage <= 1.0 or not 0.0 <= self.advantage_margin <= 1.0:
            raise SpecError(
                "guard min_advantage must be in -1..1 and advantage_margin in 0..1, got "
                f"{self.min_advantage} and {self.advantage_margin}"
            )
        if self.pairs_per_job < 1:
            raise SpecError(f"guard pairs_per_job must be at least 1, got {self.pairs_per_job}")
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
    def __init__(self, config: GuardConfig | None = None, judge: OrderJudge | None = None) -> None:
        """`judge`: the order judge fed by the ordering; without one (or with judge
        `accuracy`) the guard decides on the accuracy figures."""
        self.config = config or GuardConfig()
        self.state = GuardState.COLD
        self._pairs: deque[tuple[float, float]] = deque(maxlen=self.config.window_jobs)
        self.changes: list[GuardChange] = []
        self.judge = judge if self.config.judge == "order" else None

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

    def _verdict(self) -> tuple[bool, bool, str]:
        """(fall back, may be trusted, the figures in words)."""
        cfg = self.config
        w2, rho = self.within_2x(), self.rank_corr()
        accuracy = (
            f"{w2:.0%} of the last {self.window} predictions within 2x "
            f"(needs {cfg.min_within_2x:.0%}), rank correlation {rho:.2f} "
            f"(needs {cfg.min_rank_corr:.2f})"
        )
        if self.judge is None:
            bad = w2 < cfg.min_within_2x or rho < cfg.min_rank_corr
            good = (
                w2 >= cfg.min_within_2x + cfg.recover_margin
                and rho >= cfg.min_rank_corr + cfg.recover_margin
            )
            return bad, good, accuracy
        adv = self.judge.advantage()
        figures = (
            f"on {self.judge.pairs()} pairs of the last {self.judge.window} finished jobs that "
            f"waited together, the model's order {adv:+.1%} against the rule's in summed "
            f"completion (falls back below {cfg.min_advantage:+.1%}, trusted from "
            f"{cfg.min_advantage + cfg.advantage_margin:+.1%}); {w2:.0%} of the predictions "
            f"within 2x, rank correlation {rho:.2f}"
        )
        bad = adv < cfg.min_advantage
        good = adv >= cfg.min_advantage + cfg.advantage_margin
        return bad, good, figures

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
            bad, good, figures = self._verdict()
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

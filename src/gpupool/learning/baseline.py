"""A plain predictor: quantiles of recent finished jobs that look alike.

It is the yardstick a learned model has to beat, and the model a cluster can use without
LightGBM: the GPU-time quantiles of the last `recent` finished jobs of the same team and
GPU count, else the same GPU count, else all.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gpupool.learning.history import History, JobFacts, Outcome
from gpupool.learning.predictor import ModelInfo, Prediction


class RecentMedianPredictor:
    def __init__(
        self, recent: int = 50, min_rows: int = 20, retrain_every_s: float = 86_400.0
    ) -> None:
        self.recent = recent
        self.min_rows = min_rows
        self.retrain_every_s = retrain_every_s
        self._info: ModelInfo | None = None

    @property
    def info(self) -> ModelInfo | None:
        return self._info

    def retrain_due(self, history: History, now_s: float) -> bool:
        if self._info is None:
            return history.finished_by(now_s) >= self.min_rows
        return now_s >= self._info.trained_at_s + self.retrain_every_s

    def retrain(self, history: History, now_s: float) -> ModelInfo | None:
        rows = history.finished_by(now_s)
        if rows < self.min_rows:
            return None
        version = 1 if self._info is None else self._info.version + 1
        self._info = ModelInfo(version, now_s, rows, "recent-median")
        return self._info

    def predict(self, facts: JobFacts, history: History) -> Prediction | None:
        if self._info is None:
            return None
        matches: tuple[Callable[[Outcome], bool], ...] = (
            lambda o: o.facts.team == facts.team and o.facts.gpu_count == facts.gpu_count,
            lambda o: o.facts.gpu_count == facts.gpu_count,
            lambda o: True,
        )
        for match in matches:
            times = [o.gpu_time_s for o in _take(history, match, self.recent)]
            if len(times) >= 5:
                q10, q50, q90 = np.quantile(np.asarray(times), [0.1, 0.5, 0.9])
                return Prediction(float(q10), float(q50), float(q90), self._info.version)
        return None


def _take(history: History, match: Callable[[Outcome], bool], n: int) -> list[Outcome]:
    out: list[Outcome] = []
    for o in history.recent(10 * n):
        if match(o):
            out.append(o)
            if len(out) >= n:
                break
    return out

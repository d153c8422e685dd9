"""Deliberately wrong predictors, to show the guard stops a model that predicts badly.

Fault injection for tests and benchmarks only, never for a real cluster:
`ShuffledPredictor` hands each job the prediction made for another recent job (right
distribution, no information about this job), `InvertedPredictor` mirrors the prediction
around the history's median in log space (short looks long, long looks short). Both keep
the inner model's schedule, training and `info`, so the rest of the system sees a trained,
versioned model.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict

import numpy as np

from gpupool.learning.features import log_gpu_s
from gpupool.learning.history import History, JobFacts
from gpupool.learning.predictor import Prediction, Predictor, WrappedPredictor


class ShuffledPredictor(WrappedPredictor):
    """Each job gets the inner prediction of a different job among the last `pool` ones
    predicted, chosen by a random draw seeded with (seed, job id)."""

    def __init__(self, inner: Predictor, seed: int = 0, pool: int = 200) -> None:
        super().__init__(inner)
        self.seed = seed
        self.pool = pool
        self._made: OrderedDict[str, Prediction] = OrderedDict()

    def predict(self, facts: JobFacts, history: History) -> Prediction | None:
        own = self.inner.predict(facts, history)
        if own is None:
            return None
        others = [p for job_id, p in self._made.items() if job_id != facts.job_id]
        self._made[facts.job_id] = own
        self._made.move_to_end(facts.job_id)
        while len(self._made) > self.pool:
            self._made.popitem(last=False)
        if not others:
            return own  # nothing to swap with yet
        pick = others[random.Random(f"{self.seed}:{facts.job_id}").randrange(len(others))]
        return Prediction(pick.q10_gpu_s, pick.q50_gpu_s, pick.q90_gpu_s, own.version)


class InvertedPredictor(WrappedPredictor):
    """The inner prediction mirrored around the median log GPU-time of the last `recent`
    jobs finished by the job's submit: exp(2m - log q), with q10 and q90 swapped."""

    def __init__(self, inner: Predictor, recent: int = 1_000) -> None:
        super().__init__(inner)
        self.recent = recent
        self._median_at: tuple[History, int, float] | None = None

    def _median_log(self, history: History, submit_s: float) -> float | None:
        known = history.finished_by(submit_s)
        if known == 0:
            return None
        cached = self._median_at
        if cached is not None and cached[0] is history and cached[1] == known:
            return cached[2]
        rows = history.outcomes[max(0, known - self.recent) : known]
        m = float(np.median([log_gpu_s(o.gpu_time_s) for o in rows]))
        self._median_at = (history, known, m)
        return m

    def predict(self, facts: JobFacts, history: History) -> Prediction | None:
        own = self.inner.predict(facts, history)
        if own is None:
            return None
        m = self._median_log(history, facts.submit_s)
        if m is None:
            return own

        def mirror(q: float) -> float:
            return math.exp(2.0 * m - log_gpu_s(q))

        return Prediction(
            mirror(own.q90_gpu_s), mirror(own.q50_gpu_s), mirror(own.q10_gpu_s), own.version
        )

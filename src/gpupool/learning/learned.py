"""One ordering object for every driver: rules, or predictions mixed with rules, guarded.

The replay and the decision core feed it the same three things (a submit, a finish, the
passing of time) and ask it for an order of the jobs that want GPUs. With no predictor it
is the rule order (2D-LAS or 2D-Gittins). With one, it predicts each job's GPU-time at
submit, retrains on its schedule, judges each prediction when the job finishes, and uses
the predicted order (mixed with the rule order by preferential round-robin) only while
the guard trusts the model.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

from gpupool.learning.config import LearningConfig
from gpupool.learning.guard import DriftGuard, GuardChange, GuardState
from gpupool.learning.history import History, JobFacts, Outcome
from gpupool.learning.ordering import GittinsIndex, grid_step_above, preferential_merge
from gpupool.learning.predictor import ModelInfo, Prediction, Predictor

GITTINS_SAMPLE = 2_000
"""Finished jobs (most recent) the Gittins index is computed from."""
GITTINS_REFRESH = 100
"""Rebuild the Gittins index after this many new finishes."""
PREDICTED_BINS = 10
"""The conditional order splits recent judged jobs into this many bins of predicted
median GPU-time, of equal count; each bin has its own Gittins index."""


class Candidate(NamedTuple):
    """A job that wants GPUs now (running or waiting), as an order sees it."""

    job_id: str
    attained_gpu_s: float
    """GPU service received so far (GPUs x time run)."""
    arrival_s: float


PredictedKey = tuple[float, float, float, str]
"""A job's key in the predicted order: compared as a tuple, the job id last."""


class LearnedOrdering:
    def __init__(self, config: LearningConfig, predictor: Predictor | None = None) -> None:
        self.config = config
        self.predictor = predictor
        self.history = History()
        self.guard = DriftGuard(config.guard)
        self.facts: dict[str, JobFacts] = {}
        self.predictions: dict[str, Prediction] = {}
        self._gittins = GittinsIndex(())
        self._gittins_at = 0
        self.judged: deque[tuple[float, float]] = deque(maxlen=GITTINS_SAMPLE)
        """Recent finished jobs: (predicted median, GPU-time taken), both GPU-seconds."""
        self._judged_seen = 0
        self._bins: tuple[list[float], list[GittinsIndex]] = ([], [])
        self._bins_at = 0
        self._keys_version = 0
        """Moves whenever a job's predicted key may have changed for the same attained
        service: the bins were rebuilt, or the model retrained and predicted again."""
        self.retrains: list[ModelInfo] = []

    # ---- what happened -------------------------------------------------------------
    def submitted(self, facts: JobFacts) -> Prediction | None:
        """A job arrived; predicted now (with the model and history of this moment)."""
        self.history.submitted(facts)
        self.facts[facts.job_id] = facts
        return self._predict(facts)

    def finished(self, job_id: str, finish_s: float, gpu_time_s: float) -> None:
        """A job completed: it becomes training data, and its prediction is judged."""
        facts = self.facts.pop(job_id, None)
        if facts is None:
            return
        self.history.finished(Outcome(facts, finish_s, gpu_time_s))
        prediction = self.predictions.pop(job_id, None)
        if prediction is not None:
            self.guard.observe(prediction.q50_gpu_s, gpu_time_s)
            self.judged.append((prediction.q50_gpu_s, gpu_time_s))
            self._judged_seen += 1

    def forget(self, job_id: str) -> None:
        """A job left without completing (cancelled, failed): no outcome to learn from."""
        self.facts.pop(job_id, None)
        self.predictions.pop(job_id, None)

    def tick(self, now_s: float) -> GuardChange | None:
        """Retrain when due, then let the guard decide; returns the guard's change."""
        p = self.predictor
        if p is not None and p.retrain_due(self.history, now_s):
            info = p.retrain(self.history, now_s)
            if info is not None:
                self.retrains.append(info)
                self._keys_version += 1
                for facts in self.facts.values():
                    self._predict(facts)
        if p is None:
            return None
        return self.guard.update(
            now_s,
            self.history.span_s(),
            self.history.finished_by(now_s),
            p.info is not None,
        )

    def _predict(self, facts: JobFacts) -> Prediction | None:
        if self.predictor is None or self.predictor.info is None:
            return None
        prediction = self.predictor.predict(facts, self.history)
        if prediction is not None:
            self.predictions[facts.job_id] = prediction
        return prediction

    # ---- the order -----------------------------------------------------------------
    @property
    def uses_model(self) -> bool:
        """Whether the predicted order takes part now."""
        if self.predictor is None or self.predictor.info is None:
            return False
        if not self.config.guarded:
            return self.history.span_s() >= self.config.guard.cold_start_s
        return self.guard.state is GuardState.TRUSTED

    def rule_key(self, c: Candidate) -> tuple[float, float, str]:
        if self.config.rule == "gittins":
            self._refresh_gittins()
            return self._gittins.key(c.attained_gpu_s, c.arrival_s, c.job_id)
        q, arrival, job_id = self.config.las.key(c.attained_gpu_s, c.arrival_s, c.job_id)
        return (float(q), arrival, job_id)

    @property
    def gittins_index(self) -> GittinsIndex:
        """The index the `gittins` rule ranks with now; a new object whenever it is
        rebuilt, so a caller caching rule keys can tell when they went stale."""
        return self._gittins

    def _refresh_gittins(self) -> None:
        n = len(self.history.outcomes)
        if n - self._gittins_at >= GITTINS_REFRESH or (n and not len(self._gittins)):
            recent = self.history.outcomes[-GITTINS_SAMPLE:]
            self._gittins = GittinsIndex([o.gpu_time_s for o in recent])
            self._gittins_at = n

    def rule_order(self, candidates: Sequence[Candidate]) -> list[str]:
        return [c.job_id for c in sorted(candidates, key=self.rule_key)]

    def predicted_order(self, candidates: Sequence[Candidate]) -> list[str]:
        """Jobs the model is confident about, in the order `config.model_order` gives."""
        keyed = [k for k in map(self.predicted_key, candidates) if k is not None]
        keyed.sort()
        return [k[-1] for k in keyed]

    def predicted_key(self, c: Candidate) -> PredictedKey | None:
        """The job's place in the predicted order (smaller runs first; the job id last),
        or None when it follows the rule order. For the same attained service the key
        stays the same until `keys_version()` moves, so a driver may keep waiting jobs'
        keys sorted between decisions."""
        if self.config.model_order == "gittins":
            return self._conditional_key(c)
        p = self.predictions.get(c.job_id)
        if p is None or not p.confident(self.config.max_spread):
            return None
        if c.attained_gpu_s >= p.q90_gpu_s:
            return None  # already past what the model thought likely: it was wrong here
        left = (p.q50_gpu_s if c.attained_gpu_s < p.q50_gpu_s else p.q90_gpu_s) - c.attained_gpu_s
        return (left, c.arrival_s, 0.0, c.job_id)  # 0.0: the conditional key's shape

    def keys_version(self) -> int:
        """A number that moves whenever `predicted_key` may give another key for the same
        job and attained service (rebuilding the bins now when they are due)."""
        if self.config.model_order == "gittins":
            self.conditional_bins()
        return self._keys_version

    def _conditional_key(self, c: Candidate) -> PredictedKey | None:
        """By the Gittins index of each job's own distribution: the GPU-times of recent
        finished jobs whose predicted median fell in the same bin as its own. A sharp
        model makes narrow bins, and the order nears shortest-remaining-first; a model
        that knows nothing makes bins alike, and the order is 2D-Gittins. A job older
        than anything its bin has seen follows the rule order."""
        edges, indexes = self.conditional_bins()
        if not indexes:
            return None
        p = self.predictions.get(c.job_id)
        if p is None or not p.confident(self.config.max_spread):
            return None
        value = indexes[bisect.bisect_right(edges, p.q50_gpu_s)].index(c.attained_gpu_s)
        if value <= 0.0:
            return None
        # equal indexes (few data, one bin): shorter predicted first
        return (-value, p.q50_gpu_s - c.attained_gpu_s, c.arrival_s, c.job_id)

    def conditional_bins(self) -> tuple[list[float], list[GittinsIndex]]:
        """Bin edges of predicted median (ascending) and a Gittins index per bin, from
        the recent judged jobs; rebuilt every GITTINS_REFRESH judged predictions."""
        n = self._judged_seen
        if n - self._bins_at >= GITTINS_REFRESH or (n and not self._bins[1]):
            self._bins_at = n
            pairs = sorted(self.judged)
            bins = min(PREDICTED_BINS, max(1, len(pairs) // GITTINS_REFRESH))
            # equal predictions share a bin: edges are distinct, none at the smallest
            cuts = {pairs[len(pairs) * k // bins][0] for k in range(1, bins)}
            edges = sorted(cuts - {pairs[0][0]})
            members: list[list[float]] = [[] for _ in range(len(edges) + 1)]
            for median, taken in pairs:
                members[bisect.bisect_right(edges, median)].append(taken)
            indexes = [GittinsIndex(m) for m in members]
            self._bins = (edges, indexes)
            self._keys_version += 1
        return self._bins

    def rank_bound(self, job_id: str, attained_gpu_s: float) -> float:
        """The next attained service above `attained_gpu_s` at which the job's place in
        the predicted order can change (inf: never), for drivers that move jobs only at
        such points."""
        p = self.predictions.get(job_id)
        if p is None:
            return math.inf
        if self.config.model_order == "remaining":
            for q in (p.q50_gpu_s, p.q90_gpu_s):
                if attained_gpu_s < q:
                    return q
            return math.inf
        return grid_step_above(attained_gpu_s, self._gittins.per_decade)

    def order(self, candidates: Sequence[Candidate]) -> list[str]:
        """The order the policy in use gives now (first runs first)."""
        rule = self.rule_order(candidates)
        if not self.uses_model:
            return rule
        return preferential_merge(self.predicted_order(candidates), rule, self.config.weight)

    def learned_order(self, candidates: Sequence[Candidate]) -> list[str]:
        """The order the model would give, trusted or not (for shadow records)."""
        if self.predictor is None or self.predictor.info is None:
            return self.rule_order(candidates)
        return preferential_merge(
            self.predicted_order(candidates), self.rule_order(candidates), self.config.weight
        )

    def status(self) -> dict[str, object]:
        """What `gpupool learn status` shows: data seen, accuracy, the guard, the model."""
        info = self.predictor.info if self.predictor is not None else None
        return {
            "rule": self.config.rule,
            "guard": self.guard.state.value,
            "uses_model": self.uses_model,
            "submits_seen": self.history.submits_seen,
            "finished_seen": len(self.history.outcomes),
            "seen_s": self.history.span_s(),
            "cold_start_s": self.config.guard.cold_start_s,
            "window": self.guard.window,
            "within_2x": self.guard.within_2x(),
            "rank_corr": self.guard.rank_corr(),
            "model": None
            if info is None
            else {
                "version": info.version,
                "trained_at_s": info.trained_at_s,
                "rows": info.rows,
                "kind": info.kind,
            },
            "retrains": len(self.retrains),
        }

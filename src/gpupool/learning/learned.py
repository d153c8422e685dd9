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

import numpy as np

from gpupool.learning.config import LearningConfig
from gpupool.learning.guard import DriftGuard, GuardChange, GuardState
from gpupool.learning.history import History, JobFacts, Outcome
from gpupool.learning.judge import JudgedJob, OrderJudge
from gpupool.learning.ordering import (
    GittinsIndex,
    grid_step_above,
    ks_distance,
    preferential_merge,
    service_profile,
    shrink_weight,
)
from gpupool.learning.predictor import ModelInfo, Prediction, Predictor

GITTINS_SAMPLE = 2_000
"""Finished jobs (most recent) the Gittins index is computed from."""
GITTINS_REFRESH = 100
"""Rebuild the Gittins index after this many new finishes."""
PREDICTED_BINS = 10
MIN_BIN_JOBS = 5
"""Two bins (the fewest that can be compared) once each would hold this many jobs."""
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
        judge = (
            OrderJudge(config.guard.window_jobs, config.guard.pairs_per_job)
            if config.model_order == "gittins"
            else None  # predicted GPU-time still to go is no index: judged on accuracy
        )
        self.guard = DriftGuard(config.guard, judge)
        self.facts: dict[str, JobFacts] = {}
        self.predictions: dict[str, Prediction] = {}
        self._gittins = GittinsIndex(())
        self._gittins_at = 0
        self.judged: deque[tuple[float, float]] = deque(maxlen=GITTINS_SAMPLE)
        """Recent finished jobs: (predicted median, GPU-time taken), both GPU-seconds."""
        self._bins: tuple[list[float], list[GittinsIndex], list[float]] = ([], [], [])
        self._job_indexes: dict[str, tuple[int, GittinsIndex, float | None]] = {}
        """Per job: (keys version, the index it ranks by, its predicted median when its bin
        breaks ties by it)."""
        self._bins_base: GittinsIndex | None = None
        """The unconditional index the bins were shrunk toward (rebuilt with it)."""
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
        prediction = self.predictions.get(job_id)
        if prediction is not None and self.guard.judge is not None:
            self.guard.judge.observe(self._judged_job(facts, finish_s, gpu_time_s))
        self.history.finished(Outcome(facts, finish_s, gpu_time_s))
        self.predictions.pop(job_id, None)
        self._job_indexes.pop(job_id, None)
        if prediction is not None:
            self.guard.observe(prediction.q50_gpu_s, gpu_time_s)
            self.judged.append((prediction.q50_gpu_s, gpu_time_s))

    def _judged_job(self, facts: JobFacts, finish_s: float, gpu_time_s: float) -> JudgedJob:
        """How the rule's order and the model's saw a job that finished (before its own
        outcome joins the samples the indexes are built from)."""
        self.conditional_bins()
        index, weight = self._job_index(facts.job_id)
        if self.config.rule == "gittins":
            rule = self._gittins.profile(gpu_time_s)
        else:
            las = self.config.las
            rule = service_profile(
                lambda a: -float(las.queue(a)),
                lambda a: las.next_threshold(a) or math.inf,
                gpu_time_s,
            )
        p = self.predictions[facts.job_id]
        tie = p.q50_gpu_s if weight > 0.0 else 0.0
        return JudgedJob(
            facts.submit_s,
            finish_s,
            rule,
            (facts.submit_s, 0.0, facts.job_id),
            index.profile(gpu_time_s),
            (tie, facts.submit_s, facts.job_id),
        )

    def forget(self, job_id: str) -> None:
        """A job left without completing (cancelled, failed): no outcome to learn from."""
        self.facts.pop(job_id, None)
        self.predictions.pop(job_id, None)
        self._job_indexes.pop(job_id, None)

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
        self._job_indexes.pop(facts.job_id, None)
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
        # every GITTINS_REFRESH finishes, and at every finish while there are fewer
        if n - self._gittins_at >= GITTINS_REFRESH or (n != self._gittins_at < GITTINS_REFRESH):
            recent = self.history.outcomes[-GITTINS_SAMPLE:]
            self._gittins = GittinsIndex([o.gpu_time_s for o in recent])
            self._gittins_at = n

    def rule_order(self, candidates: Sequence[Candidate]) -> list[str]:
        return [c.job_id for c in sorted(candidates, key=self.rule_key)]

    def predicted_order(self, candidates: Sequence[Candidate]) -> list[str]:
        """Jobs the model is confident about, in the order `config.model_order` gives."""
        self.keys_version()  # the bins, rebuilt when due
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

    def _conditional_key(self, c: Candidate) -> PredictedKey:
        """By the Gittins index of each job's own distribution: the GPU-times of recent
        finished jobs whose predicted median fell in the same bin as its own, shrunk toward
        the rule's unconditional sample by how little evidence the bin carries that it
        differs (`conditional_bins`). A sharp model makes narrow bins, and the order nears
        shortest-remaining-first; a model that knows nothing has its bins shrunk all the
        way, and the order is the rule's 2D-Gittins, ties included. A job without a
        confident prediction ranks by the unconditional index too. The bins are those of
        the last `keys_version()` or `predicted_order` call (a driver calls one of them
        before keying jobs)."""
        hit = self._job_indexes.get(c.job_id)
        if hit is None or hit[0] != self._keys_version:
            index, weight = self._job_index(c.job_id)
            p = self.predictions.get(c.job_id)
            # equal indexes in a bin that tells something: shorter predicted first; in a
            # bin shrunk all the way, by arrival, as the rule does
            hit = (self._keys_version, index, p.q50_gpu_s if p is not None and weight else None)
            self._job_indexes[c.job_id] = hit
        _, index, q50 = hit
        tie = 0.0 if q50 is None else q50 - c.attained_gpu_s
        return (-index.index(c.attained_gpu_s), tie, c.arrival_s, c.job_id)

    def _job_index(self, job_id: str) -> tuple[GittinsIndex, float]:
        """The index a job ranks by in the conditional order, and its bin's weight (0: the
        unconditional index, the rule's own), with the bins as they stand."""
        edges, indexes, weights = self._bins
        p = self.predictions.get(job_id)
        if not indexes or p is None or not p.confident(self.config.max_spread):
            return self._bins_base or self._gittins, 0.0
        k = bisect.bisect_right(edges, p.q50_gpu_s)
        return indexes[k], weights[k]

    def conditional_bins(self) -> tuple[list[float], list[GittinsIndex], list[float]]:
        """Bin edges of predicted median (ascending), a Gittins index per bin and the
        bin's weight; rebuilt whenever the unconditional index is (every GITTINS_REFRESH
        finishes). A bin's GPU-times are mixed with the unconditional sample (the last
        GITTINS_SAMPLE finished jobs, what 2D-Gittins ranks by): weight w on the bin's own,
        1 - w on the unconditional, w from the bin's Kolmogorov-Smirnov distance to the
        other bins against what chance gives (`shrink_weight`). A bin no different from
        the rest by more than noise gets w = 0 and the rule's own index."""
        self._refresh_gittins()
        base = self._gittins
        if base is not self._bins_base and not self.judged:
            self._bins_base = base  # no bins yet: every job ranks by the rule's index
            self._keys_version += 1
        elif base is not self._bins_base:
            self._bins_base = base
            pairs = sorted(self.judged)
            # at least two bins once there are a few jobs: one bin has nothing to differ from
            bins = min(PREDICTED_BINS, max(2, len(pairs) // GITTINS_REFRESH))
            bins = bins if len(pairs) >= 2 * MIN_BIN_JOBS else 1
            # equal predictions share a bin: edges are distinct, none at the smallest
            cuts = {pairs[len(pairs) * k // bins][0] for k in range(1, bins)}
            edges = sorted(cuts - {pairs[0][0]})
            members: list[list[float]] = [[] for _ in range(len(edges) + 1)]
            for median, taken in pairs:
                members[bisect.bisect_right(edges, median)].append(taken)
            everything = np.sort(np.asarray([t for _, t in pairs], dtype=np.float64))
            indexes: list[GittinsIndex] = []
            weights: list[float] = []
            for m in members:
                own = np.sort(np.asarray(m, dtype=np.float64))
                w = shrink_weight(
                    _distance_to_rest(own, everything),
                    own.size,
                    everything.size - own.size,
                    len(members),
                )
                weights.append(w)
                indexes.append(GittinsIndex.mixture(own, base, w))
            self._bins = (edges, indexes, weights)
            self._keys_version += 1
        return self._bins

    def rank_bound(self, job_id: str, attained_gpu_s: float) -> float:
        """The next attained service above `attained_gpu_s` at which the job's place in
        the predicted order can change (inf: never), for drivers that move jobs only at
        such points."""
        if self.config.model_order == "gittins":  # every job ranks by an index
            return grid_step_above(attained_gpu_s, self._gittins.per_decade)
        p = self.predictions.get(job_id)  # remaining: the key moves at q50 and q90
        for q in () if p is None else (p.q50_gpu_s, p.q90_gpu_s):
            if attained_gpu_s < q:
                return q
        return math.inf

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
            "judge": "order" if self.guard.judge is not None else "accuracy",
            "order_advantage": None if self.guard.judge is None else self.guard.judge.advantage(),
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


def _distance_to_rest(own_sorted: np.ndarray, everything_sorted: np.ndarray) -> float:
    """KS distance between a bin and the other bins, from the bin and all bins together:
    F_all - F_own = (n_rest / n_all) (F_rest - F_own)."""
    n_own, n_all = own_sorted.size, everything_sorted.size
    if n_own == 0 or n_own == n_all:
        return 0.0
    return ks_distance(own_sorted, everything_sorted) * n_all / (n_all - n_own)

"""The order judge: would the model's order have served recent jobs better than the rule's?

For each finished job the model had predicted, the judge keeps how each order sees it: its
service profile under the rule's index (2D-Gittins or 2D-LAS) and under the index the
learned order gives it (its bin's distribution, shrunk). It pairs the job with up to
`pairs_per_job` recently finished jobs that were in the system with it (waited together)
and works out, for each order, the pair's summed completion time with both served from
nothing on one server (`ordering.pair_cost_s`). Over a window of jobs its figure is the
model's advantage: how much shorter the pairs' summed completion is under the model's
order than under the rule's, relative to shortest-first. It judges what the model is used
for (the order, read through its bins), not the accuracy of its predictions: an inverted
model orders well once its bins read it the right way round, and an accurate model can
still break the rule's ties no better than arrival order.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from gpupool.learning.ordering import ServiceProfile, pair_cost_s

SCAN_JOBS = 200
"""How far back the judge looks for jobs that waited with a new one."""


@dataclass(frozen=True)
class JudgedJob:
    """A finished job as both orders saw it; the ties decide equal priorities (smaller
    first), as the orders' keys do."""

    submit_s: float
    finish_s: float
    rule: ServiceProfile
    rule_tie: tuple[float, float, str]
    model: ServiceProfile
    model_tie: tuple[float, float, str]


@dataclass(frozen=True)
class PairCosts:
    """One job's pairs with the jobs that waited with it: summed excess completion time
    (GPU-seconds) under each order, and under shortest first (the yardstick)."""

    pairs: int
    rule_gpu_s: float
    model_gpu_s: float
    best_gpu_s: float


class OrderJudge:
    def __init__(self, window_jobs: int, pairs_per_job: int) -> None:
        self.pairs_per_job = pairs_per_job
        self._jobs: deque[JudgedJob] = deque(maxlen=window_jobs)
        self._costs: deque[PairCosts] = deque(maxlen=window_jobs)

    def observe(self, job: JudgedJob) -> PairCosts:
        """A finished job: paired with the recent finished jobs still in the system when it
        was submitted (they finished after its submit), newest first."""
        pairs = 0
        rule = model = best = 0.0
        for k, other in enumerate(reversed(self._jobs)):
            if pairs >= self.pairs_per_job or k >= SCAN_JOBS:
                break
            if other.finish_s <= job.submit_s:
                continue
            pairs += 1
            rule += pair_cost_s(other.rule, job.rule, other.rule_tie < job.rule_tie)
            model += pair_cost_s(other.model, job.model, other.model_tie < job.model_tie)
            g1, g2 = other.rule.gpu_s, job.rule.gpu_s
            best += 2 * min(g1, g2) + max(g1, g2)
        self._jobs.append(job)
        costs = PairCosts(pairs, rule, model, best)
        self._costs.append(costs)
        return costs

    @property
    def window(self) -> int:
        return len(self._costs)

    def pairs(self) -> int:
        return sum(c.pairs for c in self._costs)

    def advantage(self) -> float:
        """(rule's summed completion - model's) / shortest-first's, over the window's pairs:
        +0.03 means the model's order would have finished them 3 % sooner in sum; 0 with no
        pairs."""
        best = math.fsum(c.best_gpu_s for c in self._costs)
        if best <= 0.0:
            return 0.0
        rule = math.fsum(c.rule_gpu_s for c in self._costs)
        model = math.fsum(c.model_gpu_s for c in self._costs)
        return (rule - model) / best

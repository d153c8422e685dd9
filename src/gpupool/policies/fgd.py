"""fgd: fragmentation gradient descent (Weng et al., USENIX ATC '23).

Place the task where it grows the expected fragmentation least. A node's score is
sigmoid((F_before - F_after) / 1000) scaled to 0..100 and truncated to an integer, as in
the authors' scheduler plugin; a GPU-sharing task tries every GPU it fits on and keeps
the best, which also picks the GPU inside the node.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

import numpy as np

from gpupool.core.fragmentation import (
    DEFAULT_POPULARITY,
    FragmentationMeter,
    TaskShape,
    typical_of_counts,
)
from gpupool.core.model import JobSpec
from gpupool.core.state import ClusterState
from gpupool.errors import SpecError
from gpupool.policies.base import CachedScoringPolicy, lowest_free_gpus
from gpupool.policies.registry import PolicyContext, register_placement


def _score(delta_milli: float) -> int:
    return int(100.0 / (1.0 + math.exp(-delta_milli / 1000.0)))


class FgdPolicy(CachedScoringPolicy):
    name = "fgd"

    def __init__(self, meter: FragmentationMeter) -> None:
        super().__init__()
        self.meter = meter

    def _best_share(self, state: ClusterState, job: JobSpec, node: int) -> tuple[int, int]:
        """(score, gpu index) of the best GPU for a sharing task on this node."""
        model = state.node_model(node)
        cpu_left = int(state.cpu_left[node])
        row = state.gpu_rows[node]
        before = self.meter.node(model, cpu_left, row)
        best_score, best_gpu = -1, -1
        tried: dict[int, int] = {}
        usable = state.usable_gpus(job)[node] if state.share_rules else None
        for g, left in enumerate(row):
            if left < job.gpu_milli or (usable is not None and not usable[g]):
                continue
            score = tried.get(left)
            if score is None:
                after_row = (*row[:g], left - job.gpu_milli, *row[g + 1 :])
                after = self.meter.node(model, cpu_left - job.cpu_milli, after_row)
                score = tried[left] = _score(before - after)
            if score > best_score:
                best_score, best_gpu = score, g
        return best_score, best_gpu

    def node_score(self, state: ClusterState, job: JobSpec, node: int) -> int:
        if job.shares_gpu:
            return self._best_share(state, job, node)[0]
        model = state.node_model(node)
        cpu_left = int(state.cpu_left[node])
        row = state.gpu_rows[node]
        before = self.meter.node(model, cpu_left, row)
        taken = set(lowest_free_gpus(row, job.gpu_count)) if job.gpu_count else set()
        after_row = tuple(
            left - job.gpu_milli if g in taken else left for g, left in enumerate(row)
        )
        after = self.meter.node(model, cpu_left - job.cpu_milli, after_row)
        return _score(before - after)

    def choose_gpus(
        self, state: ClusterState, job: JobSpec, node: int, rng: np.random.Generator
    ) -> tuple[int, ...]:
        if job.shares_gpu:
            return (self._best_share(state, job, node)[1],)
        return super().choose_gpus(state, job, node, rng)


class LearnedFgdPolicy(FgdPolicy):
    """FGD for a scheduler that is not told its workload up front (the live service, a
    scenario's cycles): the typical tasks are the shapes of the jobs it has seen
    submitted, relearned whenever the count of jobs seen reaches a power of two (so a
    long run relearns about 40 times, deterministically, and the score cache survives
    in between). Before any job it scores every node alike."""

    def __init__(self, models: Iterable[str], popularity: float = DEFAULT_POPULARITY) -> None:
        self.models = tuple(models)
        self.popularity = popularity
        self.seen: Counter[TaskShape] = Counter()
        self.count = 0
        super().__init__(FragmentationMeter((), self.models))

    def observe(self, job: JobSpec) -> None:
        self.seen[TaskShape.of(job)] += 1
        self.count += 1
        if self.count & (self.count - 1) == 0:  # 1, 2, 4, 8, ...
            self.meter = FragmentationMeter(
                typical_of_counts(self.seen, self.popularity), self.models
            )
            self._owner, self._cache = None, {}


@register_placement("fgd")
def _make(context: PolicyContext) -> FgdPolicy:
    if context.meter is None:
        raise SpecError("fgd needs the workload's typical tasks; give it a task list to learn from")
    return FgdPolicy(context.meter)

"""fgd: fragmentation gradient descent (Weng et al., USENIX ATC '23).

Place the task where it grows the expected fragmentation least. A node's score is
sigmoid((F_before - F_after) / 1000) scaled to 0..100 and truncated to an integer, as in
the authors' scheduler plugin; a GPU-sharing task tries every GPU it fits on and keeps
the best, which also picks the GPU inside the node.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable

import numpy as np

from gpupool.domain.fragmentation import (
    DEFAULT_POPULARITY,
    FragmentationMeter,
    TaskShape,
    typical_of_counts,
)
from gpupool.domain.model import MILLI_PER_GPU, JobSpec
from gpupool.domain.state import ClusterState, FreeKey, IntArray
from gpupool.errors import SpecError
from gpupool.policies.placement.base import CachedScoringPolicy
from gpupool.policies.registry import PolicyContext, register_placement

Demand = tuple[int, int, int]
"""(CPU milli, per-GPU milli or 0, GPU count) of a job: all its FGD score reads."""
RankedKey = tuple[int, int, int, tuple[int, ...]]
"""(model id, CPU rank before, CPU rank after the job, free shares ascending) of a node."""


def _score(delta_milli: float) -> int:
    return int(100.0 / (1.0 + math.exp(-delta_milli / 1000.0)))


class FgdPolicy(CachedScoringPolicy):
    name = "fgd"

    def __init__(self, meter: FragmentationMeter) -> None:
        super().__init__()
        self.meter = meter
        self._tables: dict[Demand, tuple[IntArray, dict[RankedKey, int]]] = {}
        self._by_rank: dict[tuple[int, int], dict[RankedKey, int]] = {}
        self._tables_for: tuple[FragmentationMeter, list[FreeKey]] | None = None
        self._ranks_checked: IntArray | None = None

    def pick(
        self, state: ClusterState, job: JobSpec, candidates: IntArray, rng: np.random.Generator
    ) -> int | None:
        """The base rule (best score, ties to the lowest `tie_rank`) in one pass: while the
        tie ranks are a permutation of the nodes, score x node count - tie rank orders the
        candidates exactly as that rule does, so one argmax finds the winner."""
        if candidates.size < 2 or not self._ranks_are_a_permutation(state):
            return super().pick(state, job, candidates, rng)
        scores = self.scores(state, job, candidates)
        order = scores * state.node_count - state.tie_rank[candidates]
        return int(candidates[int(order.argmax())])

    def _ranks_are_a_permutation(self, state: ClusterState) -> bool:
        ranks = state.tie_rank
        if ranks is self._ranks_checked:
            return True
        n = state.node_count
        if ranks.shape != (n,) or not np.array_equal(np.sort(ranks), np.arange(n)):
            return False
        self._ranks_checked = ranks  # a state's ranks are replaced, never written in place
        return True

    def scores(self, state: ClusterState, job: JobSpec, candidates: IntArray) -> IntArray:
        """A node's score reads only its `FreeKey` (model, CPU left, free shares in any
        order), so it is kept per job demand and key id: many nodes share a key, and a key
        never changes meaning. Where co-location rules also decide which GPU a share may
        use, scores are kept per node instead."""
        if job.shares_gpu and state.share_rules:
            return super().scores(state, job, candidates)
        table, by_rank = self._table(state, job)
        ids = state.free_id[candidates]
        values = table[ids]
        if values.min() < 0:
            for free_id in dict.fromkeys(ids[values < 0].tolist()):
                table[free_id] = self._free_score(state, job, free_id, by_rank)
            values = table[ids]
        return values

    def _table(self, state: ClusterState, job: JobSpec) -> tuple[IntArray, dict[RankedKey, int]]:
        """Scores by key id for the job's demand, -1 where not yet scored, as long as the
        key list; and the same scores by `RankedKey`, which many key ids share. A ranked key
        holds the job's CPU in its rank after, so demands that differ in CPU alone share
        those. Tables hold for one meter and one list of keys."""
        owner = self._tables_for
        if owner is None or owner[0] is not self.meter or owner[1] is not state.free_keys:
            self._tables, self._by_rank = {}, {}
            self._tables_for = (self.meter, state.free_keys)
        milli = job.gpu_milli if job.gpu_count else 0
        demand = (job.cpu_milli, milli, job.gpu_count)
        entry = self._tables.get(demand)
        if entry is None or entry[0].size < len(state.free_keys):
            grown = np.full(2 * len(state.free_keys), -1, dtype=np.int64)
            if entry is not None:
                grown[: entry[0].size] = entry[0]
                by_rank = entry[1]
            else:
                by_rank = self._by_rank.setdefault((milli, job.gpu_count), {})
            entry = self._tables[demand] = (grown, by_rank)
        return entry

    def _free_score(
        self,
        state: ClusterState,
        job: JobSpec,
        free_id: int,
        by_rank: dict[RankedKey, int] | None = None,
    ) -> int:
        """The node score of a node with this key; a sharing task gets its best GPU's.

        The score reads the CPU left only through its rank before and after the job, so
        keys that differ in CPU alone mostly share one computation (`by_rank`)."""
        if by_rank is None:
            by_rank = self._table(state, job)[1]
        model_id, cpu_left, gpus = state.free_keys[free_id]
        model = state.models[model_id]
        meter = self.meter
        cpus = meter.cpu_requests(model)
        rank = bisect_right(cpus, cpu_left)
        rank_after = bisect_right(cpus, cpu_left - job.cpu_milli)
        key = (model_id, rank, rank_after, gpus)
        score = by_rank.get(key)
        if score is not None:
            return score
        before = meter.at_rank(model, rank, gpus)
        milli = job.gpu_milli
        if job.shares_gpu:  # each distinct free share once: equal ones leave equal nodes
            score = -1
            for g in range(bisect_left(gpus, milli), len(gpus)):
                left = gpus[g]
                if g and gpus[g - 1] == left:
                    continue
                after = meter.at_rank(model, rank_after, _take_sorted(gpus, g, milli))
                score = max(score, _score(before - after))
        else:
            # Whole GPUs: which free ones are taken does not change the multiset left.
            taken = min(job.gpu_count, gpus.count(MILLI_PER_GPU))
            shares = (MILLI_PER_GPU - milli,) * taken + gpus[: len(gpus) - taken]
            if taken and milli != MILLI_PER_GPU:
                shares = tuple(sorted(shares))
            score = _score(before - meter.at_rank(model, rank_after, shares))
        by_rank[key] = score
        return score

    def _best_share(self, state: ClusterState, job: JobSpec, node: int) -> tuple[int, int]:
        """(score, gpu index) of the best GPU for a sharing task on this node: the first
        GPU, by index, of those that score best."""
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
                after = self.meter.node(model, cpu_left - job.cpu_milli, _take(row, g, job))
                score = tried[left] = _score(before - after)
            if score > best_score:
                best_score, best_gpu = score, g
        return best_score, best_gpu

    def node_score(self, state: ClusterState, job: JobSpec, node: int) -> int:
        if job.shares_gpu:
            return self._best_share(state, job, node)[0]
        return self._free_score(state, job, int(state.free_id[node]))

    def choose_gpus(
        self, state: ClusterState, job: JobSpec, node: int, rng: np.random.Generator
    ) -> tuple[int, ...]:
        if job.shares_gpu:
            return (self._best_share(state, job, node)[1],)
        return super().choose_gpus(state, job, node, rng)


def _take(gpus: tuple[int, ...], g: int, job: JobSpec) -> tuple[int, ...]:
    """The free shares after one share of the job goes on GPU `g`."""
    return (*gpus[:g], gpus[g] - job.gpu_milli, *gpus[g + 1 :])


def _take_sorted(gpus: tuple[int, ...], g: int, milli: int) -> tuple[int, ...]:
    """`gpus` ascending after `milli` goes on GPU `g`, still ascending."""
    left = gpus[g] - milli
    k = bisect_right(gpus, left, 0, g)
    return (*gpus[:k], left, *gpus[k:g], *gpus[g + 1 :])


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
            self._owner, self._cache = None, {}  # the key-id tables follow the meter


@register_placement("fgd")
def _make(context: PolicyContext) -> FgdPolicy:
    if context.meter is None:
        raise SpecError("fgd needs the workload's typical tasks; give it a task list to learn from")
    return FgdPolicy(context.meter)

"""Shared shape of node-scoring placement policies, as in a Kubernetes scheduler profile.

Filter (nodes that fit), score each, take the best. Ties go to the node that ranks first
in the state's `tie_rank`, a per-run random order of the nodes: the FGD authors patched
kube-scheduler to break ties by node name, and prefixed node names with a random
permutation, which is exactly this. Then pick the GPUs inside the node.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from gpupool.domain.fragmentation import TaskShape
from gpupool.domain.model import MILLI_PER_GPU, JobSpec, NodeShare, Placement
from gpupool.domain.state import BoolArray, ClusterState, IntArray
from gpupool.policies.placement.domains import (
    domain_masks,
    fullest_first,
    packing_tie_break,
    shared_by,
)


class ScoringPolicy:
    name = "scoring"
    share_choice = "best-fit"
    """How a GPU-sharing job picks its GPU inside the node: best-fit or random."""

    def place(
        self,
        state: ClusterState,
        job: JobSpec,
        rng: np.random.Generator,
        allowed: BoolArray | None = None,
    ) -> Placement | None:
        """`allowed` narrows the nodes (a team's island, nodes held for another job)."""
        if job.gpu_count > state.max_gpus_per_node:
            return self.place_spanning(state, job, rng, allowed)
        mask = state.fits_mask(job)
        if allowed is not None:
            mask &= allowed
        candidates = mask.nonzero()[0]
        node = self.pick(state, job, candidates, rng)
        if node is None:
            return None
        gpus = self.choose_gpus(state, job, node, rng)
        share = NodeShare(node, gpus, job.gpu_milli, job.cpu_milli, job.mem_mib)
        return Placement((share,))

    def pick(
        self, state: ClusterState, job: JobSpec, candidates: IntArray, rng: np.random.Generator
    ) -> int | None:
        if candidates.size == 0:
            return None
        if candidates.size == 1:
            return int(candidates[0])
        scores = self.scores(state, job, candidates)
        top = candidates[scores == scores.max()]
        if top.size > 1 and state.topology.placing:
            top = packing_tie_break(state, top)
        if top.size == 1:
            return int(top[0])
        return int(top[np.argmin(state.tie_rank[top])])

    def scores(self, state: ClusterState, job: JobSpec, candidates: IntArray) -> IntArray:
        """Integer scores, higher is better, aligned with `candidates`."""
        return np.zeros(candidates.size, dtype=np.int64)

    def choose_gpus(
        self, state: ClusterState, job: JobSpec, node: int, rng: np.random.Generator
    ) -> tuple[int, ...]:
        row = state.gpu_rows[node]
        if job.gpu_count == 0:
            return ()
        if not job.shares_gpu:
            return lowest_free_gpus(row, job.gpu_count)
        usable = state.usable_gpus(job)[node]
        fitting = [g for g in range(len(row)) if usable[g]]
        if self.share_choice == "random":
            return (fitting[int(rng.integers(len(fitting)))],)
        return (min(fitting, key=lambda g: (row[g], g)),)

    def place_spanning(
        self,
        state: ClusterState,
        job: JobSpec,
        rng: np.random.Generator,
        allowed: BoolArray | None = None,
    ) -> Placement | None:
        """A gang: a job wider than any node, on whole idle nodes and the remainder on one
        more. With topology levels (domains.py), inside one domain of the level it asks
        for (required: else it waits; preferred: else as below), else the smallest domain
        of any level that has room, else spread over the fullest domains' nodes."""
        if job.shares_gpu or state.max_gpus_per_node == 0:
            return None
        if not state.topology.placing:
            return self.spread(state, job, rng, allowed)
        idle = state.idle_nodes() if allowed is None else state.idle_nodes() & allowed
        required, preferred = job.topology, job.topology_preferred
        tries = [preferred] if preferred is not None else []
        tries += [required] if required is not None else list(state.topology.levels)
        for level in tries:
            for mask in domain_masks(state, job, idle, level):
                placed = self.spread(state, job, rng, mask if allowed is None else mask & allowed)
                if placed is not None and (
                    required is None or shared_by(state, required, placed.nodes)
                ):
                    return placed
        if required is not None:
            return None  # it waits for a domain rather than spread
        return self.spread(state, job, rng, allowed)

    def spread(
        self,
        state: ClusterState,
        job: JobSpec,
        rng: np.random.Generator,
        allowed: BoolArray | None = None,
    ) -> Placement | None:
        """Whole idle nodes, then the remainder on one node. Only whole-GPU jobs may span
        nodes. CPU and memory are split in proportion to GPUs."""
        width = state.max_gpus_per_node
        full, rest = divmod(job.gpu_count, width)
        per_gpu_cpu, per_gpu_mem = job.cpu_milli // job.gpu_count, job.mem_mib // job.gpu_count
        idle = (
            state.idle_nodes()
            & (state.cpu_left >= per_gpu_cpu * width)
            & (state.mem_left >= per_gpu_mem * width)
            & state.model_mask(job.gpu_models)
        )
        if allowed is not None:
            idle &= allowed
        idle_nodes = np.flatnonzero(idle)
        if idle_nodes.size < full:
            return None
        chosen = fullest_first(state, idle_nodes)[:full]
        shares = [
            NodeShare(
                i, tuple(range(width)), MILLI_PER_GPU, per_gpu_cpu * width, per_gpu_mem * width
            )
            for i in chosen
        ]
        if rest:
            sub = JobSpec(
                job_id=job.job_id,
                gpu_count=rest,
                cpu_milli=per_gpu_cpu * rest,
                mem_mib=per_gpu_mem * rest,
                gpu_models=job.gpu_models,
            )
            mask = state.fits_mask(sub)
            if allowed is not None:
                mask &= allowed
            mask[chosen] = False
            node = self.pick(state, sub, np.flatnonzero(mask), rng)
            if node is None:
                return None
            shares.append(
                NodeShare(
                    node,
                    lowest_free_gpus(state.gpu_rows[node], rest),
                    MILLI_PER_GPU,
                    sub.cpu_milli,
                    sub.mem_mib,
                )
            )
        # Whatever integer division left over goes to the first share.
        cpu_gap = job.cpu_milli - sum(s.cpu_milli for s in shares)
        mem_gap = job.mem_mib - sum(s.mem_mib for s in shares)
        if cpu_gap or mem_gap:
            first = shares[0]
            if state.cpu_left[first.node] < first.cpu_milli + cpu_gap or (
                state.mem_left[first.node] < first.mem_mib + mem_gap
            ):
                return None
            shares[0] = NodeShare(
                first.node,
                first.gpus,
                first.gpu_milli,
                first.cpu_milli + cpu_gap,
                first.mem_mib + mem_gap,
            )
        return Placement(tuple(shares))


class CachedScoringPolicy(ScoringPolicy):
    """Scores one node at a time and caches them until the node changes.

    A node's score depends only on its own state and the job's shape, so a score stays
    valid until that node's version moves: each arrival recomputes only the nodes that
    changed since a job of the same shape last arrived.
    """

    def __init__(self) -> None:
        self._owner: ClusterState | None = None
        self._cache: dict[Hashable, tuple[IntArray, IntArray]] = {}

    def cache_key(self, job: JobSpec) -> Hashable:
        return TaskShape.of(job)

    def node_score(self, state: ClusterState, job: JobSpec, node: int) -> int:
        raise NotImplementedError

    def scores(self, state: ClusterState, job: JobSpec, candidates: IntArray) -> IntArray:
        if self._owner is not state:
            self._owner, self._cache = state, {}
        key = self.cache_key(job)
        entry = self._cache.get(key)
        if entry is None:
            entry = (
                np.full(state.node_count, -1, dtype=np.int64),
                np.zeros(state.node_count, dtype=np.int64),
            )
            self._cache[key] = entry
        seen, values = entry
        stale = candidates[seen[candidates] != state.version[candidates]]
        for node in stale.tolist():
            values[node] = self.node_score(state, job, node)
        seen[stale] = state.version[stale]
        return values[candidates]


def lowest_free_gpus(row: tuple[int, ...], count: int) -> tuple[int, ...]:
    """The first `count` wholly free GPUs by index, as the device plugin hands them out."""
    free = [g for g, left in enumerate(row) if left == MILLI_PER_GPU]
    return tuple(free[:count])

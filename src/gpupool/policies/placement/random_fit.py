"""random: any node that fits, uniformly; a random fitting GPU for a sharing task."""

from __future__ import annotations

import numpy as np

from gpupool.domain.model import JobSpec
from gpupool.domain.state import ClusterState, IntArray
from gpupool.policies.placement.base import ScoringPolicy
from gpupool.policies.registry import PolicyContext, register_placement


class RandomPolicy(ScoringPolicy):
    name = "random"
    share_choice = "random"

    def pick(
        self, state: ClusterState, job: JobSpec, candidates: IntArray, rng: np.random.Generator
    ) -> int | None:
        if candidates.size == 0:
            return None
        return int(candidates[int(rng.integers(candidates.size))])


@register_placement("random")
def _make(_: PolicyContext) -> RandomPolicy:
    return RandomPolicy()

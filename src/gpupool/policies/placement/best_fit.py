"""best-fit: the node left with the least free CPU and GPU after the task, equally weighted.

Scores are min-max normalised to 0..100 over the fitting nodes with integer arithmetic,
as the authors' plugin does; the rounding merges near-ties, which then break at random.
"""

from __future__ import annotations

import numpy as np

from gpupool.domain.model import JobSpec
from gpupool.domain.state import ClusterState, IntArray
from gpupool.policies.placement.base import ScoringPolicy
from gpupool.policies.placement.dot_product import MAX_SPEC_CPU_MILLI, MAX_SPEC_GPU_MILLI
from gpupool.policies.registry import PolicyContext, register_placement


class BestFitPolicy(ScoringPolicy):
    name = "best-fit"

    def scores(self, state: ClusterState, job: JobSpec, candidates: IntArray) -> IntArray:
        cpu_after = state.cpu_left[candidates] - job.cpu_milli
        gpu_rows = state.gpu_left[candidates]
        gpu_after = np.where(gpu_rows > 0, gpu_rows, 0).sum(axis=1) - job.total_gpu_milli
        slack = 0.5 * cpu_after / MAX_SPEC_CPU_MILLI + 0.5 * gpu_after / MAX_SPEC_GPU_MILLI
        raw = ((1.0 - slack) * 100.0).astype(np.int64)
        low, high = int(raw.min()), int(raw.max())
        if high == low:
            return np.zeros_like(raw)
        scaled: IntArray = (raw - low) * 100 // (high - low)
        return scaled


@register_placement("best-fit")
def _make(_: PolicyContext) -> BestFitPolicy:
    return BestFitPolicy()

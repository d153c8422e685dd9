"""dot-product: Tetris-style alignment of the node's free (CPU, GPU) with the request.

As configured in the FGD paper's comparison (GPU dimensions merged, normalised by the
largest node spec), the score is 100 * (1 - <free, request> / 2): the node whose free
capacity aligns least with the request wins, which packs small tasks tightly.
"""

from __future__ import annotations

import numpy as np

from gpupool.domain.model import JobSpec
from gpupool.domain.state import ClusterState, IntArray
from gpupool.policies.placement.base import ScoringPolicy
from gpupool.policies.registry import PolicyContext, register_placement

MAX_SPEC_CPU_MILLI = 128_000
MAX_SPEC_GPU_MILLI = 8_000


class DotProductPolicy(ScoringPolicy):
    name = "dot-product"

    def scores(self, state: ClusterState, job: JobSpec, candidates: IntArray) -> IntArray:
        cpu = state.cpu_left[candidates] / MAX_SPEC_CPU_MILLI
        gpu_rows = state.gpu_left[candidates]
        gpu = np.where(gpu_rows > 0, gpu_rows, 0).sum(axis=1) / MAX_SPEC_GPU_MILLI
        dot = cpu * (job.cpu_milli / MAX_SPEC_CPU_MILLI) + gpu * (
            job.total_gpu_milli / MAX_SPEC_GPU_MILLI
        )
        scores: IntArray = (100.0 * (1.0 - dot / 2.0)).astype(np.int64)
        return scores


@register_placement("dot-product")
def _make(_: PolicyContext) -> DotProductPolicy:
    return DotProductPolicy()

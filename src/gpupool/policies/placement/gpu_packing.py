"""gpu-packing: share a used GPU first, then free GPUs on a used node, then an idle node."""

from __future__ import annotations

from gpupool.domain.model import MILLI_PER_GPU, JobSpec
from gpupool.domain.state import ClusterState
from gpupool.policies.placement.base import CachedScoringPolicy
from gpupool.policies.registry import PolicyContext, register_placement

MAX_SCORE = 100


class GpuPackingPolicy(CachedScoringPolicy):
    name = "gpu-packing"

    def node_score(self, state: ClusterState, job: JobSpec, node: int) -> int:
        if job.gpu_count == 0:
            return 0
        row = state.gpu_rows[node]
        whole_free = sum(1 for left in row if left == MILLI_PER_GPU)
        if whole_free == len(row):  # an idle node: the lowest band
            return max(MAX_SCORE // 3 - whole_free, whole_free)
        wanted = job.gpu_count
        used: list[int] = []
        whole_used = 0
        for g in sorted(range(len(row)), key=lambda g: row[g]):  # least free first, stable
            if wanted == 0:
                break
            if job.gpu_milli <= row[g]:
                wanted -= 1
                used.append(g)
                whole_used += row[g] == MILLI_PER_GPU
        if wanted:
            return 0
        if whole_used:  # must open free GPUs on a used node
            return max(MAX_SCORE // 2 - whole_used, MAX_SCORE // 3)
        free_pct = sum(row[g] * 100 // MILLI_PER_GPU for g in used)
        return max(MAX_SCORE - free_pct // 10, MAX_SCORE // 2)


@register_placement("gpu-packing")
def _make(_: PolicyContext) -> GpuPackingPolicy:
    return GpuPackingPolicy()

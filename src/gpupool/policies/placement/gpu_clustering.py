"""gpu-clustering: keep tasks of the same GPU demand together on a node.

Bands, high to low: nodes holding only tasks of this kind; nodes holding this kind among
others; idle nodes; nodes holding other kinds. Inside a band, the fuller node wins.
"""

from __future__ import annotations

from gpupool.domain.model import JobSpec
from gpupool.domain.state import ClusterState, affinity_tag
from gpupool.policies.placement.base import CachedScoringPolicy
from gpupool.policies.registry import PolicyContext, register_placement

MAX_SPEC_GPU_MILLI = 8_000
QUARTER = 25


class GpuClusteringPolicy(CachedScoringPolicy):
    name = "gpu-clustering"

    def node_score(self, state: ClusterState, job: JobSpec, node: int) -> int:
        tag = affinity_tag(job)
        if tag is None:
            return 0
        kinds = state.affinity[node]
        fullness = QUARTER * (MAX_SPEC_GPU_MILLI - sum(state.gpu_rows[node])) // MAX_SPEC_GPU_MILLI
        if kinds.get(tag, 0) > 0:
            return fullness + (3 * QUARTER if len(kinds) == 1 else 2 * QUARTER)
        return fullness + (QUARTER if not kinds else 0)


@register_placement("gpu-clustering")
def _make(_: PolicyContext) -> GpuClusteringPolicy:
    return GpuClusteringPolicy()

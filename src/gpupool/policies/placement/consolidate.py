"""consolidate: the node with the fewest free GPUs that fits; ties by the state's tie rank.

This is the consolidating placement of the Helios simulator (Hu et al., SC '21), the
default for trace replay so that JCTs compare with published simulators.
"""

from __future__ import annotations

from gpupool.domain.model import JobSpec
from gpupool.domain.state import ClusterState, IntArray
from gpupool.policies.placement.base import ScoringPolicy
from gpupool.policies.registry import PolicyContext, register_placement


class ConsolidatePolicy(ScoringPolicy):
    name = "consolidate"

    def scores(self, state: ClusterState, job: JobSpec, candidates: IntArray) -> IntArray:
        return -state.whole_free[candidates]


@register_placement("consolidate")
def _make(_: PolicyContext) -> ConsolidatePolicy:
    return ConsolidatePolicy()

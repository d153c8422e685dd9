"""coolest-first: spread heat by placing work on the coolest cards that fit.

A node's score is the temperature of its hottest free GPU, lower being better, so a job
lands where it will run coolest (a hot aisle or a card still warm from its last job
waits until cooler ones are taken). Inside the node the coolest free GPUs are taken.
Temperatures are telemetry: the driver hands in the latest reading (modelled in the
simulator, NVML in the live service) before each plan.
"""

from __future__ import annotations

import numpy as np

from gpupool.domain.model import JobSpec
from gpupool.domain.state import ClusterState, IntArray
from gpupool.policies.placement.base import ScoringPolicy
from gpupool.policies.registry import PolicyContext, register_placement


class CoolestFirstPolicy(ScoringPolicy):
    name = "coolest-first"

    def __init__(self, temps_c: np.ndarray | None = None) -> None:
        self.temps_c = temps_c
        """GPU temperatures, [node, gpu] like ClusterState.gpu_left; None: all alike."""

    def scores(self, state: ClusterState, job: JobSpec, candidates: IntArray) -> IntArray:
        if self.temps_c is None or job.gpu_count == 0:
            return -state.whole_free[candidates]
        free = state.gpu_left[candidates] >= max(job.gpu_milli, 1)
        hottest = np.where(free, self.temps_c[candidates], -np.inf).max(axis=1)
        hottest = np.where(np.isfinite(hottest), hottest, 0.0)
        # tenths of a degree; between equally cool nodes, the fuller one (consolidate)
        tenths: IntArray = np.round(hottest * 10).astype(np.int64)
        return -tenths * 64 - state.whole_free[candidates]

    def choose_gpus(
        self, state: ClusterState, job: JobSpec, node: int, rng: np.random.Generator
    ) -> tuple[int, ...]:
        if self.temps_c is None or job.gpu_count == 0 or job.shares_gpu:
            return super().choose_gpus(state, job, node, rng)
        row = state.gpu_rows[node]
        free = [g for g in range(len(row)) if row[g] == 1000]
        free.sort(key=lambda g: (float(self.temps_c[node, g]), g))  # type: ignore[index]
        return tuple(sorted(free[: job.gpu_count]))


@register_placement("coolest-first")
def _make(_: PolicyContext) -> CoolestFirstPolicy:
    return CoolestFirstPolicy()

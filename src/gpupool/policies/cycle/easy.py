"""EASY backfill and team maxima, as the fifo and priority-quota plans apply them: the
blocked head's reservation (its shadow: when it can start, and the GPUs spare then) and
which later job may pass it."""

from __future__ import annotations

import heapq
from collections.abc import Mapping

import numpy as np

from gpupool.domain.model import JobSpec
from gpupool.domain.state import ClusterState
from gpupool.policies.contract import CycleView


def team_milli(view: CycleView, scratch: ClusterState, team: str, gpu_type: str) -> int:
    """GPU thousandths the team holds in the pool, running and planned this cycle: a
    share counts as the part of a GPU it takes (quotas count whole GPUs otherwise)."""
    pool = view.pool_nodes[gpu_type]
    return sum(
        j.total_gpu_milli
        for job_id, j in scratch.jobs.items()
        if j.team == team
        and job_id not in view.vacating
        and (nodes := scratch.placements[job_id].nodes)
        and pool[nodes[0]]
    )


def over_maximum(
    view: CycleView,
    scratch: ClusterState,
    usage: Mapping[tuple[str, str], int],
    job: JobSpec,
    gpu_type: str,
) -> bool:
    limit = view.quotas.maximum(job.team, gpu_type, view.now_s)
    if job.shares_gpu:
        return team_milli(view, scratch, job.team, gpu_type) + job.gpu_milli > limit * 1000
    return usage.get((job.team, gpu_type), 0) + job.gpu_count > limit


def backfills(
    view: CycleView, job: JobSpec, shadow: tuple[float, int] | None
) -> tuple[bool, tuple[float, int] | None]:
    """EASY rule for a job that fits now while an earlier job holds a reservation:
    it may start if it ends before the reservation or fits in the GPUs spare then.
    Returns (may start, the reservation with those spare GPUs updated)."""
    if shadow is None or view.now_s + (job.duration_s or 0.0) <= shadow[0]:
        return True, shadow
    if job.gpu_count > shadow[1]:
        return False, shadow
    return True, (shadow[0], shadow[1] - job.gpu_count)


def shadow(
    view: CycleView, scratch: ClusterState, job: JobSpec, gpu_type: str
) -> tuple[float, int]:
    """EASY reservation for a blocked job: (start time, GPUs spare at that time)."""
    pool = view.pool_nodes[gpu_type]
    free = int(np.where(scratch.gpu_left[pool] == 1000, 1, 0).sum())
    ends = view.ends(gpu_type)
    heapq.heapify(ends)  # usually a few ends suffice: no need to sort them all
    t = view.now_s
    while ends and free < job.gpu_count:
        end, gpus = heapq.heappop(ends)
        free += gpus
        t = end
    return t, max(0, free - job.gpu_count)

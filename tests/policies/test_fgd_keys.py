"""The fast FGD pieces against their plain definitions, on states a fill really reaches.

The meter memoises by CPU rank and bisects sorted shares, the state keeps a key id per node,
and FGD keeps scores per demand and key id; each must give exactly (==, not approx) what
the plain per-node computation gives.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpupool.domain.fragmentation import FragmentationMeter, TypicalTask, typical_tasks
from gpupool.domain.model import MILLI_PER_GPU, Cluster, JobSpec
from gpupool.domain.state import ClusterState
from gpupool.policies.placement.base import ScoringPolicy
from gpupool.policies.placement.fgd import FgdPolicy
from gpupool.sim.replay.experiments import DEFAULT_NODES, DEFAULT_PODS, embedded
from gpupool.sim.replay.fill import tuned_workload
from gpupool.traces.openb import read_nodes, read_pods


def plain_frag(
    tasks: tuple[TypicalTask, ...], model: str, cpu_left: int, gpus: tuple[int, ...]
) -> float:
    """The measure as first written: whole-idle popularity first, then each GPU task."""
    idle = sum(gpus)
    whole = 0.0
    gpu_tasks = []
    for t in tasks:
        s = t.shape
        if s.gpu_milli == 0 or (s.gpu_models and model not in s.gpu_models.split("|")):
            whole += t.popularity
        else:
            gpu_tasks.append((t.popularity, s.cpu_milli, s.gpu_milli, s.gpu_count))
    frag = whole * idle
    for popularity, cpu, milli, count in gpu_tasks:
        if cpu_left >= cpu:
            usable = sum(1 for g in gpus if g >= milli)
            if usable >= count:
                frag += popularity * sum(g for g in gpus if g < milli)
                continue
        frag += popularity * idle
    return frag


def plain_score(
    tasks: tuple[TypicalTask, ...], state: ClusterState, job: JobSpec, node: int
) -> int:
    """FGD's node score from the node's own GPU row, trying every GPU a share fits on."""
    model, cpu, row = state.node_model(node), int(state.cpu_left[node]), state.gpu_rows[node]
    before = plain_frag(tasks, model, cpu, row)

    def score(after_row: tuple[int, ...]) -> int:
        after = plain_frag(tasks, model, cpu - job.cpu_milli, after_row)
        return int(100.0 / (1.0 + math.exp(-(before - after) / 1000.0)))

    if job.shares_gpu:
        return max(
            score((*row[:g], left - job.gpu_milli, *row[g + 1 :]))
            for g, left in enumerate(row)
            if left >= job.gpu_milli
        )
    free = [g for g, left in enumerate(row) if left == MILLI_PER_GPU][: job.gpu_count]
    return score(tuple(left - job.gpu_milli if g in free else left for g, left in enumerate(row)))


@pytest.fixture(scope="module")
def filled() -> tuple[list[ClusterState], list[JobSpec], tuple[TypicalTask, ...]]:
    """Snapshots of a small FGD fill at 0%, ~40%, ~80% and the end, with its task list."""
    cluster, _ = read_nodes(embedded(DEFAULT_NODES))
    cluster = Cluster(cluster.name, cluster.nodes[::15])
    pods, _ = read_pods(embedded(DEFAULT_PODS))
    pods = pods[:600]
    tasks = typical_tasks(pods)
    state = ClusterState(cluster)
    policy = FgdPolicy(FragmentationMeter(tasks, state.models))
    rng = np.random.default_rng(3)
    workload = tuned_workload(pods, state.total_gpu_milli, 1.3, rng)
    snaps = [state.copy()]
    for k, job in enumerate(workload, start=1):
        plan = policy.place(state, job, rng)
        if plan is not None:
            state.validate(job, plan)
            state.allocate(job, plan)
        if k % (len(workload) // 3) == 0:
            snaps.append(state.copy())
    return snaps, pods, tasks


def test_meter_gives_the_plain_sum_bit_for_bit(filled: tuple) -> None:
    snaps, _, tasks = filled
    meter = FragmentationMeter(tasks, snaps[0].models)
    for state in snaps:
        for i in range(state.node_count):
            model, cpu, row = state.node_model(i), int(state.cpu_left[i]), state.gpu_rows[i]
            for cpu_left in (cpu, cpu - 3152, cpu + 1, 0):
                assert meter.node(model, cpu_left, row) == plain_frag(tasks, model, cpu_left, row)


def test_free_keys_and_largest_share_follow_each_node(filled: tuple) -> None:
    snaps, _, _ = filled
    for state in snaps:
        assert state.free_keys is snaps[0].free_keys  # copies share one key list
        for i in range(state.node_count):
            row = state.gpu_rows[i]
            key = (int(state.model_id[i]), int(state.cpu_left[i]), tuple(sorted(row)))
            assert state.free_keys[int(state.free_id[i])] == key
            assert state.max_free[i] == (max(row) if row else -1)


def test_sharing_fit_by_largest_share_matches_the_per_gpu_count(filled: tuple) -> None:
    snaps, pods, _ = filled
    for state in snaps:
        for job in pods[:200]:
            if job.shares_gpu:
                counted = state.usable_gpus(job).sum(axis=1) >= job.gpu_count
                plain = (state.cpu_left >= job.cpu_milli) & (state.mem_left >= job.mem_mib)
                plain &= state.model_mask(job.gpu_models) & counted
                assert (state.fits_mask(job) == plain).all()


def test_fgd_scores_match_the_plain_per_node_score(filled: tuple) -> None:
    snaps, pods, tasks = filled
    policy = FgdPolicy(FragmentationMeter(tasks, snaps[0].models))
    for state in snaps:  # one policy across the copies: its tables are by key, not by node
        for job in pods[:120]:
            candidates = np.flatnonzero(state.fits_mask(job))
            if candidates.size == 0:
                continue
            got = policy.scores(state, job, candidates).tolist()
            assert got == [plain_score(tasks, state, job, int(i)) for i in candidates]


def test_fgd_pick_takes_the_node_the_base_rule_takes(filled: tuple) -> None:
    """FGD's one-argmax pick against the base rule (best score, then lowest tie rank, then
    lowest index), with shuffled ranks, and with ranks that repeat (where FGD must fall
    back to the base rule)."""
    snaps, pods, tasks = filled
    policy = FgdPolicy(FragmentationMeter(tasks, snaps[0].models))
    rng = np.random.default_rng(7)
    picked = 0
    for state in snaps:
        n = state.node_count
        for ranks in (rng.permutation(n), rng.integers(0, 4, n)):
            state.tie_rank = ranks.astype(np.int64)
            for job in pods[:120]:
                candidates = np.flatnonzero(state.fits_mask(job))
                want = ScoringPolicy.pick(policy, state, job, candidates, rng)
                assert policy.pick(state, job, candidates, rng) == want
                picked += want is not None
    assert picked > 500

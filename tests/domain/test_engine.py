"""The engine applies only plans it has validated; bad plans are refused with reasons."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.domain.engine import Engine
from gpupool.domain.fragmentation import FragmentationMeter, typical_tasks
from gpupool.domain.model import Cluster, JobSpec, Node, NodeShare, Placement
from gpupool.domain.state import ClusterState
from gpupool.errors import ConflictError, NotFoundError, PlanRejected, SpecError
from gpupool.policies import PolicyContext, placement_policy


def cluster() -> Cluster:
    return Cluster(
        "c",
        (
            Node("a", "T4", 2, 16_000, 64_000),
            Node("b", "V100", 4, 32_000, 128_000),
        ),
    )


class Fixed:
    name = "fixed"

    def __init__(self, plan: Placement | None) -> None:
        self.plan = plan

    def place(
        self, state: ClusterState, job: JobSpec, rng: np.random.Generator
    ) -> Placement | None:
        return self.plan


def engine_with(plan: Placement | None) -> Engine:
    return Engine(ClusterState(cluster()), Fixed(plan), np.random.default_rng(0))


@pytest.mark.parametrize(
    ("job", "plan", "message"),
    [
        (JobSpec("j", 1, 500), Placement((NodeShare(0, (0, 1), 500),)), "plan gives 2 GPUs"),
        (JobSpec("j", 1, 500), Placement((NodeShare(5, (0,), 500),)), "no node #5"),
        (JobSpec("j", 1, 500), Placement((NodeShare(0, (3,), 500),)), "has no GPU 3"),
        (JobSpec("j", 2), Placement((NodeShare(0, (1, 1), 1000),)), "used twice"),
        (JobSpec("j", 1, 500), Placement((NodeShare(0, (0,), 400),)), "gpu_milli differs"),
        (
            JobSpec("j", 1, gpu_models=frozenset({"V100"})),
            Placement((NodeShare(0, (0,), 1000),)),
            "job allows",
        ),
        (
            JobSpec("j", 1, cpu_milli=20_000),
            Placement((NodeShare(0, (0,), 1000, 20_000),)),
            "lacks CPU",
        ),
        (JobSpec("j", 1, cpu_milli=10), Placement((NodeShare(0, (0,), 1000, 5),)), "add up"),
    ],
)
def test_bad_plans_are_refused_and_leave_state_untouched(
    job: JobSpec, plan: Placement, message: str
) -> None:
    engine = engine_with(plan)
    before = engine.state.gpu_left.copy()
    with pytest.raises(PlanRejected, match=message):
        engine.try_place(job)
    assert (engine.state.gpu_left == before).all()
    assert engine.state.used_gpu_milli == 0


def test_over_commit_of_a_shared_gpu_is_refused() -> None:
    engine = engine_with(Placement((NodeShare(0, (0,), 600),)))
    engine.try_place(JobSpec("first", 1, 600))
    with pytest.raises(PlanRejected, match="has 400 milli free"):
        engine.try_place(JobSpec("second", 1, 600))
    assert engine.state.gpu_rows[0] == (400, 1000)


def test_a_job_is_placed_once() -> None:
    engine = engine_with(Placement((NodeShare(1, (0,), 1000),)))
    engine.try_place(JobSpec("j", 1))
    with pytest.raises(PlanRejected, match="already placed"):
        engine.try_place(JobSpec("j", 1))


def test_release_returns_the_resources_and_unknown_release_is_a_conflict() -> None:
    engine = engine_with(Placement((NodeShare(1, (2, 3), 1000, 4000, 1000),)))
    engine.try_place(JobSpec("j", 2, cpu_milli=4000, mem_mib=1000))
    assert engine.state.whole_free[1] == 2 and engine.state.cpu_left[1] == 28_000
    engine.release("j", 1.0)
    assert engine.state.whole_free[1] == 4 and engine.state.cpu_left[1] == 32_000
    assert engine.state.used_gpu_milli == 0
    with pytest.raises(ConflictError, match="nothing to release"):
        engine.release("j", 2.0)


def test_unknown_policy_names_the_known_ones() -> None:
    with pytest.raises(NotFoundError, match="best-fit"):
        placement_policy("tetris")


def test_fgd_without_a_workload_says_what_it_needs() -> None:
    with pytest.raises(SpecError, match="typical tasks"):
        placement_policy("fgd")


def test_fgd_takes_the_gpu_that_strands_nothing() -> None:
    jobs = [JobSpec(f"s{i}", 1, 500, cpu_milli=1000) for i in range(3)] + [JobSpec("w", 1)]
    state = ClusterState(Cluster("c", (Node("a", "T4", 2, 16_000, 64_000),)))
    meter = FragmentationMeter(typical_tasks(jobs), state.models)
    engine = Engine(state, placement_policy("fgd", PolicyContext(meter)), np.random.default_rng(0))
    engine.try_place(JobSpec("first", 1, 500, cpu_milli=1000))
    # GPU 0 now has 500 left. Another 500 belongs there, keeping GPU 1 whole for 'w'-like tasks.
    plan = engine.try_place(JobSpec("second", 1, 500, cpu_milli=1000))
    assert plan is not None and plan.shares[0].gpus == (0,)
    assert state.gpu_rows[0] == (0, 1000)


def test_jobspec_rejects_nonsense() -> None:
    with pytest.raises(SpecError, match="gpu_milli"):
        JobSpec("j", 1, 0)
    with pytest.raises(SpecError, match="share a GPU"):
        JobSpec("j", 2, 500)
    with pytest.raises(SpecError, match="gpu_count"):
        JobSpec("j", -1)

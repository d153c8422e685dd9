"""Properties that must hold for every policy on any cluster and workload."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.domain.engine import Engine
from gpupool.domain.fragmentation import FragmentationMeter, typical_tasks
from gpupool.domain.lifecycle import TRANSITIONS, JobState, check_transition
from gpupool.domain.model import Cluster, JobSpec, Node
from gpupool.domain.state import ClusterState
from gpupool.errors import IllegalTransition
from gpupool.policies import PolicyContext, placement_names, placement_policy
from gpupool.sim.replay.run import run_replay

MODELS = ("A", "B")


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    n = draw(st.integers(1, 6))
    nodes = tuple(
        Node(
            f"n{i}",
            draw(st.sampled_from(MODELS)),
            draw(st.sampled_from((1, 2, 4, 8))),
            draw(st.integers(0, 64)) * 1000,
            draw(st.integers(0, 256)) * 1024,
        )
        for i in range(n)
    )
    return Cluster("h", nodes)


@st.composite
def jobs(draw: st.DrawFn, count: int = 40) -> list[JobSpec]:
    out = []
    for i in range(draw(st.integers(1, count))):
        gpus = draw(st.sampled_from((0, 1, 1, 1, 2, 4, 8, 12)))
        milli = draw(st.integers(1, 1000)) if gpus == 1 else 1000
        models = draw(st.sampled_from((frozenset(), frozenset({"A"}), frozenset({"B"}))))
        out.append(
            JobSpec(
                f"j{i}",
                gpu_count=gpus,
                gpu_milli=milli,
                cpu_milli=draw(st.integers(0, 16)) * 1000,
                mem_mib=draw(st.integers(0, 64)) * 1024,
                gpu_models=models if gpus else frozenset(),
            )
        )
    return out


def check_invariants(state: ClusterState) -> None:
    real = np.arange(state.gpu_left.shape[1])[None, :] < state.gpu_count[:, None]
    assert (state.gpu_left[real] <= 1000).all(), "a GPU holds more than 1000 milli"
    assert (state.gpu_left[real] >= 0).all(), "a GPU is over-committed"
    assert (state.cpu_left >= 0).all() and (state.mem_left >= 0).all()
    held = sum(j.total_gpu_milli for j in state.jobs.values())
    assert state.used_gpu_milli == held == int((1000 - state.gpu_left[real]).sum())


@settings(max_examples=60, deadline=None)
@given(clusters(), jobs(), st.sampled_from(sorted(placement_names())), st.integers(0, 2**16))
def test_no_gpu_over_committed_and_every_task_placed_or_reported(
    cluster: Cluster, workload: list[JobSpec], policy: str, seed: int
) -> None:
    state = ClusterState(cluster)
    meter = FragmentationMeter(typical_tasks(workload), state.models)
    engine = Engine(
        state, placement_policy(policy, PolicyContext(meter)), np.random.default_rng(seed)
    )
    placed, unplaced = [], []
    for job in workload:
        (placed if engine.try_place(job) is not None else unplaced).append(job.job_id)
        check_invariants(state)
    assert len(placed) + len(unplaced) == len(workload)
    actions = [(d.action, d.job_id) for d in engine.log.decisions]
    assert sorted(j for a, j in actions if a == "start") == sorted(placed)
    assert sorted(j for a, j in actions if a == "unplaced") == sorted(unplaced)
    for job_id in reversed(placed):
        engine.release(job_id, 1.0)
        check_invariants(state)
    assert (state.cpu_left == state.cpu_capacity).all()
    assert state.used_gpu_milli == 0


@given(st.sampled_from(list(JobState)), st.lists(st.sampled_from(list(JobState)), max_size=12))
def test_lifecycle_never_takes_an_illegal_transition(start: JobState, asks: list[JobState]) -> None:
    state = start
    for new in asks:
        try:
            nxt = check_transition("j", state, new)
        except IllegalTransition:
            assert new not in TRANSITIONS[state]
            continue
        assert new in TRANSITIONS[state]
        state = nxt


@st.composite
def traces(draw: st.DrawFn) -> list[JobSpec]:
    n = draw(st.integers(1, 30))
    return [
        JobSpec(
            f"t{i}",
            gpu_count=draw(st.sampled_from((1, 2, 4, 8, 16))),
            submit_s=float(draw(st.integers(0, 500))),
            duration_s=float(draw(st.integers(1, 400))),
        )
        for i in range(n)
    ]


LEGAL_REPLAY_PATHS = ("start", "finish")


@settings(max_examples=60, deadline=None)
@given(
    traces(),
    st.sampled_from(("fifo", "sjf", "srtf")),
    st.sampled_from(("consolidate", "best-fit", "fgd-free")),
)
def test_replay_finishes_every_job_along_legal_lifecycles(
    workload: list[JobSpec], queue: str, policy: str
) -> None:
    policy = "consolidate" if policy == "fgd-free" else policy
    result = run_replay(workload, nodes=2, gpus_per_node=8, queue=queue, policy=policy)
    m = result.metrics
    big = [j for j in workload if j.gpu_count > 16]
    assert m.finished + m.unplaceable == len(workload) and m.unplaceable == len(big)
    per_job: dict[str, list[str]] = {}
    for d in result.log.decisions:
        per_job.setdefault(d.job_id, []).append(d.action)
    for job in workload:
        if job.gpu_count > 16:
            assert per_job[job.job_id] == ["unplaceable"]
            continue
        path = per_job[job.job_id]
        # start (preempt start)* finish: the table allows nothing else
        assert path[0] == "start" and path[-1] == "finish"
        assert all(a in ("start", "preempt") for a in path[1:-1])
        assert all(path[k] != path[k + 1] for k in range(len(path) - 1))
        if queue != "srtf":
            assert path == ["start", "finish"]
    finished_at = {d.job_id: d.time_s for d in result.log.decisions if d.action == "finish"}
    for job in workload:
        if job.job_id in finished_at:
            assert finished_at[job.job_id] - job.submit_s >= (job.duration_s or 0) - 1e-9
    assert 0.0 <= m.utilization <= 1.0 + 1e-9

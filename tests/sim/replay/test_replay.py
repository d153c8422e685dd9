"""Replay against JCTs worked out by hand."""

from __future__ import annotations

import pytest

from gpupool.domain.model import JobSpec
from gpupool.errors import SpecError
from gpupool.sim.replay.run import auto_nodes, run_replay


def j(name: str, gpus: int, submit: float, duration: float) -> JobSpec:
    return JobSpec(name, gpu_count=gpus, submit_s=submit, duration_s=duration)


def jct(result: object, trace: list[JobSpec]) -> dict[str, float]:
    log = result.log.decisions  # type: ignore[attr-defined]
    submit = {x.job_id: x.submit_s for x in trace}
    return {d.job_id: d.time_s - submit[d.job_id] for d in log if d.action == "finish"}


def test_fifo_head_blocks_the_queue() -> None:
    # one 8-GPU node. a: 8 GPUs 0..100. b (8 GPUs) waits for a; c (1 GPU) waits behind b.
    trace = [j("a", 8, 0, 100), j("b", 8, 10, 50), j("c", 1, 20, 5)]
    r = run_replay(trace, nodes=1, gpus_per_node=8, queue="fifo")
    assert jct(r, trace) == {"a": 100, "b": 140, "c": 135}
    assert r.metrics.avg_jct_s == pytest.approx((100 + 140 + 135) / 3)
    assert r.metrics.avg_queue_s == pytest.approx((0 + 90 + 130) / 3)


def test_sjf_runs_the_shortest_waiting_job_first() -> None:
    trace = [j("a", 8, 0, 100), j("long", 8, 10, 50), j("short", 8, 20, 5)]
    r = run_replay(trace, nodes=1, gpus_per_node=8, queue="sjf")
    # at t=100 both wait: short (5 s) first, then long.
    assert jct(r, trace) == {"a": 100, "short": 85, "long": 145}


def test_srtf_preempts_the_longer_running_job() -> None:
    trace = [j("long", 8, 0, 100), j("short", 8, 10, 20)]
    r = run_replay(trace, nodes=1, gpus_per_node=8, queue="srtf")
    # short arrives with 20 s left against long's 90: long is suspended 10..30.
    assert jct(r, trace) == {"short": 20, "long": 120}
    assert r.metrics.preemptions == 1
    actions = [(d.action, d.job_id) for d in r.log.decisions]
    assert actions == [
        ("start", "long"),
        ("preempt", "long"),
        ("start", "short"),
        ("finish", "short"),
        ("start", "long"),
        ("finish", "long"),
    ]


def test_jobs_wider_than_a_node_take_whole_idle_nodes() -> None:
    trace = [j("small", 2, 0, 100), j("wide", 12, 1, 10)]
    r = run_replay(trace, nodes=3, gpus_per_node=8, queue="fifo")
    start = next(d for d in r.log.decisions if d.job_id == "wide" and d.action == "start")
    assert start.placement is not None
    shares = sorted((s.node, len(s.gpus)) for s in start.placement.shares)
    # 8 on an idle node, the remaining 4 best-fit onto the node already running 'small'
    assert shares == [(0, 4), (1, 8)]


def test_a_job_bigger_than_the_cluster_is_reported_not_lost() -> None:
    trace = [j("huge", 64, 0, 10), j("ok", 1, 0, 10)]
    r = run_replay(trace, nodes=2, gpus_per_node=8, queue="fifo")
    assert r.metrics.unplaceable == 1 and r.metrics.finished == 1
    assert [d.action for d in r.log.decisions if d.job_id == "huge"] == ["unplaceable"]


def test_auto_nodes_sizes_for_70_percent_mean_load_and_the_largest_job() -> None:
    # 10 jobs x 4 GPUs x 1000 s over a 1000 s submit span: mean demand 40 GPUs.
    trace = [j(f"x{i}", 4, i * 1000 / 9, 1000) for i in range(10)]
    assert auto_nodes(trace, 8) == 8  # ceil(40 / (0.7 * 8)) = ceil(7.14)
    assert auto_nodes([*trace, j("big", 128, 0, 1)], 8) == 16
    with pytest.raises(SpecError):
        auto_nodes([], 8)


def test_replay_needs_durations() -> None:
    with pytest.raises(SpecError, match="no duration"):
        run_replay([JobSpec("a", 1, submit_s=0.0)], nodes=1, gpus_per_node=8)

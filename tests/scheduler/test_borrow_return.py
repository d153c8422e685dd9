"""Borrowing by online work leaves the lending team its guarantee: while elastic jobs are
still checkpointing the cards they lend, the plan counts those cards for the online team
(not for the lender), so it does not preempt the lender's other work for an online job
its team's guarantee no longer covers. Otherwise the lending team falls below its
guarantee with a wide job waiting on cards scattered among replicas."""

from __future__ import annotations

import dataclasses

from gpupool.domain.lifecycle import JobState
from gpupool.domain.model import Cluster, JobKind, JobSpec, Node
from gpupool.domain.quota import TeamQuota
from gpupool.scheduler import Command, Resize, Resized, Scheduler, SchedulerConfig, Stop, Submitted
from gpupool.scheduler.config import ElasticConfig

MODEL = "A100"


def core_of(serving_gpus: int, batch_gpus: int) -> Scheduler:
    """Two nodes of four cards; a serving team and a batch team with those guarantees."""
    nodes = tuple(Node(f"n{k}", MODEL, 4, 64_000, 512_000) for k in range(2))
    cfg = SchedulerConfig(
        online_reserve=0.0,
        elastic=ElasticConfig(True, 600.0),
        teams=(
            TeamQuota("serving", {MODEL: serving_gpus}, {MODEL: 8}),
            TeamQuota("batch", {MODEL: batch_gpus}, {MODEL: 8}),
        ),
    )
    return Scheduler(Cluster("c", nodes), cfg)


def offline(job_id: str, low: int | None) -> JobSpec:
    return JobSpec(
        job_id,
        gpu_count=4,
        gpu_count_min=low,
        kind=JobKind.OFFLINE,
        team="batch",
        duration_s=86_400.0,
    )


def replica(job_id: str, t: float) -> JobSpec:
    return JobSpec(job_id, kind=JobKind.ONLINE, team="serving", submit_s=t)


def of(kind: type, commands: list[Command]) -> list[Command]:
    return [c for c in commands if isinstance(c, kind)]


def test_cards_being_lent_count_for_the_online_team_so_the_lender_keeps_its_guarantee() -> None:
    core = core_of(serving_gpus=2, batch_gpus=6)
    core.observe(Submitted(0, offline("elastic", low=2)))
    core.observe(Submitted(0, offline("fixed", low=None)))
    core.cycle(0)
    assert core.book.held[("batch", MODEL)] == 8  # two above its guarantee
    for k in range(3):
        core.observe(Submitted(60, replica(f"r{k}", 60)))
    out = core.cycle(120)
    (resize,) = of(Resize, out)
    assert resize.reason == "lent 2 GPUs to online jobs r0, r1: 4 -> 2"  # type: ignore[attr-defined]
    # r0 and r1 fill the serving team's guarantee: r2 may borrow only room no other team
    # is guaranteed, and there is none, so the batch team's other job is not preempted.
    assert not of(Stop, out)
    core.observe(Resized(140, "elastic"))
    assert not of(Stop, core.cycle(180))
    assert core.records["fixed"].state is JobState.RUNNING
    assert core.book.held[("batch", MODEL)] == 6
    assert core.book.held[("serving", MODEL)] == 2
    assert core.records["r2"].state is JobState.PENDING


def test_a_replica_borrows_on_the_node_that_already_serves_so_the_other_stays_whole() -> None:
    core = core_of(serving_gpus=4, batch_gpus=4)
    narrow = dataclasses.replace(offline("narrow", low=1), gpu_count=2)
    core.observe(Submitted(0, narrow))
    core.observe(Submitted(0, offline("wide", low=2)))
    for k in range(2):
        core.observe(Submitted(0, replica(f"r{k}", 0)))
    core.cycle(0)
    serving_node = core.state.placements["narrow"].shares[0].node
    assert {core.state.placements[f"r{k}"].shares[0].node for k in range(2)} == {serving_node}
    core.observe(Submitted(60, replica("r2", 60)))
    (resize,) = of(Resize, core.cycle(120))
    # the narrow job shares its node with replicas: it lends, the wide one keeps its node
    assert resize.job_id == "narrow"  # type: ignore[attr-defined]
    assert resize.reason == "lent 1 GPU to online job r2: 2 -> 1"  # type: ignore[attr-defined]
    core.observe(Resized(140, "narrow"))
    assert core.state.placements["r2"].shares[0].node == serving_node
    assert core.state.placements["wide"].gpu_count == 4

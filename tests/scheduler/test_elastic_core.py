"""The core's rules for elastic jobs: shrink for online work before preempting, never
below the minimum, grow back after the hold-down, stay running throughout."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.cli.parse import gpu_request
from gpupool.domain.lifecycle import JobState
from gpupool.domain.model import Cluster, JobKind, JobSpec, Node
from gpupool.errors import ConflictError, SpecError
from gpupool.scheduler import (
    Command,
    Finished,
    Launch,
    Requeue,
    Resize,
    Resized,
    Scheduler,
    SchedulerConfig,
    Stop,
    Submitted,
)
from gpupool.scheduler.config import ElasticConfig
from gpupool.server.store import NewJob
from gpupool.server.store.checks import check_job


def fleet(nodes: int = 1, gpus: int = 4) -> Cluster:
    return Cluster("c", tuple(Node(f"n{k}", "A100", gpus, 64_000, 512_000) for k in range(nodes)))


def core_of(resize: bool = True, grow_after_s: float = 600.0, nodes: int = 1) -> Scheduler:
    cfg = SchedulerConfig(online_reserve=0.0, elastic=ElasticConfig(resize, grow_after_s))
    return Scheduler(fleet(nodes), cfg)


def elastic(job_id: str = "e", low: int = 2, high: int = 4, priority: int = 0) -> JobSpec:
    return JobSpec(
        job_id,
        gpu_count=high,
        gpu_count_min=low,
        kind=JobKind.OFFLINE,
        duration_s=86_400.0,
        priority=priority,
    )


def online(job_id: str, t: float) -> JobSpec:
    return JobSpec(job_id, kind=JobKind.ONLINE, submit_s=t)


def of(kind: type, commands: list[Command]) -> list[Command]:
    return [c for c in commands if isinstance(c, kind)]


def running_with(core: Scheduler, job_id: str) -> int:
    return core.state.placements[job_id].gpu_count


def test_an_online_job_borrows_from_an_elastic_job_instead_of_preempting_it() -> None:
    core = core_of()
    core.observe(Submitted(0, elastic()))
    core.cycle(0)
    assert running_with(core, "e") == 4
    core.observe(Submitted(60, online("o", 60)))
    out = core.cycle(120)
    assert not of(Stop, out)
    (resize,) = of(Resize, out)
    assert isinstance(resize, Resize)
    assert resize.placement.gpu_count == 3
    assert resize.reason == "lent 1 GPU to online job o: 4 -> 3"
    # its processes still hold the card until they left: nothing starts on it yet
    assert running_with(core, "e") == 4 and core.records["o"].state is JobState.PENDING
    assert core.records["e"].state is JobState.RUNNING
    assert not of(Launch, core.cycle(180))
    launches = of(Launch, core.observe(Resized(200, "e")))
    assert [c.job_id for c in launches] == ["e", "o"]  # type: ignore[attr-defined]
    assert launches[0].resume and launches[0].placement.gpu_count == 3  # type: ignore[attr-defined]
    assert core.records["e"].state is JobState.RUNNING and core.records["e"].preemptions == 0
    assert running_with(core, "e") == 3 and running_with(core, "o") == 1
    assert core.book.held[("default", "A100")] == 4


def test_it_never_shrinks_below_its_minimum_and_then_preemption_takes_over() -> None:
    core = core_of()
    core.observe(Submitted(0, elastic(low=3)))
    core.cycle(0)
    core.observe(Submitted(60, online("o1", 60)))
    core.observe(Submitted(60, online("o2", 60)))
    out = core.cycle(120)
    (resize,) = of(Resize, out)
    assert resize.placement.gpu_count == 3  # type: ignore[attr-defined]
    assert not of(Stop, out)  # mid-resize it is no victim either
    core.observe(Resized(130, "e"))
    out = core.cycle(180)
    assert not of(Resize, out)
    assert [c.job_id for c in of(Stop, out)] == ["e"]  # type: ignore[attr-defined]


def test_several_online_jobs_take_cards_from_one_job_in_one_resize() -> None:
    core = core_of()
    core.observe(Submitted(0, elastic()))
    core.cycle(0)
    for k in range(3):
        core.observe(Submitted(60, online(f"o{k}", 60)))
    out = core.cycle(120)
    (resize,) = of(Resize, out)
    assert resize.reason == "lent 2 GPUs to online jobs o0, o1: 4 -> 2"  # type: ignore[attr-defined]
    assert [c.job_id for c in of(Stop, out)] == []  # the third waits: no victim mid-resize


def test_it_grows_back_once_cards_were_idle_for_the_hold_down() -> None:
    core = core_of(grow_after_s=600)
    core.observe(Submitted(0, elastic()))
    core.cycle(0)
    core.observe(Submitted(60, online("o", 60)))
    core.cycle(120)
    core.observe(Resized(130, "e"))
    core.cycle(180)
    core.observe(Finished(300, "o", JobState.CANCELLED))
    grown: list[tuple[float, Resize]] = []
    for t in range(360, 2000, 60):
        grown += [(t, c) for c in of(Resize, core.cycle(t))]  # type: ignore[misc]
    assert len(grown) == 1
    t, resize = grown[0]
    assert t >= 360 + 600 and resize.placement.gpu_count == 4
    assert resize.reason.endswith("3 -> 4") and "grew back by 1 GPU" in resize.reason
    # a growth takes its cards at once; the job restarts on them once it left
    assert running_with(core, "e") == 4
    (launch,) = core.observe(Resized(t + 10, "e"))
    assert isinstance(launch, Launch) and launch.placement.gpu_count == 4


def test_it_does_not_grow_while_an_online_job_waits_in_its_pool() -> None:
    core = core_of(grow_after_s=60)
    core.observe(Submitted(0, elastic(low=3)))
    core.cycle(0)
    core.observe(Submitted(60, online("o1", 60)))
    core.cycle(120)
    core.observe(Resized(130, "e"))
    core.observe(Submitted(140, JobSpec("o2", kind=JobKind.ONLINE, submit_s=140, priority=-5)))
    core.observe(Finished(150, "o1", JobState.CANCELLED))  # a card is idle, o2 is next
    out = core.cycle(180)
    assert not of(Resize, out)
    assert [c.job_id for c in of(Launch, out)] == ["o2"]  # type: ignore[attr-defined]


def test_with_resizing_off_online_work_preempts_as_before() -> None:
    core = core_of(resize=False)
    core.observe(Submitted(0, elastic()))
    core.cycle(0)
    core.observe(Submitted(60, online("o", 60)))
    out = core.cycle(120)
    assert not of(Resize, out) and [c.job_id for c in of(Stop, out)] == ["e"]  # type: ignore[attr-defined]


def test_a_job_that_ends_mid_resize_frees_its_cards_for_the_online_job() -> None:
    core = core_of()
    core.observe(Submitted(0, elastic()))
    core.cycle(0)
    core.observe(Submitted(60, online("o", 60)))
    core.cycle(120)
    core.observe(Finished(125, "e"))
    assert core.observe(Resized(130, "e")) == []  # a late report changes nothing
    assert [c.job_id for c in of(Launch, core.cycle(180))] == ["o"]  # type: ignore[attr-defined]
    assert "e" not in core.book.elastic.pending


def test_a_resizing_job_cannot_be_requeued_until_it_runs_again() -> None:
    core = core_of()
    core.observe(Submitted(0, elastic()))
    core.cycle(0)
    core.observe(Submitted(60, online("o", 60)))
    core.cycle(120)
    with pytest.raises(ConflictError, match="being resized"):
        core.observe(Requeue(125, "e"))


def test_a_restart_mid_resize_finishes_the_resize_once() -> None:
    """The driver restores the job on its old GPUs and hands the core the target."""
    first = core_of()
    first.observe(Submitted(0, elastic()))
    first.cycle(0)
    first.observe(Submitted(60, online("o", 60)))
    (resize,) = of(Resize, first.cycle(120))
    old = first.state.placements["e"]
    again = core_of()
    again.restore(elastic(), JobState.RUNNING, old, 200)
    again.restore(online("o", 60), JobState.PENDING, None, 200)
    again.recover_resize("e", resize.placement, 200)
    assert not of(Resize, again.cycle(200))  # not resized twice
    out = again.observe(Resized(210, "e"))
    assert [c.job_id for c in of(Launch, out)] == ["e"]  # type: ignore[attr-defined]
    assert running_with(again, "e") == 3
    assert [c.job_id for c in of(Launch, again.cycle(260))] == ["o"]  # type: ignore[attr-defined]


def test_a_restored_elastic_job_runs_on_the_gpus_it_held() -> None:
    first = core_of()
    first.observe(Submitted(0, elastic()))
    first.cycle(0)
    first.observe(Submitted(60, online("o", 60)))
    first.cycle(120)
    first.observe(Resized(130, "e"))
    again = core_of()
    again.restore(elastic(), JobState.RUNNING, first.state.placements["e"], 200)
    assert again.records["e"].spec.gpu_count == 3 and again.book.elastic.declared["e"] == 4


def test_fixed_jobs_are_never_resized() -> None:
    core = core_of()
    core.observe(Submitted(0, dataclasses.replace(elastic(), gpu_count_min=None)))
    core.cycle(0)
    core.observe(Submitted(60, online("o", 60)))
    out = core.cycle(120)
    assert not of(Resize, out) and of(Stop, out)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.booleans()),  # (online jobs arriving, one leaving?)
        min_size=1,
        max_size=25,
    ),
    st.integers(1, 4),
)
def test_elastic_jobs_stay_within_their_range_and_the_books_balance(
    steps: list[tuple[int, bool]], low: int
) -> None:
    core = core_of(grow_after_s=120, nodes=2)
    core.observe(Submitted(0, elastic("a", low=low)))
    core.observe(Submitted(0, elastic("b", low=min(low, 2), high=4, priority=1)))
    core.cycle(0)
    t, seq = 0.0, 0
    alive: list[str] = []
    resizing: set[str] = set()
    for arrivals, leave in steps:
        t += 60
        for _ in range(arrivals):
            core.observe(Submitted(t, online(f"o{seq}", t)))
            seq += 1
        if leave and alive:
            core.observe(Finished(t, alive.pop(0), JobState.CANCELLED))
        out = core.cycle(t)
        for c in out:
            if isinstance(c, Resize):
                assert c.job_id not in resizing
                resizing.add(c.job_id)
            if isinstance(c, Launch) and c.job_id.startswith("o"):
                alive.append(c.job_id)
        for job_id in sorted(resizing):  # every resize completes within the cycle
            resizing.discard(job_id)
            for c in core.observe(Resized(t + 10, job_id)):
                if isinstance(c, Launch) and c.job_id.startswith("o"):
                    alive.append(c.job_id)
        for job_id, full in core.book.elastic.declared.items():
            r = core.records[job_id]
            if r.state is JobState.RUNNING:
                n = core.state.placements[job_id].gpu_count
                assert r.spec.gpu_count_min is not None
                assert r.spec.gpu_count_min <= n <= full == 4
                assert n == r.spec.gpu_count
        held = sum(r.spec.gpu_count for r in core.running.values() if r.state is JobState.RUNNING)
        assert held == core.book.held[("default", "A100")]
        assert core.book.elastic.pending.keys() <= core.running.keys()


def test_elastic_ranges_are_checked_with_clear_errors() -> None:
    with pytest.raises(SpecError, match="1 <= min <= max"):
        JobSpec("x", gpu_count=2, gpu_count_min=3, kind=JobKind.OFFLINE)
    with pytest.raises(SpecError, match="only offline-inference, batch and training"):
        JobSpec("x", gpu_count=4, gpu_count_min=2, kind=JobKind.ONLINE)
    assert gpu_request("2..4", None) == {"gpus": 4, "gpus_min": 2}
    assert gpu_request("4..4", None) == {"gpus": 4}
    for bad, why in (("4..2", "1 <= MIN <= MAX"), ("2..x", "two whole numbers"), ("0..2", "1 <=")):
        with pytest.raises(SpecError, match=why):
            gpu_request(bad, None)
    with pytest.raises(SpecError, match="drop --gpu-mem"):
        gpu_request("2..4", "20GiB")
    job = NewJob(
        name="x", team="t", kind="online-inference", priority=0, gpu_count=4, command=("x",)
    )
    with pytest.raises(SpecError, match="only offline-inference"):
        check_job(dataclasses.replace(job, gpu_count_min=2))
    with pytest.raises(SpecError, match="whole GPUs"):
        check_job(
            dataclasses.replace(job, kind="batch", gpu_count=1, gpu_count_min=1, gpu_milli=500)
        )
    check_job(dataclasses.replace(job, kind="batch", gpu_count_min=2))


def test_workload_generators_make_elastic_jobs() -> None:
    from gpupool.sim.scenario.generators import GenContext, build_workload

    ctx = GenContext(86_400.0, None)
    entries: list[dict[str, object]] = [
        {"generator": "job", "name": "one", "team": "t", "gpus": 8, "gpus_min": 2, "work_min": 60},
        {
            "generator": "backlog",
            "name": "many",
            "team": "t",
            "count": 20,
            "gpu_choices": [1, 4, 8],
            "gpu_weights": [0.3, 0.3, 0.4],
            "elastic_min_frac": 0.5,
        },
    ]
    jobs = {j.job_id: j for j in build_workload(entries, 3, ctx).jobs}
    assert jobs["one"].gpu_count_min == 2 and jobs["one"].elastic
    many = [j for j in jobs.values() if j.job_id != "one"]
    assert {(j.gpu_count, j.gpu_count_min) for j in many} == {(1, None), (4, 2), (8, 4)}
    # without the parameter the same entry draws the same, fixed-size jobs
    fixed = [entries[0], {k: v for k, v in entries[1].items() if k != "elastic_min_frac"}]
    again = [j for j in build_workload(fixed, 3, ctx).jobs if j.job_id != "one"]
    assert [dataclasses.replace(j, gpu_count_min=None) for j in many] == again

"""A job wider than one node is a gang in the simulator as in the live service.

Three nodes of 2 A100s. A 4-GPU training job waits while only one node is free (it never
starts on part of its GPUs), starts over two nodes once two are free, stops whole when one
of its nodes is lost, and resumes from its last checkpoint on the two nodes left. The
simulator (eventsim.run_trace) and the live loop (fleet + probe, a fake executor that
runs gangs) take the same decisions; the live launch carries one member per node; the
local executor's loop refuses the job, saying how to run it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.domain.model import Cluster, JobKind, JobSpec, Node
from gpupool.errors import SpecError
from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.base import MULTI_NODE_REFUSED, Gang, GangMember, LaunchSpec
from gpupool.ports.executor.fake import FakeExecutor
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.scheduler import NodeDown
from gpupool.server.executors.local import LocalExecutor
from gpupool.server.loop.config import LiveConfig
from gpupool.server.loop.driver import LiveService
from gpupool.server.store import NewJob, Store
from gpupool.sim.eventsim import Placed, run_trace

NODES = (("g1", "A100-80GB", 2), ("g2", "A100-80GB", 2), ("g3", "A100-80GB", 2))
# (job id, submit s, GPUs, run time s): the two small jobs hold two nodes; job 4 can start
# only once job 3 has ended, which shows how much of job 3 was left after its loss
JOBS = [
    ("1", 0.0, 2, 100.0),
    ("2", 0.0, 2, 300.0),
    ("3", 10.0, 4, 200.0),
    ("4", 301.0, 4, 10.0),
]
CHECKPOINT_S = 30.0
LOSS_S = 265.0  # job 3 started at 100 and has run 165 s: its last checkpoint is at 150 s


def cluster() -> Cluster:
    return Cluster("c", tuple(Node(n, m, g, 1_000_000, 1 << 30, cluster="c") for n, m, g in NODES))


def specs() -> list[JobSpec]:
    return [
        JobSpec(
            job_id,
            gpu_count=gpus,
            team="ml",
            kind=JobKind.TRAINING,
            submit_s=t,
            duration_s=run_s,
            checkpoint_interval_s=CHECKPOINT_S,
        )
        for job_id, t, gpus, run_s in JOBS
    ]


def gang_node(placed: list[Placed]) -> str:
    """A node of job 3's first gang that the other running job does not use."""
    first = next(p for p in placed if p[2] == "3")
    return sorted({node for node, _ in first[3]})[-1]


def test_the_simulator_starts_a_gang_whole_and_requeues_it_whole_from_its_checkpoint() -> None:
    dry = run_trace(cluster(), specs())
    victim = gang_node(dry)
    placed = run_trace(cluster(), specs(), losses=[NodeDown(LOSS_S, victim)])
    by_job = [(t, what, job) for t, what, job, _ in placed]
    # job 3 waits for 4 free GPUs: nothing of it runs before job 1 ends at 100 s
    assert by_job[:3] == [(0.0, "start", "1"), (0.0, "start", "2"), (100.0, "start", "3")]
    first = placed[2][3]
    assert len(first) == 4 and len({n for n, _ in first}) == 2 and victim in {n for n, _ in first}
    # the loss stops job 3 whole (job 2 on another node runs on) and requeues it
    assert (LOSS_S, "lost", "3") in by_job
    assert not any(what == "lost" and job != "3" for _, what, job in by_job)
    resumed = [p for p in placed if p[1] == "resume" and p[2] == "3"]
    assert len(resumed) == 1
    t_resume, _, _, where = resumed[0]
    assert t_resume == 300.0  # job 2 ends at 300 s: two nodes free again
    assert victim not in {n for n, _ in where} and len(where) == 4
    # it kept the 150 s up to its last checkpoint and redoes the 15 s after it: 50 s are
    # left, so it ends at 350 s, when job 4 (which needs its GPUs) starts
    assert (350.0, "start", "4") in by_job
    assert run_trace(cluster(), specs()) == dry  # deterministic


def live_run(tmp_path: Path, executor: FakeExecutor, victim: str | None) -> LiveService:
    clock = ManualClock(0.0)
    store = Store(f"sqlite:///{tmp_path}/gang.db")
    store.migrate()
    alive = {n: f"id-{n}" for n, _, _ in NODES}
    service = LiveService(
        LiveConfig(tmp_path / "state", sample_s=0.0, host="c", nodes=NODES),
        store,
        executor,
        FakeTelemetry(",".join(f"{g}x{m}" for _, m, g in NODES)),
        clock,
        probe=lambda: dict(alive),
    )
    ends = {job_id: run_s for job_id, _, _, run_s in JOBS}
    started: dict[str, float] = {}
    for t in range(0, 700):
        clock.t = float(t)
        for job_id, ts, gpus, _ in JOBS:
            if ts == t:
                row, _ = store.jobs.submit(
                    NewJob(f"j{job_id}", "ml", "training", 0, gpus, ("true",)), float(t)
                )
                assert str(row.id) == job_id
        for job_id, since in list(started.items()):
            if since + ends[job_id] <= t and job_id in executor.handles():
                executor.finish(job_id, 0)
                del started[job_id]
        if victim is not None and t == LOSS_S:
            alive.pop(victim)
            job = started.pop("3")
            ran = t - job
            ends["3"] -= ran - ran % CHECKPOINT_S
        service.step()
        for at, action, job_id in service.record.decisions:
            if at == t and action in ("start", "resume"):
                started[job_id] = float(t)
        submitted = t >= max(ts for _, ts, _, _ in JOBS)
        if submitted and all(
            store.jobs.get(int(j)).state in ("succeeded", "failed") for j, *_ in JOBS
        ):
            break
    return service


def test_the_live_loop_runs_the_gang_as_the_simulator_does(tmp_path: Path) -> None:
    dry = run_trace(cluster(), specs())
    victim = gang_node(dry)
    simulated = run_trace(cluster(), specs(), losses=[NodeDown(LOSS_S, victim)])
    executor = FakeExecutor(runs_gangs=True)
    service = live_run(tmp_path, executor, victim)
    live = [(t, a, j, tuple(sorted(w))) for t, a, j, w in service.record.placed]
    sim = [(t, a, j, tuple(sorted(w))) for t, a, j, w in simulated if a in ("start", "resume")]
    assert live == sim
    # each launch of job 3 was a gang: one member per node, 2 GPUs each, rank 0 first
    gangs = [g for job_id, g in executor.gangs if job_id == "3"]
    assert len(gangs) == 2
    for gang, (_, _, _, where) in zip(gangs, [p for p in live if p[2] == "3"], strict=True):
        assert [len(m.gpu_indices) for m in gang.members] == [2, 2]
        assert {(m.node, i) for m in gang.members for i in m.gpu_indices} == set(where)
    assert victim not in {m.node for m in gangs[1].members}
    row = service.store.jobs.get(3)
    assert row.state == "succeeded" and row.attempts == 2
    reasons = [e.message for e in service.store.events.after(0, job_id=3) if e.kind == "suspended"]
    assert reasons and victim in reasons[0]


def test_the_local_executor_loop_refuses_a_job_across_nodes(tmp_path: Path) -> None:
    service = live_run(tmp_path, FakeExecutor(), None)
    row = service.store.jobs.get(3)
    assert row.state == "failed"
    assert MULTI_NODE_REFUSED in row.reason and "gpupool serve --ray" in row.reason
    assert "placed it on 2 nodes" in row.reason


def test_the_local_executor_refuses_a_gang_before_starting_anything(tmp_path: Path) -> None:
    gang = Gang((GangMember("g1", (0, 1)), GangMember("g2", (0, 1))))
    spec = LaunchSpec("9", 1, ("true",), {}, (0, 1, 0, 1), tmp_path / "9", False, gang=gang)
    with pytest.raises(SpecError, match="gpupool serve --ray ADDRESS"):
        LocalExecutor(cgroups=None).launch(spec, 0.0)
    assert not (tmp_path / "9").exists()

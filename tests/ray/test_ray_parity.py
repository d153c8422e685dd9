"""Parity: a slice of the OpenB trace run through the event simulator (`run_trace`) and
through the live service on the real 3-node Ray cluster of conftest.py gives the same
placement decisions: the same starts, preemptions and resumes, at the same times, on the
same nodes and GPU indices.

The slice: whole-GPU pods 10..23 of the embedded OpenB trace (openb-pod-0014 ..
openb-pod-0037; num_gpu >= 1 at gpu_milli 1000), creation times rebased to 0 and times
and durations divided by 100 (rounded to whole seconds, at least 1). The trace leaves
gpu_spec empty, so, deterministically from its own columns:

* qos LS (latency-sensitive): team "serving", online inference, priority 100, any GPU
  model (the core gives an any-model job the A100-80GB pool);
* any other qos (BE, Burstable): team "research", training, priority 0;
* a multi-GPU pod asks for H100-80GB and at most 4 GPUs (one node).

Serving is guaranteed the 8 A100s, research nothing: research borrows, and a serving
pod arriving at a full A100 pool reclaims a training pod, which checkpoints, leaves and
later resumes with only the rest of its run time.

The live side runs real processes through RayExecutor on a ManualClock. At each event
time (the next submission, or the next end of a running job computed from what the live
service itself launched: launch time + the work left) the test submits the jobs due,
lets the jobs due to end exit 0, and steps the service until it decides nothing more;
an executor that waits, inside its poll, for every exit the test expects makes each step
see the same completions the simulator does.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from gpupool.domain.model import JobKind, JobSpec
from gpupool.domain.quota import TeamQuota
from gpupool.policies.preemption import PreemptionRules
from gpupool.ports.clock.fake import ManualClock
from gpupool.ports.executor.base import Exit
from gpupool.server.executors.files import STDOUT_LOG
from gpupool.server.executors.ray import RayExecutor
from gpupool.server.loop.config import LIVE_DEFAULTS, LiveConfig, build_fleet, spec_of
from gpupool.server.loop.driver import LiveService, ray_service
from gpupool.server.store import NewJob, Store, database_url
from gpupool.sim.eventsim import Placed, run_trace
from gpupool.traces.openb import read_pods

SLICE = (10, 24)  # indices among the trace's whole-GPU pods
FIRST_LAST = ("openb-pod-0014", "openb-pod-0037")
COMPRESS = 100.0
TEAMS = (TeamQuota("serving", {"A100-80GB": 8}, {}), TeamQuota("research", {}, {}))
POLICY = "priority-quota"
RULES = PreemptionRules(min_runtime_s=0.0, max_per_job=3)
HOST = "ray"
WAIT_S = 30.0
# The job: trap SIGTERM first (the checkpoint protocol: leave at once, exit 0), say
# where it runs, then wait until the test says its work is done.
SCRIPT = (
    "trap 'echo sigterm; exit 0' TERM; "
    'echo "where $GPUPOOL_NODE $CUDA_VISIBLE_DEVICES"; '
    'while [ ! -e "$0/done-$GPUPOOL_JOB_ID" ]; do sleep 0.1; done; echo done'
)


@dataclass(frozen=True)
class TraceJob:
    pod: str
    spec: JobSpec  # what the simulator gets: what spec_of() must read back from the store
    new: NewJob  # what the live service gets


def trace_slice(done_dir: Path) -> list[TraceJob]:
    path = Path(str(resources.files("gpupool") / "data" / "openb_pod_list_default.csv"))
    pods, _ = read_pods(path)
    whole = [p for p in pods if p.gpu_count >= 1 and p.gpu_milli == 1000]
    chosen = whole[SLICE[0] : SLICE[1]]
    assert (chosen[0].job_id, chosen[-1].job_id) == FIRST_LAST
    t0 = chosen[0].submit_s
    out: list[TraceJob] = []
    for i, pod in enumerate(chosen, 1):
        assert pod.duration_s is not None
        online = pod.kind is JobKind.ONLINE  # read_pods: qos LS
        kind = JobKind.ONLINE if online else JobKind.TRAINING
        team, priority = ("serving", 100) if online else ("research", 0)
        gpus = min(pod.gpu_count, 4)
        model = "H100-80GB" if pod.gpu_count > 1 else None
        submit = float(math.floor((pod.submit_s - t0) / COMPRESS))
        run = float(max(1, math.ceil(pod.duration_s / COMPRESS)))
        spec = JobSpec(
            str(i),
            gpu_count=gpus,
            gpu_models=frozenset({model}) if model else frozenset(),
            team=team,
            priority=priority,
            kind=kind,
            submit_s=submit,
            duration_s=run,
            name=pod.job_id,  # the live service hands the core the job's name too
        )
        new = NewJob(
            name=pod.job_id,
            team=team,
            kind=kind.value,
            priority=priority,
            gpu_count=gpus,
            command=("sh", "-c", SCRIPT, str(done_dir)),
            gpu_model=model,
            duration_s=run,
        )
        out.append(TraceJob(pod.job_id, spec, new))
    return out


class GatheringExecutor(RayExecutor):
    """RayExecutor whose poll returns only once every exit in `expect` has come back, so
    one step of the service reaps all the jobs that end at that time together."""

    def __init__(self, nodes: dict[str, str]) -> None:
        super().__init__(nodes)
        self.expect: set[str] = set()
        self.exits: list[Exit] = []

    def poll(self, now_s: float) -> list[Exit]:
        exits = super().poll(now_s)
        end = time.monotonic() + WAIT_S
        while self.expect - {e.job_id for e in exits}:
            missing = sorted(self.expect - {e.job_id for e in exits})
            assert time.monotonic() < end, f"at {now_s}: jobs {missing} did not exit"
            time.sleep(0.1)
            exits += super().poll(now_s)
        unexpected = [e for e in exits if e.job_id not in self.expect]
        assert not unexpected, f"at {now_s}: unexpected exits {unexpected}"
        self.expect = set()
        self.exits += exits
        return exits


def _attempts(service: LiveService, job_id: str) -> dict[int, tuple[str, tuple[int, ...]]]:
    """attempt -> (GPUPOOL_NODE, CUDA_VISIBLE_DEVICES) as the job's process printed them."""
    log = (service.config.run_dir(int(job_id)) / STDOUT_LOG).read_text(encoding="utf-8")
    out: dict[int, tuple[str, tuple[int, ...]]] = {}
    attempt = 0
    for line in log.splitlines():
        if line.startswith("== attempt "):
            attempt = int(line.split()[2])
        elif line.startswith("where "):
            _, node, visible = line.split()
            out[attempt] = (node, tuple(int(x) for x in visible.split(",")))
    return out


def _live_run(
    service: LiveService,
    executor: GatheringExecutor,
    store: Store,
    clock: ManualClock,
    jobs: list[TraceJob],
    done_dir: Path,
    pgids: list[int],
) -> None:
    arrivals = sorted(jobs, key=lambda j: j.spec.submit_s)
    left: dict[str, float] = {}  # run time each job still needs
    since: dict[str, float] = {}  # running jobs: when the live service (re)started them
    k = 0

    def settle(t: float) -> None:
        """Step at time t until the service decides nothing more; preempted jobs leave
        (and are reaped) before the next step."""
        while True:
            seen, launched = len(service.record.decisions), len(service.record.placed)
            service.step()
            for when, _, job_id, _ in service.record.placed[launched:]:
                since[job_id] = when
                row = store.jobs.get(int(job_id))
                if row.pgid is not None:
                    pgids.append(row.pgid)
                # wait until it runs its script (trap set) before anything can stop it
                end = time.monotonic() + WAIT_S
                while row.attempts not in _attempts(service, job_id):
                    assert time.monotonic() < end, f"job {job_id} attempt {row.attempts}"
                    time.sleep(0.05)
            new = service.record.decisions[seen:]
            stopped = [job_id for _, action, job_id in new if action == "preempt"]
            for job_id in stopped:
                left[job_id] -= t - since.pop(job_id)
            if not new:
                return
            executor.expect = set(stopped)

    while k < len(arrivals) or since:
        ends = [start + left[job_id] for job_id, start in since.items()]
        t = min([*ends, *([arrivals[k].spec.submit_s] if k < len(arrivals) else [])])
        clock.t = t
        while k < len(arrivals) and arrivals[k].spec.submit_s <= t:
            job = arrivals[k]
            row, _ = store.jobs.submit(job.new, t)
            assert spec_of(row) == job.spec  # the simulator was given the same job
            left[job.spec.job_id] = float(job.spec.duration_s or 0.0)
            k += 1
        due = sorted(j for j, start in since.items() if start + left[j] <= t)
        for job_id in due:
            (done_dir / f"done-{job_id}").touch()
            del since[job_id]
            left[job_id] = 0.0
        executor.expect = set(due)
        settle(t)


def _with_placements(service: LiveService) -> list[Placed]:
    """service.record.decisions with each launch's placement from service.record.placed."""
    launches = iter(service.record.placed)
    out: list[Placed] = []
    for t, action, job_id in service.record.decisions:
        if action == "preempt":
            out.append((t, action, job_id, ()))
        else:
            placed = next(launches)
            assert placed[:3] == (t, action, job_id)
            out.append(placed)
    assert next(launches, None) is None
    return out


def test_trace_slice_places_alike_in_simulator_and_on_ray(ray_cluster: Any, tmp_path: Path) -> None:
    done_dir = tmp_path / "done"
    done_dir.mkdir()
    jobs = trace_slice(done_dir)
    fleet = sorted((name, model, count) for name, (model, count) in ray_cluster.layout.items())
    cluster, _ = build_fleet(fleet, HOST)
    simulated = run_trace(cluster, [j.spec for j in jobs], TEAMS, POLICY, RULES)
    # Not trivially equal: work on two kinds of node, a reclaim and a resume.
    assert {n for *_, where in simulated for n, _ in where} >= {"a1", "a2", "h1"}, simulated
    assert {"start", "preempt", "resume"} <= {a for _, a, _, _ in simulated}, simulated
    assert {j for _, a, j, _ in simulated if a == "start"} == {j.spec.job_id for j in jobs}

    store = Store(database_url(None, tmp_path / "db"))
    store.migrate()
    clock = ManualClock(0.0)
    executor = GatheringExecutor(ray_cluster.ids)
    config = LiveConfig(
        tmp_path / "state",
        dataclasses.replace(LIVE_DEFAULTS, teams=TEAMS, policy=POLICY, preemption=RULES),
        sample_s=0.0,
        host=HOST,
    )
    service = ray_service(config, store, clock, executor=executor)
    try:
        assert (
            service.cluster == cluster
        )  # the simulator ran on the Ray fleet as the service sees it
        _live_run(service, executor, store, clock, jobs, done_dir, ray_cluster.pgids)
        live = _with_placements(service)
        assert live == simulated

        # Every attempt ran where it was placed: its own node and GPU indices.
        attempts: dict[str, int] = {}
        for _, action, job_id, where in live:
            if action == "preempt":
                continue
            attempts[job_id] = attempts.get(job_id, 0) + 1
            (node,) = {n for n, _ in where}
            ran = _attempts(service, job_id)[attempts[job_id]]
            assert ran == (node, tuple(g for _, g in where)), (job_id, ran, where)
        # ... and ended as the simulator assumed: finished, or preempted and resumed.
        preempted = {j for _, a, j, _ in live if a == "preempt"}
        for j in jobs:
            row = store.jobs.get(int(j.spec.job_id))
            assert row.state == "succeeded", row
            assert row.preemptions == (1 if j.spec.job_id in preempted else 0), row
        outcomes = sorted((e.job_id, e.outcome) for e in executor.exits)
        assert outcomes == sorted(
            [(j.spec.job_id, "succeeded") for j in jobs] + [(j, "preempted") for j in preempted]
        )
        log = (service.config.run_dir(int(min(preempted))) / STDOUT_LOG).read_text(encoding="utf-8")
        assert "sigterm" in log and log.count("where ") == 2
    finally:
        for j in jobs:  # whatever happened, let every job end by itself
            (done_dir / f"done-{j.spec.job_id}").touch()
        service.stop()
        store.close()

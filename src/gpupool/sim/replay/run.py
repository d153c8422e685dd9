"""Replay experiment: jobs arrive at their submit times, queue, run for their duration, leave.

One event loop for every queue policy. At each instant, finished jobs leave first, then
arrivals join the queue, then the queue policy offers jobs to placement: FIFO and SJF in
strict order (the head blocks the queue, as in the Helios simulator); SRTF re-ranks
running and waiting jobs by remaining time and preempts the longer ones (checkpoint and
restore are free here; their cost is modelled with preemption in the simulator's
checkpoint model).

`backfill`, `las`, `gittins` and `learned` replay in ordered.py, loaded only when
one of them is asked for.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gpupool.domain.engine import Engine
from gpupool.domain.lifecycle import JobState, check_transition
from gpupool.domain.model import JobSpec
from gpupool.domain.state import ClusterState
from gpupool.errors import SpecError
from gpupool.policies import placement_policy, queue_policy
from gpupool.sim.replay.common import RULE_QUEUES, ProgressFn, ReplayResult, homogeneous_cluster
from gpupool.sim.replay.events import EventKind, EventQueue
from gpupool.sim.replay.metrics import replay_metrics

if TYPE_CHECKING:
    from gpupool.learning.config import LearningConfig
    from gpupool.learning.predictor import Predictor

AUTO_TARGET_LOAD = 0.70
"""--nodes auto sizes the cluster so the trace's mean GPU demand is 70% of capacity."""


def auto_nodes(
    jobs: Sequence[JobSpec], gpus_per_node: int, target: float = AUTO_TARGET_LOAD
) -> int:
    """Fewest nodes whose capacity keeps mean demand (GPU-hours over the submit span)
    at or below `target`, and that can hold the largest job."""
    if gpus_per_node <= 0:
        raise SpecError("--gpus-per-node must be at least 1")
    if not jobs:
        raise SpecError("the trace has no usable job; nothing to size a cluster for")
    gpu_s = sum(j.gpu_count * (j.duration_s or 0.0) for j in jobs)
    submits = [j.submit_s for j in jobs]
    span = max(submits) - min(submits)
    biggest = max(j.gpu_count for j in jobs)
    by_load = math.ceil(gpu_s / span / (target * gpus_per_node)) if span > 0 else 1
    return max(1, by_load, math.ceil(biggest / gpus_per_node))


@dataclass(slots=True)
class _Run:
    job: JobSpec
    state: JobState
    remaining_s: float
    started_s: float = 0.0
    token: int = 0


def run_replay(
    jobs: Sequence[JobSpec],
    nodes: int,
    gpus_per_node: int,
    queue: str = "fifo",
    policy: str = "consolidate",
    seed: int = 0,
    name: str = "replay",
    progress: ProgressFn | None = None,
    *,
    learning: LearningConfig | None = None,
    predictor: Predictor | None = None,
    origin_s: float = 0.0,
    preemptive: bool = True,
) -> ReplayResult:
    """Replay `jobs` on `nodes` x `gpus_per_node` GPUs under the queue policy `queue`.

    For `learned`, `predictor` is the GPU-time predictor (default: the one
    `learning.predictor` names, made with `origin_s`, the wall-clock time of the trace's
    second 0, so hour and weekday features are true); `learning` also sets the rule it
    mixes with (las or gittins), the mixing weight and the guard. `las` and `gittins`
    take their LAS thresholds from `learning` and never use a predictor. The ranked
    queues preempt (Tiresias' semantics) unless `preemptive` is False, as in the live
    core, where the order only chooses which waiting job starts next.
    """
    if queue in RULE_QUEUES or queue == "backfill":
        from gpupool.sim.replay.ordered import run_ordered

        return run_ordered(
            jobs,
            nodes,
            gpus_per_node,
            queue,
            policy,
            seed,
            name,
            progress,
            learning,
            predictor,
            origin_s,
            preemptive,
        )
    started = time.perf_counter()
    for job in jobs:
        if job.duration_s is None:
            raise SpecError(
                f"job {job.job_id} has no duration; replay needs durations (oracle run times)"
            )
    cluster = homogeneous_cluster(name, nodes, gpus_per_node)
    state = ClusterState(cluster)
    engine = Engine(state, placement_policy(policy), np.random.default_rng(seed))
    order = queue_policy(queue)
    total_gpus = nodes * gpus_per_node

    runs: dict[str, _Run] = {}
    events: EventQueue[tuple[str, int]] = EventQueue()
    for job in sorted(jobs, key=lambda j: j.submit_s):
        if job.job_id in runs:
            raise SpecError(f"job id {job.job_id} appears twice; job ids must be unique")
        runs[job.job_id] = _Run(job, JobState.PENDING, float(job.duration_s or 0.0))
        events.push(job.submit_s, EventKind.ARRIVAL, (job.job_id, 0))

    waiting: list[tuple[tuple[float, ...], int, str]] = []
    running: dict[str, _Run] = {}
    arrival_seq = 0

    def rank(run: _Run, seq: int) -> tuple[float, ...]:
        if order.name == "sjf":
            return (run.job.duration_s or 0.0, run.job.submit_s, seq)
        if order.name == "srtf":
            return (run.remaining_s, run.job.submit_s, seq)
        return (run.job.submit_s, seq)

    def start(run: _Run, now: float) -> bool:
        if engine.try_place(run.job, now, log_miss=False) is None:
            return False
        run.state = check_transition(run.job.job_id, run.state, JobState.RUNNING)
        run.started_s = now
        run.token += 1
        running[run.job.job_id] = run
        events.push(now + run.remaining_s, EventKind.FINISH, (run.job.job_id, run.token))
        return True

    def schedule_in_order(now: float) -> None:
        while waiting:
            _, _, job_id = waiting[0]
            if not start(runs[job_id], now):
                if order.blocking:
                    return
                break
            heapq.heappop(waiting)

    def schedule_srtf(now: float) -> None:
        for run in running.values():
            run.remaining_s -= now - run.started_s
            run.started_s = now
        ranked = sorted(
            [(rank(r, 0)[:2], 0, r.job.job_id) for r in running.values()]
            + [(key[:2], seq, job_id) for key, seq, job_id in waiting]
        )
        free = total_gpus
        wanted: list[str] = []
        for _, _, job_id in ranked:
            need = runs[job_id].job.gpu_count
            if need <= free:
                wanted.append(job_id)
                free -= need
            if free == 0:
                break
        keep = set(wanted)
        for job_id in [j for j in running if j not in keep]:
            run = running.pop(job_id)
            engine.release(job_id, now, "preempt")
            run.state = check_transition(job_id, run.state, JobState.PREEMPTING)
            run.state = check_transition(job_id, run.state, JobState.SUSPENDED)
            run.token += 1  # its pending finish event is now stale
            heapq.heappush(waiting, (rank(run, next_seq()), 0, job_id))
        placed: set[str] = set()
        for job_id in wanted:
            if job_id not in running and start(runs[job_id], now):
                placed.add(job_id)
        if placed:
            waiting[:] = [w for w in waiting if w[2] not in placed]
            heapq.heapify(waiting)

    def next_seq() -> int:
        nonlocal arrival_seq
        arrival_seq += 1
        return arrival_seq

    arrivals_done = 0
    every = max(1, len(runs) // 100)
    while len(events):
        now = events.peek_time()
        while len(events) and events.peek_time() == now:
            event = events.pop()
            job_id, token = event.payload
            run = runs[job_id]
            if event.kind is EventKind.FINISH:
                if token != run.token or run.state is not JobState.RUNNING:
                    continue  # stale: the job was preempted after this was scheduled
                running.pop(job_id)
                engine.release(job_id, now, "finish")
                run.remaining_s = 0.0
                run.state = check_transition(job_id, run.state, JobState.FINISHED)
                continue
            arrivals_done += 1
            if progress is not None and (arrivals_done % every == 0 or arrivals_done == len(runs)):
                progress(arrivals_done, len(runs))
            if run.job.gpu_count > total_gpus:
                run.state = check_transition(job_id, run.state, JobState.UNPLACEABLE)
                engine.note(job_id, now, "unplaceable")
                continue
            heapq.heappush(waiting, (rank(run, next_seq()), 0, job_id))
        if order.preemptive:
            schedule_srtf(now)
        else:
            schedule_in_order(now)

    metrics = replay_metrics(engine.log.decisions, {j.job_id: j for j in jobs}, total_gpus)
    return ReplayResult(
        name=name,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        queue=queue,
        policy=policy,
        metrics=metrics,
        log=engine.log,
        node_names=tuple(nd.name for nd in cluster.nodes),
        wall_s=time.perf_counter() - started,
    )

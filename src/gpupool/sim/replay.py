"""Replay experiment: jobs arrive at their submit times, queue, run for their duration, leave.

One event loop for every queue policy. At each instant, finished jobs leave first, then
arrivals join the queue, then the queue policy offers jobs to placement: FIFO and SJF in
strict order (the head blocks the queue, as in the Helios simulator); SRTF re-ranks
running and waiting jobs by remaining time and preempts the longer ones (checkpoint and
restore are free here; their cost is modelled with preemption in the simulator's
checkpoint model).

The rule baselines of a learned policy and the learned policy itself share that shape:
`backfill` is FIFO with EASY backfill (the blocked head holds a reservation worked out
from the running jobs' oracle end times; a later job starts now only if it ends before
the reservation or uses GPUs spare then). `las` (2D-LAS), `gittins` (2D-Gittins) and
`learned` rank running and waiting jobs with the core's `LearnedOrdering`, fed the
submits, finishes and passing time of the replay, keep the best-ranked that fit and
preempt the rest (free, as for SRTF; preemptions are counted). A running job whose
attained service crosses a point where its rank can change (a LAS threshold, a Gittins
grid step, the predicted median or 90th percentile) is an event.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from gpupool.core.engine import DecisionLog, Engine
from gpupool.core.lifecycle import JobState, check_transition
from gpupool.core.model import Cluster, JobSpec, Node
from gpupool.core.state import ClusterState
from gpupool.errors import SpecError
from gpupool.learning.config import LearningConfig
from gpupool.learning.factory import make_predictor
from gpupool.learning.guard import GuardChange
from gpupool.learning.history import JobFacts
from gpupool.learning.learned import Candidate, LearnedOrdering
from gpupool.learning.ordering import GittinsIndex, preferential_merge
from gpupool.learning.predictor import ModelInfo, Predictor
from gpupool.metrics import ReplayMetrics, replay_metrics
from gpupool.policies import placement_policy, queue_policy
from gpupool.sim.events import EventKind, EventQueue

Progress = Callable[[int, int], None]

AUTO_TARGET_LOAD = 0.70
"""--nodes auto sizes the cluster so the trace's mean GPU demand is 70% of capacity."""


@dataclass
class ReplayResult:
    name: str
    nodes: int
    gpus_per_node: int
    queue: str
    policy: str
    metrics: ReplayMetrics
    log: DecisionLog
    node_names: tuple[str, ...]
    wall_s: float
    guard_changes: tuple[GuardChange, ...] = ()
    """learned: each change of the guard (cold, trusted, fallback), in time order."""
    retrains: tuple[ModelInfo, ...] = ()
    """learned: each model the predictor trained, in time order."""
    reservations: dict[str, float] = field(default_factory=dict)
    """backfill: the first reservation (start time) each blocked head was given."""
    trusted_s: float = 0.0
    """learned: seconds of the replay during which the guard let the model order jobs."""


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


def homogeneous_cluster(name: str, nodes: int, gpus_per_node: int, model: str = "gpu") -> Cluster:
    if nodes <= 0:
        raise SpecError(f"--nodes must be at least 1, got {nodes}")
    width = len(str(nodes - 1))
    return Cluster(
        name,
        tuple(
            Node(f"{name}-n{i:0{width}d}", model, gpus_per_node, 0, 0, cluster=name)
            for i in range(nodes)
        ),
    )


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
    progress: Progress | None = None,
    *,
    learning: LearningConfig | None = None,
    predictor: Predictor | None = None,
    origin_s: float = 0.0,
) -> ReplayResult:
    """Replay `jobs` on `nodes` x `gpus_per_node` GPUs under the queue policy `queue`.

    For `learned`, `predictor` is the GPU-time predictor (default: the one
    `learning.predictor` names, made with `origin_s`, the wall-clock time of the trace's
    second 0, so hour and weekday features are true); `learning` also sets the rule it
    mixes with (las or gittins), the mixing weight and the guard. `las` and `gittins`
    take their LAS thresholds from `learning` and never use a predictor.
    """
    if queue in RULE_QUEUES or queue == "backfill":
        return _run_ordered(
            jobs,
            nodes,
            gpus_per_node,
            queue,
            policy,
            seed,
            name,
            progress,
            learning or LearningConfig(),
            predictor,
            origin_s,
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


GITTINS_PER_DECADE = GittinsIndex(()).per_decade
"""Grid steps per decade of attained service the ordering's Gittins index uses."""

RULE_QUEUES = ("las", "gittins", "learned")
"""Queues ranked by the core's LearnedOrdering (preemptive)."""


def default_predictor(config: LearningConfig, origin_s: float = 0.0) -> Predictor:
    """The predictor `config.predictor` names, untrained."""
    return make_predictor(config, origin_s)


def _gittins_boundary(attained_gpu_s: float, per_decade: int) -> float:
    """The next attained service at which the Gittins grid step changes."""
    if attained_gpu_s < 1.0:
        return 1.0
    step = math.floor(math.log10(attained_gpu_s) * per_decade)
    bound = float(10.0 ** ((step + 1) / per_decade))
    while bound <= attained_gpu_s:  # floating error at a boundary
        step += 1
        bound = float(10.0 ** ((step + 1) / per_decade))
    return bound


@dataclass(slots=True)
class _Job:
    job: JobSpec
    state: JobState
    gpus: int
    duration_s: float
    attained_gpu_s: float = 0.0
    started_s: float = 0.0
    token: int = 0
    bound_gpu_s: float = math.inf
    crossed_gpu_s: float = 0.0
    """The last boundary crossed: the rank uses at least this much attained service, so
    rounding in the running total cannot take a job back over a boundary it passed."""
    seq: int = 0


_FINISH = 0
_BOUNDARY = 1
_ARRIVAL = 2


def _run_ordered(
    jobs: Sequence[JobSpec],
    nodes: int,
    gpus_per_node: int,
    queue: str,
    policy: str,
    seed: int,
    name: str,
    progress: Progress | None,
    learning: LearningConfig,
    predictor: Predictor | None,
    origin_s: float,
) -> ReplayResult:
    started = time.perf_counter()
    for job in jobs:
        if job.duration_s is None:
            raise SpecError(
                f"job {job.job_id} has no duration; replay needs durations (oracle run times)"
            )
    cluster = homogeneous_cluster(name, nodes, gpus_per_node)
    state = ClusterState(cluster)
    engine = Engine(state, placement_policy(policy), np.random.default_rng(seed))
    queue_policy(queue)  # an unknown name fails here, as for the other queues
    total_gpus = nodes * gpus_per_node

    ordering: LearnedOrdering | None = None
    if queue in RULE_QUEUES:
        if queue == "learned":
            config = replace(learning, mode="active")
            if predictor is None:
                predictor = default_predictor(config, origin_s)
        else:
            config = replace(learning, rule=queue, mode="off")
            predictor = None
        ordering = LearnedOrdering(config, predictor)
    las = learning.las

    table: dict[str, _Job] = {}
    events: list[tuple[float, int, int, str, int, float]] = []
    """(time, kind, sequence, job id, token, boundary) in a plain heap: finishes first,
    arrivals last at equal times."""
    pushed = 0

    def push(at: float, kind: int, job_id: str, token: int, bound: float = 0.0) -> None:
        nonlocal pushed
        pushed += 1
        heapq.heappush(events, (at, kind, pushed, job_id, token, bound))

    for job in sorted(jobs, key=lambda j: j.submit_s):
        if job.job_id in table:
            raise SpecError(f"job id {job.job_id} appears twice; job ids must be unique")
        table[job.job_id] = _Job(job, JobState.PENDING, job.gpu_count, float(job.duration_s or 0))
        push(job.submit_s, _ARRIVAL, job.job_id, 0)

    waiting: dict[str, _Job] = {}
    """Arrived, not running, in arrival order (dicts keep insertion order)."""
    running: dict[str, _Job] = {}
    free = total_gpus
    reservations: dict[str, float] = {}
    guard_changes: list[GuardChange] = []
    trusted_since: float | None = None
    trusted_s = 0.0
    model_in_use = False
    seq = 0

    def attained(r: _Job, now: float) -> float:
        if r.state is JobState.RUNNING:
            return r.attained_gpu_s + r.gpus * (now - r.started_s)
        return r.attained_gpu_s

    def ranked_attained(r: _Job, now: float) -> float:
        return max(attained(r, now), r.crossed_gpu_s)

    def boundary(r: _Job, a: float) -> float:
        """The next attained service above a at which r's rank can change (inf: none)."""
        if ordering is None:
            return math.inf
        if ordering.config.rule == "gittins":
            bound = _gittins_boundary(a, GITTINS_PER_DECADE)
        else:
            nxt = las.next_threshold(a)
            bound = math.inf if nxt is None else nxt
        if ordering.uses_model:
            p = ordering.predictions.get(r.job.job_id)
            if p is not None:
                for q in (p.q50_gpu_s, p.q90_gpu_s):
                    if a < q < bound:
                        bound = q
        return bound

    def push_boundary(r: _Job, now: float) -> None:
        a = ranked_attained(r, now)
        r.bound_gpu_s = boundary(r, a)
        if r.bound_gpu_s < math.inf:
            # from the start of this run, so the time does not depend on when it is asked
            at = r.started_s + (r.bound_gpu_s - r.attained_gpu_s) / r.gpus
            push(at, _BOUNDARY, r.job.job_id, r.token, r.bound_gpu_s)

    def start(r: _Job, now: float) -> bool:
        nonlocal free
        if engine.try_place(r.job, now, log_miss=False) is None:
            return False
        r.state = check_transition(r.job.job_id, r.state, JobState.RUNNING)
        r.started_s = now
        r.token += 1
        free -= r.gpus
        running[r.job.job_id] = r
        waiting.pop(r.job.job_id, None)
        left_s = r.duration_s - r.attained_gpu_s / r.gpus
        push(now + max(0.0, left_s), _FINISH, r.job.job_id, r.token)
        if ordering is not None:
            push_boundary(r, now)
        return True

    def preempt(r: _Job, now: float) -> None:
        nonlocal free
        job_id = r.job.job_id
        r.attained_gpu_s = attained(r, now)
        running.pop(job_id)
        engine.release(job_id, now, "preempt")
        r.state = check_transition(job_id, r.state, JobState.PREEMPTING)
        r.state = check_transition(job_id, r.state, JobState.SUSPENDED)
        r.token += 1  # its pending finish and boundary events are now stale
        free += r.gpus
        waiting[job_id] = r

    # The rule order, kept sorted: a job's rule key changes only at its boundary events
    # (and for all jobs when the Gittins index is rebuilt), so it is updated there.
    rule_keys: dict[str, tuple[float, float, str]] = {}
    ranked: list[tuple[float, float, str]] = []
    index_in_use: object = None
    best_waiting: tuple[float, float, str] | None = None
    """The best rule key among waiting jobs (None: to be worked out); waiting jobs' keys
    change only when the Gittins index is rebuilt."""
    rebuilt = False

    def rekey(r: _Job, now: float) -> None:
        nonlocal rebuilt
        assert ordering is not None
        job_id = r.job.job_id
        old = rule_keys.pop(job_id, None)
        if old is not None:
            del ranked[bisect.bisect_left(ranked, old)]
        if r.state is JobState.FINISHED:
            return
        key = ordering.rule_key(Candidate(job_id, ranked_attained(r, now), r.job.submit_s))
        rule_keys[job_id] = key
        bisect.insort(ranked, key)
        if ordering.config.rule == "gittins" and gittins_index() is not index_in_use:
            rebuilt = True  # the other keys are stale: rule_order works them out again

    def gittins_index() -> object:
        assert ordering is not None
        return ordering._gittins  # identity only: was the index rebuilt?

    def rule_order(now: float) -> list[str]:
        nonlocal index_in_use, rebuilt
        assert ordering is not None
        if ordering.config.rule == "gittins" and ranked:
            # asking for one key lets the ordering rebuild its index when it is due
            first = table[ranked[0][2]]
            ordering.rule_key(Candidate(first.job.job_id, ranked_attained(first, now), 0.0))
            index = gittins_index()
            if index is not index_in_use:
                index_in_use = index
                for job_id in list(rule_keys):
                    rekey(table[job_id], now)
            rebuilt = False
        return [key[2] for key in ranked]

    def ahead_of_waiting(old: tuple[float, float, str] | None, r: _Job) -> bool:
        """Whether a running job's rule key, before and after it moved, ranks ahead of
        every waiting job: then the jobs kept running stay the same and nothing is to do."""
        assert ordering is not None
        if ordering.uses_model or old is None:
            return False
        nonlocal best_waiting
        if not waiting:
            return True
        if best_waiting is None:
            best_waiting = min(rule_keys[j] for j in waiting)
        new = rule_keys[r.job.job_id]
        return old < best_waiting and new < best_waiting

    def schedule_ranked(now: float) -> None:
        nonlocal best_waiting
        assert ordering is not None
        best_waiting = None
        if not waiting:
            return  # everything that wants GPUs runs: no rank can change that
        order = rule_order(now)
        if ordering.uses_model:
            cands = [
                Candidate(job_id, ranked_attained(table[job_id], now), table[job_id].job.submit_s)
                for job_id in order
            ]
            order = preferential_merge(
                ordering.predicted_order(cands), order, ordering.config.weight
            )
        left = total_gpus
        wanted: list[_Job] = []
        for job_id in order:
            r = table[job_id]
            if r.gpus <= left:
                wanted.append(r)
                left -= r.gpus
                if left == 0:
                    break
        keep = {r.job.job_id for r in wanted}
        for job_id in [j for j in running if j not in keep]:
            preempt(running[job_id], now)
        for r in wanted:
            if r.state is not JobState.RUNNING:
                start(r, now)

    def schedule_backfill(now: float) -> None:
        items = iter(list(waiting.values()))
        for r in items:
            if r.gpus <= free and start(r, now):
                continue
            head = r
            break
        else:
            return
        # the head waits: its reservation is the earliest time enough GPUs are free
        spare_now = free
        at = math.inf
        for end, gpus in sorted((x.started_s + x.duration_s, x.gpus) for x in running.values()):
            spare_now += gpus
            if spare_now >= head.gpus:
                at = end
                break
        reservations.setdefault(head.job.job_id, at)
        extra = spare_now - head.gpus  # GPUs still spare at the reservation
        for r in items:
            if free == 0:
                break
            if r.gpus > free:
                continue
            ends_before = now + r.duration_s <= at
            if not ends_before and r.gpus > extra:
                continue
            if start(r, now) and not ends_before:
                extra -= r.gpus

    arrivals_done = 0
    every = max(1, len(table) // 100)
    while events:
        now = events[0][0]
        changed = False
        learned = False
        # learned: a job finished, the learner has new data
        moved: list[tuple[tuple[float, float, str] | None, _Job]] = []
        while events and events[0][0] == now:
            _, what, _, job_id, token, bound = heapq.heappop(events)
            r = table[job_id]
            if what != _ARRIVAL:
                if token != r.token or r.state is not JobState.RUNNING:
                    continue  # stale: the job was preempted after this was scheduled
                if what == _BOUNDARY:
                    if bound != r.bound_gpu_s:
                        continue  # stale: the job's boundary was worked out again since
                    r.crossed_gpu_s = r.bound_gpu_s
                    push_boundary(r, now)
                    moved.append((rule_keys.get(job_id), r))
                    rekey(r, now)
                    continue
                running.pop(job_id)
                engine.release(job_id, now, "finish")
                free += r.gpus
                r.attained_gpu_s = r.gpus * r.duration_s
                r.state = check_transition(job_id, r.state, JobState.FINISHED)
                if ordering is not None:
                    ordering.finished(job_id, now, r.gpus * r.duration_s)
                    rekey(r, now)
                changed = learned = True
                continue
            arrivals_done += 1
            if progress is not None and (arrivals_done % every == 0 or arrivals_done == len(table)):
                progress(arrivals_done, len(table))
            if r.gpus > total_gpus:
                r.state = check_transition(job_id, r.state, JobState.UNPLACEABLE)
                engine.note(job_id, now, "unplaceable")
                continue
            if ordering is not None:
                j = r.job
                ordering.submitted(
                    JobFacts(job_id, j.submit_s, j.gpu_count, j.team, _gpu_type(j), j.name)
                )
            seq += 1
            r.seq = seq
            waiting[job_id] = r
            if ordering is not None:
                rekey(r, now)
            changed = True
        if moved and not changed:
            changed = rebuilt or not all(ahead_of_waiting(old, r) for old, r in moved)
        if ordering is not None:
            if learned:
                # time passes for the learner at each finish: its guard and its retraining
                # change only with finished jobs (ticking at every event cost a third of a
                # run)
                change = ordering.tick(now)
                if change is not None:
                    guard_changes.append(change)
                    engine.note("learning", now, f"guard-{change.after.value}")
                    changed = True
            # unguarded, the model comes in when the cold start ends, at any event
            if ordering.uses_model != model_in_use:
                model_in_use = ordering.uses_model
                changed = True
                if model_in_use:
                    trusted_since = now
                    for x in running.values():  # predictions now bound their ranks
                        push_boundary(x, now)
                elif trusted_since is not None:
                    trusted_s += now - trusted_since
                    trusted_since = None
        if not changed:
            continue
        if ordering is not None:
            schedule_ranked(now)
        else:
            schedule_backfill(now)

    metrics = replay_metrics(engine.log.decisions, {j.job_id: j for j in jobs}, total_gpus)
    if trusted_since is not None:
        trusted_s += (
            metrics.makespan_s + min((j.submit_s for j in jobs), default=0.0) - (trusted_since)
        )
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
        guard_changes=tuple(guard_changes),
        retrains=tuple(ordering.retrains) if ordering is not None else (),
        reservations=reservations,
        trusted_s=trusted_s,
    )


def _gpu_type(job: JobSpec) -> str:
    return min(job.gpu_models) if job.gpu_models else ""

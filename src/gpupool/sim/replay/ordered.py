"""Replays whose queue is more than an order of arrival: `backfill` (FIFO with EASY
backfill on oracle end times) and the preemptive ranked queues `las`, `gittins` and
`learned`, which rank running and waiting jobs with the core's `LearnedOrdering`.

Apart from replay.py so that a FIFO, SJF or SRTF replay never loads the learning stack.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from gpupool.domain.engine import Engine
from gpupool.domain.lifecycle import JobState, check_transition
from gpupool.domain.model import JobSpec
from gpupool.domain.state import ClusterState
from gpupool.errors import SpecError
from gpupool.learning.config import LearningConfig
from gpupool.learning.factory import make_predictor
from gpupool.learning.guard import GuardChange
from gpupool.learning.history import JobFacts
from gpupool.learning.learned import Candidate, LearnedOrdering, PredictedKey
from gpupool.learning.ordering import (
    GittinsIndex,
    grid_step_above,
    iter_preferential,
)
from gpupool.learning.predictor import Predictor
from gpupool.policies import placement_policy, queue_policy
from gpupool.sim.replay.common import RULE_QUEUES, ProgressFn, ReplayResult, homogeneous_cluster
from gpupool.sim.replay.metrics import replay_metrics

GITTINS_PER_DECADE = GittinsIndex(()).per_decade
"""Grid steps per decade of attained service the ordering's Gittins index uses."""


def default_predictor(config: LearningConfig, origin_s: float = 0.0) -> Predictor:
    """The predictor `config.predictor` names, untrained."""
    return make_predictor(config, origin_s)


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


class _WaitingKeys:
    """The predicted keys of the waiting jobs, kept sorted between decisions.

    A waiting job's attained service does not change, so neither does its key until the
    ordering's `keys_version` moves; keeping them sorted leaves only the running jobs to
    key at each decision, instead of every job that wants GPUs (most of a learned replay's
    time on a busy cluster).
    """

    def __init__(self) -> None:
        self.version = -1
        self.keys: dict[str, PredictedKey | None] = {}
        self.sorted: list[PredictedKey] = []

    def forget(self) -> None:
        self.version = -1
        self.keys.clear()
        self.sorted.clear()

    def sync(
        self, ordering: LearnedOrdering, waiting: dict[str, _Job], attained: Callable[[_Job], float]
    ) -> list[PredictedKey]:
        """The waiting jobs' keys, sorted; `attained` gives the service a job ranks by."""
        version = ordering.keys_version()
        if version != self.version:
            self.forget()
            self.version = version
        for job_id in self.keys.keys() - waiting.keys():
            key = self.keys.pop(job_id)
            if key is not None:
                del self.sorted[bisect.bisect_left(self.sorted, key)]
        for job_id in waiting.keys() - self.keys.keys():
            r = waiting[job_id]
            key = ordering.predicted_key(Candidate(job_id, attained(r), r.job.submit_s))
            self.keys[job_id] = key
            if key is not None:
                bisect.insort(self.sorted, key)
        return self.sorted


def run_ordered(
    jobs: Sequence[JobSpec],
    nodes: int,
    gpus_per_node: int,
    queue: str,
    policy: str,
    seed: int,
    name: str,
    progress: ProgressFn | None,
    learning: LearningConfig | None,
    predictor: Predictor | None,
    origin_s: float,
    preemptive: bool = True,
) -> ReplayResult:
    started = time.perf_counter()
    learning = learning or LearningConfig()
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
            bound = grid_step_above(a, GITTINS_PER_DECADE)
        else:
            nxt = las.next_threshold(a)
            bound = math.inf if nxt is None else nxt
        if ordering.uses_model:
            bound = min(bound, ordering.rank_bound(r.job.job_id, a))
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
        return ordering.gittins_index  # identity only: was the index rebuilt?

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

    waiting_keys = _WaitingKeys()

    def merged(order: list[str], now: float) -> Iterator[str]:
        """The rule order `order`, mixed with the predicted one while the model is in use,
        lazily. The waiting jobs' predicted keys are kept sorted between decisions; the
        running jobs are keyed afresh when they take part (a preemptive replay)."""
        assert ordering is not None
        if not ordering.uses_model:
            waiting_keys.forget()  # a job may start and stop unseen: key it afresh
            return iter(order)
        sorted_waiting = waiting_keys.sync(ordering, waiting, lambda r: ranked_attained(r, now))
        running_keys = [
            k
            for r in (running.values() if preemptive else ())
            if (
                k := ordering.predicted_key(
                    Candidate(r.job.job_id, ranked_attained(r, now), r.job.submit_s)
                )
            )
            is not None
        ]
        running_keys.sort()
        predicted = (k[-1] for k in heapq.merge(running_keys, sorted_waiting))
        return iter_preferential(predicted, order, ordering.config.weight)

    def schedule_ranked(now: float) -> None:
        nonlocal best_waiting
        assert ordering is not None
        best_waiting = None
        if not waiting:
            return  # everything that wants GPUs runs: no rank can change that
        if not preemptive:
            start_in_order(now)
            return
        order = merged(rule_order(now), now)
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

    def start_in_order(now: float) -> None:
        """Without preemption (the live core's ordered policies): the waiting jobs in the
        order, each started when it fits the free GPUs; running jobs keep running."""
        order = merged([job_id for job_id in rule_order(now) if job_id in waiting], now)
        for job_id in order:
            if free == 0:
                break
            r = table[job_id]
            if r.gpus <= free:
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
        if moved and not changed and preemptive:
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

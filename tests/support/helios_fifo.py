"""Independent reference for FIFO trace replay: the Helios QSSF simulator's semantics.

Written from a reading of the Helios artifact (Hu et al., SC '21; "framework/QSSF Service":
policies/fifo.py, policies/placer/consolidate.py, cluster.py) and deliberately sharing no
code with gpupool, so that it can serve as an oracle for gpupool's replay.

Semantics reproduced (Helios advances a clock one second per tick):

* At each tick: first jobs whose end time is now release their GPUs; then jobs submitted
  now join the queue; then the queue, sorted stably by submit time, is walked and each job
  is offered to placement. The first job that cannot be placed stops the walk (strict
  FIFO: the head of the line blocks everything behind it). A placed job starts now and
  ends at now + duration. JCT = end - submit.
* Placement "consolidate" on nodes of 8 GPUs. The cluster must first have at least as many
  free GPUs in total as the job asks for. Only nodes with at least one free GPU are
  considered, in node order.
  - job <= 8 GPUs: nodes sorted ascending by free GPUs (stable), the first that fits.
  - job > 8 GPUs and a multiple of 8: nodes sorted descending by free GPUs (stable); the
    walk takes completely free nodes until it has gpus / 8 of them and fails on the first
    node that is not completely free.
  - job > 8 GPUs otherwise (k = gpus // 8, r = gpus % 8): same descending order; the walk
    takes completely free nodes while it still needs more than the one remainder node;
    the next node in that order then gets the remainder if it has >= r free GPUs, and
    anything else fails. So if more than k nodes are completely free, the remainder goes
    on the (k+1)-th completely free node, not on a partly used node that would also fit;
    otherwise it goes on the partly used node with the most free GPUs.

The tick loop is replaced by an event loop that visits only instants at which a job
arrives or ends. Between two such instants the cluster and the queue do not change, so a
tick there would just fail on the same head again; with integer times the schedule is
identical to the tick loop's.

Inputs Helios could not finish (it would loop forever) are rejected with ValueError: a
non-integer submit time or duration (never equal to a tick), a duration <= 0 (Helios only
releases a job at a tick strictly after its start), or a job wider than the cluster.
"""

from __future__ import annotations

import csv
import heapq
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

GPUS_PER_NODE = 8


@dataclass(frozen=True)
class Job:
    job_id: str
    submit: int
    gpus: int
    duration: int


@dataclass(frozen=True)
class Outcome:
    job_id: str
    submit: int
    start: int
    end: int
    gpus: int
    nodes: tuple[tuple[int, int], ...]
    """(node index, GPUs taken on it), in the order the placer chose them."""

    @property
    def jct(self) -> int:
        return self.end - self.submit

    @property
    def queued(self) -> int:
        return self.start - self.submit


def _as_int(value: str | int | float, what: str, job_id: str) -> int:
    number = float(value)
    if not number.is_integer():
        raise ValueError(f"job {job_id}: {what} {value!r} is not a whole second")
    return int(number)


def consolidate_select(free: Sequence[int], gpus: int) -> list[tuple[int, int]] | None:
    """Helios' consolidate choice on nodes with `free` GPUs each; None when it fails."""
    if sum(free) < gpus:
        return None
    avail = [i for i, f in enumerate(free) if f > 0]
    if gpus <= GPUS_PER_NODE:
        for node in sorted(avail, key=lambda i: free[i]):
            if free[node] >= gpus:
                return [(node, gpus)]
        return None
    by_most_free = sorted(avail, key=lambda i: -free[i])
    whole, rest = divmod(gpus, GPUS_PER_NODE)
    taken: list[tuple[int, int]] = []
    if rest == 0:
        for node in by_most_free:
            if free[node] < GPUS_PER_NODE:
                return None
            taken.append((node, GPUS_PER_NODE))
            if len(taken) == whole:
                return taken
        return None
    for node in by_most_free:
        if free[node] == GPUS_PER_NODE and len(taken) < whole:
            taken.append((node, GPUS_PER_NODE))
            continue
        if free[node] >= rest and len(taken) == whole:
            taken.append((node, rest))
            return taken
        return None
    return None


def simulate(jobs: Iterable[Job], nodes: int) -> list[Outcome]:
    """Replay `jobs` FIFO on `nodes` nodes of 8 GPUs; outcomes in input order."""
    if nodes <= 0:
        raise ValueError("need at least one node")
    capacity = nodes * GPUS_PER_NODE
    pending = list(jobs)
    for job in pending:
        if job.duration <= 0:
            raise ValueError(f"job {job.job_id}: duration must be positive")
        if job.gpus > capacity:
            raise ValueError(f"job {job.job_id}: {job.gpus} GPUs exceed the cluster")
    # Stable: jobs submitted together keep input order, as Helios' queue sort does.
    arrivals = sorted(range(len(pending)), key=lambda i: pending[i].submit)

    free = [GPUS_PER_NODE] * nodes
    queue: deque[int] = deque()
    ends: list[tuple[int, int]] = []  # (end time, job index)
    placed: dict[int, tuple[int, tuple[tuple[int, int], ...]]] = {}
    next_arrival = 0

    while next_arrival < len(arrivals) or ends:
        candidates = []
        if next_arrival < len(arrivals):
            candidates.append(pending[arrivals[next_arrival]].submit)
        if ends:
            candidates.append(ends[0][0])
        now = min(candidates)

        while ends and ends[0][0] == now:
            _, index = heapq.heappop(ends)
            for node, count in placed[index][1]:
                free[node] += count
        while next_arrival < len(arrivals) and pending[arrivals[next_arrival]].submit == now:
            queue.append(arrivals[next_arrival])
            next_arrival += 1
        # The queue is already in (submit, input order): arrivals only ever join at the tail.
        while queue:
            job = pending[queue[0]]
            choice = consolidate_select(free, job.gpus)
            if choice is None:
                break
            for node, count in choice:
                free[node] -= count
            index = queue.popleft()
            placed[index] = (now, tuple(choice))
            heapq.heappush(ends, (now + job.duration, index))

    if queue:  # unreachable for valid input: with an empty cluster the head always fits
        raise AssertionError("jobs left waiting at the end")
    outcomes = []
    for index, job in enumerate(pending):
        start, where = placed[index]
        outcomes.append(
            Outcome(job.job_id, job.submit, start, start + job.duration, job.gpus, where)
        )
    return outcomes


def mean_jct(outcomes: Sequence[Outcome]) -> float:
    if not outcomes:
        raise ValueError("no jobs")
    return sum(o.jct for o in outcomes) / len(outcomes)


def _read(path: str | Path, submit_column: str) -> list[Job]:
    jobs = []
    with open(path, newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            job_id = row["job_id"].strip()
            jobs.append(
                Job(
                    job_id=job_id,
                    submit=_as_int(row[submit_column], "submit time", job_id),
                    gpus=_as_int(row["num_gpu"], "GPU count", job_id),
                    duration=_as_int(row["duration"], "duration", job_id),
                )
            )
    return jobs


def read_elasticflow_philly(path: str | Path) -> list[Job]:
    """ElasticFlow's Philly VC lists: submit_time, num_gpu and the replayed `duration`."""
    return _read(path, "submit_time")


def read_itp_raw(path: str | Path) -> list[Job]:
    """Microsoft ITP 2021 raw traces: job_id,submission_time,duration,num_gpu."""
    return _read(path, "submission_time")

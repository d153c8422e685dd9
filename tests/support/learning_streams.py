"""Synthetic job streams for the learning tests, and an online driver that feeds a
History (or a LearnedOrdering) in time order: finishes at or before a submit first."""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from gpupool.learning.guard import GuardChange
from gpupool.learning.history import History, JobFacts, Outcome
from gpupool.learning.learned import LearnedOrdering
from gpupool.learning.predictor import Prediction

TEAM_BASE_S = {"t0": 60.0, "t1": 600.0, "t2": 6_000.0, "t3": 200.0, "t4": 2_000.0, "t5": 20_000.0}
"""Each team's typical run time: the signal a predictor can learn (three decades)."""


@dataclass(frozen=True)
class Job:
    facts: JobFacts
    duration_s: float

    @property
    def finish_s(self) -> float:
        return self.facts.submit_s + self.duration_s

    @property
    def gpu_time_s(self) -> float:
        return self.duration_s * self.facts.gpu_count


def stream(
    n: int,
    seed: int = 0,
    gap_s: float = 600.0,
    base: Callable[[str, int], float] | None = None,
    start_s: float = 0.0,
    first_id: int = 0,
) -> list[Job]:
    """n jobs, one every `gap_s` on average; run time = the team's base x lognormal noise."""
    rng = random.Random(seed)
    teams = sorted(TEAM_BASE_S)
    t = start_s
    out: list[Job] = []
    for i in range(n):
        t += rng.expovariate(1.0 / gap_s)
        team = rng.choice(teams)
        gpus = rng.choice([1, 1, 2, 4, 8])
        mean = TEAM_BASE_S[team] if base is None else base(team, gpus)
        duration = mean * math.exp(rng.gauss(0.0, 0.4))
        name = f"{team}-model{rng.randrange(3)}"
        facts = JobFacts(f"j{first_id + i}", t, gpus, team, "A100", name)
        out.append(Job(facts, duration))
    return out


def lengthen_after(jobs: Sequence[Job], t_s: float, seed: int) -> list[Job]:
    """The same jobs, with every job not finished by t_s made 2-10x longer (so it still
    ends after t_s): what a job submitted at t_s must not be able to tell apart."""
    rng = random.Random(seed)
    out = []
    for j in jobs:
        if j.finish_s > t_s:
            j = replace(j, duration_s=j.duration_s * rng.uniform(2.0, 10.0))
        out.append(j)
    return out


def events(jobs: Sequence[Job]) -> list[tuple[float, int, Job]]:
    """(time, 0 finish | 1 submit, job) in the order a driver sees them."""
    out: list[tuple[float, int, Job]] = []
    for j in jobs:
        out.append((j.facts.submit_s, 1, j))
        out.append((j.finish_s, 0, j))
    out.sort(key=lambda e: (e[0], e[1], e[2].facts.job_id))
    return out


def full_history(jobs: Sequence[Job]) -> History:
    """Everything, future included, appended in time order."""
    h = History()
    for _, kind, j in events(jobs):
        if kind:
            h.submitted(j.facts)
        else:
            h.finished(Outcome(j.facts, j.finish_s, j.gpu_time_s))
    return h


def online(jobs: Sequence[Job], at_submit: Callable[[Job, History], None]) -> History:
    """Feed a History in time order, calling `at_submit` right after each submit."""
    h = History()
    pending: list[tuple[float, str, Job]] = []
    for j in sorted(jobs, key=lambda x: (x.facts.submit_s, x.facts.job_id)):
        while pending and pending[0][0] <= j.facts.submit_s:
            _, _, done = heapq.heappop(pending)
            h.finished(Outcome(done.facts, done.finish_s, done.gpu_time_s))
        h.submitted(j.facts)
        at_submit(j, h)
        heapq.heappush(pending, (j.finish_s, j.facts.job_id, j))
    return h


def drive(
    ordering: LearnedOrdering,
    jobs: Sequence[Job],
    tick_every_s: float = 3_600.0,
    made: list[tuple[str, Prediction | None]] | None = None,
) -> list[GuardChange]:
    """Run a LearnedOrdering through the jobs as a driver would: finishes at or before each
    moment first, a tick at least every `tick_every_s` and at each submit, then the submit
    (its prediction appended to `made`). Returns the guard's changes."""
    changes: list[GuardChange] = []
    pending: list[tuple[float, str, Job]] = []
    clock = 0.0

    def advance(to_s: float) -> None:
        nonlocal clock
        while True:
            step = min(to_s, clock + tick_every_s)
            while pending and pending[0][0] <= step:
                _, _, done = heapq.heappop(pending)
                ordering.finished(done.facts.job_id, done.finish_s, done.gpu_time_s)
            change = ordering.tick(step)
            if change is not None:
                changes.append(change)
            clock = step
            if step >= to_s:
                return

    for j in sorted(jobs, key=lambda x: (x.facts.submit_s, x.facts.job_id)):
        advance(j.facts.submit_s)
        prediction = ordering.submitted(j.facts)
        if made is not None:
            made.append((j.facts.job_id, prediction))
        heapq.heappush(pending, (j.finish_s, j.facts.job_id, j))
    if pending:
        advance(max(p[0] for p in pending))
    return changes

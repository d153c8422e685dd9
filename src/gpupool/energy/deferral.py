"""Price-aware deferral: start deadline-bound work in the cheapest hours that still meet
the deadline. Pure; the driver calls `plan_starts` every cycle and starts `start_now`.

Algorithm (docs/energy.md has the proof):

1. Time is cut into slots aligned to multiples of slot_s (so hour-priced tariffs change
   only at slot boundaries and plans made at different cycles line up); slot 0 runs from
   now to the next boundary. A job may start at its earliest moment (now, or its ready
   time if later) or at any later boundary.
2. Free capacity per slot (numpy) = capacity − work already running (`busy`, which holds
   its slots until its end) − jobs placed so far. A window that touches a slot needs the
   job's GPUs free in all of that slot (conservative).
3. Jobs are taken by latest safe start, lss = deadline − margin − run (least slack first).
   A ready job whose lss < now + slot_s is *forced*: it starts now, because the next
   cycle may come after its lss (at lss = now + slot_s the next cycle is still in time,
   and forcing it would override a plan made for exactly its lss). Any other job takes
   the cheapest window (∫ price over [start, start + run]) that starts at or after its
   ready time, at or before its lss, inside the horizon, with capacity; ties go to the
   earliest start. With a value of time, each later start also costs its delay (the job's
   value_of_time per GPU-hour, in price units through its draw), so a job is held only
   where the saving is worth the wait. A job with no such window starts now if it is
   ready (ASAP) and is flagged `at_risk`.

Guarantee: if the driver calls plan_starts at least every slot_s, first shows each job at
or before its lss, starts forced jobs at once, runs each for its run_s > 0, and at every
instant the GPUs of all jobs alive then (ready ≤ t < deadline − margin) plus other busy
work fit the capacity, then every job ends by deadline − margin. The proof needs only the
forced rule, so cheaper windows never cost a deadline. The plan is time-consistent: with
nothing new, the next cycle finds the same windows (a job keeps its slot unless one at
least as cheap and earlier, or one cheaper, is free).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpupool.energy.power import J_PER_KWH
from gpupool.errors import SpecError

_EPS_S = 1e-6


@dataclass(frozen=True)
class DeferrableJob:
    """Work that may wait. run_s: remaining run time at full speed, restart included."""

    job_id: str
    gpus: int
    run_s: float
    ready_s: float
    deadline_s: float
    power_w: float = 1.0
    """Draw of one of its GPUs while it runs (W), facility overhead included; scales the
    plan's cost, and weighs the price against value_of_time."""
    value_of_time: float = 0.0
    """What an hour of one of its GPUs' delay is worth, in the price's currency: a later
    window is taken only where the electricity it saves is worth more than the delay."""

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise SpecError(f"deferrable job {self.job_id}: gpus must be >= 1, got {self.gpus}")
        values = (self.run_s, self.ready_s, self.deadline_s, self.power_w, self.value_of_time)
        if not all(math.isfinite(v) for v in values):
            raise SpecError(
                f"deferrable job {self.job_id}: times, power and value of time must be finite"
            )
        if self.run_s < 0 or self.power_w < 0 or self.value_of_time < 0:
            raise SpecError(
                f"deferrable job {self.job_id}: run_s, power_w and value_of_time must be >= 0"
            )

    def delay_rate(self) -> float:
        """The value of a second of delay in the plan's price units (price x seconds per
        kWh of one GPU's draw): value_of_time per GPU-hour over the GPU's kW."""
        if self.value_of_time == 0:
            return 0.0
        if self.power_w == 0:
            return math.inf  # it draws nothing: no saving is worth a delay
        return self.value_of_time * J_PER_KWH / 3600.0 / self.power_w

    def latest_start_s(self, margin_s: float) -> float:
        """The last start that still ends margin_s before the deadline."""
        return self.deadline_s - margin_s - self.run_s


@dataclass(frozen=True)
class DeferralPlan:
    start_now: frozenset[str]
    """Start these this cycle (forced ones first)."""
    planned_start_s: dict[str, float]
    """Every job's planned start (now for those in start_now)."""
    forced: frozenset[str]
    """Ready jobs that must start now: their deadline allows no later start, or no window
    with capacity is left for them (then they are in at_risk too)."""
    at_risk: frozenset[str] = frozenset()
    """Jobs no window can finish by deadline − margin: started ASAP when ready."""
    cost: float = 0.0
    """Σ gpus · power_w · ∫ price dt over the planned windows (price per kWh, W -> kWh)."""
    deferred: frozenset[str] = field(default=frozenset())
    """Ready jobs that wait for a cheaper window."""


def plan_starts(
    now_s: float,
    jobs: Sequence[DeferrableJob],
    capacity_gpus: int,
    busy: Sequence[tuple[int, float]],
    price_at: Callable[[float], float],
    slot_s: float = 900.0,
    horizon_s: float | None = None,
    margin_s: float = 900.0,
) -> DeferralPlan:
    """Which pending jobs to start now, and when the rest are planned to start.

    busy: (gpus, until_s) of work already running on the same capacity. price_at: price
    (or any cost rate, e.g. carbon intensity) at a scenario time. horizon_s limits how far
    ahead a start may be planned (default: as far as the latest deadline needs).
    """
    if not slot_s > 0 or not margin_s >= 0 or capacity_gpus < 0:
        raise SpecError("plan_starts: need slot_s > 0, margin_s >= 0 and capacity_gpus >= 0")
    if horizon_s is not None and not horizon_s >= 0:
        raise SpecError(f"plan_starts: horizon_s must be >= 0, got {horizon_s}")
    ids = [j.job_id for j in jobs]
    if len(set(ids)) != len(ids):
        raise SpecError("plan_starts: job ids must be unique")
    if not jobs:
        return DeferralPlan(frozenset(), {}, frozenset())

    lss = [j.latest_start_s(margin_s) for j in jobs]
    base = math.floor(now_s / slot_s) * slot_s
    last_start = now_s + horizon_s if horizon_s is not None else max(max(lss), now_s)
    n_start = (
        math.floor((last_start - base) / slot_s + 1e-9) + 1
    )  # candidate starts: now, boundaries
    max_run = max(j.run_s for j in jobs)
    n_slots = n_start + math.ceil(max_run / slot_s) + 2

    starts = base + slot_s * np.arange(n_slots, dtype=np.float64)
    starts[0] = now_s
    price = np.array([price_at(float(t)) for t in starts], dtype=np.float64)
    cum = np.concatenate(([0.0], np.cumsum(price) * slot_s))  # ∫ price from base to boundary k

    def integral(t: float) -> float:
        k = min(math.floor((t - base) / slot_s), n_slots - 1)
        return float(cum[k] + price[k] * (t - base - k * slot_s))

    free = np.full(n_slots, float(capacity_gpus))
    for gpus, until_s in busy:
        if until_s > now_s and gpus > 0:
            free[: min(n_slots, max(1, _ceil((until_s - base) / slot_s)))] -= gpus

    blocked = np.zeros(n_slots + 1, dtype=np.int64)
    order = sorted(range(len(jobs)), key=lambda i: (lss[i], jobs[i].deadline_s, jobs[i].job_id))
    start_now: set[str] = set()
    forced: set[str] = set()
    at_risk: set[str] = set()
    deferred: set[str] = set()
    planned: dict[str, float] = {}
    cost = 0.0
    for i in order:
        job = jobs[i]
        run = job.run_s
        ready = job.ready_s <= now_s + _EPS_S
        np.cumsum(free < job.gpus, out=blocked[1:])  # blocked[b] - blocked[a]: full slots in a..b-1
        # its earliest start (now, or its ready time) occupies slots k_first..last_first
        first = now_s if ready else job.ready_s
        k_first = 0 if ready else math.floor((first - base) / slot_s + 1e-9)
        last_first = max(k_first, _ceil((first + run - base) / slot_s) - 1)
        first_ok = (
            k_first < n_start
            and first <= lss[i] + _EPS_S
            and blocked[last_first + 1] == blocked[k_first]
        )
        # later starts at boundaries k = lo..hi occupy slots k..k+span-1
        span = max(1, _ceil(run / slot_s))
        lo = max(1, k_first + 1)
        hi = min(n_start - 1, math.floor((lss[i] - base) / slot_s + 1e-9))
        k = -1  # -1: the earliest start; else a boundary
        if ready and lss[i] < now_s + slot_s:  # the next call may come after its lss
            forced.add(job.job_id)
            if not first_ok:
                at_risk.add(job.job_id)
        else:
            best = integral(first + run) - integral(first) if first_ok else math.inf
            if lo <= hi:
                q = math.floor(run / slot_s + 1e-9)
                f = run - q * slot_s
                ks = slice(lo, hi + 1)
                fits = blocked[lo + span : hi + 1 + span] == blocked[ks]
                window = cum[lo + q : hi + 1 + q] + price[lo + q : hi + 1 + q] * f - cum[ks]
                rate = job.delay_rate()
                if rate:  # the delay each later start costs, against its first moment
                    window = window + rate * (starts[ks] - first)
                window = np.where(fits, window, np.inf)
                cheapest = float(window.min())
                if cheapest < best - _tol(best):  # ties (within float noise) go earliest
                    k = lo + int(np.argmax(window <= cheapest + _tol(cheapest)))
            if k < 0 and not first_ok:
                at_risk.add(job.job_id)
                if ready:
                    forced.add(job.job_id)
        if k < 0:
            start = first
            if k_first < n_slots:
                free[k_first : min(last_first, n_slots - 1) + 1] -= job.gpus
        else:
            start = base + k * slot_s
            free[k : k + span] -= job.gpus
        planned[job.job_id] = start
        if ready:
            (start_now if k < 0 else deferred).add(job.job_id)
        cost += job.gpus * job.power_w * (integral(start + run) - integral(start)) / J_PER_KWH
    return DeferralPlan(
        frozenset(start_now),
        planned,
        frozenset(forced),
        frozenset(at_risk),
        cost,
        frozenset(deferred),
    )


def _ceil(x: float) -> int:
    """Ceiling that ignores float noise just above a whole number."""
    return math.ceil(x - 1e-9)


def _tol(cost: float) -> float:
    return 1e-9 * (1.0 + abs(cost)) if math.isfinite(cost) else 0.0


def peak_alive_gpus(jobs: Sequence[DeferrableJob], margin_s: float) -> int:
    """The most GPUs that jobs alive at one instant hold (alive: ready ≤ t < deadline −
    margin). Capacity at least this (plus other busy work) is the deferral guarantee's
    precondition."""
    events = sorted(
        (t, delta)
        for j in jobs
        if j.deadline_s - margin_s > j.ready_s
        for t, delta in ((j.ready_s, j.gpus), (j.deadline_s - margin_s, -j.gpus))
    )
    peak = alive = 0
    for _, delta in events:  # at equal times the ends (negative) come first
        alive += delta
        peak = max(peak, alive)
    return peak

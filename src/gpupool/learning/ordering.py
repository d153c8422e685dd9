"""Rule orderings a learned policy competes with, and the mix of two orders.

Tiresias (Gu et al., NSDI '19) orders by attained GPU service (GPUs x time run), without
knowing durations: 2D-LAS puts jobs in discrete queues by attained service, first come
first served inside a queue; 2D-Gittins ranks by the Gittins index of attained service
under the empirical distribution of finished jobs' GPU-time. Smaller keys run first.

`preferential_merge` is the preferential round-robin of Kumar, Purohit and Svitkina
(NeurIPS '18) as an order: of every unit of capacity a share `weight` follows the
predicted order and the rest the rule order, so a wrong prediction costs at most a
constant factor over the rule alone.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.errors import SpecError


@dataclass(frozen=True)
class LasQueues:
    """2D-LAS queue thresholds in GPU-seconds of attained service, ascending."""

    thresholds_gpu_s: tuple[float, ...] = (3_600.0, 36_000.0)

    def __post_init__(self) -> None:
        t = self.thresholds_gpu_s
        if any(x <= 0 for x in t) or any(b <= a for a, b in itertools.pairwise(t)):
            raise SpecError(
                f"LAS thresholds must be positive and ascending GPU-seconds, got {list(t)}"
            )

    def queue(self, attained_gpu_s: float) -> int:
        """0 for the highest-priority queue."""
        return bisect.bisect_right(self.thresholds_gpu_s, attained_gpu_s)

    def next_threshold(self, attained_gpu_s: float) -> float | None:
        """The attained service at which the job drops to the next queue, or None."""
        k = self.queue(attained_gpu_s)
        return self.thresholds_gpu_s[k] if k < len(self.thresholds_gpu_s) else None

    def key(self, attained_gpu_s: float, arrival_s: float, job_id: str) -> tuple[int, float, str]:
        return (self.queue(attained_gpu_s), arrival_s, job_id)


def grid_step_above(attained_gpu_s: float, per_decade: int) -> float:
    """The smallest point of the geometric grid (`per_decade` steps a decade, from 1)
    above `attained_gpu_s`."""
    if attained_gpu_s < 1.0:
        return 1.0
    step = math.floor(math.log10(attained_gpu_s) * per_decade)
    bound = float(10.0 ** ((step + 1) / per_decade))
    while bound <= attained_gpu_s:  # floating error at a step
        step += 1
        bound = float(10.0 ** ((step + 1) / per_decade))
    return bound


class GittinsIndex:
    """Gittins index of attained service under an empirical GPU-time distribution.

    For attained service a and survivors x_1 <= ... <= x_m (> a), the index is
    max_k P(S <= x_k | S > a) / E[min(S, x_k) - a | S > a]: the best completion rate per
    unit of further service. A higher index runs first. Attained service is looked up on a
    geometric grid (`per_decade` steps), so the order moves in steps, as Tiresias' does.
    """

    def __init__(
        self,
        gpu_times_s: Sequence[float] | np.ndarray,
        per_decade: int = 10,
        weights: Sequence[float] | np.ndarray | None = None,
    ) -> None:
        if weights is None:
            sample = np.sort(np.asarray([x for x in gpu_times_s if x > 0], dtype=np.float64))
            self.weights: np.ndarray | None = None
        else:  # a weighted empirical distribution (a mixture of two samples)
            x = np.asarray(gpu_times_s, dtype=np.float64)
            w = np.asarray(weights, dtype=np.float64)
            keep = (x > 0) & (w > 0)
            order = np.argsort(x[keep], kind="stable")
            sample, self.weights = x[keep][order], w[keep][order]
        self.sample = sample
        self.per_decade = per_decade
        self._cache: dict[int, float] = {}

    @classmethod
    def mixture(cls, own_gpu_s: np.ndarray, base: GittinsIndex, weight: float) -> GittinsIndex:
        """The index of `weight` x the distribution of `own_gpu_s` + (1 - weight) x `base`'s:
        a conditional distribution shrunk toward the unconditional one. Weight 0 is `base`
        itself (the same object, so the same index values to the last bit)."""
        if weight <= 0.0 or own_gpu_s.size == 0:
            return base
        if weight >= 1.0 or base.sample.size == 0:
            return cls(own_gpu_s, base.per_decade)
        base_w = (
            np.full(base.sample.size, 1.0 / base.sample.size)
            if base.weights is None
            else base.weights / base.weights.sum()
        )
        return cls(
            np.concatenate([own_gpu_s, base.sample]),
            base.per_decade,
            np.concatenate(
                [np.full(own_gpu_s.size, weight / own_gpu_s.size), base_w * (1 - weight)]
            ),
        )

    def __len__(self) -> int:
        return int(self.sample.size)

    def _step(self, attained_gpu_s: float) -> int:
        if attained_gpu_s < 1.0:
            return -1
        step = math.floor(math.log10(attained_gpu_s) * self.per_decade)
        if 10.0 ** ((step + 1) / self.per_decade) <= attained_gpu_s:
            step += 1  # at a grid point the logarithm can round below it
        return step

    def next_step(self, attained_gpu_s: float) -> float:
        """The attained service where the next grid step starts: the index is constant
        between steps."""
        return grid_step_above(attained_gpu_s, self.per_decade)

    def index(self, attained_gpu_s: float) -> float:
        step = self._step(attained_gpu_s)
        hit = self._cache.get(step)
        if hit is not None:
            return hit
        a = 0.0 if step < 0 else 10.0 ** (step / self.per_decade)
        alive = self.sample > a
        survivors = self.sample[alive]
        if survivors.size == 0:
            value = 0.0  # older than anything seen: lowest priority, served last
        elif self.weights is None:
            m = survivors.size
            gaps = survivors - a
            k = np.arange(1, m + 1, dtype=np.float64)
            expected = np.cumsum(gaps) + (m - k) * gaps
            value = float(np.max(k / np.maximum(expected, 1e-9)))
        else:
            w = self.weights[alive]
            gaps = survivors - a
            done = np.cumsum(w)
            expected = np.cumsum(w * gaps) + (done[-1] - done) * gaps
            value = float(np.max(done / np.maximum(expected, 1e-9)))
        self._cache[step] = value
        return value

    def key(self, attained_gpu_s: float, arrival_s: float, job_id: str) -> tuple[float, float, str]:
        return (-self.index(attained_gpu_s), arrival_s, job_id)

    def profile(self, gpu_s: float) -> ServiceProfile:
        """The job of `gpu_s` GPU-seconds under this index, served from nothing."""
        return service_profile(self.index, self.next_step, gpu_s)


@dataclass(frozen=True)
class ServiceProfile:
    """How an index policy sees one job as it is served from nothing to its end: the
    service at the end of each stretch of constant index, and the running minimum of the
    index up to that stretch. Two jobs under an index policy are served in the order of
    these running minima (a stretch waits behind every earlier stretch of its own job), so
    a pair's schedule, and what it costs, follows by bisection (`pair_cost_s`)."""

    ends_gpu_s: tuple[float, ...]
    priority: tuple[float, ...]
    """Non-increasing; a higher one is served first."""

    @property
    def gpu_s(self) -> float:
        return self.ends_gpu_s[-1] if self.ends_gpu_s else 0.0


def service_profile(
    index: Callable[[float], float], next_change: Callable[[float], float], gpu_s: float
) -> ServiceProfile:
    """The profile of a job of `gpu_s` under `index` (higher first), which can change only
    where `next_change` says."""
    ends: list[float] = []
    priority: list[float] = []
    a, low = 0.0, math.inf
    while a < gpu_s:
        low = min(low, index(a))
        a = min(next_change(a), gpu_s)
        ends.append(a)
        priority.append(low)
    return ServiceProfile(tuple(ends), tuple(priority))


def pair_cost_s(a: ServiceProfile, b: ServiceProfile, a_wins_ties: bool) -> float:
    """Excess of the two jobs' summed completion times, both served from nothing under one
    index policy on one server, over shortest first: 0 when the shorter is served first
    and whole; the GPU-time difference when the longer is served first and whole."""
    if not a.ends_gpu_s or not b.ends_gpu_s:
        return 0.0
    ga, gb = a.gpu_s, b.gpu_s
    # b's stretches served before a's last one: those ranking above it
    served_b = _served_before(b, a.priority[-1], not a_wins_ties)
    if served_b < len(b.ends_gpu_s):  # a ends first
        total = 2 * ga + gb + (b.ends_gpu_s[served_b - 1] if served_b else 0.0)
    else:
        served_a = _served_before(a, b.priority[-1], a_wins_ties)
        total = 2 * gb + ga + (a.ends_gpu_s[served_a - 1] if served_a else 0.0)
    return total - (2 * min(ga, gb) + max(ga, gb))


def _served_before(p: ServiceProfile, level: float, ties_first: bool) -> int:
    """How many of p's stretches rank above `level` (or equal to it, when p wins ties)."""
    lo, hi = 0, len(p.priority)
    while lo < hi:  # priority is non-increasing
        mid = (lo + hi) // 2
        v = p.priority[mid]
        if v > level or (ties_first and v == level):
            lo = mid + 1
        else:
            hi = mid
    return lo


def ks_distance(a_sorted: np.ndarray, b_sorted: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov distance (largest gap between the empirical CDFs)."""
    if a_sorted.size == 0 or b_sorted.size == 0:
        return 0.0
    points = np.concatenate([a_sorted, b_sorted])
    fa = np.searchsorted(a_sorted, points, side="right") / a_sorted.size
    fb = np.searchsorted(b_sorted, points, side="right") / b_sorted.size
    return float(np.max(np.abs(fa - fb)))


def shrink_weight(
    distance: float, n_own: int, n_rest: int, tests: int, alpha: float = 0.05
) -> float:
    """How much of a conditional distribution to keep, against the unconditional one: 0
    while its KS distance from the rest is within what chance gives at level `alpha`
    (Bonferroni over `tests` bins), rising to 1 as the distance outgrows that noise:
    1 - (critical / observed)^2, the positive-part James-Stein form."""
    if n_own == 0 or n_rest == 0 or distance <= 0.0:
        return 0.0
    critical = math.sqrt(-math.log(alpha / max(tests, 1) / 2.0) / 2.0)
    observed = distance * math.sqrt(n_own * n_rest / (n_own + n_rest))
    return max(0.0, 1.0 - (critical / observed) ** 2)


def preferential_merge(predicted: Sequence[str], rule: Sequence[str], weight: float) -> list[str]:
    """One order of the jobs in `rule`: `weight` of the picks follow `predicted` (jobs the
    predictor is confident about, in predicted order), the rest follow `rule`; each job
    appears once, where it is first picked."""
    return list(iter_preferential(predicted, rule, weight))


def iter_preferential(
    predicted: Iterable[str], rule: Sequence[str], weight: float
) -> Iterator[str]:
    """`preferential_merge`, one job at a time: a driver that needs only the head of the
    order (until the GPUs are full) stops early, and `predicted` may itself be lazy."""
    if not 0.0 <= weight <= 1.0:
        raise SpecError(f"the prediction weight must be in 0..1, got {weight}")
    return _preferential(iter(predicted), rule, weight)


def _preferential(predicted: Iterator[str], rule: Sequence[str], weight: float) -> Iterator[str]:
    taken: set[str] = set()
    members = set(rule)
    head = next(predicted, None)  # the predicted job to consider next; None: none left
    r = 0
    credit = 0.5  # rounds: a weight of one half or more picks from the prediction first,
    # a weight of 0 never does
    while len(taken) < len(members):
        credit += weight
        if credit >= 1.0 - 1e-12 and head is not None:
            credit -= 1.0
            while head is not None and (head in taken or head not in members):
                head = next(predicted, None)
            if head is not None:
                taken.add(head)
                yield head
                head = next(predicted, None)
                continue
        while r < len(rule) and rule[r] in taken:
            r += 1
        if r < len(rule):
            taken.add(rule[r])
            yield rule[r]
            r += 1
        elif head is None:
            break

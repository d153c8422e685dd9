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
from collections.abc import Iterable, Iterator, Sequence
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

    def __init__(self, gpu_times_s: Sequence[float], per_decade: int = 10) -> None:
        sample = np.sort(np.asarray([x for x in gpu_times_s if x > 0], dtype=np.float64))
        self.sample = sample
        self.per_decade = per_decade
        self._cache: dict[int, float] = {}

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
        survivors = self.sample[self.sample > a]
        if survivors.size == 0:
            value = 0.0  # older than anything seen: lowest priority, served last
        else:
            m = survivors.size
            gaps = survivors - a
            k = np.arange(1, m + 1, dtype=np.float64)
            expected = np.cumsum(gaps) + (m - k) * gaps
            value = float(np.max(k / np.maximum(expected, 1e-9)))
        self._cache[step] = value
        return value

    def key(self, attained_gpu_s: float, arrival_s: float, job_id: str) -> tuple[float, float, str]:
        return (-self.index(attained_gpu_s), arrival_s, job_id)


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

"""The learned order degrades to its rule when the model knows nothing: each bin's
distribution is shrunk toward the unconditional one by the evidence it differs; and the
pieces the order judge rests on (weighted Gittins index, pair costs) against brute force."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from gpupool.learning.config import LearningConfig
from gpupool.learning.history import JobFacts
from gpupool.learning.learned import Candidate, LearnedOrdering
from gpupool.learning.ordering import (
    GittinsIndex,
    ServiceProfile,
    ks_distance,
    pair_cost_s,
    service_profile,
    shrink_weight,
)
from gpupool.learning.predictor import Prediction


def _judged(pairs: list[tuple[float, float]], rule: str = "gittins") -> LearnedOrdering:
    """An ordering whose model was judged on finished jobs: (predicted median, taken)."""
    ordering = LearnedOrdering(LearningConfig(mode="active", rule=rule))
    for i, (median, taken) in enumerate(pairs):
        job_id = f"past-{i}"
        ordering.facts[job_id] = JobFacts(job_id, float(i), 1)
        ordering.predictions[job_id] = Prediction(median / 2, median, median * 2, 1)
        ordering.finished(job_id, float(i), taken)
    return ordering


def _taken(rng: random.Random) -> float:
    return 10 ** rng.uniform(1.0, 6.0)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_an_uninformative_model_orders_exactly_as_the_rule(seed: int) -> None:
    """Predicted medians unrelated to the GPU-time taken: every bin is shrunk to the
    unconditional distribution, and the learned order is 2D-Gittins job for job, at any
    attained service, ties by arrival included. Without the shrinkage the bins' own noisy
    distributions (about 200 jobs each) reorder the jobs."""
    rng = random.Random(seed)
    ordering = _judged([(_taken(rng), _taken(rng)) for _ in range(2_000)])
    assert ordering.conditional_bins()[2] == [0.0] * 10
    cands = []
    for i in range(300):
        job_id = f"w{i}"
        if i % 10:  # one in ten without a prediction
            m = _taken(rng)
            spread = 2.0 if i % 7 else 1_000.0  # and some not confident
            ordering.predictions[job_id] = Prediction(m / spread, m, m * spread, 1)
        attained = 0.0 if i % 3 else 10 ** rng.uniform(0.0, 6.5)
        cands.append(Candidate(job_id, attained, float(i // 4)))  # arrivals tie too
    assert ordering.predicted_order(cands) == ordering.rule_order(cands)
    assert ordering.order(cands) == ordering.rule_order(cands)


def test_an_informative_model_keeps_its_bins() -> None:
    rng = random.Random(5)
    pairs = []
    for _ in range(2_000):
        m = _taken(rng)
        pairs.append((m, m * math.exp(rng.gauss(0.0, 0.5))))
    ordering = _judged(pairs)
    weights = ordering.conditional_bins()[2]
    assert min(weights) > 0.8
    fresh = [Candidate("long", 0.0, 0.0), Candidate("short", 0.0, 1.0)]
    ordering.predictions["long"] = Prediction(5e4, 1e5, 2e5, 1)
    ordering.predictions["short"] = Prediction(50.0, 100.0, 200.0, 1)
    assert ordering.predicted_order(fresh) == ["short", "long"]
    assert ordering.rule_order(fresh) == ["long", "short"]


def test_shrink_weight_is_zero_under_the_null_and_near_one_for_distinct_samples() -> None:
    rng = np.random.default_rng(7)
    zero = 0
    for _ in range(200):
        a, b = np.sort(rng.lognormal(size=200)), np.sort(rng.lognormal(size=1_800))
        zero += shrink_weight(ks_distance(a, b), a.size, b.size, tests=10) == 0.0
    assert zero >= 195  # Bonferroni over 10 bins at 5 %: about 99.5 %
    a, b = np.sort(rng.lognormal(1.0, size=200)), np.sort(rng.lognormal(size=1_800))
    assert shrink_weight(ks_distance(a, b), a.size, b.size, tests=10) > 0.8
    assert ks_distance(np.array([1.0, 2.0]), np.array([3.0, 4.0])) == 1.0


def test_the_weighted_index_equals_the_index_of_the_repeated_sample() -> None:
    rng = random.Random(8)
    values = [_taken(rng) for _ in range(60)]
    counts = [rng.randint(1, 4) for _ in values]
    repeated = GittinsIndex([v for v, c in zip(values, counts, strict=True) for _ in range(c)])
    weighted = GittinsIndex(values, weights=counts)
    for a in [0.0, 0.5, 3.0, 40.0, 700.0, 5e3, 8e4, 9e5, 2e6]:
        assert weighted.index(a) == pytest.approx(repeated.index(a), rel=1e-9)


def test_a_mixture_of_weight_zero_is_the_base_index_itself() -> None:
    base = GittinsIndex([10.0, 100.0, 1_000.0])
    own = np.array([5.0, 6.0])
    assert GittinsIndex.mixture(own, base, 0.0) is base
    full = GittinsIndex.mixture(own, base, 1.0)
    assert full.index(0.0) == GittinsIndex([5.0, 6.0]).index(0.0)
    half = GittinsIndex.mixture(own, base, 0.5)
    assert full.index(0.0) > half.index(0.0) > base.index(0.0)


def _simulate(a: ServiceProfile, b: ServiceProfile, a_wins_ties: bool) -> float:
    """Brute force: serve the two jobs stretch by stretch by their current index (not its
    running minimum), the winner of ties first; the summed completion's excess."""
    idx_a = _raw(a)
    idx_b = _raw(b)
    ka = kb = 0
    t = 0.0
    done: dict[str, float] = {}
    served = {"a": 0.0, "b": 0.0}
    while ka < len(a.ends_gpu_s) or kb < len(b.ends_gpu_s):
        pick_a = kb >= len(b.ends_gpu_s) or (
            ka < len(a.ends_gpu_s)
            and (idx_a[ka] > idx_b[kb] or (idx_a[ka] == idx_b[kb] and a_wins_ties))
        )
        if pick_a:
            t += a.ends_gpu_s[ka] - served["a"]
            served["a"] = a.ends_gpu_s[ka]
            ka += 1
            if ka == len(a.ends_gpu_s):
                done["a"] = t
        else:
            t += b.ends_gpu_s[kb] - served["b"]
            served["b"] = b.ends_gpu_s[kb]
            kb += 1
            if kb == len(b.ends_gpu_s):
                done["b"] = t
    ga, gb = a.gpu_s, b.gpu_s
    return done["a"] + done["b"] - (2 * min(ga, gb) + max(ga, gb))


RAW: dict[int, list[float]] = {}


def _raw(p: ServiceProfile) -> list[float]:
    return RAW[id(p)]


@pytest.mark.parametrize("seed", range(6))
def test_pair_cost_matches_serving_the_two_jobs_stretch_by_stretch(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(300):
        profiles = []
        for _job in range(2):
            g = 10 ** rng.uniform(0.5, 5.0)
            levels = {k: float(rng.randint(0, 4)) for k in range(-1, 60)}  # ties on purpose
            raw: list[float] = []

            def index(a: float, levels: dict[int, float] = levels, raw: list[float] = raw) -> float:
                step = -1 if a < 1.0 else math.floor(math.log10(a) * 10 + 1e-9)
                raw.append(levels[step])
                return levels[step]

            def nxt(a: float) -> float:
                step = -1 if a < 1.0 else math.floor(math.log10(a) * 10 + 1e-9)
                return float(10.0 ** ((step + 1) / 10))

            p = service_profile(index, nxt, g)
            RAW[id(p)] = raw
            profiles.append(p)
        a, b = profiles
        for wins in (True, False):
            assert pair_cost_s(a, b, wins) == pytest.approx(
                _simulate(a, b, wins), rel=1e-9, abs=1e-6
            )


def test_pair_cost_is_zero_shortest_first_and_the_difference_longest_first() -> None:
    short = ServiceProfile((100.0,), (2.0,))
    long = ServiceProfile((1_000.0,), (1.0,))
    assert pair_cost_s(short, long, True) == 0.0
    assert pair_cost_s(
        ServiceProfile((100.0,), (1.0,)), ServiceProfile((1_000.0,), (2.0,)), True
    ) == (900.0)

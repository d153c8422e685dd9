"""The co-location world on small synthetic measurements: it runs pairs at their measured
speeds, whole cards never co-locate, and an admission that knows the slow pairs keeps
them apart while sharing still adds throughput."""

from __future__ import annotations

import itertools

import pytest

from gpupool.errors import SpecError
from gpupool.learning.colocation import SumRule
from gpupool.learning.colocation_admission import (
    ColocationGuard,
    ColocationGuardConfig,
    PairAdmissionPolicy,
)
from gpupool.sim.scenario.colocation import ColocationScenario, PairSpeeds, run
from gpupool.traces.lucid import PairMeasurement, SoloProfile


def profiles() -> dict[str, SoloProfile]:
    out = {}
    for model, sm in (("Light", 30.0), ("Heavy", 95.0)):
        for i in range(2):
            p = SoloProfile(model, "D", 32 * (i + 1), False, 100.0, sm + i, 10.0, 2000.0)
            out[p.key] = p
    return out


PROFILES = profiles()


def measured(slow: float) -> list[PairMeasurement]:
    """Light next to light keeps 0.95x; anything next to a heavy job runs at `slow`."""
    out = []
    for a, b in itertools.combinations_with_replacement(sorted(PROFILES), 2):
        heavy = "Heavy" in (PROFILES[a].model, PROFILES[b].model)
        out.append(PairMeasurement(a, b, slow if heavy else 0.95, slow if heavy else 0.95))
    return out


class Knows:
    """An admission model that predicts the measured speeds exactly (an oracle)."""

    def __init__(self, pairs: list[PairMeasurement]) -> None:
        self.speeds = PairSpeeds(pairs)

    def predict(self, a: SoloProfile, b: SoloProfile) -> tuple[float, float]:
        return self.speeds.of(a.key, b.key)


SC = ColocationScenario(
    nodes=1, gpus_per_node=4, horizon_s=12 * 3600.0, median_work_s=1800.0, load=3.0
)
"""Arrivals at 3x the whole cards' capacity: every mode is saturated, so throughput is
what the cards can do, not what arrived."""


def test_pairs_run_at_their_measured_speeds() -> None:
    pairs = measured(0.5)
    whole = run(SC, "whole", pairs, PROFILES)
    assert whole.colocated_job_s == 0.0 and whole.pairs_started == 0
    assert 0.8 < whole.throughput <= 1.0
    # sharing with no admission beyond the hard rules: heavy pairs run, at 0.5x
    anyhow = run(SC, "share", pairs, PROFILES, None)
    assert anyhow.pairs_started > 0 and anyhow.slow_share > 0.2
    # the same world with every pair measured fine has no slow time at all
    fine = run(SC, "share", measured(0.95), PROFILES, None)
    assert fine.slow_job_s == 0.0 and fine.throughput > 1.5 * whole.throughput


def test_an_admission_that_knows_keeps_slow_pairs_apart_and_gains() -> None:
    pairs = measured(0.5)
    policy = PairAdmissionPolicy(PROFILES, SumRule(200.0), Knows(pairs))
    learned = run(SC, "learned", pairs, PROFILES, policy)
    whole = run(SC, "whole", pairs, PROFILES)
    assert learned.slow_job_s == 0.0 and learned.pairs_started > 0
    assert learned.throughput > 1.1 * whole.throughput
    assert learned.guard_changes == ()


def test_same_arrivals_and_determinism() -> None:
    pairs = measured(0.5)
    a = run(SC, "share", pairs, PROFILES, None)
    b = run(SC, "share", pairs, PROFILES, None)
    assert a == b
    assert a.jobs_submitted == run(SC, "whole", pairs, PROFILES).jobs_submitted


def test_unmeasured_pairs() -> None:
    pairs = measured(0.5)
    light, heavy = (
        sorted(k for k in PROFILES if "Light" in k),
        sorted(k for k in PROFILES if "Heavy" in k),
    )
    partial = [p for p in pairs if {p.first, p.second} != {light[0], heavy[0]}]
    speeds = PairSpeeds(partial)
    with pytest.raises(SpecError, match="no measured speed"):
        speeds.of(light[0], heavy[0])
    kept = speeds.fully_crossed(list(PROFILES))
    assert len(kept) == 3 and (light[0] in kept) != (heavy[0] in kept)


def test_the_guard_falls_back_and_recovers_on_a_drift_in_the_world() -> None:
    """Every pair is measured fine and the model knows it; from hour 4 to 8 the world runs
    co-located jobs at half that. The core's guard hands admission to the rule during the
    drift and takes the model back after it, each with its sentence and hour."""
    pairs = measured(0.95)
    guard = ColocationGuard(ColocationGuardConfig(window_pairs=20, min_pairs=20))
    policy = PairAdmissionPolicy(PROFILES, SumRule(200.0), Knows(pairs), guard=guard)
    sc = ColocationScenario(
        nodes=1,
        gpus_per_node=4,
        horizon_s=16 * 3600.0,
        median_work_s=1800.0,
        load=3.0,
        drift=(4 * 3600.0, 8 * 3600.0, 0.5),
    )
    result = run(sc, "learned", pairs, PROFILES, policy)
    assert len(result.guard_changes) == 2, result.guard_changes
    fell, back = result.guard_changes
    assert "drifted" in fell and 4.0 <= float(fell.split(" h:")[0]) < 8.0
    assert "recovered" in back and float(back.split(" h:")[0]) >= 8.0
    assert guard.trusted

"""The co-location predictor, leave-one-model-pair-out, the admission in the core and its
guard, on small synthetic pairs (the Lucid files are never needed here)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from gpupool.domain.model import Cluster, JobKind, JobSpec, Node
from gpupool.errors import SpecError
from gpupool.learning.colocation import (
    SLOW_SPEED,
    PredictorSettings,
    SpeedPredictor,
    SumRule,
    admit_top,
    lompo_folds,
    lompo_predictions,
)
from gpupool.learning.colocation_admission import (
    AdmissionMode,
    ColocationGuard,
    ColocationGuardConfig,
    PairAdmissionPolicy,
)
from gpupool.scheduler import Scheduler, Submitted
from gpupool.scheduler.commands import Launch, Wait
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.events import Finished, JobProgress, Progress
from gpupool.traces.lucid import PairMeasurement, SoloProfile

FAST = PredictorSettings(rounds=60, learning_rate=0.15)
"""Fewer, larger boosting steps: the synthetic pairs need no more, and the tests stay quick."""


def profile(model: str, i: int, sm: float, bw: float, mem: float = 2000.0) -> SoloProfile:
    return SoloProfile(model, "D", 32 * (i + 1), False, 100.0, sm, bw, mem)


def synthetic(seed: int = 0) -> tuple[dict[str, SoloProfile], list[PairMeasurement]]:
    """Eight models, four configurations each, every pair measured. The true speed has an
    interaction the sum rule cannot see: bandwidth-heavy pairs slow down far more than
    their SM sum says (speed = 1 - 0.5 * own bw * partner bw / 100^2 - ...)."""
    rng = np.random.default_rng(seed)
    profiles: dict[str, SoloProfile] = {}
    for m in range(8):
        heavy = m % 2 == 0
        for i in range(4):
            sm = float(rng.uniform(20, 95))
            bw = float(rng.uniform(50, 95) if heavy else rng.uniform(2, 20))
            p = profile(f"M{m}", i, sm, bw)
            profiles[p.key] = p
    pairs: list[PairMeasurement] = []
    for a, b in itertools.combinations_with_replacement(sorted(profiles), 2):
        pa, pb = profiles[a], profiles[b]

        def speed(own: SoloProfile, other: SoloProfile) -> float:
            slow = 0.9 * own.mem_bw_util_pct * other.mem_bw_util_pct / 100.0**2
            slow += 0.1 * max(0.0, own.sm_util_pct + other.sm_util_pct - 120.0) / 100.0
            return float(1.0 - slow + rng.normal(0, 0.01))

        pairs.append(PairMeasurement(a, b, speed(pa, pb), speed(pb, pa)))
    return profiles, pairs


def test_learns_an_interaction_the_rule_cannot_see() -> None:
    profiles, pairs = synthetic()
    pred = lompo_predictions(pairs, profiles, FAST)
    truth = np.array([[p.first_speed, p.second_speed] for p in pairs])
    assert np.abs(pred - truth).mean() < 0.05
    slowed = truth.min(axis=1) < SLOW_SPEED
    rule = SumRule.calibrated(pairs, profiles, 0.7)
    by_rule = np.array([rule.admits(profiles[p.first], profiles[p.second]) for p in pairs])
    by_model = admit_top(pred.min(axis=1), float(by_rule.mean()))
    assert by_model.sum() == by_rule.sum()
    assert slowed[by_model].mean() < 0.5 * slowed[by_rule].mean()


def test_lompo_never_trains_on_the_held_out_model_pair() -> None:
    profiles, pairs = synthetic()
    seen: list[tuple[str, str]] = []
    predicted: list[int] = []
    folds = lompo_folds(pairs)

    def trainer(rows: Sequence[PairMeasurement], prof: Mapping[str, SoloProfile]) -> SpeedPredictor:
        held = folds[len(seen)].held_out
        assert all(r.models != held for r in rows), f"trained on held-out {held}"
        assert len(rows) == sum(p.models != held for p in pairs)  # everything else is used
        seen.append(held)
        predicted.extend(folds[len(seen) - 1].test)
        return SpeedPredictor(rows, prof, FAST)

    pred = lompo_predictions(pairs, profiles, trainer=trainer)
    assert len(seen) == len({p.models for p in pairs}) == 36  # 8 models: 28 + 8 self-pairs
    assert sorted(predicted) == list(range(len(pairs)))
    assert not np.isnan(pred).any()


def test_lompo_folds_hold_out_each_unordered_model_pair_whole() -> None:
    _, pairs = synthetic()
    for fold in lompo_folds(pairs):
        assert {pairs[i].models for i in fold.test} == {fold.held_out}
        assert all(pairs[i].models != fold.held_out for i in fold.train)
        assert len(fold.train) + len(fold.test) == len(pairs)


def test_deterministic() -> None:
    profiles, pairs = synthetic()
    a, b = SpeedPredictor(pairs, profiles), SpeedPredictor(pairs, profiles)
    assert a.booster.model_to_string() == b.booster.model_to_string()
    assert np.array_equal(a.predict_many(pairs, profiles), b.predict_many(pairs, profiles))


def test_rule_calibration() -> None:
    profiles, pairs = synthetic()
    rule = SumRule.calibrated(pairs, profiles, 0.5)
    admitted = [rule.admits(profiles[p.first], profiles[p.second]) for p in pairs]
    assert abs(np.mean(admitted) - 0.5) < 0.02
    with pytest.raises(SpecError):
        SumRule.calibrated(pairs, profiles, 0.0)


# ---- the guard ---------------------------------------------------------------------------


def test_guard_falls_back_and_recovers_with_hysteresis() -> None:
    guard = ColocationGuard(ColocationGuardConfig(window_pairs=20, min_pairs=10))
    changes = [guard.record(float(t), False) for t in range(20)]
    assert guard.trusted and not any(changes)
    drift = [guard.record(float(20 + t), True) for t in range(4)]
    assert drift[:3] == [None, None, None] and drift[3] is not None  # 4 of 20 > 15%
    assert (
        not guard.trusted and "drifted" in drift[3].reason and "4 of the last 20" in drift[3].reason
    )
    # the slowed pairs leave the window only as it slides past them: at 3 of 20 (15%)
    # the rule still decides, at 2 of 20 (10%, the bound less the margin) the model is back
    back = [guard.record(float(30 + t), False) for t in range(20)]
    first = next(i for i, c in enumerate(back) if c is not None)
    assert first == 17
    assert guard.trusted and "recovered" in str(back[first])
    assert sum(c is not None for c in back) == 1  # no flapping
    with pytest.raises(SpecError):
        ColocationGuardConfig(max_slowed_share=0.1, recover_margin=0.2)


# ---- the admission in the core -------------------------------------------------------------


class FixedModel:
    """Predicts the same speeds for every pair, or slow next to anything of model `bad`."""

    def __init__(self, bad: str = "") -> None:
        self.bad = bad

    def predict(self, a: SoloProfile, b: SoloProfile) -> tuple[float, float]:
        slow = self.bad in (a.model, b.model)
        return (0.5, 0.5) if slow else (0.95, 0.95)


def core_with(
    admission: PairAdmissionPolicy | None, gpus: int = 2
) -> tuple[Scheduler, dict[str, SoloProfile]]:
    cluster = Cluster("c", (Node("n0", "G", gpus, 1_000_000, 1 << 30),))
    cfg = SchedulerConfig(cycle_s=1.0, online_reserve=0.0, share_cap=None)
    return Scheduler(cluster, cfg, colocation=admission), {}


def share(job_id: str, name: str, kind: JobKind = JobKind.TRAINING, t: float = 0.0) -> JobSpec:
    return JobSpec(job_id, gpu_milli=500, kind=kind, name=name, submit_s=t, duration_s=1e6)


PROFILES = {
    p.key: p
    for p in (
        profile("Good", 0, 30, 10),
        profile("Good", 1, 40, 10),
        profile("Bad", 0, 90, 80),
        profile("Mid", 0, 60, 20),
    )
}
MID = "Mid/D/bs32/fp32"
GOOD_A, GOOD_B, BAD = "Good/D/bs32/fp32", "Good/D/bs64/fp32", "Bad/D/bs32/fp32"
assert {GOOD_A, GOOD_B, BAD, MID} == set(PROFILES)


def cards(core: Scheduler) -> dict[str, tuple[int, int]]:
    return {j: (p.shares[0].node, p.shares[0].gpus[0]) for j, p in core.state.placements.items()}


def test_learned_admission_keeps_a_predicted_slow_pair_apart() -> None:
    policy = PairAdmissionPolicy(PROFILES, SumRule(200.0), FixedModel(bad="Bad"))
    core, _ = core_with(policy)
    for i, name in enumerate((GOOD_A, BAD, GOOD_B)):
        core.observe(Submitted(0.0, share(f"j{i}", name)))
    core.cycle(0.0)
    where = cards(core)
    assert where["j1"] != where["j0"] and where["j2"] != where["j1"]
    assert where["j2"] == where["j0"]  # the good pair shares
    # without the admission (today's behaviour) the first two share a card
    plain, _ = core_with(None)
    for i, name in enumerate((GOOD_A, BAD, GOOD_B)):
        plain.observe(Submitted(0.0, share(f"j{i}", name)))
    plain.cycle(0.0)
    assert cards(plain)["j0"] == cards(plain)["j1"]


def test_rule_admission_and_unprofiled_jobs() -> None:
    rule = PairAdmissionPolicy(PROFILES, SumRule(100.0), mode=AdmissionMode.RULE)
    assert rule.problem(share("a", GOOD_A), (share("b", BAD),)) is not None  # 30+90 > 100
    assert rule.problem(share("a", GOOD_A), (share("b", GOOD_B),)) is None  # 30+40
    assert rule.problem(share("a", "unknown"), (share("b", BAD),)) is None
    with pytest.raises(SpecError):
        PairAdmissionPolicy(PROFILES, SumRule(100.0), None, mode=AdmissionMode.LEARNED)


def test_never_a_latency_service_next_to_training() -> None:
    """An admission that admits everything still cannot override the hard rule."""
    admits_all = PairAdmissionPolicy(PROFILES, SumRule(1e9), FixedModel())
    core, _ = core_with(admits_all, gpus=3)
    rng = np.random.default_rng(0)
    both_ran = False
    for i in range(30):
        kind = JobKind.ONLINE if rng.random() < 0.5 else JobKind.TRAINING
        name = (GOOD_A, GOOD_B)[i % 2]
        core.observe(Submitted(float(i), share(f"j{i}", name, kind, float(i))))
        core.cycle(float(i))
        on: dict[tuple[int, int], set[JobKind]] = {}
        for j, c in cards(core).items():
            on.setdefault(c, set()).add(core.state.jobs[j].kind)
        assert all(not (JobKind.ONLINE in k and JobKind.TRAINING in k) for k in on.values())
        kinds = set().union(*on.values()) if on else set()
        both_ran = both_ran or kinds == {JobKind.ONLINE, JobKind.TRAINING}
        running = sorted(core.state.placements)
        if running and rng.random() < 0.3:
            core.observe(Finished(float(i), running[int(rng.integers(len(running)))]))
    # the admission alone would have admitted the mixed pair: the hard rule refused it
    assert admits_all.problem(share("x", GOOD_A, JobKind.ONLINE), (share("y", GOOD_B),)) is None
    assert both_ran, "the check never had online and training work running at once"


def test_core_guard_falls_back_and_recovers_on_a_synthetic_drift() -> None:
    """Pairs are measured through Progress: fine, then (drift) every pair slowed, then
    fine again. The rule (a sum of at most 80%) admits the pairs measured, so the model is
    still judged on them while the rule decides. The core hands admission to the rule with
    a sentence in its decision log, and takes the model back once the pairs recover."""
    guard = ColocationGuard(ColocationGuardConfig(window_pairs=20, min_pairs=10))
    policy = PairAdmissionPolicy(PROFILES, SumRule(80.0), FixedModel(), guard=guard)
    core, _ = core_with(policy, gpus=1)
    t = 0.0
    states: list[bool] = []
    for phase, speed in (("fine", 0.97), ("drift", 0.6), ("fine again", 0.97)):
        for k in range(20):
            a, b = f"{phase}-{k}-a", f"{phase}-{k}-b"
            core.observe(Submitted(t, share(a, GOOD_A, t=t)))
            core.observe(Submitted(t, share(b, GOOD_B, t=t)))
            started = [c.job_id for c in core.cycle(t) if isinstance(c, Launch)]
            t += 1.0
            live = sorted(core.state.placements)
            core.observe(Progress(t, {j: JobProgress(1.0, 0.0, speed, 0.0, 1.0) for j in live}))
            for j in live:
                core.observe(Finished(t, j))
            t += 1.0
            states.append(guard.trusted)
            assert started  # something ran each round
        if phase == "drift":
            assert not guard.trusted
            # the rule decides now: 30% + 60% > 80%, so this pair no longer shares
            core.observe(Submitted(t, share("probe-a", GOOD_A, t=t)))
            core.observe(Submitted(t, share("probe-b", MID, t=t)))
            assert [c.job_id for c in core.cycle(t) if isinstance(c, Launch)] == ["probe-a"]
            core.observe(Finished(t + 0.5, "probe-a"))
            core.cycle(t + 1.0)
            core.observe(Finished(t + 1.5, "probe-b"))
            t += 2.0
    assert guard.trusted
    notes = [d.action for d in core.engine.log.decisions if d.job_id == "colocation"]
    assert len(notes) == 2
    assert notes[0].startswith("co-location model drifted, the utilisation rule decides")
    assert notes[1].startswith("co-location model recovered")
    assert states[:20] == [True] * 20 and not all(states[20:40])


def test_a_job_kept_apart_is_told_why() -> None:
    policy = PairAdmissionPolicy(PROFILES, SumRule(200.0), FixedModel(bad="Bad"))
    core, _ = core_with(policy, gpus=1)
    core.observe(Submitted(0.0, share("a", GOOD_A)))
    core.observe(Submitted(0.0, share("b", BAD)))
    waits = {c.job_id: c.reason for c in core.cycle(0.0) if isinstance(c, Wait)}
    assert sorted(core.state.placements) == ["a"]
    assert waits["b"].endswith(
        "the co-location admission keeps it off 1 with room: predicted speeds 0.50x and "
        f"0.50x next to {GOOD_A} (needs 0.85x)"
    )

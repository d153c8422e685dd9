"""The co-location admission's shadow mode (the rule decides while the model is judged on
measured pairs), the switch between shadow and active, and the promotion check."""

from __future__ import annotations

import pytest

from gpupool.domain.model import JobKind, JobSpec
from gpupool.errors import SpecError
from gpupool.learning.colocation import SumRule
from gpupool.learning.colocation_admission import (
    AdmissionMode,
    ColocationGuard,
    ColocationGuardConfig,
    MeasuredPair,
    PairAdmissionPolicy,
)
from gpupool.traces.lucid import SoloProfile


def profile(name: str, sm: float, bw: float) -> SoloProfile:
    return SoloProfile(name, "", 0, False, None, sm, bw, 2000.0, name=name)


PROFILES = {p.key: p for p in (profile("light", 30.0, 10.0), profile("heavy", 40.0, 90.0))}


class BandwidthModel:
    """Two bandwidth-heavy jobs run at 0.5x, anything else at 0.95x (a fixed predictor)."""

    def predict(self, a: SoloProfile, b: SoloProfile) -> tuple[float, float]:
        both = a.mem_bw_util_pct > 50 and b.mem_bw_util_pct > 50
        return (0.5, 0.5) if both else (0.95, 0.95)


def job(job_id: str, name: str) -> JobSpec:
    return JobSpec(job_id, gpu_milli=500, kind=JobKind.TRAINING, name=name)


def policy(mode: AdmissionMode, min_pairs: int = 10) -> PairAdmissionPolicy:
    guard = ColocationGuard(ColocationGuardConfig(window_pairs=20, min_pairs=min_pairs))
    # the rule's bound admits both pairs (30+30, 40+40): only the model can refuse one
    return PairAdmissionPolicy(PROFILES, SumRule(200.0), BandwidthModel(), 0.85, mode, guard)


def measured(k: int, first: str, second: str, speed: float) -> MeasuredPair:
    return MeasuredPair(job(f"a{k}", first), job(f"b{k}", second), speed, speed)


def test_shadow_decides_as_the_rule_while_the_model_is_judged() -> None:
    shadow = policy(AdmissionMode.SHADOW)
    heavy = (job("h1", "heavy"), (job("h2", "heavy"),))
    assert shadow.problem(*heavy) is None  # the model would refuse it; the rule admits
    assert shadow.status()["decides"] == "rule" and shadow.status()["mode"] == "shadow"
    # a pair the model admits counts (slowed or not); one it refuses says nothing of it
    shadow.observe(0.0, [measured(0, "light", "light", 0.6), measured(1, "heavy", "heavy", 0.4)])
    shadow.observe(1.0, [measured(0, "light", "light", 0.6)])  # the same pair counts once
    st = shadow.status()
    assert (st["pairs_judged"], st["window_pairs"], st["slowed_share"]) == (1, 1, 1.0)
    active = policy(AdmissionMode.LEARNED)
    why = active.problem(*heavy)
    assert why is not None and "predicted speeds 0.50x and 0.50x" in why
    assert active.status()["decides"] == "model" and active.status()["mode"] == "active"


def test_set_mode_switches_between_shadow_and_active() -> None:
    p = policy(AdmissionMode.SHADOW, min_pairs=1)
    heavy = (job("h1", "heavy"), (job("h2", "heavy"),))
    p.observe(0.0, [measured(0, "light", "light", 0.95)])
    assert p.problem(*heavy) is None
    p.set_mode(AdmissionMode.LEARNED)
    assert p.problem(*heavy) is not None and p.status()["decides"] == "model"
    p.set_mode(AdmissionMode.SHADOW)
    assert p.problem(*heavy) is None and p.status()["decides"] == "rule"
    rule = PairAdmissionPolicy(PROFILES, SumRule(200.0), mode=AdmissionMode.RULE)
    with pytest.raises(SpecError, match="only a learned co-location admission"):
        rule.set_mode(AdmissionMode.LEARNED)
    assert rule.promotion_problem() is not None and rule.status()["decider"] == "rule"


def test_promotion_is_refused_with_too_few_pairs_judged() -> None:
    p = policy(AdmissionMode.SHADOW, min_pairs=10)
    p.observe(0.0, [measured(k, "light", "light", 0.95) for k in range(3)])
    assert p.promotion_problem() == (
        "only 3 co-located pairs judged, the guard needs 10 measured pairs the model admits"
    )
    with pytest.raises(SpecError, match="promotion refused: only 3"):
        p.set_mode(AdmissionMode.LEARNED)
    assert p.mode is AdmissionMode.SHADOW
    p.set_mode(AdmissionMode.LEARNED, force=True)  # an operator may insist
    assert p.promotion_problem() == "the model is already active"


def test_promotion_is_refused_while_the_window_is_slowed_too_often() -> None:
    p = policy(AdmissionMode.SHADOW)
    slowed = [measured(k, "light", "light", 0.5 if k < 4 else 0.95) for k in range(20)]
    p.observe(0.0, slowed)
    why = p.promotion_problem()
    assert why is not None and "20% of the last 20 pairs" in why and "bound 15%" in why
    st = p.status()
    assert st["slowed_share"] == pytest.approx(0.2) and st["promotion_problem"] == why
    assert st["guard_changes"] == 1 and not st["trusted"] and "drifted" in str(st["last_change"])
    # the window slides past the slowed pairs (the same job ids again are new pairs)
    p.observe(1.0, [])
    p.observe(2.0, [measured(100 + k, "light", "light", 0.95) for k in range(20)])
    assert p.promotion_problem() is None and p.status()["trusted"]
    p.set_mode(AdmissionMode.LEARNED)
    assert p.status()["decides"] == "model"


def test_the_core_promotes_the_colocation_learner_on_its_record_only() -> None:
    """Through the core's one promotion interface (`Scheduler.learners`): refused with the
    guard's figures until enough measured pairs the model admits ran fast enough; then
    active, the model deciding (a LearnGuard for the event log), and back to shadow."""
    from gpupool.domain.model import Cluster, Node
    from gpupool.scheduler import Scheduler

    cluster = Cluster("c", (Node("n0", "A100-80GB", 2, 1_000_000, 1 << 30),))
    admission = policy(AdmissionMode.SHADOW)
    core = Scheduler(cluster, colocation=admission)
    learners = core.learners
    assert learners.mode("colocation") == "shadow"
    assert learners.promotion_problem("colocation") == (
        "only 0 co-located pairs judged, the guard needs 10 measured pairs the model admits"
    )
    admission.observe(0.0, [measured(k, "light", "light", 0.95) for k in range(10)])
    assert learners.promotion_problem("colocation") is None
    assert "0% were measured below 0.85x" in learners.evidence("colocation")["summary"]
    heavy = (job("h1", "heavy"), (job("h2", "heavy"),))
    assert admission.problem(*heavy) is None  # shadow: the rule admits
    change = learners.set_mode("colocation", "active", 5.0, "promoted by ops")
    assert (change.learner, change.state, change.text) == (
        "colocation",
        "promoted",
        "colocation promoted: promoted by ops",
    )
    assert learners.mode("colocation") == "active"
    assert admission.problem(*heavy) is not None  # the model refuses the heavy pair now
    learners.set_mode("colocation", "shadow", 6.0, "demoted by ops")
    assert admission.problem(*heavy) is None
    with pytest.raises(SpecError, match="must be active or shadow"):
        learners.set_mode("colocation", "rule", 7.0, "")
    without = Scheduler(cluster)
    assert without.learners.mode("colocation") == "off"
    with pytest.raises(SpecError, match="no learned co-location admission"):
        without.learners.promotion_problem("colocation")

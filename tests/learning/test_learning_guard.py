"""The guard: rules while the model is cold, the model while its predictions hold up,
the rules again when they drift, and back once the model recovers."""

from __future__ import annotations

import random

import pytest

from gpupool.errors import SpecError
from gpupool.learning.config import LearningConfig
from gpupool.learning.guard import DriftGuard, GuardConfig, GuardState
from gpupool.learning.judge import JudgedJob, OrderJudge
from gpupool.learning.learned import LearnedOrdering
from gpupool.learning.lightgbm_model import LightGbmPredictor, LightGbmSettings
from gpupool.learning.ordering import ServiceProfile
from learning_streams import TEAM_BASE_S, drive, stream

DAY = 86_400.0


def _feed(guard: DriftGuard, n: int, good: bool, rng: random.Random) -> None:
    """n judged predictions: within 1.5x of the truth, or unrelated to it."""
    for _ in range(n):
        actual = 10 ** rng.uniform(1, 5)
        pred = actual * rng.uniform(0.7, 1.5) if good else 10 ** rng.uniform(1, 5)
        guard.observe(pred, actual)


def test_cold_until_both_the_time_seen_and_the_finished_jobs_are_enough() -> None:
    cfg = GuardConfig(window_jobs=50, cold_start_s=14 * DAY, min_finished=200)
    guard = DriftGuard(cfg)
    _feed(guard, 50, True, random.Random(1))
    assert guard.update(1.0, 13.9 * DAY, 10_000, True) is None  # not seen long enough
    assert guard.update(2.0, 30 * DAY, 199, True) is None  # too few finished
    assert guard.update(3.0, 30 * DAY, 10_000, False) is None  # no model
    assert guard.state is GuardState.COLD
    change = guard.update(4.0, 14 * DAY, 200, True)
    assert change is not None and change.after is GuardState.TRUSTED
    assert change.reason.startswith("model trusted: ")
    back = guard.update(5.0, 15 * DAY, 300, False)  # the model is gone: cold again
    assert back is not None and back.after is GuardState.COLD


def test_a_model_not_yet_judged_on_enough_jobs_stays_cold() -> None:
    guard = DriftGuard(GuardConfig(window_jobs=100, cold_start_s=0.0, min_finished=50))
    _feed(guard, 29, True, random.Random(2))
    assert guard.update(1.0, DAY, 1_000, True) is None
    _feed(guard, 1, True, random.Random(3))
    change = guard.update(2.0, DAY, 1_000, True)
    assert change is not None and change.after is GuardState.TRUSTED


def test_falls_back_on_drift_with_a_sentence_and_recovers() -> None:
    cfg = GuardConfig(
        window_jobs=100, min_within_2x=0.3, min_rank_corr=0.2, cold_start_s=0.0, min_finished=0
    )
    guard = DriftGuard(cfg)
    rng = random.Random(4)
    _feed(guard, 100, True, rng)
    assert guard.update(1.0, DAY, 100, True) is not None
    assert guard.state is GuardState.TRUSTED
    _feed(guard, 40, False, rng)  # a few bad ones are absorbed by the window
    assert guard.update(2.0, DAY, 140, True) is None
    _feed(guard, 60, False, rng)
    change = guard.update(3.0, DAY, 200, True)
    assert change is not None and change.after is GuardState.FALLBACK
    assert change.reason.startswith("model drifted, rules decide: ")
    assert "predictions within 2x (needs 30%)" in change.reason
    assert "rank correlation" in change.reason
    _feed(guard, 100, True, rng)
    change = guard.update(4.0, DAY, 300, True)
    assert change is not None and change.after is GuardState.TRUSTED
    assert [c.after for c in guard.changes] == [
        GuardState.TRUSTED,
        GuardState.FALLBACK,
        GuardState.TRUSTED,
    ]


def test_recovery_needs_the_margin_so_the_guard_does_not_flap() -> None:
    cfg = GuardConfig(
        window_jobs=20,
        min_within_2x=0.5,
        min_rank_corr=-1.0,
        recover_margin=0.1,
        cold_start_s=0.0,
        min_finished=0,
    )
    guard = DriftGuard(cfg)

    def window(share_within: float) -> None:
        k = round(share_within * 20)
        for i in range(20):
            guard.observe(100.0 * (1.0 if i < k else 10.0), 100.0)

    window(0.55)  # passes the threshold, not the threshold plus margin
    change = guard.update(1.0, DAY, 20, True)
    assert change is not None and change.after is GuardState.FALLBACK
    assert change.reason.startswith("model not good enough yet: ")
    assert guard.update(2.0, DAY, 40, True) is None
    window(0.65)
    change = guard.update(3.0, DAY, 60, True)
    assert change is not None and change.after is GuardState.TRUSTED
    window(0.55)  # trusted stays trusted above the threshold
    assert guard.update(4.0, DAY, 80, True) is None
    window(0.45)
    change = guard.update(5.0, DAY, 100, True)
    assert change is not None and change.after is GuardState.FALLBACK


def test_guard_config_rejects_values_out_of_range() -> None:
    with pytest.raises(SpecError, match="window_jobs"):
        GuardConfig(window_jobs=5)
    with pytest.raises(SpecError, match="min_rank_corr"):
        GuardConfig(min_rank_corr=1.5)


@pytest.mark.parametrize("judge", ["order", "accuracy"])
def test_learned_ordering_falls_back_on_a_workload_change_and_recovers_after_it(
    judge: str,
) -> None:
    """Six teams with run times a decade apart; on day 8 the teams swap their workloads
    (the shortest team runs the longest jobs). The model trusted on the first regime
    drifts, the rules take over, and after the model has seen the new regime (retrained
    every two days, recent medians refreshed) it is trusted again."""
    guard = GuardConfig(
        window_jobs=100,
        cold_start_s=3 * DAY,
        min_finished=150,
        judge=judge,
        min_advantage=0.02,  # the mechanism, at bars a few hundred synthetic jobs can clear
        advantage_margin=0.03,
    )
    config = LearningConfig(mode="active", retrain_every_s=2 * DAY, guard=guard)
    settings = LightGbmSettings(min_rows=100, num_boost_round=25, retrain_every_s=2 * DAY)
    ordering = LearnedOrdering(config, LightGbmPredictor(settings))
    teams = sorted(TEAM_BASE_S, key=TEAM_BASE_S.__getitem__)
    swapped = dict(zip(teams, reversed([TEAM_BASE_S[t] for t in teams]), strict=True))
    before = stream(1_150, seed=7, gap_s=600.0)
    drift_s = before[-1].facts.submit_s
    after = stream(
        1_500,
        seed=8,
        gap_s=600.0,
        base=lambda team, _: swapped[team],
        start_s=drift_s,
        first_id=len(before),
    )
    changes = drive(ordering, before + after)
    first = before[0].facts.submit_s
    states = [(c.t_s, c.after) for c in changes]
    assert changes[0].after is GuardState.TRUSTED
    assert changes[0].t_s >= first + guard.cold_start_s
    assert changes[0].t_s < drift_s
    fallback = [c for c in changes if c.after is GuardState.FALLBACK]
    assert fallback and fallback[0].t_s > drift_s, states
    assert fallback[0].reason.startswith("model drifted, rules decide: ")
    recovered = [c for c in changes if c.after is GuardState.TRUSTED and c.t_s > fallback[0].t_s]
    assert recovered, states
    retrained = [i.trained_at_s for i in ordering.retrains]
    assert any(fallback[0].t_s <= t <= recovered[0].t_s for t in retrained)
    assert ordering.guard.state is GuardState.TRUSTED and ordering.uses_model
    assert (ordering.guard.judge is not None) == (judge == "order")


def _judged_job(i: int, g: float, model_good: bool) -> JudgedJob:
    """A job submitted every 10 s that stays 1,000 s (so it waited with the last 100): the
    rule ranks all alike (by arrival); the model shorter first, or longer first."""
    rule = ServiceProfile((g,), (1.0,))
    model = ServiceProfile((g,), ((1 / g) if model_good else g,))
    t = 10.0 * i
    return JudgedJob(t, t + 1_000.0, rule, (t, 0.0, str(i)), model, (0.0, t, str(i)))


def test_the_order_judge_falls_back_when_the_models_order_loses_and_recovers() -> None:
    cfg = GuardConfig(window_jobs=100, cold_start_s=0.0, min_finished=0, pairs_per_job=8)
    judge = OrderJudge(cfg.window_jobs, cfg.pairs_per_job)
    guard = DriftGuard(cfg, judge)
    rng = random.Random(9)
    i = 0

    def feed(n: int, good: bool) -> None:
        nonlocal i
        for _ in range(n):
            g = 10 ** rng.uniform(1, 5)
            judge.observe(_judged_job(i, g, good))
            guard.observe(g, g)  # the accuracy figures are perfect throughout
            i += 1

    feed(100, True)
    change = guard.update(1.0, DAY, 100, True)
    assert change is not None and change.after is GuardState.TRUSTED
    assert judge.advantage() > 0.1
    feed(60, False)
    change = guard.update(2.0, DAY, 160, True)
    assert change is not None and change.after is GuardState.FALLBACK
    assert change.reason.startswith("model drifted, rules decide: on ")
    assert "against the rule's in summed completion" in change.reason
    assert judge.advantage() < 0
    feed(100, True)  # a whole window of good pairs again
    change = guard.update(4.0, DAY, 260, True)
    assert change is not None and change.after is GuardState.TRUSTED


def test_the_order_judge_needs_the_margin_to_trust_again() -> None:
    cfg = GuardConfig(window_jobs=50, cold_start_s=0.0, min_finished=0, advantage_margin=0.5)
    judge = OrderJudge(cfg.window_jobs, cfg.pairs_per_job)
    guard = DriftGuard(cfg, judge)
    rng = random.Random(10)
    for i in range(50):
        g = 10 ** rng.uniform(1, 5)
        judge.observe(_judged_job(i, g, True))
        guard.observe(g, g)
    adv = judge.advantage()
    assert 0.0 < adv < 0.5
    change = guard.update(1.0, DAY, 50, True)  # good, not by the margin: not trusted
    assert change is not None and change.after is GuardState.FALLBACK
    assert change.reason.startswith("model not good enough yet: ")

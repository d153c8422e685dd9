"""The GPU-time predictor: features at submit that cannot see the future, a LightGBM
model that learns, retrains on schedule, is deterministic, and the wrong predictors."""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import numpy as np
import pytest

from gpupool.errors import SpecError
from gpupool.learning.baseline import RecentMedianPredictor
from gpupool.learning.config import LearningConfig
from gpupool.learning.factory import make_predictor
from gpupool.learning.faults import InvertedPredictor, ShuffledPredictor
from gpupool.learning.features import FEATURE_NAMES, UNKNOWN, FeatureIndex, Vocabulary
from gpupool.learning.guard import spearman
from gpupool.learning.history import History, JobFacts, Outcome
from gpupool.learning.learned import LearnedOrdering
from gpupool.learning.lightgbm_model import LightGbmPredictor, LightGbmSettings
from gpupool.learning.predictor import ModelInfo, Prediction
from learning_streams import Job, drive, full_history, lengthen_after, online, stream

SMALL = LightGbmSettings(min_rows=50, num_boost_round=30, retrain_every_s=86_400.0)
PROBES = (120, 260, 400, 560)


# ---- the predictor never sees a job's duration before it finishes --------------------
def _view(make: Callable[[], LightGbmPredictor], jobs: Sequence[Job], i: int):
    """Features and prediction of job i at its submit, by a model trained at that moment,
    from a History that holds the whole trace, future included."""
    history = full_history(jobs)
    predictor = make()
    facts = jobs[i].facts
    assert predictor.retrain(history, facts.submit_s) is not None
    return predictor.features(facts, history), predictor.predict(facts, history)


def leaks(make: Callable[[], LightGbmPredictor], jobs: Sequence[Job]) -> list[str]:
    """Probes whose features or prediction change when every job not finished by their
    submit (themselves included) is made longer: any such change is a leak."""
    found = []
    for i in PROBES:
        submit = jobs[i].facts.submit_s
        changed = lengthen_after(jobs, submit, seed=i)
        assert changed[i].duration_s != jobs[i].duration_s  # the job itself changed
        assert sum(a != b for a, b in zip(jobs, changed, strict=True)) > 1
        x0, p0 = _view(make, jobs, i)
        x1, p1 = _view(make, changed, i)
        same_x = np.array_equal(x0, x1, equal_nan=True)
        if not same_x or p0 != p1:
            found.append(f"job {i}: features equal {same_x}, prediction {p0} vs {p1}")
    return found


class _LeakyIndex(FeatureIndex):
    """Team median over every finished outcome the History holds, ended or not by submit."""

    def row(self, facts: JobFacts, history: History, vocab: Vocabulary) -> list[float]:
        row = super().row(facts, history, vocab)
        team = [math.log(o.gpu_time_s) for o in history.outcomes if o.facts.team == facts.team]
        row[FEATURE_NAMES.index("team_median_log")] = float(np.median(team[-20:]))
        return row


class _LeakyTraining(LightGbmPredictor):
    """Trains on every outcome in the History instead of those finished by now."""

    def retrain(self, history: History, now_s: float) -> ModelInfo | None:
        return super().retrain(history, math.inf)


def test_features_and_predictions_ignore_every_duration_not_finished_by_submit() -> None:
    jobs = stream(650, seed=3)
    assert leaks(lambda: LightGbmPredictor(SMALL), jobs) == []
    x, _ = _view(lambda: LightGbmPredictor(SMALL), jobs, PROBES[-1])
    assert not np.isnan(x).all()  # the probes do carry history features


def test_the_leak_check_catches_a_feature_that_looks_past_submit() -> None:
    jobs = stream(650, seed=3)

    def leaky() -> LightGbmPredictor:
        p = LightGbmPredictor(SMALL)
        p.index = _LeakyIndex(SMALL.features)
        return p

    assert len(leaks(leaky, jobs)) == len(PROBES)


def test_the_leak_check_catches_training_on_jobs_not_yet_finished() -> None:
    jobs = stream(650, seed=3)
    assert len(leaks(lambda: _LeakyTraining(SMALL), jobs)) == len(PROBES)


def test_features_online_equal_features_rebuilt_later_from_the_whole_trace() -> None:
    """Training rebuilds each job's features from a longer History: it sees what the job's
    prediction saw at submit, no more."""
    jobs = stream(400, seed=5)
    vocab = Vocabulary.from_facts(j.facts for j in jobs)
    index = FeatureIndex()
    at_submit: dict[str, list[float]] = {}
    online(jobs, lambda j, h: at_submit.__setitem__(j.facts.job_id, index.row(j.facts, h, vocab)))
    later = FeatureIndex().matrix([j.facts for j in jobs], full_history(jobs), vocab)
    now = np.asarray([at_submit[j.facts.job_id] for j in jobs])
    np.testing.assert_array_equal(now, later)


# ---- the features ----------------------------------------------------------------------
def test_features_read_clock_arrivals_and_recent_history() -> None:
    origin = 1_600_000_000.0
    h = History()
    first = JobFacts("a", 0.0, 2, "alice", "A100", "bert")
    h.submitted(first)
    h.submitted(JobFacts("b", 100.0, 1, "bob"))
    h.finished(Outcome(first, 500.0, math.e**4))
    h.submitted(JobFacts("c", 3_000.0, 2, "alice"))
    h.finished(Outcome(JobFacts("c", 3_000.0, 2, "alice"), 3_500.0, math.e**6))
    probe = JobFacts("d", 3_700.0, 8, "alice", "H100", "bert")
    h.submitted(probe)
    h.submitted(JobFacts("e", 9_000.0, 1, "bob"))  # after the probe: not an arrival it saw
    vocab = Vocabulary.from_facts([first, JobFacts("x", 0, 1, "bob")])
    row = dict(zip(FEATURE_NAMES, FeatureIndex(origin_s=origin).row(probe, h, vocab), strict=True))
    wall = datetime.fromtimestamp(origin + 3_700.0, UTC)
    assert row["hour_utc"] == pytest.approx(wall.hour + wall.minute / 60 + wall.second / 3600)
    assert row["weekday_utc"] == wall.weekday()
    assert row["gpu_count"] == 8 and row["log2_gpu_count"] == 3
    assert row["arrivals_1h"] == 2  # b at 100 s and c at 3000 s; a at 0 s is 3700 s back
    assert row["arrivals_24h"] == 3
    assert row["team"] == 1 and row["gpu_type"] == UNKNOWN and row["name"] == 1
    assert row["team_median_log"] == pytest.approx(5.0)
    assert row["team_last_log"] == pytest.approx(6.0)
    assert row["name_median_log"] == pytest.approx(4.0)
    assert math.isnan(row["gpus_median_log"])  # no 8-GPU job finished yet
    assert row["cluster_median_log"] == pytest.approx(5.0)


def test_vocabulary_codes_in_first_seen_order_with_rare_and_unseen_values_unknown() -> None:
    facts = [JobFacts(str(i), i, 1, team) for i, team in enumerate("bcbacbb")]
    vocab = Vocabulary.from_facts(facts, min_count=2)
    assert vocab.teams == {"b": 1, "c": 2}  # "a" seen once
    assert vocab.teams.get("zed", UNKNOWN) == UNKNOWN == 0


# ---- the model ---------------------------------------------------------------------------
def _online_predictions(
    predictor_: LightGbmPredictor | RecentMedianPredictor, jobs: Sequence[Job]
) -> list[tuple[Job, Prediction]]:
    made: list[tuple[Job, Prediction]] = []

    def at_submit(j: Job, h: History) -> None:
        if predictor_.retrain_due(h, j.facts.submit_s):
            predictor_.retrain(h, j.facts.submit_s)
        p = predictor_.predict(j.facts, h)
        if p is not None:
            made.append((j, p))

    online(jobs, at_submit)
    return made


def test_lightgbm_learns_gpu_time_with_ordered_quantiles() -> None:
    jobs = stream(1_200, seed=11)
    settings = LightGbmSettings(min_rows=100, num_boost_round=60, retrain_every_s=2 * 86_400.0)
    made = _online_predictions(LightGbmPredictor(settings), jobs)
    assert len(made) > 1_000
    assert all(p.q10_gpu_s <= p.q50_gpu_s <= p.q90_gpu_s for _, p in made)
    pred = np.asarray([p.q50_gpu_s for _, p in made])
    actual = np.asarray([j.gpu_time_s for j, _ in made])
    ratio = pred / actual
    assert np.mean((ratio >= 0.5) & (ratio <= 2.0)) > 0.6
    assert spearman(pred, actual) > 0.8
    inside = np.mean([p.q10_gpu_s <= j.gpu_time_s <= p.q90_gpu_s for j, p in made])
    assert 0.5 < inside < 0.95  # the 10-90 band holds most, not all


def test_retraining_follows_the_schedule_with_consecutive_versions() -> None:
    settings = LightGbmSettings(
        min_rows=50, max_rows=200, num_boost_round=20, retrain_every_s=86_400.0
    )
    predictor = LightGbmPredictor(settings)
    ordering = LearnedOrdering(LearningConfig(mode="shadow"), predictor)
    jobs = stream(900, seed=2)
    drive(ordering, jobs)
    infos = ordering.retrains
    assert [i.version for i in infos] == list(range(1, len(infos) + 1))
    assert len(infos) >= 4 and predictor.info == infos[-1]
    assert infos[0].rows >= 50
    history = full_history(jobs)
    assert history.finished_by(infos[0].trained_at_s - 3_600.0) < 50  # trained when due
    assert all(b.trained_at_s - a.trained_at_s >= 86_400.0 for a, b in itertools.pairwise(infos))
    assert all(b.trained_at_s - a.trained_at_s <= 90_000.0 for a, b in itertools.pairwise(infos))
    assert all(i.rows == min(200, history.finished_by(i.trained_at_s)) for i in infos)
    assert max(i.rows for i in infos) == 200  # capped at the most recent max_rows
    assert all(i.kind == "lightgbm" for i in infos)


def test_no_prediction_before_the_first_model() -> None:
    jobs = stream(200, seed=2)
    ordering = LearnedOrdering(LearningConfig(mode="shadow"), LightGbmPredictor(SMALL))
    seen = []
    for j in jobs[:30]:  # nothing has finished yet... or too little
        ordering.tick(j.facts.submit_s)
        seen.append(ordering.submitted(j.facts))
    assert seen == [None] * 30 and ordering.retrains == []


def test_too_few_finished_jobs_give_no_model() -> None:
    jobs = stream(100, seed=4)
    history = full_history(jobs)
    p = LightGbmPredictor(LightGbmSettings(min_rows=100))
    assert not p.retrain_due(history, jobs[50].facts.submit_s)
    assert p.retrain(history, jobs[50].facts.submit_s) is None
    assert p.info is None and p.predict(jobs[60].facts, history) is None


def test_same_history_gives_the_same_model_and_predictions_byte_for_byte() -> None:
    jobs = stream(500, seed=9)
    t = jobs[450].facts.submit_s
    runs = []
    for _ in range(2):
        history = full_history(jobs)
        p = LightGbmPredictor(SMALL)
        p.retrain(history, t)
        preds = [p.predict(j.facts, history) for j in jobs[450:]]
        packed = b"".join(
            struct.pack("<3d", q.q10_gpu_s, q.q50_gpu_s, q.q90_gpu_s) for q in preds if q
        )
        runs.append((packed, [b.model_to_string() for b in p._boosters]))
    assert runs[0] == runs[1] and len(runs[0][0]) == 50 * 24


# ---- the wrong predictors and the factory ---------------------------------------------
class _Fixed:
    """A stand-in model: the job's number as its prediction (a known, distinct value)."""

    info = None

    def retrain_due(self, history: History, now_s: float) -> bool:
        return False

    def retrain(self, history: History, now_s: float) -> None:
        return None

    def predict(self, facts: JobFacts, history: History) -> Prediction:
        k = float(facts.job_id[1:]) + 1.0
        return Prediction(k, 2 * k, 3 * k, 7)


def test_shuffled_gives_each_job_another_recent_jobs_prediction() -> None:
    h = History()
    shuffled = ShuffledPredictor(_Fixed(), seed=1, pool=50)
    picks = []
    for i in range(300):
        facts = JobFacts(f"j{i}", float(i), 1)
        p = shuffled.predict(facts, h)
        assert p is not None and p.version == 7
        picks.append(p.q10_gpu_s - 1)
    assert picks[0] == 0  # the first job has nobody to swap with
    others = np.asarray(picks[1:])
    own = np.arange(1, 300)
    assert np.all(others != own) and np.all(others >= own - 50) and np.all(others < own)
    again = ShuffledPredictor(_Fixed(), seed=1, pool=50)
    assert [again.predict(JobFacts(f"j{i}", float(i), 1), h) for i in range(300)][5].q10_gpu_s == (
        picks[5] + 1
    )


def test_inverted_mirrors_around_the_median_so_short_looks_long() -> None:
    h = History()
    for i, g in enumerate([10.0, 100.0, 1_000.0]):
        f = JobFacts(f"x{i}", 0.0, 1)
        h.submitted(f)
        h.finished(Outcome(f, 1.0 + i, g))
    inverted = InvertedPredictor(_Fixed())
    inner = _Fixed()
    pairs = []
    for i in range(20):
        f = JobFacts(f"j{i}", 5.0, 1)
        a, b = inner.predict(f, h), inverted.predict(f, h)
        assert b is not None
        assert a.q50_gpu_s * b.q50_gpu_s == pytest.approx(100.0**2)  # exp(2 log 100)
        assert b.q10_gpu_s <= b.q50_gpu_s <= b.q90_gpu_s
        pairs.append((a.q50_gpu_s, b.q50_gpu_s))
    arr = np.asarray(pairs)
    assert spearman(arr[:, 0], arr[:, 1]) == pytest.approx(-1.0)


def test_factory_makes_each_named_predictor_and_the_config_rejects_others() -> None:
    kinds = {
        "lightgbm": LightGbmPredictor,
        "recent-median": RecentMedianPredictor,
        "shuffled": ShuffledPredictor,
        "inverted": InvertedPredictor,
    }
    for name, kind in kinds.items():
        p = make_predictor(LearningConfig(predictor=name, retrain_every_s=3_600.0), 10.0)
        assert isinstance(p, kind) and p.info is None
    inner = make_predictor(LearningConfig(predictor="inverted", seed=4), 10.0)
    assert isinstance(inner, InvertedPredictor) and isinstance(inner.inner, LightGbmPredictor)
    assert inner.inner.settings.seed == 4 and inner.inner.index.origin_s == 10.0
    with pytest.raises(SpecError, match=r"learning\.predictor must be one of"):
        LearningConfig(predictor="oracle")


def test_rounds_are_chosen_on_the_newest_rows_so_noise_keeps_few() -> None:
    noise = stream(700, seed=13, base=lambda team, gpus: 1_000.0 / gpus)  # GPU-time: noise
    signal = stream(700, seed=13)
    t = noise[-1].facts.submit_s
    kept = {}
    for name, jobs, share in (("noise", noise, 0.2), ("signal", signal, 0.2), ("all", noise, 0.0)):
        p = LightGbmPredictor(
            LightGbmSettings(
                num_boost_round=150,
                validation_share=share,
                num_leaves=15,
                min_data_in_leaf=20,
                lambda_l2=0.0,
            )
        )
        p.retrain(full_history(jobs), t)
        kept[name] = p._boosters[1].num_trees()  # the median's model
    assert kept["all"] == 150
    assert kept["noise"] * 3 < kept["all"] and kept["noise"] * 2 < kept["signal"], kept


def test_history_counts_arrivals_before_a_moment_within_its_kept_window() -> None:
    h = History(keep_submits_s=1_000.0)
    for i in range(10_000):
        h.submitted(JobFacts(f"s{i}", float(i), 1))
    assert h.arrivals_between(9_000.0, 9_100.0) == 100  # 9000..9099: the end is excluded
    assert h.arrivals_between(9_100.0, 9_100.0) == 0
    assert h.arrivals_since(9_990.0) == 10
    assert h.arrivals_between(0.0, 20_000.0) == 1_001  # only the kept window: 8999..9999
    assert h.submits_seen == 10_000 and h.now_s == 9_999.0
    with pytest.raises(SpecError, match="in time order"):
        h.submitted(JobFacts("late", 5.0, 1))

"""Co-location that predicts its slowdown: each job's speed next to another on one GPU,
from the two jobs' solo profiles, against the utilisation-sum rule.

The predictor is a LightGBM regression of a job's speed (together over alone, capped at
1: values above it are measurement noise) on its own and its partner's solo SM
utilisation, memory-bandwidth utilisation and memory, and their sums; the speed may only
fall as the partner's (or the summed) SM and bandwidth use rise (monotone constraints),
which is what keeps it sane on pairs of models it never saw. One thread, deterministic,
seeded: the same rows give the same model. The opponent admits a pair when the two solo
SM utilisations sum to at most a threshold. Leave-one-model-pair-out (`lompo_folds`)
judges both on pairs of models absent from training.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from gpupool.errors import SpecError
from gpupool.traces.lucid import PairMeasurement, SoloProfile

FloatArray = npt.NDArray[np.float64]

FEATURE_NAMES = (
    "own_sm_util_pct",
    "own_mem_bw_util_pct",
    "own_mem_mib",
    "partner_sm_util_pct",
    "partner_mem_bw_util_pct",
    "partner_mem_mib",
    "sum_sm_util_pct",
    "sum_mem_bw_util_pct",
    "sum_mem_mib",
)
MONOTONE = (0, 0, 0, -1, -1, 0, -1, -1, 0)
"""A job is never faster for a busier partner (SM or bandwidth, alone or summed)."""

SLOW_SPEED = 0.85
"""A job below this speed next to its partner counts as slowed (issue 34)."""


def features(own: SoloProfile, partner: SoloProfile) -> list[float]:
    """One job's row next to a partner; the partner's row is the same call swapped."""
    return [
        own.sm_util_pct,
        own.mem_bw_util_pct,
        own.mem_mib,
        partner.sm_util_pct,
        partner.mem_bw_util_pct,
        partner.mem_mib,
        own.sm_util_pct + partner.sm_util_pct,
        own.mem_bw_util_pct + partner.mem_bw_util_pct,
        own.mem_mib + partner.mem_mib,
    ]


@dataclass(frozen=True)
class PredictorSettings:
    num_leaves: int = 15
    min_data_in_leaf: int = 20
    learning_rate: float = 0.05
    rounds: int = 200
    lambda_l2: float = 1.0
    seed: int = 0

    def params(self) -> dict[str, Any]:
        return {
            "objective": "regression",
            "num_leaves": self.num_leaves,
            "min_data_in_leaf": self.min_data_in_leaf,
            "learning_rate": self.learning_rate,
            "lambda_l2": self.lambda_l2,
            "monotone_constraints": list(MONOTONE),
            "monotone_constraints_method": "advanced",
            "num_threads": 1,
            "deterministic": True,
            "force_row_wise": True,
            "seed": self.seed,
            "verbose": -1,
        }


class PairSpeedModel(Protocol):
    def predict(self, a: SoloProfile, b: SoloProfile) -> tuple[float, float]:
        """The speeds of `a` and of `b` when they share one GPU."""
        ...


def training_rows(
    pairs: Iterable[PairMeasurement], profiles: Mapping[str, SoloProfile]
) -> tuple[FloatArray, FloatArray]:
    """Both orderings of every pair: (features, speed capped at 1)."""
    x: list[list[float]] = []
    y: list[float] = []
    for p in pairs:
        a, b = profiles[p.first], profiles[p.second]
        x += [features(a, b), features(b, a)]
        y += [min(p.first_speed, 1.0), min(p.second_speed, 1.0)]
    if not x:
        raise SpecError("no measured pairs to train the co-location predictor on")
    return np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)


class SpeedPredictor:
    """The learned model: LightGBM over `features`, trained on measured pairs."""

    def __init__(
        self,
        pairs: Sequence[PairMeasurement],
        profiles: Mapping[str, SoloProfile],
        settings: PredictorSettings | None = None,
    ) -> None:
        self.settings = settings or PredictorSettings()
        self.trained_on = tuple(pairs)
        x, y = training_rows(self.trained_on, profiles)
        import lightgbm as lgb  # lazily: a server without a learned admission never trains

        data = lgb.Dataset(x, y, feature_name=list(FEATURE_NAMES), free_raw_data=False)
        self.booster = lgb.train(self.settings.params(), data, num_boost_round=self.settings.rounds)
        self.cache: dict[tuple[str, str], tuple[float, float]] = {}

    def predict(self, a: SoloProfile, b: SoloProfile) -> tuple[float, float]:
        key = (a.key, b.key)
        found = self.cache.get(key)
        if found is None:
            out = self.booster.predict(np.asarray([features(a, b), features(b, a)]))
            found = self.cache[key] = (float(out[0]), float(out[1]))
        return found

    def predict_many(
        self, pairs: Sequence[PairMeasurement], profiles: Mapping[str, SoloProfile]
    ) -> FloatArray:
        """[pair, 2]: each pair's predicted (first, second) speed."""
        x, _ = training_rows(pairs, profiles)
        out: FloatArray = np.asarray(self.booster.predict(x), dtype=np.float64)
        return out.reshape(-1, 2)


@dataclass(frozen=True)
class SumRule:
    """The opponent: admit a pair when its solo SM utilisations sum to at most this."""

    max_sum_sm_pct: float

    def admits(self, a: SoloProfile, b: SoloProfile) -> bool:
        return a.sm_util_pct + b.sm_util_pct <= self.max_sum_sm_pct

    @staticmethod
    def calibrated(
        pairs: Sequence[PairMeasurement], profiles: Mapping[str, SoloProfile], admit_share: float
    ) -> SumRule:
        """The threshold that admits `admit_share` of these pairs."""
        if not 0.0 < admit_share <= 1.0:
            raise SpecError(f"admit_share must be in (0, 1], got {admit_share}")
        sums = np.sort(
            [profiles[p.first].sm_util_pct + profiles[p.second].sm_util_pct for p in pairs]
        )
        k = max(1, round(admit_share * len(sums)))
        return SumRule(float(sums[k - 1]))


@dataclass(frozen=True)
class Fold:
    held_out: tuple[str, str]
    """The unordered pair of models no training row may involve."""
    train: tuple[int, ...]
    test: tuple[int, ...]


def lompo_folds(pairs: Sequence[PairMeasurement]) -> list[Fold]:
    """Leave-one-model-pair-out: one fold per unordered pair of models, in sorted order."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, p in enumerate(pairs):
        groups.setdefault(p.models, []).append(i)
    everything = range(len(pairs))
    return [
        Fold(models, tuple(i for i in everything if pairs[i].models != models), tuple(test))
        for models, test in sorted(groups.items())
    ]


Trainer = Callable[[Sequence[PairMeasurement], Mapping[str, SoloProfile]], SpeedPredictor]


def lompo_predictions(
    pairs: Sequence[PairMeasurement],
    profiles: Mapping[str, SoloProfile],
    settings: PredictorSettings | None = None,
    trainer: Trainer | None = None,
) -> FloatArray:
    """[pair, 2]: each pair predicted by a model trained without its pair of models."""
    train: Trainer = trainer or (lambda rows, prof: SpeedPredictor(rows, prof, settings))
    out = np.full((len(pairs), 2), np.nan)
    for fold in lompo_folds(pairs):
        model = train([pairs[i] for i in fold.train], profiles)
        out[list(fold.test)] = model.predict_many([pairs[i] for i in fold.test], profiles)
    return out


class LompoModel:
    """For a simulation judged against the measurements: a pair is predicted by the model
    trained without its pair of models, so no prediction has seen its own answer."""

    def __init__(
        self,
        pairs: Sequence[PairMeasurement],
        profiles: Mapping[str, SoloProfile],
        settings: PredictorSettings | None = None,
    ) -> None:
        self.models: dict[tuple[str, str], SpeedPredictor] = {}
        self.everything = SpeedPredictor(pairs, profiles, settings)
        for fold in lompo_folds(pairs):
            rows = [pairs[i] for i in fold.train]
            self.models[fold.held_out] = SpeedPredictor(rows, profiles, settings)

    def predict(self, a: SoloProfile, b: SoloProfile) -> tuple[float, float]:
        models = (a.model, b.model) if a.model <= b.model else (b.model, a.model)
        return self.models.get(models, self.everything).predict(a, b)


@dataclass(frozen=True)
class AdmissionScore:
    """Pairs admitted and slowed, for a comparison at equal admission."""

    admitted_share: float
    slowed_share_of_admitted: float
    admitted: int
    slowed: int


def score_admission(admitted: npt.NDArray[np.bool_], min_speed: FloatArray) -> AdmissionScore:
    slowed = admitted & (min_speed < SLOW_SPEED)
    n = int(admitted.sum())
    return AdmissionScore(
        admitted_share=n / max(1, admitted.size),
        slowed_share_of_admitted=int(slowed.sum()) / max(1, n),
        admitted=n,
        slowed=int(slowed.sum()),
    )


def admit_top(score: FloatArray, share: float) -> npt.NDArray[np.bool_]:
    """Admit the `share` of pairs with the highest score (ties by index, so exactly that
    many): the comparison at the opponent's admission rate."""
    k = round(share * score.size)
    order = np.lexsort((np.arange(score.size), -score))
    out = np.zeros(score.size, dtype=np.bool_)
    out[order[:k]] = True
    return out

"""A LightGBM predictor of GPU-time: three quantile regressions of log GPU-seconds.

Trained on the outcomes that finished by the moment of training (at most the most recent
`max_rows`), each with its features as of its own submit (`features.FeatureIndex`), so
neither training nor prediction sees a duration before the job ended. Retrained on a
schedule (weekly by default), versioned; no model before `min_rows` finished jobs.
The label is log GPU-time relative to the job's baseline (the most specific recent median
it has), and the number of boosting rounds is chosen on the newest training rows, so the
trees add only the corrections that carried over to newer jobs. Deterministic: one
thread, a fixed seed, row-wise histograms, LightGBM's deterministic mode, so the same
history gives the same model and the same predictions byte for byte.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import lightgbm

from gpupool.errors import SpecError
from gpupool.learning.config import LearningConfig
from gpupool.learning.features import (
    CATEGORICAL_COLUMNS,
    FEATURE_NAMES,
    FeatureConfig,
    FeatureIndex,
    Vocabulary,
    baseline_log,
    log_gpu_s,
)
from gpupool.learning.history import History, JobFacts
from gpupool.learning.predictor import ModelInfo, Prediction

ALPHAS = (0.1, 0.5, 0.9)


@dataclass(frozen=True)
class LightGbmSettings:
    retrain_every_s: float = 7 * 86_400.0
    min_rows: int = 100
    """Finished jobs needed before a first model."""
    max_rows: int = 20_000
    """Training rows: the most recent finished jobs."""
    num_boost_round: int = 150
    learning_rate: float = 0.05
    num_leaves: int = 7
    min_data_in_leaf: int = 100
    lambda_l2: float = 10.0
    seed: int = 0
    validation_share: float = 0.2
    """The newest share of the training rows the number of rounds is chosen on (0: always
    `num_boost_round`)."""
    early_stopping_rounds: int = 20
    relative: bool = True
    """Learn log GPU-time relative to the job's baseline (`features.baseline_log`: the
    recent median of jobs alike), so a level shift between retrains is tracked by the
    baseline and the trees learn the corrections; False: learn the level itself."""
    features: FeatureConfig = field(default_factory=FeatureConfig)

    def __post_init__(self) -> None:
        if self.retrain_every_s <= 0:
            raise SpecError(f"retrain_every_s must be > 0, got {self.retrain_every_s}")
        if self.min_rows < 2 or self.max_rows < self.min_rows:
            raise SpecError(
                f"min_rows must be at least 2 and max_rows at least min_rows, got "
                f"{self.min_rows} and {self.max_rows}"
            )
        if self.lambda_l2 < 0:
            raise SpecError(f"lambda_l2 must be >= 0, got {self.lambda_l2}")
        if not 0.0 <= self.validation_share < 1.0:
            raise SpecError(f"validation_share must be in [0, 1), got {self.validation_share}")
        if self.num_boost_round < 1 or self.num_leaves < 2 or self.min_data_in_leaf < 1:
            raise SpecError("num_boost_round, num_leaves and min_data_in_leaf must be positive")


class LightGbmPredictor:
    def __init__(self, settings: LightGbmSettings | None = None, origin_s: float = 0.0) -> None:
        self.settings = settings or LightGbmSettings()
        self.index = FeatureIndex(self.settings.features, origin_s)
        self._info: ModelInfo | None = None
        self._vocab = Vocabulary()
        self._boosters: tuple[lightgbm.Booster, ...] = ()
        self._fallback_log = 0.0

    def _baseline(self, x: np.ndarray) -> np.ndarray:
        if not self.settings.relative:
            return np.zeros(x.shape[0])
        base = baseline_log(x)
        return np.where(np.isnan(base), self._fallback_log, base)

    @property
    def info(self) -> ModelInfo | None:
        return self._info

    def retrain_due(self, history: History, now_s: float) -> bool:
        if self._info is None:
            return history.finished_by(now_s) >= self.settings.min_rows
        return now_s >= self._info.trained_at_s + self.settings.retrain_every_s

    def _params(self, alpha: float) -> dict[str, object]:
        s = self.settings
        return {
            "objective": "quantile",
            "alpha": alpha,
            "learning_rate": s.learning_rate,
            "num_leaves": s.num_leaves,
            "min_data_in_leaf": s.min_data_in_leaf,
            "lambda_l2": s.lambda_l2,
            "seed": s.seed,
            "deterministic": True,
            "force_row_wise": True,
            "num_threads": 1,
            "verbosity": -1,
        }

    def _dataset(self, x: np.ndarray, y: np.ndarray) -> lightgbm.Dataset:
        import lightgbm  # lazily: most processes that import the learned policy never train

        return lightgbm.Dataset(
            x,
            label=y,
            feature_name=list(FEATURE_NAMES),
            categorical_feature=list(CATEGORICAL_COLUMNS),
            params={"verbosity": -1, "seed": self.settings.seed, "deterministic": True},
            free_raw_data=True,
        )

    def _fit(self, alpha: float, x: np.ndarray, y: np.ndarray) -> lightgbm.Booster:
        """Rounds chosen on the most recent `validation_share` of the rows (trained on the
        older ones), then a model of that many rounds on all rows: where the features do
        not carry over to newer jobs, few rounds are kept and the baseline decides."""
        import lightgbm

        s = self.settings
        params = self._params(alpha)
        rounds = s.num_boost_round
        cut = int(len(y) * (1.0 - s.validation_share))
        if s.validation_share > 0 and len(y) - cut >= 20 and cut >= 40:
            train = self._dataset(x[:cut], y[:cut])
            valid = lightgbm.Dataset(x[cut:], label=y[cut:], reference=train)
            probe = lightgbm.train(
                params,
                train,
                num_boost_round=s.num_boost_round,
                valid_sets=[valid],
                callbacks=[lightgbm.early_stopping(s.early_stopping_rounds, verbose=False)],
            )
            rounds = max(1, probe.best_iteration)
        return lightgbm.train(params, self._dataset(x, y), num_boost_round=rounds)

    def retrain(self, history: History, now_s: float) -> ModelInfo | None:
        s = self.settings
        known = history.finished_by(now_s)
        if known < s.min_rows:
            return None
        rows = history.outcomes[max(0, known - s.max_rows) : known]
        facts = [o.facts for o in rows]
        vocab = Vocabulary.from_facts(facts, s.features.min_category_count)
        x = self.index.matrix(facts, history, vocab)
        y = np.asarray([log_gpu_s(o.gpu_time_s) for o in rows], dtype=np.float64)
        self._fallback_log = float(np.median(y))
        if s.relative:
            y = y - self._baseline(x)
        boosters = [self._fit(alpha, x, y) for alpha in ALPHAS]
        self._boosters = tuple(boosters)
        self._vocab = vocab
        version = 1 if self._info is None else self._info.version + 1
        self._info = ModelInfo(version, now_s, len(rows), "lightgbm")
        return self._info

    def features(self, facts: JobFacts, history: History) -> np.ndarray:
        """The row the model is shown for `facts` (as of its submit)."""
        return np.asarray([self.index.row(facts, history, self._vocab)], dtype=np.float64)

    def predict(self, facts: JobFacts, history: History) -> Prediction | None:
        if self._info is None:
            return None
        x = self.features(facts, history)
        base = float(self._baseline(x)[0])
        logs = sorted(
            base + float(np.asarray(b.predict(x, num_threads=1))[0]) for b in self._boosters
        )
        q10, q50, q90 = (math.exp(v) for v in logs)  # sorted: quantiles never cross
        return Prediction(q10, q50, q90, self._info.version)


def make_lightgbm(config: LearningConfig, origin_s: float = 0.0) -> LightGbmPredictor:
    """The LightGBM predictor a learning configuration asks for (its schedule and seed)."""
    return LightGbmPredictor(
        LightGbmSettings(retrain_every_s=config.retrain_every_s, seed=config.seed), origin_s
    )

"""The predictor a learning configuration names.

"lightgbm" (the default): quantile LightGBM on features at submit
(`lightgbm_model.LightGbmPredictor`). "recent-median": quantiles of recent finished jobs
that look alike (`baseline.RecentMedianPredictor`), the yardstick. "shuffled" and
"inverted" are fault injection for testing the guard, never for a real cluster: the
LightGBM model with its predictions handed to other jobs, or mirrored so short looks long
(`faults`).
"""

from __future__ import annotations

from gpupool.errors import SpecError
from gpupool.learning.baseline import RecentMedianPredictor
from gpupool.learning.config import PREDICTORS, LearningConfig
from gpupool.learning.faults import InvertedPredictor, ShuffledPredictor
from gpupool.learning.predictor import Predictor


def make_predictor(config: LearningConfig, origin_s: float = 0.0) -> Predictor:
    """A fresh, untrained predictor of the kind `config.predictor` names; `origin_s` is the
    UTC epoch second that time 0 of the driver's clock stands for (hour and weekday)."""
    name = config.predictor
    if name == "recent-median":
        return RecentMedianPredictor(retrain_every_s=config.retrain_every_s)
    if name not in PREDICTORS:
        raise SpecError(f"learning.predictor must be one of {', '.join(PREDICTORS)}, got {name!r}")
    # LightGBM (and SciPy under it) is imported only when a model is made: 0.3 s that the
    # rules, the simulator's other queues and the CLI never pay
    from gpupool.learning.lightgbm_model import make_lightgbm

    if name == "lightgbm":
        return make_lightgbm(config, origin_s)
    if name == "shuffled":
        return ShuffledPredictor(make_lightgbm(config, origin_s), seed=config.seed)
    return InvertedPredictor(make_lightgbm(config, origin_s))

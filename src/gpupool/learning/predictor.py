"""The shape every GPU-time predictor has: quantiles of a job's GPU-seconds, versioned."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gpupool.learning.history import History, JobFacts


@dataclass(frozen=True)
class Prediction:
    """Quantiles of a job's GPU-time to completion (GPU-seconds), from model `version`."""

    q10_gpu_s: float
    q50_gpu_s: float
    q90_gpu_s: float
    version: int

    def spread(self) -> float:
        """q90 / q10: how unsure the model is (1 is certain)."""
        return self.q90_gpu_s / max(self.q10_gpu_s, 1e-9)

    def confident(self, max_spread: float) -> bool:
        return self.spread() <= max_spread


@dataclass(frozen=True)
class ModelInfo:
    """What `gpupool learn status` shows of the model in use."""

    version: int
    trained_at_s: float
    rows: int
    kind: str


class Predictor(Protocol):
    """Learns from a History only; `predict` uses what the History held at submit."""

    @property
    def info(self) -> ModelInfo | None:
        """None until the first model is trained."""
        ...

    def retrain_due(self, history: History, now_s: float) -> bool:
        """Whether the schedule asks for a new model now (cheap; called every cycle)."""
        ...

    def retrain(self, history: History, now_s: float) -> ModelInfo | None:
        """Train on the outcomes finished by now_s; None when there are too few."""
        ...

    def predict(self, facts: JobFacts, history: History) -> Prediction | None:
        """At the job's submit, with `history` as it stands then; None without a model."""
        ...


class WrappedPredictor:
    """A predictor that changes another's predictions but trains and versions as it does
    (the deliberately wrong ones, a recorder): `info`, `retrain_due` and `retrain` are the
    inner predictor's; a subclass writes `predict`."""

    def __init__(self, inner: Predictor) -> None:
        self.inner = inner

    @property
    def info(self) -> ModelInfo | None:
        return self.inner.info

    def retrain_due(self, history: History, now_s: float) -> bool:
        return self.inner.retrain_due(history, now_s)

    def retrain(self, history: History, now_s: float) -> ModelInfo | None:
        return self.inner.retrain(history, now_s)

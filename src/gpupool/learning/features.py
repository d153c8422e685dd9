"""Features of a job at its submit: what the job says about itself and what the cluster
had seen by then.

Every number here is computed from the job's `JobFacts` and from the outcomes that had
finished by the job's submit (`finish_s <= submit_s`), whatever else the History holds:
a job's own duration, and the duration of any job still running at its submit, never
reach its features. The same function serves training (each training job's features as of
its own submit) and prediction, so the model is trained on what it will be shown.

Columns (`FEATURE_NAMES`): GPU count and its log2; GPU type, team and name as categorical
codes (a `Vocabulary` frozen with the model, unknown values get code 0); hour of day and
weekday (UTC, from `origin_s + submit_s`); arrivals in the hour and the day before; the median
and mean of log GPU-time over the team's last `recent` finished jobs, and its last one;
the same-name median and last; the same-GPU-count median; the cluster's median over its
last `cluster_recent`. Missing values (no such job yet) are NaN, which LightGBM routes on
its own.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpupool.errors import SpecError
from gpupool.learning.history import History, JobFacts

FEATURE_NAMES: tuple[str, ...] = (
    "gpu_count",
    "log2_gpu_count",
    "gpu_type",
    "team",
    "name",
    "hour_utc",
    "weekday_utc",
    "arrivals_1h",
    "arrivals_24h",
    "team_median_log",
    "team_mean_log",
    "team_last_log",
    "name_median_log",
    "name_last_log",
    "gpus_median_log",
    "cluster_median_log",
)
CATEGORICAL: tuple[str, ...] = ("gpu_type", "team", "name")
CATEGORICAL_COLUMNS: tuple[int, ...] = tuple(FEATURE_NAMES.index(c) for c in CATEGORICAL)

UNKNOWN = 0
"""The code of a value the vocabulary does not hold (unseen or too rare when trained)."""


def log_gpu_s(gpu_time_s: float) -> float:
    """The scale every model works in: natural log of GPU-seconds, floored at 1 s."""
    return math.log(max(gpu_time_s, 1.0))


@dataclass(frozen=True)
class FeatureConfig:
    recent: int = 20
    """Finished jobs per team, name or GPU count the recent statistics are taken over."""
    cluster_recent: int = 100
    """Finished jobs the cluster's recent median is taken over."""
    min_category_count: int = 2
    """A team, name or GPU type seen fewer times in the training rows is coded unknown, so
    the model learns what an unknown value looks like."""

    def __post_init__(self) -> None:
        if self.recent < 1 or self.cluster_recent < 1:
            raise SpecError("feature recent and cluster_recent must be at least 1")
        if self.min_category_count < 1:
            raise SpecError("feature min_category_count must be at least 1")


@dataclass(frozen=True)
class Vocabulary:
    """Codes of the categorical values, in first-seen order of the training rows (1, 2, ...)."""

    gpu_types: dict[str, int] = field(default_factory=dict)
    teams: dict[str, int] = field(default_factory=dict)
    names: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def from_facts(facts: Iterable[JobFacts], min_count: int = 1) -> Vocabulary:
        rows = list(facts)
        return Vocabulary(
            _codes((f.gpu_type for f in rows), min_count),
            _codes((f.team for f in rows), min_count),
            _codes((f.name for f in rows), min_count),
        )


def _codes(values: Iterable[str], min_count: int) -> dict[str, int]:
    counts: dict[str, int] = {}
    for v in values:  # dicts keep insertion order: first seen first
        counts[v] = counts.get(v, 0) + 1
    codes: dict[str, int] = {}
    for v, n in counts.items():
        if n >= min_count and v:
            codes[v] = len(codes) + 1
    return codes


class _Series:
    """Finish times and log GPU-times of one group's outcomes, in finish order."""

    __slots__ = ("finish_s", "log_gpu")

    def __init__(self) -> None:
        self.finish_s: list[float] = []
        self.log_gpu: list[float] = []

    def before(self, t_s: float, k: int) -> list[float]:
        """The last k values of outcomes finished at or before t_s."""
        j = bisect.bisect_right(self.finish_s, t_s)
        return self.log_gpu[max(0, j - k) : j]


class FeatureIndex:
    """Per-team, per-name and per-GPU-count series of finished jobs, kept in step with one
    History (append-only), so one job's features cost a few bisections."""

    def __init__(self, config: FeatureConfig | None = None, origin_s: float = 0.0) -> None:
        self.config = config or FeatureConfig()
        self.origin_s = origin_s
        self._history: History | None = None
        self._synced = 0
        self._series: dict[Hashable, _Series] = {}
        self._all = _Series()

    def sync(self, history: History) -> None:
        """Take in the outcomes appended to `history` since the last call."""
        if self._history is not history or self._synced > len(history.outcomes):
            self._history = history
            self._synced = 0
            self._series = {}
            self._all = _Series()
        for o in history.outcomes[self._synced :]:
            value = log_gpu_s(o.gpu_time_s)
            keys: list[Hashable] = [("team", o.facts.team), ("gpus", o.facts.gpu_count)]
            if o.facts.name:
                keys.append(("name", o.facts.name))
            for key in keys:
                series = self._series.get(key)
                if series is None:
                    series = self._series[key] = _Series()
                series.finish_s.append(o.finish_s)
                series.log_gpu.append(value)
            self._all.finish_s.append(o.finish_s)
            self._all.log_gpu.append(value)
        self._synced = len(history.outcomes)

    def _recent(self, key: Hashable, t_s: float) -> list[float]:
        series = self._series.get(key)
        return [] if series is None else series.before(t_s, self.config.recent)

    def row(self, facts: JobFacts, history: History, vocab: Vocabulary) -> list[float]:
        """The features of `facts` as of its submit, from `history` (synced here)."""
        self.sync(history)
        t = facts.submit_s
        known = history.finished_by(t)  # the explicit guard: nothing that ended later
        cluster = self._all.log_gpu[max(0, known - self.config.cluster_recent) : known]
        team = self._recent(("team", facts.team), t)
        name = self._recent(("name", facts.name), t) if facts.name else []
        gpus = self._recent(("gpus", facts.gpu_count), t)
        wall = self.origin_s + t
        return [
            float(facts.gpu_count),
            math.log2(max(facts.gpu_count, 1)),
            float(vocab.gpu_types.get(facts.gpu_type, UNKNOWN)),
            float(vocab.teams.get(facts.team, UNKNOWN)),
            float(vocab.names.get(facts.name, UNKNOWN)),
            (wall % 86_400.0) / 3_600.0,
            float((math.floor(wall / 86_400.0) + 3) % 7),  # 1970-01-01 was a Thursday
            float(history.arrivals_between(t - 3_600.0, t)),
            float(history.arrivals_between(t - 86_400.0, t)),
            _median(team),
            _mean(team),
            team[-1] if team else math.nan,
            _median(name),
            name[-1] if name else math.nan,
            _median(gpus),
            _median(cluster),
        ]

    def matrix(self, facts: Sequence[JobFacts], history: History, vocab: Vocabulary) -> np.ndarray:
        """One row per job, each as of that job's own submit."""
        out = np.empty((len(facts), len(FEATURE_NAMES)), dtype=np.float64)
        for i, f in enumerate(facts):
            out[i] = self.row(f, history, vocab)
        return out


def _median(values: list[float]) -> float:
    n = len(values)
    if n == 0:
        return math.nan
    s = sorted(values)
    mid = n // 2
    return s[mid] if n % 2 else 0.5 * (s[mid - 1] + s[mid])


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan


BASELINE_ORDER: tuple[str, ...] = (
    "name_median_log",
    "gpus_median_log",
    "team_median_log",
    "cluster_median_log",
)
"""Where a job's baseline comes from: the most specific recent median it has."""
_BASELINE_COLUMNS = tuple(FEATURE_NAMES.index(c) for c in BASELINE_ORDER)


def baseline_log(x: np.ndarray) -> np.ndarray:
    """Per row of a feature matrix: the first of `BASELINE_ORDER` that is known, else NaN."""
    out = np.full(x.shape[0], np.nan)
    for col in reversed(_BASELINE_COLUMNS):
        v = x[:, col]
        out = np.where(np.isnan(v), out, v)
    return out

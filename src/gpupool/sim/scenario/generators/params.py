"""Generator parameters: every generator's table of defaults, and the one checked access
to them, so that a bad value reads alike whichever generator it is given to."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpupool.domain.model import MILLI_PER_GPU
from gpupool.errors import SpecError
from gpupool.sim.scenario.workload import Workload

HOUR_S = 3600.0
DAY_S = 86_400.0


@dataclass(frozen=True)
class GenContext:
    """What generators may know about the scenario besides their own entry."""

    horizon_s: float
    traces_dir: Path | None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.horizon_s) and self.horizon_s >= 0):
            raise SpecError(
                f"scenario horizon must be a finite number >= 0 s, got {self.horizon_s}"
            )


WorkloadGenerator = Callable[[Mapping[str, object], np.random.Generator, GenContext], Workload]


class _Required:
    def __repr__(self) -> str:
        return "required"


REQUIRED: object = _Required()
"""Default marking a parameter the entry must give."""

_COMMON: dict[str, object] = {"team": REQUIRED, "name": None, "priority": 0}
_GPU_MIX: dict[str, object] = {
    "gpu_choices": [1, 2, 4, 8, 16, 32],
    "gpu_weights": [0.45, 0.15, 0.15, 0.15, 0.06, 0.04],
}
_PER_GPU: dict[str, object] = {"cpu_milli_per_gpu": 8000, "mem_mib_per_gpu": 65_536}
_SERVICE: dict[str, object] = {
    "team": REQUIRED,
    "name": None,
    # A service is latency-critical: ranking it below batch work by default would be a trap.
    "priority": 100,
    "replica_rps": 20.0,
    "slo_p99_ms": 200.0,
    "base_p99_ms": 120.0,
    "replica_gpu_milli": MILLI_PER_GPU,
    "min_replicas": 1,
    "max_replicas": 10_000,
    "gpu_models": [],
    "user_region": None,
    "latency_bound_ms": None,
}
_PLACEMENT: dict[str, object] = {
    # deadline = submit + work x a factor drawn uniformly from deadline_slack ([] : none)
    "deadline_slack": [],
    "min_deadline_h": 0.0,
    # where the input lives: data locations drawn by weight, sizes log-uniform in GB
    "datasets": [],
    "dataset_weights": [],
    "dataset_gb_min": 0.0,
    "dataset_gb_max": 0.0,
    "gpu_models": [],
    # a gang runs inside one domain of this topology level (required) or tries to (preferred)
    "topology": None,
    "topology_preferred": None,
}

PARAMETERS: dict[str, dict[str, object]] = {
    "finetune": {
        **_COMMON,
        "gpus": 64,
        "start_h": 0.0,
        "work_h": 336.0,
        "state_gib_per_gpu": 17.5,
        "checkpoint_interval_s": 3600.0,
        **_PER_GPU,
        "count": 1,
        "gap_h": 0.0,
    },
    "diurnal-service": {
        **_SERVICE,
        "base_rps": 20.0,
        "peak_rps": 1200.0,
        "peak_start_h": 10.0,
        "peak_hours": 4.0,
        "ramp_min": 20.0,
    },
    "azure-service": {
        **_SERVICE,
        "file": "both",
        "peak_hour": 14.0,
        "day_rps": 1000.0,
        "night_rps": 150.0,
    },
    "mixed": {
        **_COMMON,
        "jobs_per_day": 40.0,
        "day_factor": 1.5,
        "night_factor": 0.5,
        "start_h": 0.0,
        "end_h": None,
        **_GPU_MIX,
        "duration_scale": 1.0,
        "min_work_h": 0.1,
        "max_work_h": 72.0,
        "offline_share": 0.3,
        "max_offline_work_h": 6.0,
        "state_gib_min": 2.0,
        "state_gib_max": 20.0,
        "checkpoint_interval_s": 1800.0,
        **_PER_GPU,
    },
    "backlog": {
        **_COMMON,
        "count": 100,
        "submit_h": 0.0,
        "spread_h": 0.0,
        **_GPU_MIX,
        "work_h_min": 2.0,
        "work_h_max": 24.0,
        "state_gib_per_gpu": 8.0,
        "checkpoint_interval_s": 1800.0,
        "kind": "training",
        "elastic_min_frac": None,
        **_PER_GPU,
        **_PLACEMENT,
    },
    "model-jobs": {
        **_COMMON,
        "count": 100,
        "submit_h": 0.0,
        "spread_h": 0.0,
        "model": REQUIRED,
        "task": "inference",
        "precision": "bf16",
        "context": 4096,
        "seq_len": 4096,
        "batch": 8,
        "grad_accum": 1,
        "tokens_min": REQUIRED,
        "tokens_max": REQUIRED,
        "deadline_h": [],
        "state_gib_per_gpu": 8.0,
        "checkpoint_interval_s": 1800.0,
    },
    "job": {
        **_COMMON,
        "gpus": 1,
        "gpus_min": None,
        "submit_h": 0.0,
        "work_min": REQUIRED,
        "kind": "training",
        "deadline_h": None,
        "dataset": None,
        "dataset_gb": 0.0,
        "gpu_models": [],
        "state_gib_per_gpu": 8.0,
        "checkpoint_interval_s": 1800.0,
        **_PER_GPU,
    },
    "itp": {
        "cluster": REQUIRED,
        "name": None,
        "team": None,
        "teams": ["t1", "t2", "t3", "t4"],
        "priority": None,
        "priorities": [0, 1, 2],
        "priority_weights": [0.6, 0.3, 0.1],
        "start_day": 0.0,
        "days": 7.0,
        "online_share": 0.1,
        "online_priority": 100,
        "state_gib_per_gpu": 8.0,
        "checkpoint_interval_s": 1800.0,
        **_PER_GPU,
    },
}
"""Every generator's parameters and defaults (REQUIRED: must be given; None: derived)."""


class Params:
    """An entry's parameters, checked against the generator's table; defaults go through the
    same checks as given values."""

    def __init__(self, raw: Mapping[str, object], generator: str) -> None:
        if not isinstance(raw, Mapping):
            raise SpecError(f"generator {generator!r}: parameters must be a mapping")
        self.generator = generator
        self.table = PARAMETERS[generator]
        self.raw = raw
        bad = sorted(str(k) for k in raw if k not in self.table and k != "generator")
        if bad:
            raise SpecError(
                f"generator {generator!r}: unknown parameter(s) {', '.join(bad)}; "
                f"allowed: {', '.join(self.table)}"
            )

    def given(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def _value(self, key: str) -> object:
        value = self.raw.get(key)
        if value is None:
            value = self.table[key]
        if value is REQUIRED:
            raise SpecError(f"generator {self.generator!r}: missing required parameter {key!r}")
        return value

    def _fail(self, key: str, value: object, want: str) -> SpecError:
        return SpecError(f"generator {self.generator!r}: {key} must be {want}, got {value!r}")

    def _to_float(self, key: str, value: object, want: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._fail(key, value, want)
        x = float(value)
        if not math.isfinite(x):
            raise self._fail(key, value, want)
        return x

    def num(self, key: str, lo: float | None = None, hi: float | None = None) -> float:
        """A finite number in [lo, hi]."""
        want = _range_text("a number", lo, hi)
        x = self._to_float(key, self._value(key), want)
        if (lo is not None and x < lo) or (hi is not None and x > hi):
            raise self._fail(key, x, want)
        return x

    def pos(self, key: str) -> float:
        """A finite number > 0."""
        x = self._to_float(key, self._value(key), "a number > 0")
        if x <= 0:
            raise self._fail(key, x, "a number > 0")
        return x

    def int_(self, key: str, lo: int | None = None, hi: int | None = None) -> int:
        value = self._value(key)
        want = _range_text("a whole number", lo, hi)
        x = self._to_float(key, value, want)
        if not x.is_integer() or (lo is not None and x < lo) or (hi is not None and x > hi):
            raise self._fail(key, value, want)
        return int(x)

    def text(self, key: str, choices: Sequence[str] | None = None) -> str:
        value = self._value(key)
        if not isinstance(value, str) or not value.strip():
            raise self._fail(key, value, "a non-empty string")
        if choices is not None and value not in choices:
            raise self._fail(key, value, f"one of {', '.join(choices)}")
        return value

    def _list(self, key: str) -> list[object]:
        value = self._value(key)
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise self._fail(key, value, "a list")
        return list(value)

    def nums(self, key: str, lo: float | None = None) -> list[float]:
        want = _range_text("a list of numbers", lo, None)
        out = [self._to_float(key, v, want) for v in self._list(key)]
        if lo is not None and any(x < lo for x in out):
            raise self._fail(key, out, want)
        return out

    def ints(self, key: str, lo: int | None = None) -> list[int]:
        want = _range_text("a list of whole numbers", lo, None)
        out = [self._to_float(key, v, want) for v in self._list(key)]
        if any(not x.is_integer() for x in out) or (lo is not None and any(x < lo for x in out)):
            raise self._fail(key, self._value(key), want)
        return [int(x) for x in out]

    def texts(self, key: str) -> list[str]:
        items = self._list(key)
        if any(not isinstance(v, str) or not v.strip() for v in items):
            raise self._fail(key, items, "a list of non-empty strings")
        return [str(v) for v in items]

    def choices(self, values_key: str, weights_key: str) -> tuple[np.ndarray, np.ndarray]:
        """Values with their probabilities, from parallel lists of values and weights."""
        values = self.ints(values_key)
        weights = self.nums(weights_key, lo=0.0)
        if not values:
            raise self._fail(values_key, values, "a non-empty list")
        if len(weights) != len(values):
            raise SpecError(
                f"generator {self.generator!r}: {weights_key} needs one weight per entry of "
                f"{values_key} ({len(values)}), got {len(weights)}"
            )
        total = sum(weights)
        if total <= 0:
            raise SpecError(f"generator {self.generator!r}: {weights_key} must sum to more than 0")
        return np.array(values, dtype=np.int64), np.array(weights) / total

    def name(self) -> str:
        return self.text("name") if self.given("name") else self.generator


def _range_text(what: str, lo: float | None, hi: float | None) -> str:
    if lo is not None and hi is not None:
        return f"{what} in [{lo:g}, {hi:g}]"
    if lo is not None:
        return f"{what} >= {lo:g}"
    if hi is not None:
        return f"{what} <= {hi:g}"
    return what

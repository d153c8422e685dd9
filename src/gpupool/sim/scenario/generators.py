"""Workload generators: turn a scenario's `workload:` entries into jobs and services.

Each entry names a generator and its parameters. Times are in hours in YAML (suffix `_h`,
or `_min`, `_day`, `_s` where named so) and become seconds in the specs; scenario time 0 is
midnight of day 0, which is what the day/night shapes key on. Entry k draws from its own
child generator `default_rng([seed, k])`, so adding an entry never changes the others, and
prefixes its job ids with its `name` so ids stay unique across the workload.
"""

from __future__ import annotations

import csv
import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import lru_cache
from pathlib import Path

import numpy as np
import numpy.typing as npt

from gpupool.domain.model import MILLI_PER_GPU, JobKind, JobSpec
from gpupool.errors import SpecError
from gpupool.sim.scenario.usage import LatencyUpdate, UsageOverride, parse_updates, parse_usage
from gpupool.sim.scenario.workload import LoadCurve, ServiceSpec, Workload
from gpupool.traces.azure_llm import RequestArrival, arrival_rate_per_s, read_azure_llm
from gpupool.traces.itp import read_itp
from gpupool.traces.location import TRACES_ENV

HOUR_S = 3600.0
DAY_S = 86_400.0

PHILLY_RUNTIME = Path("philly") / "philly_runtime.csv"
AZURE_DIR = Path("azure-llm-inference-2023")
AZURE_FILES = {
    "code": "AzureLLMInferenceTrace_code.csv",
    "conv": "AzureLLMInferenceTrace_conv.csv",
}
ITP_RAW_DIR = Path("microsoft-itp-2021") / "raw-traces"

PHILLY_MEDIAN_S = 1186.0
PHILLY_MEAN_S = 14_613.0
"""Published summary of philly_runtime.csv, for the lognormal fallback."""


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


Generator = Callable[[Mapping[str, object], np.random.Generator, GenContext], Workload]


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


# ---------------------------------------------------------------------------------------------
# Parameter access: one place that checks types and ranges, so messages read alike.


class _Params:
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


# ---------------------------------------------------------------------------------------------
# Trace files.


def _trace_file(ctx: GenContext, generator: str, relative: Path) -> Path:
    """The trace file a generator needs, or a SpecError saying how to provide it."""
    if ctx.traces_dir is None:
        raise SpecError(
            f"generator {generator!r} needs the trace file <traces>/{relative.as_posix()}, but no "
            f"traces folder was found; set {TRACES_ENV} to the folder holding the public traces "
            "(…/shared/traces)"
        )
    path = ctx.traces_dir / relative
    if not path.is_file():
        raise SpecError(
            f"generator {generator!r} needs the trace file {path}, which does not exist; "
            f"set {TRACES_ENV} to the folder holding the public traces (…/shared/traces)"
        )
    return path


@lru_cache(maxsize=4)
def _philly_runtimes(path: Path) -> np.ndarray:
    values: list[float] = []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = [h.strip() for h in next(reader, [])]
        if "runtime" not in header:
            raise SpecError(f"{path}: expected a 'runtime' column, header is {header}")
        col = header.index("runtime")
        for row in reader:
            if not row:
                continue
            try:
                x = float(row[col])
            except (ValueError, IndexError):
                raise SpecError(f"{path}:{reader.line_num}: runtime is not a number") from None
            if not (math.isfinite(x) and x >= 0):
                raise SpecError(f"{path}:{reader.line_num}: runtime must be >= 0, got {x}")
            values.append(x)
    if not values:
        raise SpecError(f"{path}: no runtimes")
    out = np.array(values)
    out.flags.writeable = False
    return out


def lognormal_params(median_s: float, mean_s: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this median and mean: median = e^mu and
    mean = e^(mu + sigma^2/2), so sigma = sqrt(2 ln(mean/median))."""
    if not 0 < median_s <= mean_s:
        raise SpecError("a lognormal needs 0 < median <= mean")
    return math.log(median_s), math.sqrt(2.0 * math.log(mean_s / median_s))


@lru_cache(maxsize=4)
def _itp_jobs(path: Path) -> tuple[JobSpec, ...]:
    jobs, _ = read_itp(path, "raw")
    return tuple(jobs)


def _first_stamp_s(path: Path) -> float:
    """Wall time of a trace file's first row, in seconds: read_azure_llm counts from it."""
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        row = next(reader, None)
    text = (row or {}).get("TIMESTAMP") or ""
    match = re.fullmatch(r"\s*(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(\.\d+)?\s*", text)
    if not match:
        raise SpecError(f"{path}: first TIMESTAMP {text!r} is not 'YYYY-MM-DD HH:MM:SS[.f]'")
    whole = datetime.strptime(match.group(1).replace("T", " "), "%Y-%m-%d %H:%M:%S")
    return (whole - datetime(1970, 1, 1)).total_seconds() + float(match.group(2) or 0.0)


@lru_cache(maxsize=4)
def azure_minute_shape(paths: tuple[Path, ...]) -> tuple[float, ...]:
    """Per-minute arrival rate of the Azure LLM files, over the whole minutes in which all of
    them were recording, normalised to mean 1."""
    starts = [_first_stamp_s(p) for p in paths]
    origin = max(starts)
    merged: list[RequestArrival] = []
    end = math.inf
    for path, start in zip(paths, starts, strict=True):
        arrivals, _ = read_azure_llm(path)
        if not arrivals:
            raise SpecError(f"{path}: no requests")
        end = min(end, start + arrivals[-1].arrival_s)
        shift = start - origin
        merged += [
            replace(a, arrival_s=a.arrival_s + shift) for a in arrivals if a.arrival_s + shift >= 0
        ]
    merged.sort(key=lambda a: a.arrival_s)
    minutes = int((end - origin) // 60.0)
    rates = arrival_rate_per_s(merged, 60.0)[:minutes]
    mean = sum(rates) / len(rates) if rates else 0.0
    if mean <= 0:
        raise SpecError(f"Azure trace files {', '.join(map(str, paths))} overlap by no minute")
    return tuple(r / mean for r in rates)


# ---------------------------------------------------------------------------------------------
# Generators.


def _job_resources(p: _Params) -> tuple[int, int]:
    return p.int_("cpu_milli_per_gpu", lo=0), p.int_("mem_mib_per_gpu", lo=0)


def finetune(params: Mapping[str, object], rng: np.random.Generator, ctx: GenContext) -> Workload:
    """`count` identical large training jobs (default: a 70B fine-tune on 64 GPUs), `gap_h`
    apart: the long, checkpoint-heavy job other work must fit around."""
    p = _Params(params, "finetune")
    name, team, priority = p.name(), p.text("team"), p.int_("priority")
    gpus, count = p.int_("gpus", lo=1), p.int_("count", lo=0)
    start_s, gap_s = p.num("start_h", lo=0) * HOUR_S, p.num("gap_h", lo=0) * HOUR_S
    work_s = p.num("work_h", lo=0) * HOUR_S
    state, ckpt = p.num("state_gib_per_gpu", lo=0), p.pos("checkpoint_interval_s")
    cpu, mem = _job_resources(p)
    jobs = tuple(
        JobSpec(
            job_id=f"{name}-{i}",
            gpu_count=gpus,
            cpu_milli=cpu * gpus,
            mem_mib=mem * gpus,
            team=team,
            priority=priority,
            kind=JobKind.TRAINING,
            submit_s=start_s + i * gap_s,
            duration_s=work_s,
            checkpoint_interval_s=ckpt,
            state_gib_per_gpu=state,
        )
        for i in range(count)
    )
    return Workload(jobs=jobs)


def _service(p: _Params, load: LoadCurve) -> ServiceSpec:
    slo, base = p.pos("slo_p99_ms"), p.pos("base_p99_ms")
    if base > slo:
        raise SpecError(
            f"generator {p.generator!r}: base_p99_ms ({base:g}) must not exceed slo_p99_ms "
            f"({slo:g}): a replica at its rated load must meet the SLO"
        )
    lo = p.int_("min_replicas", lo=0)
    return ServiceSpec(
        name=p.name(),
        team=p.text("team"),
        load=load,
        replica_rps=p.pos("replica_rps"),
        slo_p99_ms=slo,
        base_p99_ms=base,
        replica_gpu_milli=p.int_("replica_gpu_milli", lo=1, hi=MILLI_PER_GPU),
        min_replicas=lo,
        max_replicas=p.int_("max_replicas", lo=lo),
        gpu_models=frozenset(p.texts("gpu_models")),
        priority=p.int_("priority"),
        user_region=p.text("user_region") if p.given("user_region") else None,
        latency_bound_ms=p.pos("latency_bound_ms") if p.given("latency_bound_ms") else None,
    )


def diurnal_service(
    params: Mapping[str, object], rng: np.random.Generator, ctx: GenContext
) -> Workload:
    """An online service at base_rps, ramping linearly over ramp_min up to peak_rps, holding it
    from peak_start_h for peak_hours each day, then ramping back down: the classic daily peak.
    The ramps lie outside the peak window."""
    p = _Params(params, "diurnal-service")
    base, peak = p.num("base_rps", lo=0), p.num("peak_rps", lo=0)
    start_h, hours = p.num("peak_start_h", lo=0, hi=24), p.num("peak_hours", lo=0, hi=24)
    ramp_s = p.num("ramp_min", lo=0) * 60.0
    hold_s = hours * HOUR_S
    if hold_s + 2 * ramp_s > DAY_S:
        raise SpecError(
            f"generator 'diurnal-service': peak_hours ({hours:g}) plus two ramps of ramp_min "
            f"({ramp_s / 60:g}) exceed a day; shorten one of them"
        )
    # The curve starts where the ramp up starts; LoadCurve's period wraps the rest of the day.
    t0 = (start_h * HOUR_S - ramp_s) % DAY_S
    load = LoadCurve(
        times_s=(t0, t0 + ramp_s, t0 + ramp_s + hold_s, t0 + 2 * ramp_s + hold_s),
        rps=(base, peak, peak, base),
        period_s=DAY_S,
    )
    return Workload(services=(_service(p, load),))


def azure_envelope(
    t_s: np.ndarray, peak_hour: float, day_rps: float, night_rps: float
) -> np.ndarray:
    """Raised cosine: day_rps at peak_hour, night_rps 12 h away."""
    phase = 2.0 * np.pi * (t_s / HOUR_S - peak_hour) / 24.0
    return night_rps + (day_rps - night_rps) * 0.5 * (1.0 + np.cos(phase))


def azure_service(
    params: Mapping[str, object], rng: np.random.Generator, ctx: GenContext
) -> Workload:
    """An online service shaped like Azure LLM inference (2023) traffic.

    Measured: the per-minute arrival rate (60 s windows) of the trace's one recorded hour,
    over the whole minutes in which every chosen file (`file`: both, code or conv) was
    recording, normalised to mean 1; this short-term burstiness is tiled minute by minute
    across the day. Synthesized: the day shape, a raised cosine with day_rps at peak_hour and
    night_rps 12 h away, which multiplies the tiled burstiness. The product is sampled every
    60 s for one day and repeats daily.
    """
    p = _Params(params, "azure-service")
    which = p.text("file", ["both", *AZURE_FILES, *AZURE_FILES.values()])
    keys = list(AZURE_FILES) if which == "both" else [which]
    paths = tuple(
        _trace_file(ctx, "azure-service", AZURE_DIR / AZURE_FILES.get(k, k)) for k in keys
    )
    peak_hour = p.num("peak_hour", lo=0, hi=24)
    day, night = p.num("day_rps", lo=0), p.num("night_rps", lo=0)
    shape = np.array(azure_minute_shape(paths))
    times = np.arange(int(DAY_S // 60)) * 60.0
    burst = shape[np.arange(times.size) % shape.size]
    rps = azure_envelope(times, peak_hour, day, night) * burst
    load = LoadCurve(tuple(times.tolist()), tuple(rps.tolist()), period_s=DAY_S)
    return Workload(services=(_service(p, load),))


def _work_samples(ctx: GenContext, rng: np.random.Generator, n: int) -> np.ndarray:
    """Work in seconds from Philly's empirical runtimes, or the lognormal fallback."""
    path = None if ctx.traces_dir is None else ctx.traces_dir / PHILLY_RUNTIME
    if path is not None and path.is_file():
        return rng.choice(_philly_runtimes(path), size=n)
    mu, sigma = lognormal_params(PHILLY_MEDIAN_S, PHILLY_MEAN_S)
    return rng.lognormal(mu, sigma, size=n)


def _is_day(t_s: np.ndarray) -> np.ndarray:
    hour = (t_s % DAY_S) / HOUR_S
    return (hour >= 9.0) & (hour < 21.0)


def mixed(params: Mapping[str, object], rng: np.random.Generator, ctx: GenContext) -> Workload:
    """A team's everyday stream of training and offline-inference jobs.

    Arrivals: Poisson at jobs_per_day, times day_factor from 09:00 to 21:00 and night_factor
    otherwise (a homogeneous process at the higher rate, thinned). GPUs: drawn from
    gpu_choices/gpu_weights. Work: drawn from the measured Philly runtimes
    (philly/philly_runtime.csv) times duration_scale, clipped to [min_work_h, max_work_h]; if
    the file is unavailable, from a lognormal with Philly's median (1186 s) and mean
    (14,613 s), i.e. mu = ln 1186, sigma = sqrt(2 ln(14613/1186)) ≈ 2.24. An offline_share of
    the jobs are 1-GPU offline inference with work at most max_offline_work_h.
    """
    p = _Params(params, "mixed")
    name, team, priority = p.name(), p.text("team"), p.int_("priority")
    per_day = p.num("jobs_per_day", lo=0)
    f_day, f_night = p.num("day_factor", lo=0), p.num("night_factor", lo=0)
    start_s = p.num("start_h", lo=0) * HOUR_S
    end_s = p.num("end_h", lo=start_s / HOUR_S) * HOUR_S if p.given("end_h") else ctx.horizon_s
    if end_s < start_s:
        raise SpecError(
            f"generator 'mixed': start_h ({start_s / HOUR_S:g}) is past the scenario end "
            f"({end_s / HOUR_S:g} h); lower start_h or give end_h"
        )
    gpu_values, gpu_probs = p.choices("gpu_choices", "gpu_weights")
    if gpu_values.min() < 1:
        raise SpecError("generator 'mixed': gpu_choices must all be >= 1")
    scale = p.num("duration_scale", lo=0)
    min_work, max_work = p.num("min_work_h", lo=0), p.num("max_work_h", lo=0)
    max_off = p.num("max_offline_work_h", lo=0)
    if not min_work <= min(max_work, max_off):
        raise SpecError(
            "generator 'mixed': need min_work_h <= max_work_h and min_work_h <= max_offline_work_h"
        )
    offline_share = p.num("offline_share", lo=0, hi=1)
    s_min, s_max = p.num("state_gib_min", lo=0), p.num("state_gib_max", lo=0)
    if s_min > s_max:
        raise SpecError("generator 'mixed': need state_gib_min <= state_gib_max")
    ckpt = p.pos("checkpoint_interval_s")
    cpu, mem = _job_resources(p)

    f_max = max(f_day, f_night)
    lam_max = per_day / DAY_S * f_max
    n = int(rng.poisson(lam_max * (end_s - start_s)))
    times = np.sort(rng.uniform(start_s, end_s, size=n))
    accept = rng.random(n) * f_max < np.where(_is_day(times), f_day, f_night)
    times = times[accept]
    n = times.size
    gpus = rng.choice(gpu_values, size=n, p=gpu_probs)
    work = _work_samples(ctx, rng, n) * scale
    offline = rng.random(n) < offline_share
    state = rng.uniform(s_min, s_max, size=n)
    work = np.clip(work, min_work * HOUR_S, max_work * HOUR_S)
    work = np.where(offline, np.minimum(work, max_off * HOUR_S), work)
    gpus = np.where(offline, 1, gpus)

    kinds = [JobKind.OFFLINE if off else JobKind.TRAINING for off in offline]
    return Workload(
        jobs=_gpu_jobs(name, team, priority, kinds, gpus, times, work, ckpt, state, cpu, mem)
    )


def backlog(params: Mapping[str, object], rng: np.random.Generator, ctx: GenContext) -> Workload:
    """`count` jobs queued at once (or spread uniformly over spread_h): a stress burst, with
    log-uniform work in [work_h_min, work_h_max]."""
    p = _Params(params, "backlog")
    name, team, priority = p.name(), p.text("team"), p.int_("priority")
    count = p.int_("count", lo=0)
    submit_s, spread_s = p.num("submit_h", lo=0) * HOUR_S, p.num("spread_h", lo=0) * HOUR_S
    gpu_values, gpu_probs = p.choices("gpu_choices", "gpu_weights")
    if gpu_values.min() < 1:
        raise SpecError("generator 'backlog': gpu_choices must all be >= 1")
    w_min, w_max = p.pos("work_h_min"), p.pos("work_h_max")
    if w_min > w_max:
        raise SpecError("generator 'backlog': need work_h_min <= work_h_max")
    state, ckpt = p.num("state_gib_per_gpu", lo=0), p.pos("checkpoint_interval_s")
    kind = JobKind(p.text("kind", [JobKind.TRAINING.value, JobKind.OFFLINE.value]))
    cpu, mem = _job_resources(p)

    times = np.sort(submit_s + rng.uniform(0.0, spread_s, size=count))
    gpus = rng.choice(gpu_values, size=count, p=gpu_probs)
    work = np.exp(rng.uniform(math.log(w_min), math.log(w_max), size=count)) * HOUR_S
    states = np.full(count, state)
    jobs = _gpu_jobs(
        name, team, priority, [kind] * count, gpus, times, work, ckpt, states, cpu, mem
    )
    if p.given("elastic_min_frac"):  # elastic: runs on this share of its GPUs or more
        frac = p.num("elastic_min_frac", lo=0.0, hi=1.0)
        jobs = tuple(
            replace(j, gpu_count_min=max(1, math.ceil(j.gpu_count * frac)))
            if j.gpu_count > 1
            else j
            for j in jobs
        )
    return Workload(jobs=_placed(p, rng, jobs))


def _placed(p: _Params, rng: np.random.Generator, jobs: Sequence[JobSpec]) -> tuple[JobSpec, ...]:
    """Deadlines, datasets and allowed GPU types (the _PLACEMENT parameters). Draws come
    after the jobs' own, so entries without them keep their jobs unchanged."""
    slack = p.nums("deadline_slack", lo=1.0)
    if slack and len(slack) != 2:
        raise SpecError(f"generator {p.generator!r}: deadline_slack is [min, max], got {slack}")
    min_deadline_s = p.num("min_deadline_h", lo=0) * HOUR_S
    datasets = p.texts("datasets")
    models = frozenset(p.texts("gpu_models"))
    n = len(jobs)
    factors = rng.uniform(min(slack), max(slack), size=n) if slack else None
    where = None
    sizes = None
    if datasets:
        weights = p.nums("dataset_weights", lo=0) or [1.0] * len(datasets)
        if len(weights) != len(datasets) or sum(weights) <= 0:
            raise SpecError(
                f"generator {p.generator!r}: dataset_weights needs one weight per dataset"
            )
        probs = np.array(weights) / sum(weights)
        where = rng.choice(len(datasets), size=n, p=probs)
        lo, hi = p.num("dataset_gb_min", lo=0), p.num("dataset_gb_max", lo=0)
        if lo > hi:
            raise SpecError(f"generator {p.generator!r}: need dataset_gb_min <= dataset_gb_max")
        sizes = (
            np.exp(rng.uniform(math.log(lo), math.log(hi), size=n)) if lo > 0 else np.full(n, hi)
        )
    out = []
    for i, job in enumerate(jobs):
        changes: dict[str, object] = {}
        if factors is not None and job.duration_s is not None:
            span = max(job.duration_s * float(factors[i]), min_deadline_s)
            changes["deadline_s"] = job.submit_s + span
        if where is not None and sizes is not None:
            changes["dataset"] = datasets[int(where[i])]
            changes["dataset_gb"] = float(sizes[i])
        if models:
            changes["gpu_models"] = models
        out.append(replace(job, **changes) if changes else job)  # type: ignore[arg-type]
    return tuple(out)


def _gpu_jobs(
    name: str,
    team: str,
    priority: int,
    kinds: Sequence[JobKind],
    gpus: npt.NDArray[np.int64],
    times: npt.NDArray[np.float64],
    work: npt.NDArray[np.float64],
    ckpt: float,
    states: npt.NDArray[np.float64],
    cpu_per_gpu: int,
    mem_per_gpu: int,
) -> tuple[JobSpec, ...]:
    """Whole-GPU jobs, CPU and memory in proportion to their GPUs."""
    return tuple(
        JobSpec(
            job_id=f"{name}-{i}",
            gpu_count=int(gpus[i]),
            cpu_milli=cpu_per_gpu * int(gpus[i]),
            mem_mib=mem_per_gpu * int(gpus[i]),
            team=team,
            priority=priority,
            kind=kinds[i],
            submit_s=float(times[i]),
            duration_s=float(work[i]),
            checkpoint_interval_s=ckpt,
            state_gib_per_gpu=float(states[i]),
        )
        for i in range(len(kinds))
    )


def itp(params: Mapping[str, object], rng: np.random.Generator, ctx: GenContext) -> Workload:
    """Real jobs of one Microsoft ITP 2021 cluster (raw trace: submit, duration, GPUs).

    Keeps the jobs submitted in [start_day, start_day + days) days, shifted so the window
    starts at 0. The trace has no teams, kinds or priorities, so they are drawn (seeded): the
    team uniformly from `teams` (or `team` for all); an online_share of the 1-GPU jobs become
    online inference (a service deployment that runs for its duration, never preempted) at
    online_priority; the rest are training with a priority drawn from
    priorities/priority_weights (or `priority` for all).
    """
    p = _Params(params, "itp")
    name = p.name()
    cluster = p.text("cluster")
    rel = ITP_RAW_DIR / f"{cluster}.csv"
    if ctx.traces_dir is not None and not (ctx.traces_dir / rel).is_file():
        folder = ctx.traces_dir / ITP_RAW_DIR
        found = sorted(f.stem for f in folder.glob("cluster*.csv")) if folder.is_dir() else []
        if found:
            raise SpecError(
                f"generator 'itp': no ITP cluster {cluster!r} in {folder}; "
                f"use one of: {', '.join(found)}"
            )
    path = _trace_file(ctx, "itp", rel)
    if p.given("team") and p.given("teams"):
        raise SpecError("generator 'itp': give `team` (one team for all) or `teams`, not both")
    teams = [p.text("team")] if p.given("team") else p.texts("teams")
    if not teams:
        raise SpecError("generator 'itp': teams must not be empty")
    if p.given("priority") and (p.given("priorities") or p.given("priority_weights")):
        raise SpecError(
            "generator 'itp': give `priority` (one for all) or `priorities`/`priority_weights`, "
            "not both"
        )
    if p.given("priority"):
        prio_values, prio_probs = np.array([p.int_("priority")]), np.array([1.0])
    else:
        prio_values, prio_probs = p.choices("priorities", "priority_weights")
    start_s = p.num("start_day", lo=0) * DAY_S
    days = p.pos("days")
    end_s = start_s + days * DAY_S
    online_share = p.num("online_share", lo=0, hi=1)
    online_priority = p.int_("online_priority")
    state, ckpt = p.num("state_gib_per_gpu", lo=0), p.pos("checkpoint_interval_s")
    cpu, mem = _job_resources(p)

    kept = [j for j in _itp_jobs(path) if start_s <= j.submit_s < end_s]
    n = len(kept)
    team_idx = rng.integers(0, len(teams), size=n)
    online_draw = rng.random(n)
    prios = rng.choice(prio_values, size=n, p=prio_probs)
    jobs: list[JobSpec] = []
    for i, job in enumerate(kept):
        online = job.gpu_count == 1 and online_draw[i] < online_share
        jobs.append(
            JobSpec(
                job_id=f"{name}-{job.job_id}",
                gpu_count=job.gpu_count,
                cpu_milli=cpu * job.gpu_count,
                mem_mib=mem * job.gpu_count,
                team=teams[int(team_idx[i])],
                priority=online_priority if online else int(prios[i]),
                kind=JobKind.ONLINE if online else JobKind.TRAINING,
                submit_s=job.submit_s - start_s,
                duration_s=job.duration_s,
                checkpoint_interval_s=ckpt,
                state_gib_per_gpu=state,
            )
        )
    return Workload(jobs=tuple(jobs))


def single_job(params: Mapping[str, object], rng: np.random.Generator, ctx: GenContext) -> Workload:
    """One job given in full: a named case a scenario must get right (e.g. a short job
    whose data sits far away)."""
    p = _Params(params, "job")
    gpus = p.int_("gpus", lo=1)
    cpu, mem = _job_resources(p)
    submit_s = p.num("submit_h", lo=0) * HOUR_S
    deadline = p.num("deadline_h", lo=0) * HOUR_S if p.given("deadline_h") else None
    job = JobSpec(
        job_id=p.name(),
        gpu_count=gpus,
        cpu_milli=cpu * gpus,
        mem_mib=mem * gpus,
        team=p.text("team"),
        priority=p.int_("priority"),
        kind=JobKind(p.text("kind", [k.value for k in JobKind if k is not JobKind.ONLINE])),
        submit_s=submit_s,
        duration_s=p.pos("work_min") * 60.0,
        checkpoint_interval_s=p.pos("checkpoint_interval_s"),
        state_gib_per_gpu=p.num("state_gib_per_gpu", lo=0),
        deadline_s=None if deadline is None else submit_s + deadline,
        dataset=p.text("dataset") if p.given("dataset") else None,
        dataset_gb=p.num("dataset_gb", lo=0),
        gpu_models=frozenset(p.texts("gpu_models")),
        gpu_count_min=p.int_("gpus_min", lo=1) if p.given("gpus_min") else None,
    )
    return Workload(jobs=(job,))


def model_jobs(params: Mapping[str, object], rng: np.random.Generator, ctx: GenContext) -> Workload:
    """Jobs given by a model instead of a GPU count: `count` of them, submitted uniformly
    over [submit_h, submit_h + spread_h), each with log-uniform work in [tokens_min,
    tokens_max] tokens (to generate, or to train on). The scheduler sizes each one per GPU
    type with the planner (gpupool.sizing) when it is submitted."""
    from gpupool.sizing.planner import PlanRequest
    from gpupool.sizing.shapes import get_shape

    p = _Params(params, "model-jobs")
    name, team, priority = p.name(), p.text("team"), p.int_("priority")
    count = p.int_("count", lo=0)
    task = p.text("task", ["inference", "training"])
    submit_s, spread_s = p.num("submit_h", lo=0) * HOUR_S, p.num("spread_h", lo=0) * HOUR_S
    t_min, t_max = p.pos("tokens_min"), p.pos("tokens_max")
    if t_min > t_max:
        raise SpecError("generator 'model-jobs': need tokens_min <= tokens_max")
    deadline = p.nums("deadline_h", lo=0)
    if deadline and len(deadline) != 2:
        raise SpecError(f"generator 'model-jobs': deadline_h is [min, max], got {deadline}")
    shape = get_shape(p.text("model"))
    times = np.sort(submit_s + rng.uniform(0.0, spread_s, size=count))
    tokens = np.exp(rng.uniform(math.log(t_min), math.log(t_max), size=count))
    spans = rng.uniform(min(deadline), max(deadline), size=count) * HOUR_S if deadline else None
    kind = JobKind.TRAINING if task == "training" else JobKind.OFFLINE
    jobs = []
    sized = {}
    for i in range(count):
        job_id = f"{name}-{i}"
        jobs.append(
            JobSpec(
                job_id=job_id,
                team=team,
                priority=priority,
                kind=kind,
                submit_s=float(times[i]),
                checkpoint_interval_s=p.pos("checkpoint_interval_s"),
                state_gib_per_gpu=p.num("state_gib_per_gpu", lo=0),
                deadline_s=None if spans is None else float(times[i] + spans[i]),
            )
        )
        sized[job_id] = PlanRequest(
            shape=shape,
            task=task,
            precision=p.text("precision"),
            context=p.int_("context", lo=1),
            seq_len=p.int_("seq_len", lo=1),
            batch=p.int_("batch", lo=1),
            grad_accum=p.int_("grad_accum", lo=1),
            tokens=float(tokens[i]),
        )
    return Workload(jobs=tuple(jobs), sized=sized)


GENERATORS: dict[str, Generator] = {
    "model-jobs": model_jobs,
    "job": single_job,
    "finetune": finetune,
    "diurnal-service": diurnal_service,
    "azure-service": azure_service,
    "mixed": mixed,
    "backlog": backlog,
    "itp": itp,
}


WORLD_KEYS = frozenset({"usage", "update"})
"""Entry keys that describe the simulated world's measurements, not the jobs the scheduler
sees: `usage:` (what the entry's jobs measure on their cards, gpupool.sim.scenario.usage) and, for a
service, `update:` (a model update that moves its base p99 from a time on)."""


def _with_world(part: Workload, entry: Mapping[str, object], where: str) -> Workload:
    """The entry's world keys attached to the jobs and services it made."""
    usage: dict[str, UsageOverride] = {}
    updates: dict[str, tuple[LatencyUpdate, ...]] = {}
    if entry.get("usage") is not None:
        over = parse_usage(entry["usage"], where)
        usage = {j.job_id: over for j in part.jobs} | {s.name: over for s in part.services}
    if entry.get("update") is not None:
        if not part.services:
            raise SpecError(f"{where}: update: moves a service's latency; this entry has none")
        found = parse_updates(entry["update"], where)
        updates = {s.name: found for s in part.services}
    if not usage and not updates:
        return part
    return replace(part, usage={**part.usage, **usage}, updates={**part.updates, **updates})


def build_workload(entries: Sequence[Mapping[str, object]], seed: int, ctx: GenContext) -> Workload:
    """All entries' jobs and services. Entry k draws from default_rng([seed, k])."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise SpecError(f"seed must be a whole number >= 0, got {seed!r}")
    if isinstance(entries, str | bytes) or not isinstance(entries, Sequence):
        raise SpecError("workload must be a list of generator entries")
    total = Workload()
    names: dict[str, int] = {}
    for k, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise SpecError(f"workload entry {k}: expected a mapping with a `generator:` key")
        gen = entry.get("generator")
        if gen is None:
            raise SpecError(
                f"workload entry {k}: missing `generator:`; known: {', '.join(GENERATORS)}"
            )
        if not isinstance(gen, str) or gen not in GENERATORS:
            raise SpecError(
                f"workload entry {k}: unknown generator {gen!r}; known: {', '.join(GENERATORS)}"
            )
        name = entry.get("name")
        if name is None:
            name = f"{gen}{k}"
        if not isinstance(name, str) or not name.strip():
            raise SpecError(f"workload entry {k} ({gen}): name must be a non-empty string")
        if name in names:
            raise SpecError(
                f"workload entry {k} ({gen}): name {name!r} is already used by entry "
                f"{names[name]}; give each entry its own name"
            )
        names[name] = k
        rng = np.random.default_rng([int(seed), k])
        params = {key: v for key, v in entry.items() if key not in WORLD_KEYS}
        try:
            part = GENERATORS[gen]({**params, "name": name}, rng, ctx)
            part = _with_world(part, entry, f"generator {gen!r}")
        except SpecError as err:
            raise SpecError(f"workload entry {k} ({gen}, name {name!r}): {err}") from err
        total = total + part
    ids = [j.job_id for j in total.jobs] + [s.name for s in total.services]
    dups = [i for i, n in Counter(ids).items() if n > 1]
    if dups:
        dup = dups[0]
        raise SpecError(
            f"job/service id {dup!r} occurs twice in the workload; rename the entries so no "
            "entry's name is another's job id prefix"
        )
    return total

"""Right-sizing: which GPU type, and how many, for a model-shaped job, at what cost.

`plan` tries every GPU type x count, estimates memory per GPU (memory.py) and speed
(perf.py), prices the option and ranks them: options that fit and meet the deadline
first, cheapest per unit of work first, faster first on ties; options that do not fit last.
`sized_options` keeps one option per GPU type, for the scheduler to size a job that names a
model instead of a GPU count.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

from gpupool.errors import SpecError
from gpupool.sizing.catalog import Catalog, GpuType, load_catalog
from gpupool.sizing.memory import (
    BYTES_PER_ELEM,
    OPTIMIZERS,
    RECOMPUTE,
    TRAINING_PRECISIONS,
    MemoryEstimate,
    inference_memory,
    training_memory,
)
from gpupool.sizing.perf import DEFAULT_PERF, PerfParams, decode, tp_valid, training_step
from gpupool.sizing.shapes import ModelShape

TASKS = ("inference", "training")
DEFAULT_COUNTS = (1, 2, 4, 8)


@dataclass(frozen=True)
class PlanRequest:
    """A model-shaped job. Inference: `batch` concurrent sequences of `context` tokens each;
    `tokens` is the number of tokens to generate. Training: `batch` is the micro-batch per
    data-parallel rank of `seq_len`-token sequences, `grad_accum` micro-batches per step;
    `tokens` is the number of tokens to train on."""

    shape: ModelShape
    task: str = "inference"
    precision: str = "bf16"
    context: int = 4096
    seq_len: int = 4096
    batch: int = 1
    tokens: float | None = None
    deadline_s: float | None = None
    counts: tuple[int, ...] = DEFAULT_COUNTS
    gpus: tuple[str, ...] | None = None
    zero_stage: int = 3
    recompute: str = "selective"
    optimizer: str = "adam"
    grad_accum: int = 1
    kv_precision: str | None = None
    perf: PerfParams = field(default=DEFAULT_PERF, compare=False)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise SpecError(f"unknown task {self.task!r}; choose from {', '.join(TASKS)}")
        if self.precision not in BYTES_PER_ELEM:
            raise SpecError(
                f"unknown precision {self.precision!r}; choose from {', '.join(BYTES_PER_ELEM)}"
            )
        if self.task == "training" and self.precision not in TRAINING_PRECISIONS:
            raise SpecError(
                f"training in {self.precision} is not modelled; choose from "
                f"{', '.join(TRAINING_PRECISIONS)}"
            )
        if self.kv_precision is not None and self.kv_precision not in BYTES_PER_ELEM:
            raise SpecError(
                f"unknown KV precision {self.kv_precision!r}; choose from "
                f"{', '.join(BYTES_PER_ELEM)}"
            )
        for key in ("context", "seq_len", "batch", "grad_accum"):
            if getattr(self, key) < 1:
                raise SpecError(f"{key} must be at least 1, got {getattr(self, key)}")
        if not self.counts or any(c < 1 for c in self.counts):
            raise SpecError(f"GPU counts must be whole numbers >= 1, got {self.counts}")
        if self.tokens is not None and not self.tokens > 0:
            raise SpecError(f"tokens must be > 0, got {self.tokens}")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise SpecError(f"deadline must be > 0 seconds, got {self.deadline_s}")
        if self.deadline_s is not None and self.tokens is None:
            raise SpecError("a deadline needs the amount of work: give tokens (--tokens)")
        if self.zero_stage not in (0, 1, 2, 3):
            raise SpecError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage}")
        if self.recompute not in RECOMPUTE:
            raise SpecError(
                f"unknown recompute {self.recompute!r}; choose from {', '.join(RECOMPUTE)}"
            )
        if self.optimizer not in OPTIMIZERS:
            raise SpecError(
                f"unknown optimizer {self.optimizer!r}; choose from {', '.join(OPTIMIZERS)}"
            )

    def as_dict(self) -> dict[str, object]:
        """What was asked, for JSON output."""
        out: dict[str, object] = {
            "model": self.shape.name,
            "shape": {k: v for k, v in asdict(self.shape).items() if k != "source"},
            "task": self.task,
            "precision": self.precision,
            "batch": self.batch,
            "tokens": self.tokens,
            "deadline_s": self.deadline_s,
            "counts": list(self.counts),
            "gpus": list(self.gpus) if self.gpus is not None else None,
        }
        if self.task == "inference":
            out["context"] = self.context
            out["kv_precision"] = self.kv_precision
        else:
            out.update(
                seq_len=self.seq_len,
                grad_accum=self.grad_accum,
                zero_stage=self.zero_stage,
                recompute=self.recompute,
                optimizer=self.optimizer,
            )
        return out


@dataclass(frozen=True)
class PlanOption:
    """One GPU type x count for the request, estimated.

    `parallel` says how the GPUs split the work ('tp4', 'tp2 x dp4 zero3'); `efficiency` is
    the estimated share of ideal linear scaling (training) or of the single-GPU decode rate
    per GPU (inference; None on one GPU). `note` says why an option does not fit.
    """

    gpu: str
    count: int
    mem_per_gpu_gib: float
    fits: bool
    est_tokens_per_s: float | None
    est_step_s: float | None
    cost_per_hour_usd: float
    cost_per_million_tokens_usd: float | None
    run_s: float | None
    cost_per_job_usd: float | None
    meets_deadline: bool | None
    gpu_memory_gib: float = 0.0
    parallel: str = ""
    throughput_tokens_per_s: float | None = None
    efficiency: float | None = None
    note: str = ""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def plan(request: PlanRequest, catalog: Catalog | None = None) -> list[PlanOption]:
    """Every tried GPU type x count, best first (see the module docstring for the order)."""
    cat = load_catalog() if catalog is None else catalog
    options = [
        estimate(request, gpu, count) for gpu in _gpus(request, cat) for count in _counts(request)
    ]
    return rank(options, request)


def rank(options: Iterable[PlanOption], request: PlanRequest) -> list[PlanOption]:
    """Fit and meet the deadline, then cheapest per unit of work, then fastest; then options
    that fit but miss the deadline (fastest first); then those that do not fit."""
    per_job = request.tokens is not None

    def key(o: PlanOption) -> tuple[float, ...]:
        speed = -(o.throughput_tokens_per_s or 0.0)
        if not o.fits:
            return (2.0, o.count, o.mem_per_gpu_gib - o.gpu_memory_gib, 0.0)
        cost = o.cost_per_job_usd if per_job else o.cost_per_million_tokens_usd
        cost_key = math.inf if cost is None else cost
        if o.meets_deadline is False:
            return (1.0, o.run_s if o.run_s is not None else math.inf, cost_key, o.count)
        return (0.0, _sig(cost_key), speed, o.count)

    return sorted(options, key=key)


def _sig(value: float, digits: int = 4) -> float:
    """Round to `digits` significant digits, so costs equal to a hundredth of a percent tie
    and the faster option wins."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))


def estimate(request: PlanRequest, gpu: GpuType, count: int) -> PlanOption:
    """The option for one GPU type and count."""
    if request.task == "inference":
        return _inference(request, gpu, count)
    return _training(request, gpu, count)


def min_gpus(
    request: PlanRequest, gpu: GpuType | str, catalog: Catalog | None = None
) -> int | None:
    """The smallest count among `request.counts` whose memory fits on this GPU type."""
    gtype = _gpu(gpu, catalog)
    for count in _counts(request):
        if estimate(request, gtype, count).fits:
            return count
    return None


def sized_options(
    request: PlanRequest, catalog: Catalog | None = None, gpus: Iterable[str] | None = None
) -> dict[str, PlanOption]:
    """Per GPU type, the option a scheduler should request: the fewest GPUs that fit (the
    cheaper on a tie) and, with a deadline, the fewest that meet it; if none meets it, the
    fastest that fits. GPU types on which nothing fits are left out."""
    cat = load_catalog() if catalog is None else catalog
    names = list(gpus) if gpus is not None else None
    types = [cat[n] for n in names] if names is not None else list(_gpus(request, cat))
    out: dict[str, PlanOption] = {}
    for gtype in types:
        fitting = [o for o in (estimate(request, gtype, c) for c in _counts(request)) if o.fits]
        if not fitting:
            continue
        meeting = [o for o in fitting if o.meets_deadline is not False]
        if meeting:
            best = min(meeting, key=lambda o: (o.count, _cost_key(o, request)))
        else:
            best = min(fitting, key=lambda o: (o.run_s or math.inf, o.count))
        out[gtype.name] = best
    return out


def _cost_key(o: PlanOption, request: PlanRequest) -> float:
    cost = o.cost_per_job_usd if request.tokens is not None else o.cost_per_million_tokens_usd
    return math.inf if cost is None else cost


def _gpus(request: PlanRequest, cat: Catalog) -> list[GpuType]:
    if request.gpus is None:
        return list(cat)
    seen: dict[str, GpuType] = {}
    for name in request.gpus:
        gtype = cat[name]
        seen[gtype.name] = gtype
    return list(seen.values())


def _counts(request: PlanRequest) -> list[int]:
    return sorted(set(request.counts))


def _gpu(gpu: GpuType | str, catalog: Catalog | None) -> GpuType:
    if isinstance(gpu, GpuType):
        return gpu
    cat = load_catalog() if catalog is None else catalog
    return cat[gpu]


class _Cost(NamedTuple):
    per_hour_usd: float
    per_million_usd: float | None
    run_s: float | None
    per_job_usd: float | None
    meets_deadline: bool | None


def _price(request: PlanRequest, gpu: GpuType, count: int, throughput: float | None) -> _Cost:
    """Cost fields shared by both tasks; `throughput` is None when the option does not fit."""
    per_hour = gpu.price_usd_per_hour * count
    per_million: float | None = None
    run_s: float | None = None
    per_job: float | None = None
    if throughput:
        per_million = per_hour / 3600.0 * 1e6 / throughput
        if request.tokens is not None:
            run_s = request.tokens / throughput
            per_job = per_hour * run_s / 3600.0
    meets: bool | None = None
    if request.deadline_s is not None:
        meets = run_s is not None and run_s <= request.deadline_s
    return _Cost(per_hour, per_million, run_s, per_job, meets)


def _option(
    request: PlanRequest,
    gpu: GpuType,
    count: int,
    mem_gib: float,
    fits: bool,
    throughput: float,
    *,
    step_s: float | None,
    parallel: str,
    efficiency: float | None,
    note: str,
) -> PlanOption:
    cost = _price(request, gpu, count, throughput if fits else None)
    inference = request.task == "inference"
    return PlanOption(
        gpu=gpu.name,
        count=count,
        mem_per_gpu_gib=mem_gib,
        fits=fits,
        est_tokens_per_s=throughput if fits and inference else None,
        est_step_s=step_s if fits and not inference else None,
        cost_per_hour_usd=cost.per_hour_usd,
        cost_per_million_tokens_usd=cost.per_million_usd,
        run_s=cost.run_s,
        cost_per_job_usd=cost.per_job_usd,
        meets_deadline=cost.meets_deadline,
        gpu_memory_gib=gpu.memory_gib,
        parallel=parallel,
        throughput_tokens_per_s=throughput if fits else None,
        efficiency=efficiency,
        note=note,
    )


def _inference(request: PlanRequest, gpu: GpuType, count: int) -> PlanOption:
    shape = request.shape
    whole = inference_memory(
        shape, request.precision, request.context, request.batch, request.kv_precision
    )
    mem = whole.per_gpu(count)
    fits = mem.total_gib <= gpu.memory_gib
    note = "" if fits else _short(mem, gpu)
    if not tp_valid(shape, count):
        fits = False
        note = f"{shape.heads} heads / {shape.kv_heads} KV heads do not split {count} ways"

    def rate(n: int) -> float:
        return decode(
            gpu,
            n,
            shape,
            request.precision,
            request.context,
            request.batch,
            request.kv_precision,
            request.perf,
        ).tokens_per_s

    tokens_per_s = rate(count)
    efficiency = tokens_per_s / (count * rate(1)) if count > 1 else None
    return _option(
        request,
        gpu,
        count,
        mem.total_gib,
        fits,
        tokens_per_s,
        step_s=None,
        parallel=f"tp{count}" if count > 1 else "single",
        efficiency=efficiency,
        note=note,
    )


def _training(request: PlanRequest, gpu: GpuType, count: int) -> PlanOption:
    shape = request.shape
    whole = training_memory(
        shape,
        request.precision,
        request.seq_len,
        request.batch,
        request.optimizer,
        request.recompute,
        request.zero_stage,
    )
    # Smallest tensor-parallel degree that fits: TP costs communication on the critical path.
    candidates = [t for t in (1, 2, 4, 8) if t <= count and count % t == 0 and tp_valid(shape, t)]
    chosen = candidates[0]
    mem = whole.per_gpu(count, chosen)
    fits = False
    for t in candidates:
        trial = whole.per_gpu(count, t)
        if trial.total_gib <= gpu.memory_gib:
            chosen, mem, fits = t, trial, True
            break
        if trial.total_gib < mem.total_gib:
            chosen, mem = t, trial
    step = training_step(
        gpu,
        count,
        shape,
        request.precision,
        request.seq_len,
        request.batch,
        request.grad_accum,
        chosen,
        request.zero_stage,
        request.recompute,
        request.perf,
    )
    dp = count // chosen
    parts = []
    if chosen > 1:
        parts.append(f"tp{chosen}")
    if dp > 1:
        parts.append(f"dp{dp}" + (f" zero{request.zero_stage}" if request.zero_stage else ""))
    parallel = " x ".join(parts) or "single"
    return _option(
        request,
        gpu,
        count,
        mem.total_gib,
        fits,
        step.tokens_per_s,
        step_s=step.step_s,
        parallel=parallel,
        efficiency=step.efficiency,
        note="" if fits else _short(mem, gpu),
    )


def _short(mem: MemoryEstimate, gpu: GpuType) -> str:
    return f"needs {mem.total_gib:.1f} GiB of {gpu.memory_gib:.1f} GiB per GPU"

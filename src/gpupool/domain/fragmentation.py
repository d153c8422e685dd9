"""GPU fragmentation measured against a popularity-weighted "typical task" mix.

This is the measure of Weng et al., "Beware of Fragmentation" (USENIX ATC '23): for each
typical task m with popularity p_m, the idle GPU share of a node that m could not use
counts as fragment. If m cannot run on the node at all (no GPU it may use, too little CPU,
too few GPUs with enough free share, or m wants no GPU), every idle GPU share is fragment;
if m fits, only the GPUs whose free share is below m's per-GPU request are. A node's
fragmentation is the popularity-weighted sum over the mix. CPU-only tasks are part of the
mix, as in the authors' configuration (isInvolvedCpuPods, 95% popularity threshold).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import accumulate

from gpupool.domain.model import JobSpec

DEFAULT_POPULARITY = 0.95
"""The authors' run scripts keep the most popular task shapes up to 95% of all tasks."""


@dataclass(frozen=True, slots=True, order=True)
class TaskShape:
    cpu_milli: int
    gpu_milli: int  # per GPU; 0 for a task that wants no GPU
    gpu_count: int
    gpu_models: str  # '|'-joined allowed models, '' for any

    @staticmethod
    def of(job: JobSpec) -> TaskShape:
        milli = job.gpu_milli if job.gpu_count else 0
        return TaskShape(job.cpu_milli, milli, job.gpu_count, "|".join(sorted(job.gpu_models)))


@dataclass(frozen=True, slots=True)
class TypicalTask:
    shape: TaskShape
    popularity: float


def typical_tasks(
    jobs: Iterable[JobSpec], popularity: float = DEFAULT_POPULARITY
) -> tuple[TypicalTask, ...]:
    """The most frequent task shapes covering `popularity` of all tasks, renormalised to 1.

    Jobs are counted by their raw fields first: a `TaskShape` is made once per distinct
    demand rather than once per job."""
    demands = Counter(
        (j.cpu_milli, j.gpu_milli if j.gpu_count else 0, j.gpu_count, j.gpu_models) for j in jobs
    )
    counts: Counter[TaskShape] = Counter()
    for (cpu, milli, count, models), n in demands.items():
        counts[TaskShape(cpu, milli, count, "|".join(sorted(models)))] += n
    return typical_of_counts(counts, popularity)


def typical_of_counts(
    counts: Mapping[TaskShape, int], popularity: float = DEFAULT_POPULARITY
) -> tuple[TypicalTask, ...]:
    """`typical_tasks` of jobs already counted by shape."""
    total = sum(counts.values())
    if total == 0:
        return ()
    # Most frequent first; equal counts: the larger shape first (the authors' tie-break).
    ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    chosen: list[tuple[TaskShape, int]] = []
    covered = 0
    for shape, count in ranked:
        if covered >= popularity * total:
            break
        chosen.append((shape, count))
        covered += count
    return tuple(TypicalTask(shape, count / covered) for shape, count in chosen)


class FragmentationMeter:
    """Fragmentation of a node state in GPU milli; memoised, since states repeat a lot.

    The memo keys CPU by its rank among the mix's CPU requests: a node's CPU is only ever
    compared with those, so nodes that differ in CPU but not in rank share one entry."""

    def __init__(self, tasks: tuple[TypicalTask, ...], models: Iterable[str]) -> None:
        self.tasks = tasks
        self._per_model: dict[str, _ModelMix] = {}
        for model in models:
            whole_idle = 0.0
            gpu_tasks: list[tuple[float, int, int, int]] = []
            for t in tasks:
                s = t.shape
                allowed = not s.gpu_models or model in s.gpu_models.split("|")
                if s.gpu_milli == 0 or not allowed:
                    whole_idle += t.popularity
                else:
                    gpu_tasks.append((t.popularity, s.cpu_milli, s.gpu_milli, s.gpu_count))
            cpus = tuple(sorted({cpu for _, cpu, _, _ in gpu_tasks}))
            millis = tuple(sorted({milli for _, _, milli, _ in gpu_tasks}))
            self._per_model[model] = _ModelMix(
                whole_idle,
                cpus,
                millis,
                tuple((p, cpus.index(c), millis.index(m), n) for p, c, m, n in gpu_tasks),
            )
        self._memo: dict[tuple[str, int, tuple[int, ...]], float] = {}

    def node(self, model: str, cpu_left: int, gpus: tuple[int, ...]) -> float:
        return self.at_rank(model, self.cpu_rank(model, cpu_left), tuple(sorted(gpus)))

    def cpu_rank(self, model: str, cpu_left: int) -> int:
        """How many of the mix's CPU requests (as `model` sees it) fit in `cpu_left`: two
        CPU amounts of one rank are alike to the measure."""
        return bisect_right(self._per_model[model].cpus, cpu_left)

    def cpu_requests(self, model: str) -> tuple[int, ...]:
        """The distinct CPU requests `cpu_rank` counts, ascending."""
        return self._per_model[model].cpus

    def at_rank(self, model: str, cpu_rank: int, gpus: tuple[int, ...]) -> float:
        """`node` for a CPU given by its `cpu_rank` and free shares already ascending."""
        key = (model, cpu_rank, gpus)
        value = self._memo.get(key)
        if value is None:
            value = self._memo[key] = _fragment(self._per_model[model], cpu_rank, gpus)
        return value


@dataclass(frozen=True, slots=True)
class _ModelMix:
    """The typical tasks as one GPU model sees them."""

    whole_idle: float
    """Popularity of the tasks that can use none of its GPUs: all idle share is fragment."""
    cpus: tuple[int, ...]
    """Distinct CPU requests of the others, ascending."""
    millis: tuple[int, ...]
    """Distinct per-GPU requests of the others, ascending."""
    gpu_tasks: tuple[tuple[float, int, int, int], ...]
    """(popularity, index into `cpus`, index into `millis`, GPU count), in task order."""


def _fragment(mix: _ModelMix, cpu_rank: int, gpus: tuple[int, ...]) -> float:
    """`gpus` ascending, `cpu_rank` the number of `mix.cpus` at or below the CPU left. The
    GPUs below a per-GPU request are a prefix, so one bisection per distinct request gives
    both how many GPUs it can use and the share it strands. The float sum runs in task
    order, as the plain definition adds it."""
    below_milli = list(accumulate(gpus, initial=0))  # [k]: share on the k smallest GPUs
    idle = below_milli[-1]
    cuts = [bisect_left(gpus, milli) for milli in mix.millis]
    frag = mix.whole_idle * idle
    for popularity, cpu, j, count in mix.gpu_tasks:
        cut = cuts[j]
        if cpu_rank > cpu and len(gpus) - cut >= count:
            frag += popularity * below_milli[cut]
        else:
            frag += popularity * idle
    return frag

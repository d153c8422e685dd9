"""Which pool (GPU type, and site) a job waits for, when more than one would do.

A job given by a model is sized per GPU type by the planner: how many GPUs of that type
hold it and how long its work takes there. A plain job may allow several types at the
same count and duration. Each scheduling cycle the decision core asks a chooser to
point every waiting, never-started job at one pool; the cycle policy then plans within
pools as before. Choices are re-made each cycle until the job starts, so a job follows
capacity as it frees; once started it stays on its GPU type (its progress is counted in
that type's seconds).

By class (`placement.gpu_type: by-class`, the default): each job kind ranks the GPU types
(data/gpu_class_preferences.csv: training the fastest, offline inference the most memory,
online inference and batch the cheapest; `placement.prefer` puts named types first). A
job goes to its kind's most preferred type among those it can start on now, and waits for
its most preferred type only when no type it may use is free.
"""

from __future__ import annotations

import csv
import functools
import math
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, replace
from importlib import resources

from gpupool.domain.model import JobKind, JobSpec
from gpupool.domain.state import BoolArray, ClusterState
from gpupool.errors import SpecError
from gpupool.federation import placement as fed
from gpupool.federation.placement import FedJob, SiteDecision, SiteOption
from gpupool.federation.topology import Topology
from gpupool.sizing.catalog import Catalog


@dataclass(frozen=True)
class PoolOption:
    """One way to run a job: on `gpu_count` GPUs of pool `pool`, taking `duration_s`."""

    pool: str
    gpu_type: str
    site: str
    gpu_count: int
    duration_s: float | None
    price_usd_per_gpu_hour: float

    def cost_usd(self) -> float:
        return self.gpu_count * (self.duration_s or 0.0) * self.price_usd_per_gpu_hour / 3600.0


@dataclass(frozen=True)
class PoolLoad:
    """What a chooser knows about a pool this cycle."""

    free_gpus: int
    """Whole idle GPUs a job could start on now."""
    drain_s: float
    """How long the work queued and running in the pool keeps all its GPUs busy."""


@dataclass(frozen=True)
class Choice:
    option: PoolOption
    reason: str
    rejected_remote: bool = False
    """A remote site was refused because moving the data takes longer than waiting."""


def pool_loads(
    state: ClusterState, pool_nodes: Mapping[str, BoolArray], work_gpu_s: Mapping[str, float]
) -> dict[str, PoolLoad]:
    """Each pool's free whole GPUs and drain time (its queued and running GPU-seconds of
    work over its GPUs); nodes out of the pool's mask (down, not started) do not count."""
    out = {}
    for key, mask in pool_nodes.items():
        free = int(state.whole_free[mask].sum())
        gpus = int(state.gpu_count[mask].sum())
        out[key] = PoolLoad(free, work_gpu_s.get(key, 0.0) / gpus if gpus else math.inf)
    return out


def charge(
    loads: MutableMapping[str, PoolLoad],
    option: PoolOption,
    state: ClusterState,
    pool_nodes: Mapping[str, BoolArray],
) -> None:
    """Count a job just pointed at `option` in its pool's load, so the next waiting job
    in the same round sees it: it takes free GPUs, or lengthens the drain."""
    load = loads[option.pool]
    if option.gpu_count <= load.free_gpus:
        loads[option.pool] = replace(load, free_gpus=load.free_gpus - option.gpu_count)
    else:
        gpus = max(1, int(state.gpu_count[pool_nodes[option.pool]].sum()))
        extra = option.gpu_count * (option.duration_s or 0.0) / gpus
        loads[option.pool] = replace(load, drain_s=load.drain_s + extra)


def wait_s(option: PoolOption, load: PoolLoad) -> float:
    return 0.0 if option.gpu_count <= load.free_gpus else load.drain_s


def choose_first(options: Sequence[PoolOption]) -> Choice:
    return Choice(options[0], "the job's first allowed pool")


def choose_blind(options: Sequence[PoolOption], loads: Mapping[str, PoolLoad]) -> Choice:
    """Types and sites treated alike: the pool with the most free GPUs that fits the job
    now, else the one that drains first (what a scheduler that sees only GPUs does)."""
    fits = [o for o in options if o.gpu_count <= loads[o.pool].free_gpus]
    if fits:
        best = max(fits, key=lambda o: (loads[o.pool].free_gpus, -options.index(o)))
        return Choice(best, f"most free GPUs ({loads[best.pool].free_gpus})")
    best = min(options, key=lambda o: (loads[o.pool].drain_s, options.index(o)))
    return Choice(best, "none free: the pool that drains first")


def choose_cost_aware(
    job: JobSpec,
    options: Sequence[PoolOption],
    loads: Mapping[str, PoolLoad],
    now_s: float,
    value_of_time_usd_per_h: float,
) -> Choice:
    """Cheapest pool for the job's work that still meets its deadline (Gavel's point:
    a job belongs where its speed per dollar is highest). A cheaper type that is full is
    still chosen (the job waits for it) unless waiting would miss the deadline; then the
    cheapest pool that meets it; if none can, the one that finishes first. Without a
    deadline, completion time is priced at `value_of_time_usd_per_h`."""

    def finish_s(o: PoolOption) -> float:
        return now_s + wait_s(o, loads[o.pool]) + (o.duration_s or 0.0)

    def value(o: PoolOption) -> tuple[float, float, int]:
        delay_h = (finish_s(o) - now_s) / 3600.0
        return (o.cost_usd() + value_of_time_usd_per_h * delay_h, finish_s(o), options.index(o))

    if job.deadline_s is not None:
        meets = [o for o in options if finish_s(o) <= job.deadline_s]
        if not meets:
            best = min(options, key=lambda o: (finish_s(o), options.index(o)))
            return Choice(best, "no pool meets the deadline: the one that finishes first")
        best = min(meets, key=value)
        return Choice(best, f"cheapest meeting the deadline (${best.cost_usd():.2f})")
    best = min(options, key=value)
    return Choice(best, f"cheapest for its work (${best.cost_usd():.2f})")


def choose_across_sites(
    job: JobSpec,
    options: Sequence[PoolOption],
    loads: Mapping[str, PoolLoad],
    topo: Topology,
    now_s: float,
    aware: bool,
    user_region: str | None = None,
    latency_bound_ms: float | None = None,
    value_of_time_usd_per_h: float = 0.0,
) -> tuple[Choice | None, SiteDecision]:
    """Across sites: the federation's rules (transfer time, local queueing, latency,
    deadline, then completion time, plus cost when value_of_time_usd_per_h > 0) when
    aware; the most free GPUs when blind."""
    site_options = [
        SiteOption(
            site=o.site,
            gpu_type=o.gpu_type,
            run_s=o.duration_s or 0.0,
            gpus=o.gpu_count,
            price_usd_per_gpu_hour=o.price_usd_per_gpu_hour,
            est_wait_s=wait_s(o, loads[o.pool]),
            free_gpus=loads[o.pool].free_gpus,
        )
        for o in options
    ]
    job_ = FedJob(
        job_id=job.job_id,
        kind=job.kind.value,
        dataset=job.dataset,
        dataset_gb=job.dataset_gb,
        home_site=None,
        user_region=user_region or job.user_region,
        latency_bound_ms=(latency_bound_ms or job.latency_bound_ms)
        if job.kind is JobKind.ONLINE
        else None,
        deadline_s=job.deadline_s,
        submit_s=job.submit_s,
    )
    if aware:
        decision = fed.choose_site(job_, site_options, topo, now_s, value_of_time_usd_per_h)
    else:
        decision = fed.blind_choice(job_, site_options, topo)
    if decision.option is None:
        return None, decision
    picked = decision.option
    option = next(o for o in options if o.site == picked.site and o.gpu_type == picked.gpu_type)
    # Counted when the job has to queue where it goes and a remote site was refused only
    # because moving the data would take longer: the move a blind scheduler would make.
    remote = picked.est_wait_s > 0 and any("transfer" in why for _, why in decision.rejected)
    return Choice(option, decision.reason, remote), decision


# ---- GPU types by job class -------------------------------------------------------------------
@dataclass(frozen=True)
class ClassRule:
    """How a job kind ranks GPU types by default: a catalogue column, best first."""

    kind: JobKind
    rank_by: str
    descending: bool
    reads_as: str
    """How the rule reads in a reason: 'fastest', 'most memory', 'cheapest'."""


RANK_COLUMNS = ("price_usd_per_hour", "memory_gib", "bf16_tflops", "mem_bw_gb_s", "fp32_tflops")
"""Catalogue columns a class rule may rank by."""


@functools.lru_cache(maxsize=1)
def class_rules() -> dict[JobKind, ClassRule]:
    """The packaged rules (data/gpu_class_preferences.csv), one per job kind."""
    text = (resources.files("gpupool") / "data" / "gpu_class_preferences.csv").read_text(
        encoding="utf-8"
    )
    rules: dict[JobKind, ClassRule] = {}
    for row in csv.DictReader(text.splitlines()):
        if row["rank_by"] not in RANK_COLUMNS or row["order"] not in ("ascending", "descending"):
            raise SpecError(f"gpu_class_preferences.csv: bad rule for {row['kind']}: {row}")
        kind = JobKind(row["kind"])
        rules[kind] = ClassRule(kind, row["rank_by"], row["order"] == "descending", row["reads_as"])
    missing = [k.value for k in JobKind if k not in rules]
    if missing:
        raise SpecError(f"gpu_class_preferences.csv has no rule for {', '.join(missing)}")
    return rules


@dataclass(frozen=True)
class ClassRanking:
    """One job kind's GPU types, most preferred first, and why the first is first."""

    kind: JobKind
    types: tuple[str, ...]
    reads_as: str
    """'fastest', or 'configured' when placement.prefer names the type."""
    configured: frozenset[str] = frozenset()

    def rank(self, gpu_type: str) -> int:
        return self.types.index(gpu_type) if gpu_type in self.types else len(self.types)

    def why(self, gpu_type: str) -> str:
        return "configured" if gpu_type in self.configured else self.reads_as


def class_rankings(
    types: Sequence[str],
    catalog: Catalog | None,
    prefer: Mapping[str, Sequence[str]] | None = None,
) -> dict[JobKind, ClassRanking]:
    """Each job kind's order over the fleet's GPU types: the types `prefer[kind]` names
    first (in its order; names the fleet lacks are skipped), then the rest by the kind's
    rule over the catalogue (ties: cheaper, then by name); types the catalogue lacks last,
    by name."""
    rules = class_rules()
    names = sorted(set(types))
    out: dict[JobKind, ClassRanking] = {}
    for kind, rule in rules.items():
        known = [t for t in names if catalog is not None and t in catalog]

        def key(t: str, rule: ClassRule = rule) -> tuple[float, float, str]:
            assert catalog is not None
            gpu = catalog[t]
            value = float(getattr(gpu, rule.rank_by))
            return (-value if rule.descending else value, gpu.price_usd_per_hour, t)

        ranked = sorted(known, key=key) + [t for t in names if t not in known]
        first = [t for t in dict.fromkeys((prefer or {}).get(kind.value, ())) if t in names]
        order = tuple(first + [t for t in ranked if t not in first])
        out[kind] = ClassRanking(kind, order, rule.reads_as, frozenset(first))
    return out


def choose_by_class(
    job: JobSpec,
    options: Sequence[PoolOption],
    loads: Mapping[str, PoolLoad],
    ranking: ClassRanking,
    room: Mapping[str, int] | None = None,
) -> Choice:
    """The job kind's most preferred GPU type among the pools it can start on now (free
    GPUs, and room under its team's maximum when `room` gives it); when it can start
    nowhere, its most preferred type, to wait for. Never waits while a type it may use
    idles. Ties within a type: fewer GPUs, cheaper work, the options' order."""

    def key(o: PoolOption) -> tuple[int, int, float, int]:
        return (ranking.rank(o.gpu_type), o.gpu_count, o.cost_usd(), options.index(o))

    def startable(o: PoolOption) -> bool:
        free = loads[o.pool].free_gpus
        if room is not None:
            free = min(free, room.get(o.pool, free))
        return o.gpu_count <= free

    kind = job.kind.value
    top = min(options, key=key)
    now = [o for o in options if startable(o)]
    if not now:
        return Choice(
            top,
            f"GPU type {top.gpu_type}: {kind} prefers {top.gpu_type} "
            f"({ranking.why(top.gpu_type)}); none free, it waits for one",
        )
    best = min(now, key=key)
    if best.gpu_type == top.gpu_type:
        return Choice(
            best,
            f"GPU type {best.gpu_type}: {kind} prefers {best.gpu_type} "
            f"({ranking.why(best.gpu_type)})",
        )
    return Choice(
        best,
        f"GPU type {best.gpu_type}: {top.gpu_type} preferred ({ranking.why(top.gpu_type)}) "
        f"but busy, {best.gpu_type} idle",
    )


def plan_text(entries: Sequence[tuple[str, int | None, int]], chosen: str) -> str:
    """A sized job's plan: per GPU type of the fleet (type, the fewest GPUs that hold the
    job or None, the type's GPUs here), e.g. '4 x A100-80GB (chosen), RTX-4090: does not
    fit within the counts tried'."""
    parts = []
    for gpu_type, count, have in entries:
        if count is None:
            parts.append(f"{gpu_type}: does not fit within the counts tried")
        elif gpu_type == chosen:
            parts.append(f"{count} x {gpu_type} (chosen)")
        elif count > have:
            parts.append(f"{count} x {gpu_type} (more than the {have} here)")
        else:
            parts.append(f"{count} x {gpu_type}")
    return ", ".join(parts)

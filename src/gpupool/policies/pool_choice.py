"""Which pool (GPU type, and site) a job waits for, when more than one would do.

A job given by a model is sized per GPU type by the planner: how many GPUs of that type
hold it and how long its work takes there. A plain job may allow several types at the
same count and duration. Each scheduling cycle the decision core asks a chooser to
point every waiting, never-started job at one pool; the cycle policy then plans within
pools as before. Choices are re-made each cycle until the job starts, so a job follows
capacity as it frees; once started it stays on its GPU type (its progress is counted in
that type's seconds).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, replace

from gpupool.core.model import JobKind, JobSpec
from gpupool.core.state import BoolArray, ClusterState
from gpupool.federation import placement as fed
from gpupool.federation.placement import FedJob, SiteDecision, SiteOption
from gpupool.federation.topology import Topology


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

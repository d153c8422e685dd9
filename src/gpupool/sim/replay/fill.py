"""Fill experiment: tasks arrive one by one and never leave (Weng et al., ATC '23, §5).

The task list is shuffled with the seed, then "tuned up" by drawing tasks at random,
with replacement, until the total GPU request reaches `tune` x cluster capacity. Each
task is placed or reported unplaced; after every arrival the run samples allocation and
fragmentation. Curves are read at integer "arrived workload" percentages as the
authors' analysis does: the mean over all arrivals that round to that percentage.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gpupool.domain.engine import DecisionLog, Engine
from gpupool.domain.fragmentation import FragmentationMeter, typical_tasks
from gpupool.domain.model import Cluster, JobSpec
from gpupool.domain.state import ClusterState
from gpupool.policies import PolicyContext, placement_policy
from gpupool.sim.replay.common import ProgressFn

ARRIVED_PCT_MAX = 130


@dataclass
class FillResult:
    policy: str
    seed: int
    tune: float
    total_gpus: int
    arrived_milli: npt.NDArray[np.int64]
    used_milli: npt.NDArray[np.int64]
    frag_milli: npt.NDArray[np.float64]
    tasks: int
    placed: int
    unplaced: list[str]
    log: DecisionLog
    wall_s: float
    node_names: tuple[str, ...] = field(default=())

    def curves(self) -> dict[str, list[float]]:
        return discrete_curves(self)


def tuned_workload(
    pods: Sequence[JobSpec], capacity_milli: int, tune: float, rng: np.random.Generator
) -> list[JobSpec]:
    """Shuffle the list, then append random draws while the GPU request stays within
    `tune` x capacity. As in the authors' simulator, the stop test adds the drawn task's
    per-GPU share, and the first draw that would overshoot ends the tuning."""
    ordered = sorted(pods, key=lambda j: j.job_id)
    order = rng.permutation(len(ordered))
    workload = [ordered[i] for i in order]
    if tune <= 0:
        return workload
    target = tune * capacity_milli
    total = sum(j.total_gpu_milli for j in workload)
    if total > target:
        while total > target and workload:
            gone = workload.pop(int(rng.integers(len(workload))))
            total -= gone.total_gpu_milli
        return workload
    serial = 0
    while True:
        pick = ordered[int(rng.integers(len(ordered)))]
        per_gpu = pick.gpu_milli if pick.gpu_count else 0
        if total + per_gpu > target:
            break
        workload.append(_clone(pick, f"{pick.job_id}-tuned-{serial}"))
        total += pick.total_gpu_milli
        serial += 1
    return workload


def _clone(job: JobSpec, job_id: str) -> JobSpec:
    return JobSpec(
        job_id=job_id,
        gpu_count=job.gpu_count,
        gpu_milli=job.gpu_milli,
        cpu_milli=job.cpu_milli,
        mem_mib=job.mem_mib,
        gpu_models=job.gpu_models,
        team=job.team,
        priority=job.priority,
        kind=job.kind,
    )


def run_fill(
    cluster: Cluster,
    pods: Sequence[JobSpec],
    policy: str,
    seed: int,
    tune: float = 1.3,
    progress: ProgressFn | None = None,
    keep_log: bool = True,
) -> FillResult:
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    state = ClusterState(cluster)
    meter = FragmentationMeter(typical_tasks(pods), state.models)
    engine = Engine(
        state,
        placement_policy(policy, PolicyContext(meter=meter)),
        rng,
        DecisionLog(keep=keep_log),
    )
    workload = tuned_workload(pods, state.total_gpu_milli, tune, rng)
    state.tie_rank = rng.permutation(state.node_count).astype(np.int64)

    n = len(workload)
    node_frag = [_key_frag(meter, state, i) for i in range(state.node_count)]
    frag_total = float(sum(node_frag))
    # Samples go to lists, one per arrival, and become arrays once at the end.
    arrived, used, frag = [0], [0], [frag_total]
    arrived_total = 0
    unplaced: list[str] = []
    every = max(1, n // 100)
    for k, job in enumerate(workload, start=1):
        arrived_total += job.total_gpu_milli
        plan = engine.try_place(job, float(k))
        if plan is None:
            unplaced.append(job.job_id)
        else:
            for share in plan.shares:
                i = share.node
                new = _key_frag(meter, state, i)
                frag_total += new - node_frag[i]
                node_frag[i] = new
        arrived.append(arrived_total)
        used.append(state.used_gpu_milli)
        frag.append(frag_total)
        if progress is not None and (k % every == 0 or k == n):
            progress(k, n)
    return FillResult(
        policy=policy,
        seed=seed,
        tune=tune,
        total_gpus=int(state.gpu_count.sum()),
        arrived_milli=np.array(arrived, dtype=np.int64),
        used_milli=np.array(used, dtype=np.int64),
        frag_milli=np.array(frag, dtype=np.float64),
        tasks=n,
        placed=n - len(unplaced),
        unplaced=unplaced,
        log=engine.log,
        wall_s=time.perf_counter() - started,
        node_names=tuple(nd.name for nd in cluster.nodes),
    )


def _key_frag(meter: FragmentationMeter, state: ClusterState, node: int) -> float:
    """The node's fragmentation, read through its free key (shares already ascending)."""
    model_id, cpu_left, gpus = state.free_keys[int(state.free_id[node])]
    model = state.models[model_id]
    return meter.at_rank(model, meter.cpu_rank(model, cpu_left), gpus)


def discrete_curves(result: FillResult) -> dict[str, list[float]]:
    """Allocation and fragmentation at each integer arrived % from 0 to 130."""
    total = result.total_gpus
    arrived_pct = np.round(result.arrived_milli / total / 10.0)
    alloc_pct = np.round(result.used_milli / total / 10.0, 2)
    idle = total * 1000 - result.used_milli
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = np.where(idle > 0, np.round(100.0 * result.frag_milli / idle, 2), 0.0)
    out: dict[str, list[float]] = {
        "arrived_pct": [],
        "alloc_pct": [],
        "unallocated_pct": [],
        "frag_amount_pct": [],
        "frag_rate_pct": [],
    }
    for pct in range(ARRIVED_PCT_MAX + 1):
        sel = arrived_pct == pct
        if not sel.any():
            sel = (arrived_pct >= pct - 1) & (arrived_pct <= pct + 1)
            if not sel.any():
                continue
        alloc = round(float(alloc_pct[sel].mean()), 2)
        out["arrived_pct"].append(float(pct))
        out["alloc_pct"].append(alloc)
        out["unallocated_pct"].append(round(pct - alloc, 2))
        out["frag_amount_pct"].append(
            round(100.0 * float(result.frag_milli[sel].mean()) / 1000.0 / total, 2)
        )
        out["frag_rate_pct"].append(round(float(rate[sel].mean()), 2))
    return out

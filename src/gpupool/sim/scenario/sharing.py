"""A scenario of shared inference: online replicas asking for GPU memory, arriving among
whole-GPU offline work, placed by the one core under each placement policy.

Jobs arrive one per cycle and never leave (a fill, as in Weng et al., ATC '23, but
through the scheduling core: co-location rule, shares sized by memory per card, the
cycle policy). The figure is how many shares the fleet could not place when the
arrivals stop, and how much GPU capacity the placed jobs use: a placement that leaves
holes (parts of cards no later share fits) strands shares that a packing one places.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpupool.domain.model import MILLI_PER_GPU, Cluster, JobKind, JobSpec, Node
from gpupool.scheduler import Scheduler, Submitted
from gpupool.scheduler.config import PlacementConfig, SchedulerConfig
from gpupool.sizing.catalog import Catalog, load_catalog

SHARE_MEM_GIB = (10, 18, 24, 40)
"""What the online replicas ask for: a 7B model in bf16 with its KV cache (about 18 GiB)
and its smaller and larger neighbours."""
WHOLE_GPUS = (1, 2, 4)


@dataclass(frozen=True)
class SharingScenario:
    nodes: int = 16
    gpus_per_node: int = 8
    gpu_model: str = "A100-80GB"
    demand: float = 1.0
    """Arrivals stop once the GPUs they asked for reach this share of the fleet's."""
    share_fraction: float = 0.7
    """Share of the arrivals that are online replicas on part of one GPU."""
    seed: int = 0


@dataclass(frozen=True)
class SharingResult:
    policy: str
    seed: int
    shares: int
    shares_unplaced: int
    whole_jobs: int
    whole_unplaced: int
    allocated_pct: float
    """GPU capacity held by placed jobs when the arrivals stop."""


def workload(sc: SharingScenario, catalog: Catalog) -> list[JobSpec]:
    rng = np.random.default_rng(sc.seed)
    card_mib = round(catalog[sc.gpu_model].memory_gib * 1024)
    budget = sc.demand * sc.nodes * sc.gpus_per_node * MILLI_PER_GPU
    out: list[JobSpec] = []
    asked = 0.0
    while asked < budget:
        i = len(out)
        if rng.random() < sc.share_fraction:
            mib = int(rng.choice(SHARE_MEM_GIB)) * 1024
            out.append(JobSpec(f"s{i}", kind=JobKind.ONLINE, gpu_mem_mib=mib, submit_s=float(i)))
            asked += mib * MILLI_PER_GPU / card_mib
        else:
            count = int(rng.choice(WHOLE_GPUS))
            out.append(JobSpec(f"w{i}", gpu_count=count, kind=JobKind.OFFLINE, submit_s=float(i)))
            asked += count * MILLI_PER_GPU
    return out


def run(sc: SharingScenario, policy: str, catalog: Catalog | None = None) -> SharingResult:
    cluster = Cluster(
        "sharing",
        tuple(
            Node(f"n{k:02d}", sc.gpu_model, sc.gpus_per_node, 1_000_000, 1 << 30)
            for k in range(sc.nodes)
        ),
    )
    config = SchedulerConfig(
        cycle_s=1.0,
        online_reserve=0.0,
        share_cap=None,
        queue_depth=1 << 20,  # everything waiting is tried each cycle: a fill, no backlog cut
        placement=PlacementConfig(policy=policy),
    )
    cat = catalog or load_catalog()
    core = Scheduler(cluster, config, catalog=cat, seed=sc.seed)
    jobs = workload(sc, cat)
    for job in jobs:
        core.observe(Submitted(job.submit_s, job))
        core.cycle(job.submit_s)
    shares = [j for j in jobs if j.gpu_mem_mib is not None]
    placed = core.state.placements
    used = sum(core.state.jobs[j].total_gpu_milli for j in placed)
    return SharingResult(
        policy=policy,
        seed=sc.seed,
        shares=len(shares),
        shares_unplaced=sum(1 for j in shares if j.job_id not in placed),
        whole_jobs=len(jobs) - len(shares),
        whole_unplaced=sum(1 for j in jobs if j.gpu_mem_mib is None and j.job_id not in placed),
        allocated_pct=100.0 * used / (cluster.gpu_count * MILLI_PER_GPU),
    )


OPENB_MODEL = "openb-gpu"
"""The sampled openb nodes under one model name: the placement policy, not pool choice,
decides where a task goes (the tasks' own model constraints are dropped)."""


def openb_run(
    policy: str,
    seed: int = 0,
    node_stride: int = 8,
    demand: float = 1.0,
    share_kind: JobKind = JobKind.OFFLINE,
) -> SharingResult:
    """The Alibaba openb trace through the core: every `node_stride`-th GPU node, tasks
    drawn from its pods with replacement (by seed) until their GPU requests reach `demand`
    of the sample's GPUs, one per cycle, never leaving. Its GPU-sharing tasks (part of one
    GPU; in PAI mostly inference) run as online inference, the rest as batch: the
    co-location rule holds, and CPU counts, as in the FGD paper's fill."""
    from gpupool.sim.replay.experiments import DEFAULT_NODES, DEFAULT_PODS, embedded
    from gpupool.traces.openb import read_nodes, read_pods

    full, _ = read_nodes(embedded(DEFAULT_NODES))
    pods, _ = read_pods(embedded(DEFAULT_PODS))
    nodes = tuple(
        Node(n.name, OPENB_MODEL, n.gpu_count, n.cpu_milli, n.mem_mib)
        for n in full.nodes[::node_stride]
    )
    cluster = Cluster("openb-sample", nodes)
    gpu_pods = [p for p in pods if p.gpu_count > 0]
    rng = np.random.default_rng(seed)
    budget = demand * cluster.gpu_count * MILLI_PER_GPU
    jobs: list[JobSpec] = []
    asked = 0
    while asked < budget:
        p = gpu_pods[int(rng.integers(len(gpu_pods)))]
        i = len(jobs)
        jobs.append(
            JobSpec(
                f"{'s' if p.shares_gpu else 'w'}{i}",
                gpu_count=p.gpu_count,
                gpu_milli=p.gpu_milli,
                cpu_milli=p.cpu_milli,
                mem_mib=p.mem_mib,
                kind=share_kind if p.shares_gpu else JobKind.BATCH,
                submit_s=float(i),
            )
        )
        asked += p.total_gpu_milli
    config = SchedulerConfig(
        cycle_s=1.0,
        online_reserve=0.0,
        share_cap=None,
        queue_depth=64,
        placement=PlacementConfig(policy=policy),
    )
    core = Scheduler(cluster, config, seed=seed)
    for job in jobs:
        core.observe(Submitted(job.submit_s, job))
        core.cycle(job.submit_s)
    placed = core.state.placements
    shares = [j for j in jobs if j.shares_gpu]
    used = sum(core.state.jobs[j].total_gpu_milli for j in placed)
    return SharingResult(
        policy=policy,
        seed=seed,
        shares=len(shares),
        shares_unplaced=sum(1 for j in shares if j.job_id not in placed),
        whole_jobs=len(jobs) - len(shares),
        whole_unplaced=sum(1 for j in jobs if not j.shares_gpu and j.job_id not in placed),
        allocated_pct=100.0 * used / (cluster.gpu_count * MILLI_PER_GPU),
    )

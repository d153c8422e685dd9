"""The live service's configuration, and the fleet it describes as the core counts it.

`LiveConfig` is what `gpupool serve` was started with; `map_fleet` turns it and the
telemetry's inventory into the core's `Cluster` and the indices that translate between
the core's (node, local GPU), the API's GPU index and the telemetry's."""

from __future__ import annotations

import dataclasses
import socket
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpupool.domain.model import Cluster, JobKind, JobSpec, Node
from gpupool.energy.tariff import Tariff, load_tariff, on_wall_clock
from gpupool.errors import SpecError
from gpupool.policies.preemption import PreemptionRules
from gpupool.ports.telemetry.base import GpuInfo
from gpupool.scheduler.config import SchedulerConfig
from gpupool.server.agent.storage import StorageConfig
from gpupool.server.executors.mps import Mps, NoMps
from gpupool.server.fleet.labels import NodeLabels
from gpupool.server.fleet.sites import SitesConfig, with_cloud_nodes
from gpupool.server.loop.diskspace import DiskFloor
from gpupool.server.loop.endpoints import NetworkConfig
from gpupool.server.store import JobRow, RetryPolicy
from gpupool.server.telemetry.history import HistoryConfig
from gpupool.server.telemetry.misses import DEFAULT_MISS_LIMIT

LIVE_DEFAULTS = SchedulerConfig(
    cycle_s=1.0,
    online_reserve=0.2,
    online_reserve_on="online-seen",
    preemption=PreemptionRules(60.0, 3, reserve_vacate_s=30.0),
    share_cap=None,
    autoscale_down_stable_s=300.0,
    autoscale_load_window_s=60.0,
    autoscale_demand="reactive",
)
"""The service's defaults where they differ from a scenario's: a cycle a second; the 20%
online reserve applies in a pool once an online job was submitted for it (a fleet that
never serves keeps every GPU), and training borrows it only if it checkpoints within
30 s; a minute's minimum runtime (online inference does not wait for it); no cap on
online replicas per GPU (as many as their shares fit; a scenario keeps its cap of 2 so
that its figures stay those of the calibrated co-location model); a service's p99 and
rate measured over the last minute, and scaled down only after 5 minutes of low demand; a
service's replicas follow its measured rate (`autoscale.demand: reactive`; `forecast`
learns it)."""


def one_team_per_card(sched: SchedulerConfig, mps: Mps, isolation: object) -> SchedulerConfig:
    """`sharing.one_team_per_card` where the file leaves it open: on where MPS enforces
    shares and each team's jobs run as the team's own user. MPS serves one user per card
    at a time: measured on an H200, a second user's job sat in CUDA's start-up until the
    first user's had ended (bench/device_mps_access.py)."""
    if sched.sharing.one_team_per_card is not None:
        return sched
    separate_users = bool(getattr(isolation, "enabled", False))
    on = separate_users and not isinstance(mps, NoMps)
    return dataclasses.replace(
        sched, sharing=dataclasses.replace(sched.sharing, one_team_per_card=on)
    )


@dataclass(frozen=True)
class LiveConfig:
    """What the live service runs by: `gpupool serve`'s options and its --config file."""

    state_dir: Path
    scheduling: SchedulerConfig = LIVE_DEFAULTS
    """What the core decides by: the same section a scenario file has."""
    sample_s: float = 1.0
    monitor_s: float = 300.0
    host: str = field(default_factory=socket.gethostname)
    nodes: tuple[tuple[str, str, int], ...] = ()
    """An explicit fleet of (node name, GPU model, GPU count), e.g. the nodes of a Ray
    cluster: one Node each, GPUs numbered 0.. on each node. Empty: `build_cluster`."""
    sites: SitesConfig | None = None
    """Several clusters: each node's site, the federation's placement rules, cloud nodes
    (which join `nodes` here, down until started). None: one cluster."""
    node_sites: tuple[tuple[str, str], ...] = ()
    """(node, site) the nodes declared themselves (e.g. a Ray node's site resource)."""
    node_labels: NodeLabels = ()
    """(node, its labels): where each node sits in the network (server/fleet/labels.py)."""
    seed: int = 0
    """Seeds the core's random choices (placement ties of random policies)."""
    source: str = "the scheduling configuration"
    """Where `scheduling` came from (the --config file), for error messages."""
    retention_s: float | None = 30 * 86_400.0
    """Jobs that ended longer ago than this are deleted with their events and job
    directories (and job-less events as old); None keeps everything."""
    purge_every_s: float = 3600.0
    purge_batch: int = 200
    """Jobs (and job-less events) deleted per loop step while a purge finds more."""
    lost_retries: int = 3
    """How often a job may be requeued because it was lost (its process vanished without
    an exit record, its node left) before it fails instead."""
    disk_floor: DiskFloor = field(default_factory=DiskFloor)
    """Launches wait (reason DiskFull) while the state directory has less free space."""
    health_late_s: float | None = None
    """/healthz is unhealthy when the last completed cycle is older; None: max(10 s, 5
    cycles)."""
    db_retry: RetryPolicy = field(default_factory=RetryPolicy)
    """How the loop retries a database that is locked, unreachable or full."""
    scrape_s: float = 1.0
    """How often each running service replica's /metrics is scraped (docs/services.md)."""
    scrape_timeout_s: float = 0.5
    history: HistoryConfig = field(default_factory=HistoryConfig)
    """The telemetry history's buckets, retention and row cap (the --config history:)."""
    storage: StorageConfig = field(default_factory=StorageConfig)
    """Where checkpoints live so every node finds them (the --config storage:)."""
    network: NetworkConfig = field(default_factory=NetworkConfig)
    """The server's own node address and the replicas' port range (--config network:)."""
    telemetry_miss_limit: int = DEFAULT_MISS_LIMIT
    """Missed answers in a row of a node's telemetry (a Ray node's actor) before its GPUs
    read as lost and are drained; until then its last answer stands in."""

    @property
    def cycle_s(self) -> float:
        return self.scheduling.cycle_s

    @property
    def late_after_s(self) -> float:
        if self.health_late_s is not None:
            return self.health_late_s
        return max(10.0, 5 * self.cycle_s)

    @property
    def jobs_dir(self) -> Path:
        """Where each job's directory is: logs, exit records, handles, checkpoints."""
        return self.state_dir / "jobs"

    def run_dir(self, job_id: int) -> Path:
        return self.jobs_dir / str(job_id)

    def checkpoint_dir(self, job_id: int) -> Path:
        """Where the job's checkpoints are: in shared storage, else its run directory."""
        shared = self.storage.checkpoint_dir(job_id)
        return shared if shared is not None else self.run_dir(job_id) / "checkpoint"


def build_cluster(
    inventory: Sequence[GpuInfo], host: str
) -> tuple[Cluster, dict[tuple[int, int], int]]:
    """One node per GPU model on this machine; (node, local GPU) -> NVML device index."""
    by_model: dict[str, list[GpuInfo]] = defaultdict(list)
    for gpu in inventory:
        by_model[gpu.model].append(gpu)
    nodes = []
    devices: dict[tuple[int, int], int] = {}
    for k, (model, gpus) in enumerate(sorted(by_model.items())):
        nodes.append(Node(f"{host}/{model}", model, len(gpus), 1_000_000, 1 << 30, cluster=host))
        for g, gpu in enumerate(sorted(gpus, key=lambda x: x.index)):
            devices[(k, g)] = gpu.index
    return Cluster(host, tuple(nodes)), devices


def build_fleet(
    fleet: Sequence[tuple[str, str, int]],
    name: str,
    sites: Mapping[str, str] | None = None,
    labels: NodeLabels = (),
) -> tuple[Cluster, dict[tuple[int, int], int]]:
    """One node per (name, model, count) entry, in its site (`sites`, else `name`), with
    its `labels`; (node, local GPU) -> the same local index."""
    where = sites or {}
    labelled = dict(labels)
    nodes = tuple(
        Node(
            n,
            model,
            count,
            1_000_000,
            1 << 30,
            cluster=where.get(n, name),
            labels=labelled.get(n, ()),
        )
        for n, model, count in fleet
    )
    devices = {(k, g): g for k, node in enumerate(nodes) for g in range(node.gpu_count)}
    return Cluster(name, nodes), devices


@dataclass(frozen=True)
class FleetMap:
    """Where the core's GPUs are: its cluster, and for each (node, local GPU) of the core
    the GPU's index as the API shows it and the telemetry's index of it."""

    cluster: Cluster
    devices: dict[tuple[int, int], int]
    """(node, local GPU) -> the GPU's index as the API and the job rows show it."""
    tele_index: dict[tuple[int, int], int]
    """(node, local GPU) -> the telemetry's GPU index, where the telemetry has the GPU."""
    key_of: dict[tuple[str, int], tuple[int, int]]
    """(node name, GPU index as the API shows it) -> (node, local GPU) of the core."""
    gpu_info: dict[int, GpuInfo]
    """The telemetry's GPUs by index."""
    declared: bool
    """A declared fleet of nodes (`LiveConfig.nodes`, the sites' cloud nodes), not this
    machine's GPUs."""

    def node_names(self) -> set[str]:
        return {n.name for n in self.cluster.nodes}


def map_fleet(config: LiveConfig, inventory: Sequence[GpuInfo]) -> FleetMap:
    """The fleet of `config.nodes` (and the sites' cloud nodes), each node in its site, or
    else this machine's GPUs (`build_cluster`)."""
    sites = config.sites
    fleet = with_cloud_nodes(config.nodes, sites)
    if fleet:
        declared = dict(config.node_sites)
        site_of: dict[str, str] = {}
        for name, _, _ in fleet:
            site = sites.site_of(name, declared.get(name)) if sites else declared.get(name)
            if sites is not None and site is None:
                raise SpecError(
                    f"node {name} has no site: list it under nodes: in the sites file "
                    f"or declare it on the node (gpupool_site_<site>)"
                )
            if site is not None:
                site_of[name] = site
        cluster, devices = build_fleet(fleet, config.host, site_of, config.node_labels)
        # The telemetry's GPUs stand for the fleet's, in fleet order, where it has them.
        order = sorted(devices)
        known = {g.index for g in inventory}
        tele_index = {key: i for i, key in enumerate(order) if i in known}
    else:
        cluster, devices = build_cluster(inventory, config.host)
        if config.node_labels:  # `labels:` of --config, by this machine's node names
            labelled = dict(config.node_labels)
            nodes = tuple(
                dataclasses.replace(n, labels=labelled.get(n.name, n.labels)) for n in cluster.nodes
            )
            cluster = Cluster(cluster.name, nodes)
        tele_index = dict(devices)
    key_of = {(cluster.nodes[k].name, dev): (k, g) for (k, g), dev in devices.items()}
    gpu_info = {g.index: g for g in inventory}
    return FleetMap(cluster, devices, tele_index, key_of, gpu_info, bool(fleet))


def spec_of(row: JobRow) -> JobSpec:
    """The core's spec of a job as the database holds it."""
    return JobSpec(
        job_id=str(row.id),
        gpu_count=row.gpu_count,
        gpu_milli=row.gpu_milli if row.gpu_count else 1000,
        gpu_mem_mib=row.gpu_mem_mib if row.gpu_count == 1 else None,
        gpu_models=frozenset({row.gpu_model}) if row.gpu_model else frozenset(),
        team=row.team,
        priority=row.priority,
        kind=JobKind(row.kind),
        submit_s=row.submitted_at,
        duration_s=row.duration_s,
        checkpoint_interval_s=row.checkpoint_every_s or 3600.0,
        deadline_s=row.deadline_at
        if row.deadline_at is not None and row.deadline_at >= row.submitted_at
        else None,
        dataset=row.dataset,
        dataset_gb=row.dataset_gb,
        user_region=row.user_region,
        latency_bound_ms=row.latency_bound_ms,
        state_gib_per_gpu=row.state_gib_per_gpu,
        time_limit_s=row.time_limit_s,
        gpu_count_min=row.gpu_count_min,
        name=row.name,
        user=row.user or row.owner or "",
        topology=row.topology,
        topology_preferred=row.topology_preferred,
    )


def site_tariffs(config: SchedulerConfig, sites: set[str]) -> dict[str, Tariff | None]:
    """The electricity tariff of each site (energy.tariff, energy.site_tariffs)."""
    e = config.energy
    names = {site: e.site_tariffs.get(site, e.tariff) for site in sorted(sites)}
    loaded = {
        name: on_wall_clock(load_tariff(name)) for name in set(names.values()) if name is not None
    }
    return {site: loaded[name] if name is not None else None for site, name in names.items()}

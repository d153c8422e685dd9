"""The live driver: the scheduler core fed by the database, an executor and telemetry.

One thread runs `step()` every cycle: new jobs from the database join the scheduler,
finished processes are reaped, GPU health is sampled, and the cycle's decisions are
carried out (launch processes, preempt with SIGTERM and a grace period). The database
is the truth a restart recovers from: a job is written as running before its process
starts, its process handle right after, and every state change with an event in one
transaction. The API thread only writes new jobs and cancel requests to the database
and wakes the loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import math
import shutil
import socket
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpupool.domain.lifecycle import JobState
from gpupool.domain.model import Cluster, JobKind, JobSpec, Node, NodeShare, Placement
from gpupool.energy.tariff import Tariff, load_tariff, on_wall_clock
from gpupool.errors import (
    ConflictError,
    GpupoolError,
    IllegalTransition,
    NotFoundError,
    SpecError,
    Unavailable,
)
from gpupool.policies.preemption import PreemptionRules
from gpupool.ports.clock.base import Clock
from gpupool.ports.cloud.base import CommandRunner
from gpupool.ports.executor.base import (
    MULTI_NODE_REFUSED,
    NO_LIMITS,
    Executor,
    Exit,
    Gang,
    GangMember,
    Handle,
    JobUser,
    LaunchSpec,
)
from gpupool.ports.telemetry.base import GpuInfo, GpuSample, Telemetry
from gpupool.ports.telemetry.fake import FakeTelemetry, declared_use
from gpupool.scheduler import (
    Burst,
    Cancel,
    Command,
    Defer,
    Drain,
    Expire,
    GpuTemps,
    GpuUsage,
    Hold,
    Launch,
    Progress,
    Reclaim,
    Release,
    Requeue,
    Resize,
    Resized,
    Scale,
    Scheduler,
    ServiceDemand,
    ServiceLoad,
    ServiceTemplate,
    SetPowerCap,
    Stop,
    Wait,
    pool_key,
)
from gpupool.scheduler.commands import LearnGuard, LearnShadow
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.config_schema import check_fleet
from gpupool.server.executors.files import launch_file
from gpupool.server.executors.mps import Mps, MpsError, NoMps, ShareRequest, detect_mps, share_env
from gpupool.server.fleet.sites import (
    DOWN,
    STARTING,
    CloudNodes,
    SitesConfig,
    pool_prices,
    with_cloud_nodes,
)
from gpupool.server.ha.lease import Lease
from gpupool.server.loop.diskspace import DiskFloor, DiskProbe, DiskSpace, StatvfsDisk
from gpupool.server.loop.health import LoopHealth
from gpupool.server.loop.learning import Evidence, ShadowTally, check_evidence, outcomes_of
from gpupool.server.store import (
    TERMINAL,
    JobRow,
    NewJob,
    NewService,
    Retry,
    RetryPolicy,
    ServiceRow,
    Store,
    transient,
)
from gpupool.server.telemetry.history import HistoryConfig, attach, running_replicas
from gpupool.server.telemetry.monitor import MonitorRule, Signals
from gpupool.server.telemetry.prometheus import StartLatency
from gpupool.server.telemetry.replica_load import LoadWindow, Measured, Scraper
from gpupool.sizing.catalog import load_catalog
from gpupool.sizing.request_json import plan_request_from

log = logging.getLogger("gpupool.server")

ENVIRONMENT_ERRNOS = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EROFS,
        errno.EMFILE,
        errno.ENFILE,
        errno.EIO,
        errno.ENOMEM,
        errno.EAGAIN,
        errno.EACCES,
        errno.EPERM,
    }
)
"""OS errors that say the server's machine is in trouble (disk, descriptors, memory), not
the job: a launch that fails with one is requeued, and launches pause for a while."""

LOST_PREFIX = "lost: "
"""The reason of a requeue because the job was lost: counted against `lost_retries`."""

LIVE_DEFAULTS = SchedulerConfig(
    cycle_s=1.0,
    online_reserve=0.2,
    online_reserve_on="online-seen",
    preemption=PreemptionRules(60.0, 3, reserve_vacate_s=30.0),
    share_cap=None,
    autoscale_down_stable_s=300.0,
    autoscale_load_window_s=60.0,
)
"""The service's defaults where they differ from a scenario's: a cycle a second; the 20%
online reserve applies in a pool once an online job was submitted for it (a fleet that
never serves keeps every GPU), and training borrows it only if it checkpoints within
30 s; a minute's minimum runtime (online inference does not wait for it); no cap on
online replicas per GPU (as many as their shares fit; a scenario keeps its cap of 2 so
that its figures stay those of the calibrated co-location model); a service's p99 and
rate measured over the last minute, and scaled down only after 5 minutes of low demand."""


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

    @property
    def cycle_s(self) -> float:
        return self.scheduling.cycle_s

    @property
    def late_after_s(self) -> float:
        if self.health_late_s is not None:
            return self.health_late_s
        return max(10.0, 5 * self.cycle_s)


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
    fleet: Sequence[tuple[str, str, int]], name: str, sites: Mapping[str, str] | None = None
) -> tuple[Cluster, dict[tuple[int, int], int]]:
    """One node per (name, model, count) entry, in its site (`sites`, else `name`);
    (node, local GPU) -> the same local index."""
    where = sites or {}
    nodes = tuple(
        Node(n, model, count, 1_000_000, 1 << 30, cluster=where.get(n, name))
        for n, model, count in fleet
    )
    devices = {(k, g): g for k, node in enumerate(nodes) for g in range(node.gpu_count)}
    return Cluster(name, nodes), devices


@dataclass(frozen=True)
class _Prepared:
    """A launch recorded as running, waiting for its process."""

    decision: Launch
    row: JobRow
    spec: LaunchSpec
    node: str


def spec_of(row: JobRow) -> JobSpec:
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
    )


RESIZE_EXITS = ("preempted", "killed", "lost")
"""How a resizing job's processes may leave (checkpointed, killed after the grace, gone):
each is relaunched on the new GPUs, resuming from its checkpoint."""

TIME_LIMIT_REASON = "ran past its "
"""How the reason of a job stopped at its time limit begins (core: Expire)."""


class LiveService:
    def __init__(
        self,
        config: LiveConfig,
        store: Store,
        executor: Executor,
        telemetry: Telemetry,
        clock: Clock,
        probe: Callable[[], dict[str, str]] | None = None,
        cloud_runner: CommandRunner | None = None,
        disk: DiskProbe | None = None,
        lease: Lease | None = None,
        mps: Mps | None = None,
    ) -> None:
        """`probe`, for a fleet of `config.nodes`, names the nodes alive now (node name ->
        an id that changes when the node restarts, e.g. the Ray node id): polled at most
        once a second, a node it no longer lists is lost and its jobs requeued. `disk`
        measures the state directory's free space (statvfs of it by default); `lease`, the
        controller lease this service was started under: the loop stops when it is lost."""
        self.config = config
        self.stopping = threading.Event()
        self.health = LoopHealth(config.late_after_s)
        self.stage = "start"
        """What the loop is doing now, for errors reported from deep inside (retries)."""
        self.raw_store = store
        """The store without retries: for best-effort writes that must not hold the loop."""
        self.store = store.retrying(Retry(config.db_retry, self._db_retry, self.stopping))
        self.executor = executor
        self.telemetry = telemetry
        self.clock = clock
        self.inventory = telemetry.inventory()
        self.gpu_info = {g.index: g for g in self.inventory}
        sites = config.sites
        fleet = with_cloud_nodes(config.nodes, sites)
        self.fleet = bool(fleet)
        if self.fleet:
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
            self.cluster, self.devices = build_fleet(fleet, config.host, site_of)
            # The telemetry's GPUs stand for the fleet's, in fleet order, where it has them.
            order = sorted(self.devices)
            known = {g.index for g in self.inventory}
            self.tele_index = {key: i for i, key in enumerate(order) if i in known}
        else:
            self.cluster, self.devices = build_cluster(self.inventory, config.host)
            self.tele_index = dict(self.devices)
        self.key_of = {
            (self.cluster.nodes[k].name, dev): (k, g) for (k, g), dev in self.devices.items()
        }
        """(node name, GPU index as the API shows it) -> (node, local GPU) of the core."""
        self.probe = probe
        self.last_probe = -1e18
        self.gone: dict[str, tuple[str | None, float]] = {}
        """Nodes the probe or a lost job took out: (their id then, None if unlisted; when)."""
        sched = config.scheduling
        multi_site = len({n.cluster for n in self.cluster.nodes}) > 1
        pools = {pool_key(n, multi_site): (n.cluster, n.gpu_model) for n in self.cluster.nodes}
        catalog = load_catalog()
        topology = None
        prices = {
            key: catalog[model].price_usd_per_hour if model in catalog else 0.0
            for key, (_, model) in pools.items()
        }
        if sites is not None:
            topology = sites.topology
            prices = pool_prices(sites, pools)
            sched = dataclasses.replace(
                sched,
                placement=dataclasses.replace(
                    sched.placement,
                    site=sites.placement,
                    value_of_time_usd_per_h=sites.value_of_time_usd_per_h,
                ),
                burst=sites.burst,
            )
        self.mps: Mps = (
            mps
            if mps is not None
            else detect_mps(
                config.state_dir / "mps",
                real_gpus=not isinstance(telemetry, FakeTelemetry) and not self.fleet,
            )
        )
        """Enforces GPU shares where the driver has MPS (server/executors/mps.py); else advisory."""
        sched = one_team_per_card(sched, self.mps, getattr(executor, "isolation", None))
        # Elastic jobs lend GPUs only where the executor can restart a job on other GPUs.
        resize = sched.elastic.resize and executor.can_resize
        sched = dataclasses.replace(
            sched, elastic=dataclasses.replace(sched.elastic, resize=resize)
        )
        self.scheduler = Scheduler(
            self.cluster,
            sched,
            pool_price=prices,
            topology=topology,
            catalog=catalog,
            tariffs=_site_tariffs(sched, {n.cluster for n in self.cluster.nodes}),
            cloud_nodes=[c.name for c in sites.cloud_nodes] if sites is not None else (),
            seed=config.seed,
            replica_id=self._new_replica,
        )
        check_fleet(sched, self.scheduler.fleet.pool_gpus, config.source)
        self.cloud: CloudNodes | None = None
        if sites is not None and sites.cloud_nodes:
            self.cloud = CloudNodes(sites, config.state_dir, cloud_runner)
            now = clock.now()
            for c in sites.cloud_nodes:  # out of the pool until started and joined
                self.gone[c.name] = (None, now)
        self.lock = threading.RLock()
        self.wake = threading.Event()
        self.seen_id = 0
        self.evicting: dict[str, str] = {}
        """Jobs stopped because their node went bad: requeued when they exit."""
        self.resizing: dict[str, Placement] = {}
        """Elastic jobs whose processes are leaving for a resize: relaunched on these GPUs
        (the core's Launch) when they exit; the job stays running."""
        self.samples: list[GpuSample] = []
        self.monitor = MonitorRule(every_s=config.monitor_s)
        self.signals: Signals | None = None
        self.signals_at: float | None = None
        self.last_sample = -1e18
        self.bad_nodes: set[str] = set()
        self.nodes_lost: dict[str, int] = defaultdict(int)
        """Times each node was lost (left the cluster, or its jobs' actors died)."""
        self.decisions: list[tuple[float, str, str]] = []
        """(time, action, job) of every start, resume and preemption: what parity compares."""
        self.placed: list[tuple[float, str, str, tuple[tuple[str, int], ...]]] = []
        """(time, start|resume, job, ((node, GPU index), ...)) of every launch."""
        self.on_decision: Callable[[float, str, str], None] | None = None
        self.commands: list[tuple[float, Command]] | None = None
        """When set, every command the core returned, with its time (parity tests)."""
        self.thread: threading.Thread | None = None
        self.loop_error: str | None = None
        self.lease = lease
        self.on_lease_lost: Callable[[], None] | None = None
        """Called (from the loop thread) once the lease is lost and the loop has stopped."""
        self.jobs_dir = config.state_dir / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.next_purge = -1e18
        self.disk: DiskProbe = disk if disk is not None else StatvfsDisk(self.jobs_dir)
        self.disk_space: DiskSpace | None = None
        self.gate: str | None = None
        """Why launches wait now (DiskFull, ReadOnly, LaunchFailing), or None."""
        self.told: dict[int, str] = {}
        """Waiting jobs whose reason says why launches wait: job -> the reason they had."""
        self.told_kind: dict[int, str] = {}
        self.reported: dict[tuple[str, int | None, str], float] = {}
        """When each distinct loop error was last logged (repeats are logged once a minute)."""
        self.launch_backoff_s = 0.0
        self.launch_retry_at = -1e18
        self.launch_error: str | None = None
        self.service_rows: dict[str, ServiceRow] = {}
        """The live services, as stored (their replicas' command, env, port variable)."""
        self.ports: dict[str, int] = {}
        """Each running replica's loopback port."""
        self.cancel_why: dict[str, str] = {}
        """Why the core cancelled a replica (scaled down, service deleted)."""
        self.scraper = Scraper(
            LoadWindow(sched.autoscale_load_window_s),
            clock.now,
            every_s=config.scrape_s,
            timeout_s=config.scrape_timeout_s,
        )
        self.served: dict[str, deque[tuple[float, float]]] = defaultdict(deque)
        """Each service's measured rate (short window) over the look-ahead: its demand."""
        self.service_load: dict[str, Measured] = {}
        self.replica_load: dict[str, Measured] = {}
        self.last_service_sample = -1e18
        self.start_latency = StartLatency()
        """Queue wait and submit-to-start histograms by kind, observed as processes start."""
        self.history = attach(self)
        """Per-card bucket means and services' p99, written once a bucket (the review's)."""
        self.wait_codes: dict[int, str] = {}
        self.shadow = ShadowTally()
        """Shadow cycles of the learned policy since start (counts; events are bounded)."""
        self.learning = sched.policy == "learned"
        """Whether the core runs the learned policy (shadow or active)."""
        for svc in self.store.services.list():
            self._load_service(svc)
            made = len(self.store.services.replicas(svc.name, False))
            self.scheduler.restore_service(svc.name, made)
        now = clock.now()
        if self.learning:  # what finished before this start is the learner's first history
            self.scheduler.learning_seed(outcomes_of(self.store.history.finished_runs(None, now)))
        self.recover()
        self._recover_lifecycle()
        if self.learning:
            self._restore_learning_mode(now)
        for row in self.store.jobs.active():  # replicas of a service deleted while we were down
            if row.service is not None and row.service not in self.service_rows:
                self.cancel(row.id)

    # ---- restart ------------------------------------------------------------------------------
    def recover(self) -> None:
        """Rebuild the scheduler from the database; re-adopt processes that still run."""
        now = self.clock.now()
        node_of = {n.name: i for i, n in enumerate(self.cluster.nodes)}
        for row in self.store.jobs.active():
            self.seen_id = max(self.seen_id, row.id)
            spec = spec_of(row)
            if row.state in ("running", "preempting"):
                placement = self._placement_of(row, node_of)
                state = JobState.RUNNING if row.state == "running" else JobState.PREEMPTING
                self.scheduler.restore(
                    spec, state, placement, now, row.preemptions, service=self._live(row)
                )
                if row.port is not None and row.service is not None:
                    self.ports[str(row.id)] = row.port
                handle = self._handle_of(row)
                # Found by its cgroup or launch token, however far its launch had got: a
                # job whose shim is gone is ended by the executor (and reported, "lost"
                # unless it left a record) before the core can place it again.
                adopted = handle is not None and self.executor.adopt(handle, self.run_dir(row.id))
                if adopted and handle is not None:
                    found = self.executor.handles().get(str(row.id), handle)
                    how = ""
                    if found.pid != handle.pid:  # the crash came before its pid was stored
                        how = " (found by its launch intent)"
                        self.store.jobs.set_process(
                            row.id, found.pid, found.pgid, found.start_ticks, now
                        )
                    self.store.events.add(
                        "adopted",
                        f"pid {found.pid} still runs: re-adopted{how}",
                        now,
                        job_id=row.id,
                    )
                if adopted and row.state == "preempting":
                    self.executor.preempt(str(row.id), row.grace_s, now)
                if row.state == "running" and row.resize_gpus is not None and handle is not None:
                    self._recover_resize(row, node_of, adopted, now)
                if handle is None:  # it never started: back in the queue
                    self._requeue(row.id, now, "the scheduler stopped before it started")
            elif row.state in ("pending", "suspended"):
                state = JobState.PENDING if row.state == "pending" else JobState.SUSPENDED
                self.scheduler.restore(
                    spec, state, None, now, row.preemptions, service=self._live(row)
                )

    def _live(self, row: JobRow) -> str | None:
        """The live service a row is a replica of (None: a job of its own, or a replica
        whose service was deleted: it is cancelled once recovered)."""
        return row.service if row.service in self.service_rows else None

    # ---- services -----------------------------------------------------------------------------
    def _template(self, svc: NewService | ServiceRow) -> ServiceTemplate:
        """The core's template of a service; a replica's share of a card from its GPU
        memory over the largest card it may use."""
        milli = svc.gpu_milli
        if svc.gpu_model is not None and svc.gpu_model not in {
            n.gpu_model for n in self.cluster.nodes
        }:
            have = ", ".join(sorted({n.gpu_model for n in self.cluster.nodes}))
            raise SpecError(f"service {svc.name} asks for {svc.gpu_model}; this fleet has {have}")
        if svc.gpu_mem_mib is not None:
            models = sorted({n.gpu_model for n in self.cluster.nodes})
            allowed = [m for m in models if svc.gpu_model is None or m == svc.gpu_model]
            cards = [c for m in allowed if (c := self.scheduler.fleet.card_mem_mib(m)) is not None]
            big = max(cards, default=0)
            if svc.gpu_mem_mib > big:
                raise SpecError(
                    f"service {svc.name} asks for {svc.gpu_mem_mib} MiB of GPU memory per "
                    f"replica; the largest card it may use here has {big} MiB "
                    f"({', '.join(allowed)})"
                )
            milli = min(1000, -(-svc.gpu_mem_mib * 1000 // big))
        return ServiceTemplate(
            name=svc.name,
            team=svc.team,
            replica_rps=svc.replica_rps,
            slo_p99_ms=svc.slo_p99_ms,
            replica_gpu_milli=milli,
            min_replicas=svc.min_replicas,
            max_replicas=svc.max_replicas,
            gpu_models=frozenset({svc.gpu_model}) if svc.gpu_model else frozenset(),
            priority=svc.priority,
        )

    def _load_service(self, row: ServiceRow) -> None:
        self.scheduler.add_service(self._template(row))
        self.service_rows[row.name] = row

    def _new_replica(self, service: str, seq: int, gpu_milli: int) -> str:
        """The core wants a replica: it becomes a job row (its id, the core's job id)."""
        svc = self.service_rows[service]
        job = NewJob(
            name=f"{service}-r{seq}",
            team=svc.team,
            kind="online-inference",
            priority=svc.priority,
            gpu_count=1,
            command=svc.command,
            env=svc.env,
            cwd=svc.cwd,
            gpu_model=svc.gpu_model,
            grace_s=svc.grace_s,
            max_retries=3,
            owner=svc.owner_token,
            gpu_milli=gpu_milli,
            service=service,
        )
        row, _ = self.store.jobs.submit(job, self.clock.now())
        return str(row.id)

    def create_service(self, svc: NewService) -> ServiceRow:
        """Called by the API: the service is stored and its replicas follow at once."""
        with self.lock:
            self._template(svc)  # refused before anything is stored
            row = self.store.services.create(svc, self.clock.now())
            self._load_service(row)
            made = len(self.store.services.replicas(row.name, False))
            self.scheduler.restore_service(row.name, made)
            self.wake.set()
            return row

    def scale_service(self, name: str, low: int, high: int) -> ServiceRow:
        with self.lock:
            row = self.store.services.scale(name, low, high, self.clock.now())
            self._load_service(row)
            self.wake.set()
            return row

    def delete_service(self, name: str) -> ServiceRow:
        """Called by the API: the service is gone; its replicas stop with their grace."""
        with self.lock:
            now = self.clock.now()
            row = self.store.services.delete(name, now)
            if name in self.scheduler.services:
                self._carry_out(self.scheduler.remove_service(name, now), now)
            self.service_rows.pop(name, None)
            self.served.pop(name, None)
            self.service_load.pop(name, None)
            self.wake.set()
            return row

    def service_view(self, name: str) -> dict[str, Any]:
        """A service with its replicas and what they measured (GET /v1/services/NAME)."""
        row = self.store.services.get(name)
        replicas = self.store.services.replicas(name)
        # Without the loop's lock (a launch may hold it a while): a load balancer polls
        # this every second. Each read is of a value the loop replaces whole, or a copy.
        load = self.service_load.get(name)
        per = self.replica_load
        target = len(self.scheduler.replicas.get(name, {}))
        failures = _copy(self.scraper.failures)
        stopping = set(_copy(self.cancel_why))
        ready = self.scraper.seen()
        out = service_json(row)
        out["target_replicas"] = target
        out["rps"] = round(load.rps, 3) if load is not None else None
        out["p99_ms"] = _ms(load.p99_ms) if load is not None else None
        out["replicas_reporting"] = load.reporting if load is not None else 0
        out["replicas"] = []
        for r in replicas:
            key = str(r.id)
            m = per.get(key)
            serving = r.state == "running" and r.port is not None
            out["replicas"].append(
                {
                    "job_id": r.id,
                    "name": r.name,
                    "state": _replica_state(r, key in ready, key in stopping),
                    "node": r.node,
                    "gpus": [{"node": n, "index": i} for n, i in r.gpus],
                    "port": r.port,
                    "url": f"http://127.0.0.1:{r.port}" if serving else None,
                    "ready": serving and key in ready,
                    "rps": round(m.rps, 3) if m is not None and m.reporting else None,
                    "p99_ms": _ms(m.p99_ms) if m is not None and m.reporting else None,
                    "scrape_error": failures.get(key),
                    "reason": r.reason,
                }
            )
        out["events"] = [
            {"at": e.at_s, "kind": e.kind, "message": e.message}
            for e in self.store.services.events(name, limit=50)
        ]
        return out

    def _services(self, now: float) -> None:
        """Scrape targets are the running replicas; what they measured goes to the core:
        ServiceLoad (rate and p99 over the load window) and ServiceDemand (the highest
        short-window rate over the look-ahead, as the expected peak)."""
        if now - self.last_service_sample < self.config.scrape_s - 1e-9:
            return
        self.last_service_sample = now
        sched = self.config.scheduling
        window = sched.autoscale_load_window_s
        short = min(10.0, window)
        targets: dict[str, int] = {}
        mine: dict[str, list[str]] = {}
        for name in self.scheduler.services:
            ids = [
                job_id
                for job_id, r in self.scheduler.replicas[name].items()
                if r.state is JobState.RUNNING and job_id in self.ports
            ]
            mine[name] = ids
            targets.update({job_id: self.ports[job_id] for job_id in ids})
        self.scraper.set_targets(targets)
        self.replica_load = {
            job_id: self.scraper.measure([job_id], now, short) for job_id in targets
        }
        for name, ids in mine.items():
            load = self.scraper.measure(ids, now)
            self.service_load[name] = load
            rate = self.scraper.measure(ids, now, short)
            served = self.served[name]
            served.append((now, rate.rps))
            while served and served[0][0] < now - sched.autoscale_lookahead_s - 1e-9:
                served.popleft()
            self.scheduler.observe(ServiceDemand(now, name, max(r for _, r in served)))
            if load.reporting:
                self.scheduler.observe(
                    ServiceLoad(now, name, load.rps, load.p99_ms, load.reporting)
                )

    def _recover_resize(
        self, row: JobRow, node_of: dict[str, int], adopted: bool, now: float
    ) -> None:
        """A resize was under way when the server stopped: the core resumes it, and the
        job's processes (asked again to leave, if they still run) are relaunched once,
        on the new GPUs, when they exit."""
        assert row.resize_gpus is not None
        target = self._placement_of(dataclasses.replace(row, gpus=row.resize_gpus), node_of)
        if target is None:
            return  # its GPUs are no longer in the fleet: it runs on where it is
        key = str(row.id)
        self.scheduler.recover_resize(key, target, now)
        self.resizing[key] = target
        self.store.events.add(
            "resizing", "the server restarted mid-resize: resuming the resize", now, job_id=row.id
        )
        if adopted:
            self.executor.resize(key, row.grace_s, now)

    def _placement_of(self, row: JobRow, node_of: dict[str, int]) -> Placement | None:
        by_node: dict[int, list[int]] = defaultdict(list)
        index_of = {dev: key for key, dev in self.devices.items()} if not self.fleet else {}
        for name, device in row.gpus:
            key = self.key_of.get((name, device)) or index_of.get(device)
            if key is None:
                return None
            by_node[key[0]].append(key[1])
        if not by_node and row.node is not None and row.node in node_of:
            by_node[node_of[row.node]] = []
        if not by_node:
            return None
        return Placement(
            tuple(NodeShare(n, tuple(sorted(g)), 1000) for n, g in sorted(by_node.items()))
        )

    def _handle_of(self, row: JobRow) -> Handle | None:
        """The attempt's handle: from the database, else the handle file written right
        after the launch, else the launch intent written before its shim started (pid 0:
        the executor finds the processes by its cgroup or token). None: never started."""
        run_dir = self.run_dir(row.id)
        intent = _read_intent(launch_file(run_dir, row.attempts))
        token, group = intent if intent is not None else ("", "")
        if row.pid is not None and row.pgid is not None and row.start_ticks is not None:
            return Handle(
                str(row.id), row.attempts, row.pid, row.pgid, row.start_ticks, token, group
            )
        path = run_dir / f"handle-{row.attempts}.json"
        if path.is_file():  # written right after launch, before the database heard of it
            try:
                d = json.loads(path.read_text(encoding="utf-8"))
                pid, pgid, ticks = int(d["pid"]), int(d["pgid"]), int(d["start_ticks"])
            except (OSError, ValueError, KeyError, TypeError):
                pass  # torn by the crash: the intent still finds it
            else:
                return Handle(str(row.id), row.attempts, pid, pgid, ticks, token, group)
        if intent is not None:
            return Handle(str(row.id), row.attempts, 0, 0, 0, token, group)
        return None

    # ---- the loop -----------------------------------------------------------------------------
    def start(self) -> None:
        watch = getattr(self.executor, "watch_exits", None)
        if watch is not None:  # an ended job is reaped at once, not at the next cycle
            watch(self.wake.set)
        self.thread = threading.Thread(target=self._run, name="gpupool-scheduler", daemon=True)
        self.health.started(self.thread)
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()
        if self.thread is not None:
            self.thread.join(timeout=10)
        self.executor.shutdown()
        self.scraper.close()
        self.mps.close()

    MIN_STEP_S = 0.05
    """Wake-ups (new jobs, cancels) run a cycle early, but at most 20 cycles a second."""

    def _run(self) -> None:
        """Cycle until stopped. Each stage of a step guards itself (`_stage`), so an error
        costs that stage (or that job) one cycle and never the loop; a database that is
        locked or full holds the loop in retries, which /healthz shows as a late cycle."""
        try:
            while not self.stopping.is_set():
                started = time.monotonic()
                if self.lease is not None and not self.lease.held():
                    self._lease_lost()
                    return
                try:
                    self.step()
                except Exception as err:  # the stages catch their own; this is the last net
                    self._fault("cycle", err)
                self.health.completed()
                if self.wake.wait(self.config.cycle_s):
                    self._expect_launch()
                self.wake.clear()
                rest = self.MIN_STEP_S - (time.monotonic() - started)
                if rest > 0:
                    self.stopping.wait(rest)
        except BaseException as err:
            self.health.dead(f"{type(err).__name__}: {err}")
            log.critical("the scheduler loop died", exc_info=True)
            raise

    def _expect_launch(self) -> None:
        """Woken (a submit, a cancel): a launch may follow this step, so the executor may
        get ready for it now (LocalExecutor primes its cgroups while the step reaps,
        ingests and decides)."""
        expect = getattr(self.executor, "expect_launch", None)
        if expect is not None:
            try:
                expect()
            except Exception as err:  # it only saves time
                self._fault("launch", err)

    def _lease_lost(self) -> None:
        why = (
            f"lost the controller lease on {self.lease.where if self.lease else '?'} (its "
            "database session ended, or its lock file was removed or replaced); scheduling "
            "stopped so that only one controller runs"
        )
        log.critical(why)
        self.loop_error = why
        self.health.dead(why)
        if self.on_lease_lost is not None:
            self.on_lease_lost()

    def step(self) -> None:
        with self.lock:
            now = self.clock.now()
            self.loop_error = None
            # What ended frees GPUs before what arrived is considered; measurements come
            # before the arrivals too (a job's pool is chosen on them), as in the simulator.
            self._stage("reap", self._reap, now)
            if now - self.last_sample >= self.config.sample_s:
                self._stage("sample", self._sample, now)
            self._stage("progress", self._progress, now)
            if self.scheduler.services:
                self._stage("services", self._services, now)
            self._stage("ingest", self._ingest, now)
            if self.probe is not None and now - self.last_probe >= self.PROBE_S:
                self._stage("probe", self._probe, now)
            if self.cloud is not None:
                self._stage("cloud", self._check_cloud, now)
            self._stage("disk", self._check_gate, now)
            if self.gate is None:
                self._stage("cycle", self._cycle, now)
            self._stage("purge", self._purge, now)
            self._stage("history", self._history, now)
            self.stage = "idle"

    def _history(self, now: float) -> None:
        self.history.step(now, self.samples, running_replicas(self))

    def _cycle(self, now: float) -> None:
        self._carry_out(self.scheduler.cycle(now), now)

    # ---- faults ---------------------------------------------------------------------------
    def _stage(self, stage: str, fn: Callable[..., None], *args: Any) -> None:
        self.stage = stage
        try:
            fn(*args)
        except Exception as err:
            self._fault(stage, err)

    REPEAT_LOG_S = 60.0

    def _fault(self, stage: str, err: BaseException, job_id: int | None = None) -> None:
        """An unexpected error: logged with its stage and job, shown by /healthz and
        /v1/cluster, and an event where the database takes one; the loop goes on."""
        what = _describe(err)
        where = f"{stage}" + (f" (job {job_id})" if job_id is not None else "")
        self.health.error(stage, what, job_id)
        self.loop_error = f"{where}: {what}"
        # The same error every cycle is logged (and recorded) once a minute, not 20 times
        # a second: a fault that lasts a day must not fill the disk with its own log.
        key, now_mono = (stage, job_id, what), time.monotonic()
        if now_mono - self.reported.get(key, -1e18) < self.REPEAT_LOG_S:
            return
        if len(self.reported) > 1000:
            self.reported.clear()
        self.reported[key] = now_mono
        log.error("scheduler %s failed: %s", where, what, exc_info=err)
        with contextlib.suppress(Exception):  # the database may be what failed; logged
            self.raw_store.events.add(
                "loop-error", f"{stage}: {what}"[:2000], self.clock.now(), job_id=job_id
            )

    def _db_retry(self, err: BaseException, attempt: int, delay_s: float) -> None:
        """A database call of the loop failed and is retried (its store's Retry)."""
        message = f"database unavailable, retry {attempt} in {delay_s:g} s: {_describe(err)}"
        if attempt == 1 or attempt % 10 == 0:
            log.warning("scheduler %s: %s", self.stage, message)
        self.health.error(self.stage, message[:2000])
        self.loop_error = f"{self.stage}: {message}"

    def health_view(self) -> dict[str, Any]:
        """/healthz: ok, the loop's last cycle, errors, role, and why launches wait."""
        loop = self.health.view(stopping=self.stopping.is_set())
        space = self.disk_space
        return {
            "ok": loop["ok"],
            "scheduler_error": self.loop_error,
            "role": "active",
            "problem": loop["problem"],
            "loop": loop,
            "launches": {
                "waiting": self.gate,
                "disk": None
                if space is None
                else {
                    "path": space.path,
                    "free_mib": round(space.free_bytes / (1 << 20), 1),
                    "floor_mib": round(
                        self.config.disk_floor.floor_bytes(space.total_bytes) / (1 << 20), 1
                    ),
                    "read_only": space.read_only,
                },
            },
            "lease": None if self.lease is None else self.lease.where,
        }

    # ---- launch gate: a full or read-only disk, launches failing for the environment --------
    LAUNCH_BACKOFF_MAX_S = 30.0

    def _check_gate(self, now: float) -> None:
        """Launches wait while the state disk is below its floor or read-only, or for a
        while after a launch failed for a reason of the machine (launch backoff); the
        waiting jobs' reasons say why, and they go back when the gate opens."""
        try:
            self.disk_space = self.disk.space()
            gate = self.config.disk_floor.problem(self.disk_space)
        except OSError as err:
            gate = f"DiskUnknown: cannot measure the state directory's free space: {err}"
        if gate is None and time.monotonic() < self.launch_retry_at:
            gate = (
                f"LaunchFailing: {self.launch_error}; launches retry in "
                f"{self.launch_retry_at - time.monotonic():.0f} s"
            )
        if gate != self.gate:
            if gate is not None and _kind(gate) != _kind(self.gate):
                log.warning("launches wait: %s", gate)
                self._best_effort_event("launches-waiting", gate, now)
            elif gate is None:
                log.warning("launches resume")
                self._best_effort_event("launches-resumed", f"launches resume ({self.gate})", now)
            self.gate = gate
        if self.gate is None:
            self._untell(now)
        else:
            self._tell(self.gate, now)

    def _best_effort_event(self, kind: str, message: str, now: float) -> None:
        try:
            self.raw_store.events.add(kind, message, now)
        except Exception as err:
            log.warning("could not record event %s: %s", kind, err)

    def _waiting_ids(self) -> list[int]:
        return [
            int(job_id)
            for job_id, r in self.scheduler.records.items()
            if r.state in (JobState.PENDING, JobState.SUSPENDED) and job_id.isdigit()
        ]

    def _tell(self, gate: str, now: float) -> None:
        """Waiting jobs' reasons say why (once per job; best effort: a full disk may
        refuse the write, which is tried again next cycle)."""
        kind = gate.split(":", 1)[0]
        for job_id in self._waiting_ids():
            if job_id in self.told and self.told_kind.get(job_id) == kind:
                continue
            try:
                row = self.raw_store.jobs.get(job_id)
                if row.state not in ("pending", "suspended"):
                    continue
                before = self.told.get(job_id, row.reason)
                self.raw_store.jobs.update(
                    job_id, now, expect=("pending", "suspended"), event="waiting", reason=gate
                )
            except Exception:
                continue
            self.told[job_id] = before
            self.told_kind[job_id] = kind

    def _untell(self, now: float) -> None:
        """Gate open: jobs still waiting get their reason back."""
        for job_id, before in list(self.told.items()):
            try:
                self.raw_store.jobs.update(
                    job_id, now, expect=("pending", "suspended"), reason=before
                )
            except IllegalTransition:
                pass  # it started or ended meanwhile: its reason says so already
            except Exception:
                continue  # the database refused: again next cycle
            del self.told[job_id]
            self.told_kind.pop(job_id, None)

    def _launch_trouble(self, err: BaseException) -> None:
        """A launch failed for the machine, not the job: launches pause, 1 s doubling to
        30 s, so a full disk or a descriptor limit is not hammered every cycle."""
        self.launch_backoff_s = min(max(1.0, self.launch_backoff_s * 2), self.LAUNCH_BACKOFF_MAX_S)
        self.launch_retry_at = time.monotonic() + self.launch_backoff_s
        self.launch_error = _describe(err)

    def run_dir(self, job_id: int) -> Path:
        return self.jobs_dir / str(job_id)

    def read_log(self, job_id: int, stream: str, offset: int, limit: int, rank: int = 0) -> bytes:
        """A job's log from `offset`: the node that runs it (through the executor, e.g. its
        Ray actor) while it runs, this host's copy otherwise (the executor copies the rest
        there when an attempt ends). `rank` > 0: that gang member's log (``rank-<k>/``)."""
        name = f"{stream}.log"
        remote = getattr(self.executor, "read_log", None)
        if remote is not None and str(job_id) in self.executor.handles():
            try:
                data: bytes = (
                    remote(str(job_id), name, offset, rank=rank)
                    if rank
                    else remote(str(job_id), name, offset)
                )
                return data[:limit]
            except Exception:  # it just ended, or its node is in doubt: what is here
                pass
        path = self.run_dir(job_id) / (f"rank-{rank}/{name}" if rank else name)
        if not path.is_file():
            return b""
        with path.open("rb") as f:
            size = f.seek(0, 2)
            if offset >= size:  # past the end (however far): an empty page
                return b""
            f.seek(offset)
            return f.read(limit)

    # ---- node liveness (a fleet with a probe, e.g. Ray) -------------------------------------
    PROBE_S = 1.0
    RESTORE_AFTER_S = 30.0
    """A node that lost a job but stays listed is trusted again after this long."""

    def _alive(self) -> dict[str, str] | None:
        if self.probe is None:
            return None
        try:
            return self.probe()
        except Exception as err:  # e.g. the Ray GCS is unreachable for a while
            self.loop_error = f"cannot list the live nodes: {err}"
            return None

    def _probe(self, now: float) -> None:
        self.last_probe = now
        alive = self._alive()
        if alive is None:
            return
        for node in self.cluster.nodes:
            name, now_id = node.name, alive.get(node.name)
            if self.cloud is not None and name in self.cloud.status:
                self._probe_cloud(name, now_id, now)
                continue
            if now_id is None:
                if name not in self.gone or self.gone[name][0] is not None:
                    self._node_down(name, None, now, f"node {name} left the cluster")
            elif name in self.gone and name not in self.bad_nodes:
                was_id, since = self.gone[name]
                if now_id != was_id or now - since >= self.RESTORE_AFTER_S:
                    del self.gone[name]
                    self._node_joined(name, now_id)
                    self.scheduler.node_up(name, now)
                    self.store.events.add(
                        "node-healthy", f"node {name} is back", now, data={"node": name}
                    )

    def _probe_cloud(self, name: str, now_id: str | None, now: float) -> None:
        assert self.cloud is not None
        state = self.cloud.state(name)
        if now_id is None and state not in (DOWN, STARTING):
            why = self.cloud.left(name, now)
            if name in self.gone:  # reclaimed: already out of the pool, nothing ran there
                self.gone[name] = (None, now)
                self.scheduler.node_down(name, now, why)
                self.store.events.add("cloud-node-down", why, now)
            else:
                self._node_down(name, None, now, why)
        elif now_id is not None and state in (DOWN, STARTING):
            why = self.cloud.joined(name, now)
            self._node_joined(name, now_id)
            self.gone.pop(name, None)
            self.scheduler.node_up(name, now)
            self.store.events.add("cloud-node-up", why, now)

    def _node_joined(self, name: str, node_id: str) -> None:
        remember = getattr(self.executor, "remember_node", None)
        if remember is not None:
            remember(name, node_id)

    def _check_cloud(self, now: float) -> None:
        """Start and stop commands that ended, and started nodes that never joined."""
        assert self.cloud is not None
        for kind, message, gave_up in self.cloud.check(now):
            self.store.events.add(kind, message, now)
            for name in gave_up:  # it will not join: the core counts it down again
                self.scheduler.node_down(name, now, message)
                self.gone[name] = (None, now)

    def _node_down(self, name: str, node_id: str | None, now: float, why: str) -> None:
        first = name not in self.gone
        self.gone[name] = (node_id, now)
        if not first:
            return
        self.nodes_lost[name] += 1
        self.store.events.add("node-lost", why, now, data={"node": name})
        for job_id in self.scheduler.node_down(name, now, why):
            row = self.store.jobs.get(int(job_id))
            self.evicting[job_id] = f"{why}; requeued from its checkpoint"
            if job_id in self.executor.handles():
                self.executor.preempt(job_id, row.grace_s, now)

    # ---- inputs -----------------------------------------------------------------------------
    def _ingest(self, now: float) -> None:
        for row in self.store.jobs.list(state="pending", after_id=self.seen_id, limit=10_000):
            self.seen_id = max(self.seen_id, row.id)
            if str(row.id) not in self.scheduler.records:
                try:
                    sized = plan_request_from(row.sizing) if row.sizing is not None else None
                    record = self.scheduler.submit(spec_of(row), now, sized=sized)
                except Exception as err:  # this job cannot be scheduled; the others can
                    self._fault("ingest", err, row.id)
                    self._transition(
                        row.id,
                        "failed",
                        now,
                        ("pending",),
                        reason=f"cannot be scheduled: {_describe(err)}",
                        ended_at=now,
                    )
                    continue
                if record.state is JobState.UNPLACEABLE:
                    self._transition(
                        row.id,
                        "failed",
                        now,
                        ("pending",),
                        reason=f"Unplaceable: cannot run here: {record.end_reason}",
                        ended_at=now,
                    )

    def cancel(self, job_id: int) -> JobRow:
        """Called by the API: pending jobs end at once, running ones get SIGTERM + grace."""
        with self.lock:
            now = self.clock.now()
            row = self.store.jobs.request_cancel(job_id, now)
            key = str(job_id)
            record = self.scheduler.records.get(key)
            if row.state == "cancelled":
                if record is not None:
                    self.scheduler.finished(key, now, JobState.CANCELLED, "cancelled on request")
            elif row.state in ("running", "preempting") and key in self.executor.handles():
                self.executor.cancel(key, row.grace_s, now)
            self.wake.set()
            return row

    def _reap(self, now: float) -> None:
        for ex in self.executor.poll(now):
            try:
                self._exited(ex, now)
            except Exception as err:  # one job's end must not hide the others'
                self._fault("reap", err, int(ex.job_id) if ex.job_id.isdigit() else None)

    def _exited(self, ex: Exit, now: float) -> None:
        job_id = int(ex.job_id)
        row = self.store.jobs.get(job_id)
        if row.state in TERMINAL:
            return
        key = ex.job_id
        self._unload(row)
        running = ("running", "preempting")
        if self._ended_by_time_limit(ex, row, now):
            return
        resizing = self.resizing.pop(key, None) is not None
        if resizing and ex.job_id not in self.evicting and ex.outcome in RESIZE_EXITS:
            # Its processes left for a resize: the core frees what it lent and relaunches
            # it on its new GPUs (its Launch); it stays running, no preemption counted.
            self._carry_out(self.scheduler.observe(Resized(now, key)), now)
            return
        if ex.job_id in self.evicting:
            why = self.evicting.pop(ex.job_id)
            self.scheduler.lost(key, now, why)
            self._transition(job_id, "suspended", now, running, reason=why, exit_code=ex.exit_code)
        elif ex.outcome == "succeeded":
            self.scheduler.finished(key, now, JobState.FINISHED)
            self._transition(
                job_id, "succeeded", now, running, reason=ex.reason, exit_code=0, ended_at=now
            )
        elif ex.outcome in ("preempted", "killed"):
            self._transition(
                job_id,
                "suspended",
                now,
                ("preempting",),
                reason=f"preempted: {ex.reason}; resumes from its checkpoint",
                exit_code=ex.exit_code,
            )
            self._carry_out(self.scheduler.vacated(key, now), now)
        elif ex.outcome == "cancelled":
            self.scheduler.finished(key, now, JobState.CANCELLED)
            why = self.cancel_why.pop(key, "cancelled on request")
            self._transition(job_id, "cancelled", now, running, reason=why, ended_at=now)
        elif ex.outcome == "lost":
            lost = self.raw_store.events.count(job_id, "suspended", LOST_PREFIX)
            limit = self.config.lost_retries
            if lost >= limit:
                self.scheduler.finished(key, now, JobState.FAILED)
                self._transition(
                    job_id,
                    "failed",
                    now,
                    running,
                    reason=(
                        f"lost {lost + 1} times, more than the limit of {limit} requeues "
                        f"(gpupool serve --lost-retries): {ex.reason}. A job lost again and "
                        "again may be crashing its node or filling the state disk: read its "
                        "logs and checkpoint directory, fix it, and submit it again"
                    ),
                    ended_at=now,
                )
            else:
                self.scheduler.lost(key, now, ex.reason)
                self._transition(
                    job_id,
                    "suspended",
                    now,
                    running,
                    reason=f"{LOST_PREFIX}{ex.reason} (requeue {lost + 1} of {limit})",
                )
            alive = self._alive()
            where = ex.node or row.node  # a gang member's node, else the job's
            if alive is not None and where is not None and where in self.key_nodes():
                # Its node is in doubt: nothing goes there until the probe clears it.
                self._node_down(where, alive.get(where), now, f"node {where}: {ex.reason}")
        elif row.retries < row.max_retries:
            self.scheduler.lost(key, now, ex.reason)
            self._transition(
                job_id,
                "suspended",
                now,
                running,
                reason=f"{ex.outcome}: {ex.reason}; retry {row.retries + 1} of {row.max_retries}",
                exit_code=ex.exit_code,
                retries=row.retries + 1,
            )
        else:
            self.scheduler.finished(key, now, JobState.FAILED)
            self._transition(
                job_id,
                "failed",
                now,
                running,
                reason=f"{ex.outcome}: {ex.reason}",
                exit_code=ex.exit_code,
                ended_at=now,
            )

    def _requeue(self, job_id: int, now: float, why: str) -> None:
        self.scheduler.lost(str(job_id), now, why)
        self._transition(job_id, "suspended", now, ("running", "preempting"), reason=why)

    def _sample(self, now: float) -> None:
        self.last_sample = now
        self.samples = self.telemetry.sample(now)
        self.monitor.observe(self.samples)
        if self.config.scheduling.energy.thermal.aware:
            self.scheduler.observe(self._temps(now))
        self.scheduler.observe(self._usage(now))
        if self.monitor.due(now):
            self.signals = self.monitor.evaluate(now)
            self.signals_at = now
            if self.signals.reclaimable or self.signals.scale_out:
                self.store.events.add(
                    "monitor",
                    f"reclaimable GPUs {list(self.signals.reclaimable)}; "
                    f"scale-out {'yes' if self.signals.scale_out else 'no'} "
                    f"(mean utilisation {self.signals.mean_util_pct:.0f}%)",
                    now,
                )
        node_of_device = {dev: key[0] for key, dev in self.tele_index.items()}
        unhealthy = {node_of_device.get(s.index) for s in self.samples if not s.healthy}
        for name in sorted(self.bad_nodes):  # a node whose GPUs all recovered comes back
            index = next(i for i, n in enumerate(self.cluster.nodes) if n.name == name)
            if index not in unhealthy:
                self.bad_nodes.discard(name)
                if name not in self.gone:
                    self.scheduler.node_up(name, now)
                self.store.events.add(
                    "node-healthy", f"node {name} is healthy again", now, data={"node": name}
                )
        for s in self.samples:
            if s.healthy:
                continue
            k = node_of_device.get(s.index)
            if k is None:
                continue
            name = self.cluster.nodes[k].name
            if name in self.bad_nodes:
                continue
            self.bad_nodes.add(name)
            if name in self.gone:
                continue
            why = f"node {name} unhealthy: GPU {s.index} {s.problem}"
            self.store.events.add("node-unhealthy", why, now, data={"node": name})
            for job_id in self.scheduler.node_down(name, now, why):
                row = self.store.jobs.get(int(job_id))
                self.evicting[job_id] = f"{why}; requeued from its checkpoint"
                self.executor.preempt(job_id, row.grace_s, now)

    def _temps(self, now: float) -> GpuTemps:
        """Each GPU's measured temperature, [node, gpu] as the core counts them, and each
        node's inlet air as configured (a GPU without a reading counts as that air)."""
        inlet = self.scheduler.room_inlet_c()
        width = max(n.gpu_count for n in self.cluster.nodes)
        temps = np.repeat(inlet[:, None], width, axis=1)
        by_index = {s.index: s for s in self.samples}
        for (k, g), tele in self.tele_index.items():
            sample = by_index.get(tele)
            if sample is not None:
                temps[k, g] = sample.temp_c
        return GpuTemps(now, temps, inlet)

    def _usage(self, now: float) -> GpuUsage:
        """Each card's measured SM utilisation and memory, [node, gpu] as the core counts
        them (NaN and -1 where the telemetry has no reading): what sharing decides by."""
        shape = self.scheduler.state.gpu_left.shape
        util = np.full(shape, np.nan)
        used = np.full(shape, -1, dtype=np.int64)
        total = np.zeros(shape, dtype=np.int64)
        by_index = {s.index: s for s in self.samples}
        for (k, g), tele in self.tele_index.items():
            sample = by_index.get(tele)
            if sample is not None and sample.healthy:
                util[k, g] = sample.util_pct
                used[k, g] = sample.mem_used_mib
                total[k, g] = sample.mem_total_mib
        return GpuUsage(now, util, used, total)

    def _progress(self, now: float) -> None:
        """Work done by running jobs, where the executor can tell (else the core
        estimates it from their start times)."""
        measure = getattr(self.executor, "progress", None)
        if measure is not None:
            self.scheduler.observe(Progress(now, measure(now)))

    # ---- outputs ----------------------------------------------------------------------------
    def _carry_out(self, commands: Sequence[Command], now: float) -> None:
        """Launches between two other commands go out together (an executor with
        `launch_many` starts them in parallel); the order of the commands is kept."""
        if self.commands is not None:
            self.commands += [(now, c) for c in commands]
        batch: list[Launch] = []
        waits: list[Wait] = []
        for c in commands:
            if isinstance(c, Launch):
                batch.append(c)
                continue
            if isinstance(c, Wait):
                waits.append(c)  # told together: one commit for a cycle's reasons
                continue
            self._launch_all(batch, now)
            batch = []
            self._waiting_all(waits, now)
            waits = []
            job_id = getattr(c, "job_id", None)
            try:
                self._command(c, now)
            except Exception as err:  # one command's failure must not drop the others
                self._fault(type(c).__name__.lower(), err, _job_number(job_id))
        self._launch_all(batch, now)
        self._waiting_all(waits, now)

    def _command(self, c: Command, now: float) -> None:
        if isinstance(c, Stop):
            row = self.store.jobs.get(int(c.job_id))
            self._transition(
                row.id,
                "preempting",
                now,
                ("running",),
                reason=c.reason,
                preemptions=row.preemptions + 1,
            )
            self.executor.preempt(c.job_id, row.grace_s, now)
            self._decided(now, "preempt", c.job_id)
        elif isinstance(c, Scale):
            self.store.events.add(
                "service-scaled",
                f"service {c.service}: {c.text}",
                now,
                data={
                    "service": c.service,
                    "from": c.from_replicas,
                    "to": c.to_replicas,
                    "reason": c.reason,
                },
            )
            for job_id in c.dropped:  # replicas that never ran: they end here
                self._transition(
                    int(job_id),
                    "cancelled",
                    now,
                    ("pending", "suspended"),
                    reason=f"{c.reason}: not needed any more, ended before it started",
                    ended_at=now,
                )
        elif isinstance(c, Resize):
            self._resize(c, now)
        elif isinstance(c, Cancel):
            self.cancel_why[c.job_id] = c.reason
            if c.job_id in self.executor.handles():
                self.executor.cancel(c.job_id, self.store.jobs.get(int(c.job_id)).grace_s, now)
        elif isinstance(c, SetPowerCap):
            self._power_cap(c, now)
        elif isinstance(c, Defer):
            until = time.strftime("%H:%M", time.localtime(c.until_s))
            self._update(
                int(c.job_id),
                now,
                ("pending", "suspended"),
                "deferred",
                reason=f"deferred until {until} ({c.reason})",
            )
        elif isinstance(c, Expire):
            self._expire(c, now)
        elif isinstance(c, Wait):
            self._waiting_all([c], now)
        elif isinstance(c, Burst):
            assert self.cloud is not None
            for name in c.nodes:
                self.store.events.add("cloud-burst", self.cloud.start(name, c.reason, now), now)
        elif isinstance(c, Reclaim):
            assert self.cloud is not None
            for name in c.nodes:  # out of the pool already: nothing starts there
                self.gone[name] = (None, now)
                self.store.events.add("cloud-reclaim", self.cloud.stop(name, c.reason, now), now)
        elif isinstance(c, LearnShadow):  # a record only: nothing is carried out
            due = self.shadow.record(c)
            if due is not None:
                self.store.events.add("learn-shadow", due[0], now, data=due[1])
        elif isinstance(c, LearnGuard):
            self.store.events.add(
                "learn-guard",
                f"learned policy {c.state}: {c.reason}",
                now,
                data={"state": c.state, "reason": c.reason},
            )

    # ---- the learned policy: its mode, promotion and demotion ------------------------------
    def _restore_learning_mode(self, now: float) -> None:
        """A promotion or demotion survives a restart: the mode it stored wins over the
        config's (until one was made, the config's mode applies)."""
        stored = self.store.settings.learning_mode()
        if stored is None:
            return
        reason = f"restored at start: {stored.reason}"
        self._carry_out([self.scheduler.set_learning_mode(stored.mode, now, reason)], now)

    def _require_learning(self) -> None:
        if not self.learning:
            raise NotFoundError(
                f"this server schedules with policy {self.config.scheduling.policy!r}, not "
                "'learned': there is no learned policy to show, promote or demote; set "
                "`policy: learned` and a `learning:` section in the --config file of "
                "`gpupool serve`"
            )

    def _learning_mode(self) -> str:
        """The mode the core runs the learned policy in now (shadow or active)."""
        status = self.scheduler.learning_status() or {}
        return str(status.get("mode", self.config.scheduling.learning.mode))

    def learning_view(self) -> dict[str, Any]:
        """What GET /v1/learn shows: the core's status, the mode, the shadow record and the
        last promotion or demotion."""
        self._require_learning()
        with self.lock:
            status = self.scheduler.learning_status()
            shadow = self.shadow.view()
        cfg = self.config.scheduling.learning
        stored = self.store.settings.learning_mode()
        changes = self.store.settings.learning_changes(limit=1)
        return {
            "policy": self.config.scheduling.policy,
            "mode": (status or {}).get("mode", cfg.mode),
            "mode_since_s": stored.set_at_s if stored is not None else None,
            "mode_reason": stored.reason if stored is not None else "the configured mode",
            "status": status,
            "shadow": shadow,
            "min_jobs": cfg.guard.min_finished,
            "config": dataclasses.asdict(cfg),
            "last_change": None if not changes else dataclasses.asdict(changes[0]),
        }

    def learning_history(self, days: float) -> dict[str, Any]:
        """The jobs that finished here in the last `days` and the fleet's size: what the
        CLI replays under the rule and the learned policy."""
        self._require_learning()
        now = self.clock.now()
        since = now - days * 86_400.0
        runs = self.store.history.finished_runs(since, now)
        per_node = [n.gpu_count for n in self.cluster.nodes if n.gpu_count > 0]
        return {
            "now_s": now,
            "since_s": since,
            "days": days,
            "fleet": {"nodes": len(per_node), "gpus": sum(per_node), "gpus_per_node": per_node},
            "jobs": [
                {
                    "id": r.job_id,
                    "team": r.team,
                    "name": r.name,
                    "gpu_count": r.gpu_count,
                    "gpu_model": r.gpu_model,
                    "submit_s": r.submit_s,
                    "run_gpu_s": r.gpu_time_s,
                    "finish_s": r.finish_s,
                }
                for r in runs
            ],
        }

    def promote_learning(self, evidence: Mapping[str, Any], by: str) -> dict[str, Any]:
        """Make the learned policy active, if the replay evidence shows it wins here."""
        self._require_learning()
        with self.lock:
            now = self.clock.now()
            if self._learning_mode() == "active":
                raise ConflictError(
                    "the learned policy is active already; `gpupool learn demote` returns it "
                    "to shadow"
                )
            ev = Evidence.of(evidence)
            cfg = self.config.scheduling.learning
            finished = len(self.store.history.finished_runs(now - ev.days * 86_400.0, now))
            check_evidence(ev, cfg.rule, cfg.guard.min_finished, finished)
            reason = (
                f"promoted by {by}: a replay of the last {ev.days:g} days ({ev.jobs} jobs) gave "
                f"a mean JCT of {ev.learned_mean_jct_s:.1f} s learned against "
                f"{ev.rule_mean_jct_s:.1f} s {ev.rule} ({ev.gain:.1%} less)"
            )
            self.store.settings.set_learning_mode(
                "active", now, reason, action="promote", by=by, evidence=evidence
            )
            self._carry_out([self.scheduler.set_learning_mode("active", now, reason)], now)
            self.wake.set()
        return self.learning_view()

    def demote_learning(self, by: str, why: str = "") -> dict[str, Any]:
        """Back to shadow: the rules decide, the learned order is only recorded."""
        self._require_learning()
        with self.lock:
            now = self.clock.now()
            if self._learning_mode() == "shadow":
                raise ConflictError("the learned policy is in shadow already: nothing to demote")
            reason = f"demoted by {by}" + (f": {why}" if why else "")
            self.store.settings.set_learning_mode("shadow", now, reason, action="demote", by=by)
            self._carry_out([self.scheduler.set_learning_mode("shadow", now, reason)], now)
            self.wake.set()
        return self.learning_view()

    def _resize(self, c: Resize, now: float) -> None:
        """Checkpoint and stop an elastic job's processes (SIGTERM, its grace) to restart
        it on the GPUs the core gives it; recorded first, so a restart finishes it."""
        row = self.store.jobs.get(int(c.job_id))
        gpus = [
            (self.cluster.nodes[s.node].name, self.devices[(s.node, g)])
            for s in c.placement.shares
            for g in s.gpus
        ]
        self._update(
            row.id, now, ("running",), "resizing", reason=f"resizing: {c.reason}", resize_gpus=gpus
        )
        self.resizing[c.job_id] = c.placement
        self._decided(now, "resize", c.job_id)
        if c.job_id not in self.executor.handles():  # its process is gone already
            self.resizing.pop(c.job_id, None)
            self._carry_out(self.scheduler.observe(Resized(now, c.job_id)), now)
            return
        self.executor.resize(c.job_id, row.grace_s, now)

    def _power_cap(self, c: SetPowerCap, now: float) -> None:
        """A SetPowerCap of the core on the node and GPU it names (a reset included)."""
        node = self.cluster.nodes[c.node].name
        tele = self.tele_index.get((c.node, c.gpu))
        if tele is None:
            message = "no telemetry for this GPU: skipped"
        else:
            device = dataclasses.replace(c, node=0, gpu=tele)
            result = self.telemetry.apply(device)
            message = f"{'applied' if result.ok else 'skipped'} ({result.message})"
        holder = next(
            (
                job_id
                for job_id, p in self.scheduler.placements().items()
                if any(s.node == c.node and c.gpu in s.gpus for s in p.shares)
            ),
            None,
        )
        self.store.events.add(
            "power-cap",
            f"node {node} GPU {self.devices[(c.node, c.gpu)]}: {c.reason}: {message}",
            now,
            job_id=int(holder) if holder is not None and holder.isdigit() else None,
        )

    def _launch_all(self, batch: Sequence[Launch], now: float) -> None:
        if not batch:
            return
        self.stage = "launch"
        if self.gate is not None:  # e.g. a claimant of a vacated job: it waits too
            for d in batch:
                if self.store.jobs.get(int(d.job_id)).state == "running":  # a resized job
                    self._requeue(int(d.job_id), now, self.gate)
                else:
                    self.scheduler.lost(d.job_id, now, self.gate)
            return
        ready = []
        for d in batch:
            try:
                p = self._prepare(d, now)
            except Exception as err:
                try:
                    self._unstarted(d, err, now)
                except Exception as worse:  # not even that: the core requeues it at least
                    self._fault("launch", worse, _job_number(d.job_id))
                    with contextlib.suppress(Exception):
                        self.scheduler.lost(d.job_id, now, f"could not start: {_describe(err)}")
                continue
            if p is not None:
                ready.append(p)
        if not ready:
            return
        many = getattr(self.executor, "launch_many", None)
        results: list[Handle | BaseException]
        if self.fleet and many is not None:
            try:
                results = many([(p.spec, p.node) for p in ready], now)
            except Exception as err:
                results = [err] * len(ready)
        else:
            results = [self._launch_one(p, now) for p in ready]
        for p, result in zip(ready, results, strict=True):
            try:
                self._started(p, result, now)
            except Exception as err:
                self._fault("launch", err, p.row.id)

    def _prepare(self, d: Launch, now: float) -> _Prepared | None:
        """Record the job as running (before its process exists, so a restart finds it)
        and build what the executor needs."""
        row = self.store.jobs.get(int(d.job_id))
        self.wait_codes.pop(row.id, None)  # its next wait's first code is an event again
        shares = d.placement.shares
        devices = tuple(self.devices[(s.node, g)] for s in shares for g in s.gpus)
        node = self.cluster.nodes[shares[0].node].name
        attempt = row.attempts + 1
        svc = self.service_rows.get(row.service) if row.service is not None else None
        port = free_loopback_port() if svc is not None else None
        gpus = [
            [self.cluster.nodes[s.node].name, self.devices[(s.node, g)]]
            for s in shares
            for g in s.gpus
        ]
        if row.state == "running":  # an elastic job's relaunch after a resize
            self._update(
                row.id,
                now,
                ("running",),
                "resized",
                reason=f"{d.note}; resumed from its checkpoint" if d.note else "resized",
                gpus=gpus,
                node=node,
                attempts=attempt,
                pid=None,
                pgid=None,
                start_ticks=None,
                resize_gpus=None,
            )
        else:
            self._transition(
                row.id,
                "running",
                now,
                ("pending", "suspended"),
                reason=("resumed" if d.resume else "started") + (f": {d.note}" if d.note else ""),
                gpus=gpus,
                node=node,
                attempts=attempt,
                started_at=row.started_at if row.started_at is not None else now,
                pid=None,
                pgid=None,
                start_ticks=None,
                resize_gpus=None,  # a resize cut short (lost, cancelled) is over
                port=port,
            )
        run_dir = self.run_dir(row.id)
        run_dir.mkdir(parents=True, exist_ok=True)
        # Who it runs as and what it may use: the executor's isolation policy, if any.
        isolation = getattr(self.executor, "isolation", None)
        user: JobUser | None = None
        refused: GpupoolError | None = None
        limits = NO_LIMITS
        if isolation is not None:
            limits = isolation.limits_for(row.team, row.kind)
            try:
                user = isolation.user_for(row.team)
            except GpupoolError as err:
                refused = err
        # On a fake fleet the job gets no GPU at all (CUDA_VISIBLE_DEVICES empty), even on
        # a machine that has real ones; it learns its fake GPUs from GPUPOOL_FAKE_GPUS.
        fake = isinstance(self.telemetry, FakeTelemetry)
        env = dict(row.env)
        if svc is not None and port is not None:
            env[svc.port_env] = str(port)
            self.ports[d.job_id] = port
        if fake:
            env["GPUPOOL_FAKE_GPUS"] = ",".join(str(x) for x in devices)
        if row.gpu_count_min is not None:  # elastic: how many it got this time
            env["GPUPOOL_GPU_COUNT"] = str(len(devices))
        visible: str | None = None
        if d.spec is not None and d.spec.shares_gpu:
            shared = self._share_env(d.spec, shares[0].node, shares[0].gpus[0], row.id, now)
            visible = shared.pop("CUDA_VISIBLE_DEVICES", None)
            env.update(shared)
        spec = LaunchSpec(
            job_id=d.job_id,
            attempt=attempt,
            argv=tuple(row.command),
            env=env,
            gpu_indices=() if fake and not self.fleet else devices,
            run_dir=run_dir,
            resume=d.resume or row.attempts > 0,
            cwd=Path(row.cwd) if row.cwd else None,
            user=user,
            limits=limits,
            visible_devices=visible if not fake else None,
        )
        if self.fleet and len({s.node for s in shares}) > 1:
            # Across nodes: a gang, one member per node, rank 0 on the first share's.
            members = tuple(
                GangMember(
                    self.cluster.nodes[s.node].name,
                    tuple(self.devices[(s.node, g)] for g in s.gpus),
                )
                for s in shares
            )
            spec = dataclasses.replace(spec, gang=Gang(members, row.grace_s))
            if not getattr(self.executor, "runs_gangs", False):
                refused = refused or SpecError(
                    f"the core placed it on {len(shares)} nodes "
                    f"({', '.join(m.node for m in members)}); {MULTI_NODE_REFUSED}"
                )
        prepared = _Prepared(d, row, spec, node)
        if refused is not None:
            self._started(prepared, refused, now)
            return None
        return prepared

    def _share_env(
        self, job: JobSpec, node: int, gpu: int, job_id: int, now: float
    ) -> dict[str, str]:
        """A sharing job's environment: its share, and MPS's limits where MPS runs (a
        daemon that will not start leaves the share advisory, said in the job's events)."""
        tele = self.tele_index.get((node, gpu))
        info = self.gpu_info.get(tele) if tele is not None else None
        card = info.mem_total_mib if info is not None and info.mem_total_mib > 0 else 0
        mem = job.gpu_mem_mib
        if mem is None:
            mem = -(-card * job.gpu_milli // 1000)
        share = ShareRequest(
            self.devices[(node, gpu)], info.uuid if info is not None else "", job.gpu_milli, mem
        )
        try:
            return share_env(share, self.mps if info is not None and info.uuid else None)
        except MpsError as err:
            self.store.events.add(
                "mps", f"MPS not started ({err}); its GPU share is advisory", now, job_id=job_id
            )
            return share_env(share, None)

    def _launch_one(self, p: _Prepared, now: float) -> Handle | BaseException:
        launch_on = getattr(self.executor, "launch_on", None)
        try:
            if self.fleet and launch_on is not None:
                handle: Handle = launch_on(p.spec, p.node, now)
                return handle
            return self.executor.launch(p.spec, now)
        except Exception as err:  # e.g. its working directory does not exist, or no fds
            return err

    def _unstarted(self, d: Launch, err: BaseException, now: float) -> None:
        """A launch that failed before any process started (recording it, its run
        directory): requeued when the machine is at fault, else failed with the reason."""
        job_id = int(d.job_id)
        self._fault("launch", err, job_id)
        row = self.store.jobs.get(job_id)
        if _environmental(err) or row.state == "suspended":
            self._launch_trouble(err)
            why = f"could not start: {_describe(err)}; requeued, launches retry shortly"
            self.scheduler.lost(d.job_id, now, why)
            if row.state in ("running", "preempting"):
                self._transition(job_id, "suspended", now, ("running", "preempting"), reason=why)
            else:
                self._update(job_id, now, ("pending", "suspended"), "waiting", reason=why)
            return
        self.scheduler.finished(d.job_id, now, JobState.FAILED)
        self._transition(
            job_id,
            "failed",
            now,
            ("running", "pending"),
            reason=f"could not start: {_describe(err)}",
            ended_at=now,
        )

    def _started(self, p: _Prepared, result: Handle | BaseException, now: float) -> None:
        d, row = p.decision, p.row
        if isinstance(result, Unavailable):  # e.g. a node's launcher did not answer
            self._requeue(row.id, now, f"could not start yet: {result}")
            return
        if isinstance(result, BaseException):
            self._fault("launch", result, row.id)
            if _environmental(result):  # the machine, not the job: it waits and runs later
                self._launch_trouble(result)
                self._requeue(
                    row.id,
                    now,
                    f"could not start: {_describe(result)}; requeued, launches retry shortly",
                )
                return
            self.scheduler.finished(d.job_id, now, JobState.FAILED)
            self._transition(
                row.id,
                "failed",
                now,
                ("running",),
                reason=f"could not start: {_describe(result)}",
                ended_at=now,
            )
            return
        handle = result
        self.launch_backoff_s = 0.0
        try:  # a second record of the process, in case the database write below is lost
            (p.spec.run_dir / f"handle-{p.spec.attempt}.json").write_text(
                json.dumps(
                    {"pid": handle.pid, "pgid": handle.pgid, "start_ticks": handle.start_ticks}
                ),
                encoding="utf-8",
            )
        except OSError as err:  # a full or read-only disk: the database still records it
            self._fault("launch", err, row.id)
        self.store.jobs.set_process(row.id, handle.pid, handle.pgid, handle.start_ticks, now)
        shares = d.placement.shares
        tele = tuple(
            self.tele_index[(s.node, g)]
            for s in shares
            for g in s.gpus
            if (s.node, g) in self.tele_index
        )
        self._load(tele, row)
        action = "resume" if d.resume else "start"
        if row.state != "running":  # a start or resume, not an elastic job's relaunch
            record = self.scheduler.records.get(d.job_id)
            ready_s = record.ready_s if record is not None else row.submitted_at
            first = now - row.submitted_at if row.started_at is None else None
            self.start_latency.started(row.kind, now - ready_s, first)
        where = tuple(
            (self.cluster.nodes[s.node].name, self.devices[(s.node, g)])
            for s in shares
            for g in s.gpus
        )
        self.placed.append((now, action, d.job_id, where))
        self._decided(now, action, d.job_id)

    def _load(self, devices: tuple[int, ...], row: JobRow) -> None:
        """Tell a fake fleet what runs where."""
        set_load = getattr(self.telemetry, "set_load", None)
        if set_load is None:
            return
        if row.gpu_milli < 1000 or row.gpu_mem_mib is not None:
            self._load_shared(set_load)
            return
        sm_pct, mem_mib = declared_use(row.env) or (100.0, 1024)
        for dev in devices:
            set_load(dev, sm_pct, mem_mib)

    def _load_shared(self, set_load: Callable[..., None], leaving: str | None = None) -> None:
        """A fake card that jobs share is as busy as the shares placed on it: SM
        utilisation their share of it, memory their memory (or share of the card's)."""
        state = self.scheduler.state
        for (k, g), tele in self.tele_index.items():
            if not 0 < int(state.gpu_left[k, g]) < 1000:
                continue
            info = self.gpu_info.get(tele)
            card = info.mem_total_mib if info is not None else 0
            used = mem = 0
            for job_id, placement in state.placements.items():
                job = state.jobs[job_id]
                if job_id != leaving and any(
                    sh.node == k and g in sh.gpus for sh in placement.shares
                ):
                    used += job.gpu_milli
                    mem += job.gpu_mem_mib or -(-card * job.gpu_milli // 1000)
            set_load(tele, min(100.0, used / 10.0), min(mem, card))

    def _unload(self, row: JobRow) -> None:
        set_load = getattr(self.telemetry, "set_load", None)
        if set_load is not None:
            for name, dev in row.gpus:
                key = self.key_of.get((name, dev))
                index = self.tele_index.get(key) if key is not None else None
                if index is None and not self.fleet:
                    index = dev
                if index is not None:
                    set_load(index, 0.0, 0)
        if set_load is not None and (row.gpu_milli < 1000 or row.gpu_mem_mib is not None):
            self._load_shared(set_load, str(row.id))  # the other sharers still run

    def _node_state(self, name: str) -> str:
        """up, lost, unhealthy, a cloud node's down / starting / stopping, or an up node's
        draining (jobs still run there) / drained."""
        if self.cloud is not None and name in self.cloud.status:
            state = self.cloud.state(name)
            if state != "up":
                return f"cloud-{state}"
        if name in self.gone:
            return "lost"
        if name in self.bad_nodes:
            return "unhealthy"
        return self.scheduler.draining(name) or "up"

    def key_nodes(self) -> set[str]:
        return {n.name for n in self.cluster.nodes}

    def _transition(
        self, job_id: int, to: str, now: float, expect: tuple[str, ...], **fields: Any
    ) -> None:
        try:
            self.store.jobs.transition(job_id, to, now, expect=expect, **fields)
        except IllegalTransition as err:
            self.store.events.add("error", str(err), now, job_id=job_id)

    def _update(
        self, job_id: int, now: float, expect: tuple[str, ...], event: str, **fields: Any
    ) -> None:
        try:
            self.store.jobs.update(job_id, now, expect=expect, event=event, **fields)
        except IllegalTransition as err:
            self.store.events.add("error", str(err), now, job_id=job_id)

    def _decided(self, now: float, action: str, job_id: str) -> None:
        self.decisions.append((now, action, job_id))
        if self.on_decision is not None:
            self.on_decision(now, action, job_id)

    # ---- lifecycle: hold, release, requeue, drain, time limits, purge -----------------------
    def hold(self, job_id: int, by: str) -> JobRow:
        """Called by the API: a waiting job starts only once released; one being stopped
        (preempted, requeued) is held once it has left."""
        with self.lock:
            now = self.clock.now()
            self._ingest(now)  # a job submitted a moment ago is known to the core first
            row = self.store.jobs.get(job_id)
            if row.state in ("pending", "suspended") and str(job_id) not in self.scheduler.records:
                raise ConflictError(f"job {job_id} is not read in yet; hold it in a moment")
            if row.state == "running":
                raise ConflictError(
                    f"job {job_id} is running; `gpupool requeue {job_id} --hold` stops it "
                    "(with a checkpoint) and holds it"
                )
            if row.terminal:
                raise ConflictError(f"job {job_id} has ended ({row.state}); nothing to hold")
            row = self.store.jobs.set_held(
                job_id, True, now, f"held by {by}; `gpupool release {job_id}` lets it start"
            )
            self.scheduler.observe(Hold(now, str(job_id)))
            return row

    def release(self, job_id: int, by: str) -> JobRow:
        """Called by the API: a held job may start again, in its old place in the queue."""
        with self.lock:
            now = self.clock.now()
            row = self.store.jobs.get(job_id)
            if not row.held or row.terminal:
                raise ConflictError(
                    f"job {job_id} is not on hold ({row.state}); `gpupool hold {job_id}` holds it"
                )
            row = self.store.jobs.set_held(job_id, False, now, f"released by {by}")
            key = str(job_id)
            if key in self.scheduler.book.on_hold:
                self.scheduler.observe(Release(now, key))
            self.wake.set()
            return row

    def requeue(self, job_id: int, by: str, hold: bool = False) -> JobRow:
        """Called by the API: stop a running job as a preemption does (SIGTERM, its grace
        to checkpoint) and put it back in the queue; with hold, held once it has left."""
        with self.lock:
            now = self.clock.now()
            row = self.store.jobs.get(job_id)
            key = str(job_id)
            if row.state != "running":
                waits = f"it waits in the queue already (`gpupool hold {job_id}` holds it)"
                hint = {
                    "pending": waits,
                    "suspended": waits,
                    "preempting": "it is being stopped already",
                }.get(row.state, "it has ended; submit it again to rerun it")
                raise ConflictError(f"job {job_id} is {row.state}: {hint}")
            if key not in self.executor.handles():
                raise ConflictError(f"job {job_id} is still starting; requeue it in a moment")
            commands = self.scheduler.observe(Requeue(now, key, f"requeued by {by}"))
            self._carry_out(commands, now)
            if hold:
                self.store.jobs.set_held(
                    job_id, True, now, f"held by {by}; `gpupool release {job_id}` lets it start"
                )
                self.scheduler.observe(Hold(now, key))
            self.wake.set()
            return self.store.jobs.get(job_id)

    def drain(self, node: str, by: str, undo: bool = False, reason: str = "") -> dict[str, Any]:
        """Called by the API (admin): no new job goes to the node, its jobs run on; undo
        lets it take work again. Kept in the database across restarts."""
        with self.lock:
            if node not in self.key_nodes():
                have = ", ".join(sorted(self.key_nodes()))
                raise NotFoundError(f"node {node} is not in this cluster (it has {have})")
            now = self.clock.now()
            why = reason or (f"undrained by {by}" if undo else f"drained by {by}")
            changed = self.store.nodes.set_drain(node, not undo, now, by, why)
            self.scheduler.observe(Drain(now, node, undo))
            self.wake.set()
            return {"node": node, "state": self._node_state(node), "changed": changed}

    def _recover_lifecycle(self) -> None:
        """After recover(): drains, holds, stops at a time limit and run start times from
        the database, so a restart keeps them."""
        now = self.clock.now()
        for node in self.store.nodes.drains():
            if node in self.key_nodes():
                self.scheduler.drain(node, now)
        for row in self.store.jobs.active():
            key = str(row.id)
            r = self.scheduler.records.get(key)
            if r is None:
                continue
            if row.held and row.state != "running":
                self.scheduler.hold(key, now)
            if row.state == "preempting" and row.reason.startswith(TIME_LIMIT_REASON):
                self.scheduler.restored_expiry(key, row.reason)
            if row.state == "running":  # a time limit counts from the run's real start
                started = self.store.jobs.run_started_at(row.id)
                if started is not None:
                    self.scheduler.restored_run_start(key, started)

    def _waiting_all(self, waits: Sequence[Wait], now: float) -> None:
        """Store why waiting jobs do not start, as `Code: sentence` (an empty reason:
        nothing holds them back), in one transaction. A Deferred job keeps the reason its
        Defer wrote (in local time); while the launch gate is closed a job's reason says
        that, and this one is what it gets back once the gate opens."""
        told: list[tuple[int, str, str | None]] = []
        codes: dict[int, str] = {}
        for c in waits:
            if c.code == "Deferred":
                continue
            text = c.text or "waiting for GPUs"
            job_id = int(c.job_id)
            if job_id in self.told:
                self.told[job_id] = text
                continue
            event = (
                "limit"
                if c.code in ("JobLimit", "CpuJobLimit")
                else ("wait-reason" if self.wait_codes.get(job_id) != c.code else None)
            )
            told.append((job_id, text, event))
            codes[job_id] = c.code
        if not told:
            return
        left = self.store.jobs.set_reasons(told, now)
        if len(self.wait_codes) + len(codes) > 100_000:  # bounded: at worst told twice
            self.wait_codes.clear()
        for job_id, code in codes.items():
            if job_id not in left:
                self.wait_codes[job_id] = code  # a new code is an event: the review's waits
        for job_id, state in left.items():
            if state is None:
                continue  # gone: nothing to tell it
            self.store.events.add(
                "error",
                f"job {job_id} is {state}, not pending or suspended; it changed meanwhile: "
                "read it again and decide anew",
                now,
                job_id=job_id,
            )

    def _expire(self, c: Expire, now: float) -> None:
        """A job past its time limit: SIGTERM, its grace, SIGKILL; failed once it left."""
        row = self.store.jobs.get(int(c.job_id))
        self._transition(row.id, "preempting", now, ("running",), reason=f"{c.reason}; stopping")
        if c.job_id in self.executor.handles():
            self.executor.cancel(c.job_id, row.grace_s, now)

    def _ended_by_time_limit(self, ex: Exit, row: JobRow, now: float) -> bool:
        """The exit of a job stopped at its time limit: failed with the reason (one that
        finished within its grace has succeeded, as usual)."""
        why = self.scheduler.book.expiring.get(ex.job_id)
        if why is None or ex.outcome == "succeeded":
            return False
        self.scheduler.finished(ex.job_id, now, JobState.FAILED, why)
        self._transition(
            row.id,
            "failed",
            now,
            ("running", "preempting"),
            reason=why,
            exit_code=ex.exit_code,
            ended_at=now,
        )
        return True

    def _purge(self, now: float) -> None:
        """Delete jobs that ended before the retention (with their events and job
        directories) and older job-less events: a small batch per step while there are
        more, then again after purge_every_s."""
        cfg = self.config
        if cfg.retention_s is None or now < self.next_purge:
            return
        purged = self.store.jobs.purge(now - cfg.retention_s, cfg.purge_batch)
        for job_id in purged.job_ids:
            shutil.rmtree(self.run_dir(job_id), ignore_errors=True)
            self.scheduler.forget(str(job_id))
        self.next_purge = now if purged.more else now + cfg.purge_every_s

    # ---- views for the API ----------------------------------------------------------------
    VIEW_WAIT_S = 5.0
    """How long a view waits for the loop's state before answering that the loop is stuck."""

    def cluster_view(self) -> dict[str, Any]:
        if not self.lock.acquire(timeout=self.VIEW_WAIT_S):
            raise Unavailable(
                f"the scheduler loop has held its state for over {self.VIEW_WAIT_S:g} s "
                f"(now in {self.stage}: {self.loop_error or 'no error yet'}); /healthz "
                "says more; retry shortly"
            )
        try:
            return self._cluster_view()
        finally:
            self.lock.release()

    def _cluster_view(self) -> dict[str, Any]:
        with self.lock:
            jobs_on: dict[tuple[int, int], str] = {}
            for job_id, p in self.scheduler.placements().items():
                for part in p.shares:
                    for g in part.gpus:
                        jobs_on[(part.node, g)] = job_id
            samples = {s.index: s for s in self.samples}
            reclaimable = set(self.signals.reclaimable) if self.signals is not None else set()
            nodes = []
            for k, node in enumerate(self.cluster.nodes):
                gpus = []
                for g in range(node.gpu_count):
                    dev = self.devices[(k, g)]
                    tele = self.tele_index.get((k, g))
                    info = self.gpu_info.get(tele) if tele is not None else None
                    s = samples.get(tele) if tele is not None else None
                    gpus.append(
                        {
                            "index": dev,
                            "uuid": info.uuid if info else None,
                            "model": info.model if info else node.gpu_model,
                            "mem_total_mib": info.mem_total_mib if info else None,
                            "mem_used_mib": s.mem_used_mib if s else None,
                            "util_pct": s.util_pct if s else None,
                            "temp_c": s.temp_c if s else None,
                            "power_w": s.power_w if s else None,
                            "power_limit_w": s.power_limit_w
                            if s
                            else (info.power_limit_w if info else None),
                            "sm_clock_mhz": s.sm_clock_mhz if s else None,
                            "mem_clock_mhz": s.mem_clock_mhz if s else None,
                            "ecc_uncorrected": s.ecc_uncorrected if s else None,
                            "healthy": s.healthy if s else True,
                            "problem": s.problem if s else "",
                            "job_id": int(jobs_on[(k, g)]) if (k, g) in jobs_on else None,
                            "reclaimable": tele in reclaimable,
                        }
                    )
                nodes.append(
                    {
                        "name": node.name,
                        "gpu_model": node.gpu_model,
                        "site": node.cluster,
                        "state": self._node_state(node.name),
                        "healthy": node.name not in self.bad_nodes and node.name not in self.gone,
                        "lost_total": self.nodes_lost.get(node.name, 0),
                        "gpus": gpus,
                    }
                )
            sig = self.signals
            return {
                "nodes": nodes,
                "signals": {
                    "reclaimable": sorted(reclaimable),
                    "scale_out": bool(sig.scale_out) if sig else False,
                    "mean_util_pct": sig.mean_util_pct if sig else None,
                    "window_s": sig.window_s if sig else self.config.monitor_s,
                    "evaluated_at": self.signals_at,
                },
                "queue": {
                    "pending": self.scheduler.waiting(),
                    "running": len(self.scheduler.placements()),
                },
                "scheduler_error": self.loop_error,
            }


def _read_intent(path: Path) -> tuple[str, str] | None:
    """(launch token, cgroup) of a launch intent; None if there is none, or it is torn
    (it is written to a temporary file and renamed, but not fsynced: only a crash of the
    machine can tear it, and then nothing of its attempt runs any more)."""
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(d, dict):
        return None
    return str(d.get("token") or ""), str(d.get("cgroup") or "")


def _describe(err: BaseException) -> str:
    """An error for a job's reason: our own messages as they are, others with their type
    (a database error as the driver said it, without SQLAlchemy's statement and links)."""
    if isinstance(err, GpupoolError):
        return str(err)
    orig = getattr(err, "orig", None)
    if isinstance(orig, BaseException):
        return f"{type(orig).__name__}: {orig}"
    return f"{type(err).__name__}: {err}"


def _environmental(err: BaseException) -> bool:
    """Whether a launch failed because of the machine (disk full or read-only, out of file
    descriptors or memory, the database unavailable), not because of the job."""
    seen: BaseException | None = err
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(seen, OSError) and seen.errno in ENVIRONMENT_ERRNOS:
            return True
        if transient(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _kind(gate: str | None) -> str | None:
    """DiskFull, ReadOnly, LaunchFailing: the word a gate's reason starts with."""
    return None if gate is None else gate.split(":", 1)[0]


def _job_number(job_id: object) -> int | None:
    return int(job_id) if isinstance(job_id, str) and job_id.isdigit() else None


def _site_tariffs(config: SchedulerConfig, sites: set[str]) -> dict[str, Tariff | None]:
    """The electricity tariff of each site (energy.tariff, energy.site_tariffs)."""
    e = config.energy
    names = {site: e.site_tariffs.get(site, e.tariff) for site in sorted(sites)}
    loaded = {
        name: on_wall_clock(load_tariff(name)) for name in set(names.values()) if name is not None
    }
    return {site: loaded[name] if name is not None else None for site, name in names.items()}


def ray_service(
    config: LiveConfig,
    store: Store,
    clock: Clock,
    executor: Executor | None = None,
    telemetry: Telemetry | None = None,
    cloud_runner: CommandRunner | None = None,
    lease: Lease | None = None,
) -> LiveService:
    """A LiveService on the gpupool nodes of the Ray cluster this process has joined
    (ray.init): the fleet is what `ray_nodes()` lists (plus the cloud nodes of
    `config.sites`, down until started), jobs start with `RayExecutor.launch_on` on the
    node and GPU indices the core chose, and a node that leaves the cluster is lost.
    Telemetry defaults to RayTelemetry: NVML read on each node by a small actor (a fake
    fleet of the declared GPUs on a node without any)."""
    from gpupool.server.executors.ray import RayExecutor, ray_nodes

    cloud = {c.name for c in config.sites.cloud_nodes} if config.sites else set()
    found = [n for n in ray_nodes() if n.gpu_count > 0 and n.model and n.name not in cloud]
    if not found:
        raise SpecError(
            "the Ray cluster has no gpupool nodes: start each with `ray start --resources` "
            "from gpupool.server.executors.ray.node_resources(name, model, gpus)"
        )
    config = dataclasses.replace(
        config,
        nodes=tuple((n.name, n.model, n.gpu_count) for n in found),
        node_sites=tuple((n.name, n.site) for n in found if n.site),
    )
    if executor is None:
        executor = RayExecutor({n.name: n.ray_node_id for n in found})
    if telemetry is None:
        from gpupool.server.telemetry.ray import RayTelemetry

        fleet = with_cloud_nodes(config.nodes, config.sites)  # LiveService's order
        telemetry = RayTelemetry(fleet, {n.name: n.ray_node_id for n in found})

    def probe() -> dict[str, str]:
        return {n.name: n.ray_node_id for n in ray_nodes()}

    return LiveService(
        config,
        store,
        executor,
        telemetry,
        clock,
        probe=probe,
        cloud_runner=cloud_runner,
        lease=lease,
    )


def free_loopback_port() -> int:
    """A port nothing listens on now, for a replica to serve on (127.0.0.1 only)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _copy(table: dict[str, str]) -> dict[str, str]:
    """A copy of a dict another thread may change meanwhile (retried until it holds)."""
    for _ in range(100):
        try:
            return dict(table)
        except RuntimeError:  # changed size during the copy
            continue
    return {}


def _replica_state(row: JobRow, answered: bool, cancelled: bool) -> str:
    """A replica as a client sees it: `starting` until its /metrics answers, `running`,
    `stopping` once the scheduler let it go (still serving its drain), else its job state."""
    if row.state in ("running", "preempting"):
        if cancelled or row.state == "preempting":
            return "stopping"
        return "running" if answered and row.port is not None else "starting"
    return row.state


def _ms(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else round(value, 1)


def service_json(row: ServiceRow) -> dict[str, Any]:
    return {
        "name": row.name,
        "team": row.team,
        "model": row.model,
        "gpu_model": row.gpu_model,
        "gpu_mem_mib": row.gpu_mem_mib,
        "gpu_milli": row.gpu_milli,
        "min_replicas": row.min_replicas,
        "max_replicas": row.max_replicas,
        "replica_rps": row.replica_rps,
        "slo_p99_ms": row.slo_p99_ms,
        "port_env": row.port_env,
        "command": list(row.command),
        "cwd": row.cwd,
        "grace_s": row.grace_s,
        "priority": row.priority,
        "created_at": row.created_at,
        "deleted_at": row.deleted_at,
    }

"""The live driver: the scheduler core fed by the database, an executor and telemetry.

One thread runs `step()` every cycle: new jobs from the database join the scheduler,
finished processes are reaped, GPU health is sampled, and the cycle's decisions are
carried out (launch processes, preempt with SIGTERM and a grace period). The database
is the truth a restart recovers from: a job is written as running before its process
starts, its process handle right after, and every state change with an event in one
transaction. The API thread only writes new jobs and cancel requests to the database
and wakes the loop (`Operations`), and reads what it shows (`Views`).

`LiveService` builds the parts of the loop and wires them: each gets the shared
`LoopState` and only the ports it uses, from this constructor (no globals).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gpupool.errors import SpecError
from gpupool.learning.colocation_admission import AdmissionMode
from gpupool.ports.clock.base import Clock
from gpupool.ports.cloud.base import CommandRunner
from gpupool.ports.executor.base import Executor
from gpupool.ports.telemetry.base import Telemetry
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.scheduler import Scheduler, pool_key
from gpupool.scheduler.config_schema import check_fleet
from gpupool.server.executors.mps import Mps, detect_mps
from gpupool.server.fleet.labels import merge_labels
from gpupool.server.fleet.sites import CloudNodes, pool_prices, with_cloud_nodes
from gpupool.server.ha.lease import Lease
from gpupool.server.loop.carry_out import CarryOut
from gpupool.server.loop.config import LiveConfig, map_fleet, one_team_per_card, site_tariffs
from gpupool.server.loop.diskspace import DiskProbe, StatvfsDisk
from gpupool.server.loop.fake_load import FakeLoad
from gpupool.server.loop.faults import Faults
from gpupool.server.loop.gate import LaunchGate
from gpupool.server.loop.health import LoopHealth
from gpupool.server.loop.launch import Launcher
from gpupool.server.loop.learning import ShadowTally
from gpupool.server.loop.nodes import Nodes
from gpupool.server.loop.observe import Observer
from gpupool.server.loop.operations import Operations
from gpupool.server.loop.record import DecisionRecord
from gpupool.server.loop.recovery import Recovery
from gpupool.server.loop.services import Services
from gpupool.server.loop.state import LoopState
from gpupool.server.loop.views import Views
from gpupool.server.store import Retry, Store
from gpupool.server.telemetry.history import attach, running_replicas
from gpupool.server.telemetry.prometheus import StartLatency
from gpupool.server.telemetry.replica_load import LoadWindow, Scraper
from gpupool.sizing.catalog import load_catalog
from gpupool.traces.colocation_setup import load_pair_admission

log = logging.getLogger("gpupool.server")

NO_PROGRESS = (
    "no measured speeds: this executor does not report job progress, so the co-location "
    "guard judges no pairs (its record stays empty and a promotion is refused)"
)


class LiveService:
    """The live service: its ports, the core, the loop's parts wired together, and the
    loop thread that runs `step()`. The API reaches the loop through `operations` (what
    it asks) and `views` (what it shows); parity tests read `record`."""

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
        scraper: Scraper | None = None,
    ) -> None:
        """`probe`, for a fleet of `config.nodes`, names the nodes alive now (node name ->
        an id that changes when the node restarts, e.g. the Ray node id): polled at most
        once a second, a node it no longer lists is lost and its jobs requeued. `disk`
        measures the state directory's free space (statvfs of it by default); `lease`, the
        controller lease this service was started under: the loop stops when it is lost;
        `scraper` reads the services' replicas' /metrics (over HTTP by default)."""
        self.config = config
        self.state = state = LoopState()
        self.health = LoopHealth(config.late_after_s)
        self.raw_store = store
        """The store without retries: for best-effort writes that must not hold the loop."""
        self.faults = Faults(state, self.health, store, clock)
        self.store = store.retrying(Retry(config.db_retry, self.faults.db_retry, state.stopping))
        self.executor = executor
        self.telemetry = telemetry
        self.clock = clock
        self.inventory = telemetry.inventory()
        self.map = fleet = map_fleet(config, self.inventory)
        """The fleet as the core counts it; its parts are also this service's own names
        (`cluster`, `devices`, ...), which the telemetry history and the API read."""
        self.cluster, self.devices, self.tele_index = fleet.cluster, fleet.devices, fleet.tele_index
        self.key_of, self.gpu_info, self.fleet = fleet.key_of, fleet.gpu_info, fleet.declared
        self.probe = probe
        sites = config.sites
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
        colocation = load_pair_admission(sched.sharing.admission, config.source)
        if colocation is not None and getattr(executor, "progress", None) is None:
            colocation.measured_note = NO_PROGRESS
            if colocation.mode is AdmissionMode.LEARNED:
                raise SpecError(
                    f"{config.source}: sharing.admission.mode active needs the measured speeds "
                    "its guard falls back on, and this executor reports no job progress: use "
                    "mode: shadow (the rule decides) or decider: rule"
                )
        self.scheduler = Scheduler(
            self.cluster,
            sched,
            colocation=colocation,
            pool_price=prices,
            topology=topology,
            catalog=catalog,
            tariffs=site_tariffs(sched, {n.cluster for n in self.cluster.nodes}),
            cloud_nodes=[c.name for c in sites.cloud_nodes] if sites is not None else (),
            seed=config.seed,
            replica_id=self._new_replica,
        )
        check_fleet(sched, self.scheduler.fleet.pool_gpus, config.source)
        self.cloud: CloudNodes | None = None
        if sites is not None and sites.cloud_nodes:
            self.cloud = CloudNodes(sites, config.state_dir, cloud_runner)
        self.nodes = Nodes(
            state, fleet, self.scheduler, self.store, executor, probe, self.cloud, clock.now()
        )
        self.record = DecisionRecord()
        """Every start, resume, preemption and launch (and command, when asked): parity."""
        self.thread: threading.Thread | None = None
        self.lease = lease
        self.on_lease_lost: Callable[[], None] | None = None
        """Called (from the loop thread) once the lease is lost and the loop has stopped."""
        self.jobs_dir = config.jobs_dir
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.disk: DiskProbe = disk if disk is not None else StatvfsDisk(self.jobs_dir)
        self.scraper = (
            scraper
            if scraper is not None
            else Scraper(
                LoadWindow(sched.autoscale_load_window_s),
                clock.now,
                every_s=config.scrape_s,
                timeout_s=config.scrape_timeout_s,
            )
        )
        self.services = Services(
            state, config, fleet, self.scheduler, self.store, clock, self.scraper
        )
        self.start_latency = StartLatency()
        """Queue wait and submit-to-start histograms by kind, observed as processes start."""
        self.history = attach(self)
        """Per-card bucket means and services' p99, written once a bucket (the review's)."""
        self.shadow = ShadowTally()
        """Shadow cycles of the learned policy since start (counts; events are bounded)."""
        self.learning = sched.policy == "learned"
        """Whether the core runs the learned policy (shadow or active)."""
        self.launch_gate = LaunchGate(state, config.disk_floor, self.disk, self.scheduler, store)
        fake_load = FakeLoad(telemetry, self.scheduler, fleet)
        self.launcher = Launcher(
            state,
            config,
            fleet,
            self.scheduler,
            self.store,
            executor,
            telemetry,
            self.mps,
            self.services,
            self.launch_gate,
            self.faults,
            self.record,
            self.start_latency,
            fake_load,
        )
        self.carry_out = CarryOut(
            state,
            config,
            fleet,
            self.scheduler,
            self.store,
            executor,
            telemetry,
            self.cloud,
            self.nodes,
            self.launcher,
            self.launch_gate,
            self.faults,
            self.record,
            self.shadow,
        )
        self.observer = Observer(
            state,
            config,
            fleet,
            self.scheduler,
            self.store,
            store,
            executor,
            telemetry,
            self.nodes,
            self.carry_out,
            fake_load,
            self.faults,
        )
        self.views = Views(
            state,
            config,
            fleet,
            self.scheduler,
            self.store,
            executor,
            clock,
            self.health,
            lease,
            self.launch_gate,
            self.nodes,
            self.services,
            self.scraper,
            self.shadow,
            self.start_latency,
            self.learning,
        )
        """What the API shows (cluster, /healthz, services, the learned policy, logs)."""
        self.operations = Operations(
            state,
            config,
            fleet,
            self.scheduler,
            self.store,
            executor,
            clock,
            self.services,
            self.nodes,
            self.observer,
            self.carry_out,
            self.views,
            self.learning,
            telemetry,
        )
        """What the API asks (cancel, hold, release, requeue, drain, services, learning,
        faults on the fake fleet)."""
        self.recovery = Recovery(
            state,
            config,
            fleet,
            self.scheduler,
            self.store,
            executor,
            clock,
            self.services,
            self.carry_out,
            self.operations,
            self.learning,
        )
        self.recovery.run()

    def _new_replica(self, service: str, seq: int, gpu_milli: int) -> str:
        """The core's `replica_id`: a replica it wants becomes a job row (`Services`)."""
        return self.services.new_replica(service, seq, gpu_milli)

    # ---- the loop -----------------------------------------------------------------------------
    def start(self) -> None:
        watch = getattr(self.executor, "watch_exits", None)
        if watch is not None:  # an ended job is reaped at once, not at the next cycle
            watch(self.state.wake.set)
        self.thread = threading.Thread(target=self._run, name="gpupool-scheduler", daemon=True)
        self.health.started(self.thread)
        self.thread.start()

    def stop(self) -> None:
        self.state.stopping.set()
        self.state.wake.set()
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
        state = self.state
        try:
            while not state.stopping.is_set():
                started = time.monotonic()
                if self.lease is not None and not self.lease.held():
                    self._lease_lost()
                    return
                try:
                    self.step()
                except Exception as err:  # the stages catch their own; this is the last net
                    self.faults.report("cycle", err)
                self.health.completed()
                if state.wake.wait(self.config.cycle_s):
                    self._expect_launch()
                state.wake.clear()
                rest = self.MIN_STEP_S - (time.monotonic() - started)
                if rest > 0:
                    state.stopping.wait(rest)
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
                self.faults.report("launch", err)

    def _lease_lost(self) -> None:
        why = (
            f"lost the controller lease on {self.lease.where if self.lease else '?'} (its "
            "database session ended, or its lock file was removed or replaced); scheduling "
            "stopped so that only one controller runs"
        )
        log.critical(why)
        self.state.loop_error = why
        self.health.dead(why)
        if self.on_lease_lost is not None:
            self.on_lease_lost()

    def step(self) -> None:
        state, observer = self.state, self.observer
        with state.lock:
            now = self.clock.now()
            state.loop_error = None
            # What ended frees GPUs before what arrived is considered; measurements come
            # before the arrivals too (a job's pool is chosen on them), as in the simulator.
            self._stage("reap", observer.reap, now)
            if observer.sample_due(now):
                self._stage("sample", observer.sample, now)
            self._stage("progress", observer.progress, now)
            if self.scheduler.services:
                self._stage("services", self.services.measure, now)
            self._stage("ingest", observer.ingest, now)
            if self.nodes.probe_due(now):
                self._stage("probe", self.nodes.check_probe, now)
            if self.cloud is not None:
                self._stage("cloud", self.nodes.check_cloud, now)
            self._stage("disk", self.launch_gate.check, now)
            if state.gate is None:
                self._stage("cycle", self._cycle, now)
            self._stage("purge", self.carry_out.purge, now)
            self._stage("history", self._history, now)
            state.stage = "idle"

    def _history(self, now: float) -> None:
        self.history.step(
            now, self.state.samples, running_replicas(self.scheduler, self.state.endpoints)
        )

    def _cycle(self, now: float) -> None:
        self.carry_out.run(self.scheduler.cycle(now), now)

    # ---- faults ---------------------------------------------------------------------------
    def _stage(self, stage: str, fn: Callable[..., None], *args: Any) -> None:
        self.state.stage = stage
        try:
            fn(*args)
        except Exception as err:
            self.faults.report(stage, err)


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
    from gpupool.server.executors.ray import RayExecutor
    from gpupool.server.executors.ray_nodes import ray_nodes

    cloud = {c.name for c in config.sites.cloud_nodes} if config.sites else set()
    found = [n for n in ray_nodes() if n.gpu_count > 0 and n.model and n.name not in cloud]
    if not found:
        raise SpecError(
            "the Ray cluster has no gpupool nodes: on each GPU machine run `gpupool node join "
            "HEAD_ADDRESS` (docs/cluster.md)"
        )
    config = dataclasses.replace(
        config,
        nodes=tuple((n.name, n.model, n.gpu_count) for n in found),
        node_sites=tuple((n.name, n.site) for n in found if n.site),
        node_labels=merge_labels(((n.name, n.labels) for n in found), config.node_labels),
    )
    if executor is None:
        executor = RayExecutor({n.name: n.ray_node_id for n in found})
    if telemetry is None:
        from gpupool.server.telemetry.ray import RayTelemetry

        fleet = with_cloud_nodes(config.nodes, config.sites)  # LiveService's order
        telemetry = RayTelemetry(
            fleet,
            {n.name: n.ray_node_id for n in found},
            miss_limit=config.telemetry_miss_limit,
        )

    def probe() -> dict[str, str]:
        """The live gpupool nodes (with GPUs, as the fleet above takes them)."""
        return {n.name: n.ray_node_id for n in ray_nodes() if n.gpu_count > 0 and n.model}

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

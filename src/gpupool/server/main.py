"""`gpupool serve`: the database, the executor, telemetry and the API in one process.

serve() takes typed ServeOptions; the command line that fills them is gpupool.cli.serve's
(the server imports nothing of the command line).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from gpupool.domain.quota import TeamQuota
from gpupool.errors import ConflictError, SpecError
from gpupool.ports.clock.base import Clock, StartedClock, SystemClock
from gpupool.ports.telemetry.base import Telemetry
from gpupool.ports.telemetry.fake import FakeTelemetry, fake_nodes, parse_inlet
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.config_schema import SCHEDULING_KEYS, parse_scheduling
from gpupool.server.agent.storage import SECTION as STORAGE_SECTION
from gpupool.server.agent.storage import StorageConfig, load_storage, prepare_shared, probe
from gpupool.server.executors.local import LocalExecutor
from gpupool.server.fleet.labels import SECTION as LABELS_SECTION
from gpupool.server.fleet.labels import load_labels, merge_labels
from gpupool.server.fleet.sites import load_sites
from gpupool.server.ha.lease import Lease, controller_lease
from gpupool.server.isolation.containment import SECTION as ISOLATION_SECTION
from gpupool.server.isolation.containment import Isolation, service_isolation, sqlite_file
from gpupool.server.loop.config import LIVE_DEFAULTS, LiveConfig
from gpupool.server.loop.diskspace import DEFAULT_FLOOR_MIB, DEFAULT_FLOOR_PCT, DiskFloor
from gpupool.server.loop.driver import LiveService
from gpupool.server.loop.endpoints import SECTION as NETWORK_SECTION
from gpupool.server.loop.endpoints import load_network
from gpupool.server.store import NewJob, Store, database_url
from gpupool.server.telemetry.history import SECTION as HISTORY_SECTION
from gpupool.server.telemetry.history import load_history
from gpupool.server.telemetry.misses import KEY as MISS_LIMIT_KEY
from gpupool.server.telemetry.misses import load_miss_limit, parse_miss_limit
from gpupool.server.telemetry.nvml import NoGpuError, NvmlTelemetry
from gpupool.specfile import SpecReader

DEFAULT_PORT = 8642


DEFAULT_LIMIT_CONCURRENCY = 1024
"""Connections (and requests in progress) served at once; beyond it, 503 at once."""
DEFAULT_BACKLOG = 2048


@dataclass(frozen=True)
class ServeOptions:
    """What `gpupool serve` runs with; gpupool.cli.serve reads them from its flags, whose
    defaults are these. Each field is the flag of the same name (units in the name where
    the flag's has none: --cycle is cycle_s); serve() checks them and says which flag is
    wrong."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    db: str | None = None
    state_dir: Path = Path(".gpupool")
    fake_gpus: str | None = None
    auth: str = "token"
    """token: bearer tokens; none: no authentication (loopback only)."""
    config: Path | None = None
    cycle_s: float | None = None
    """None: the config file's cycle_s, else the service's default."""
    sample_s: float = 1.0
    scrape_s: float = 1.0
    fake_inlet: str | None = None
    clock_start: str | None = None
    clock_speed: float = 1.0
    monitor_s: float = 300.0
    retention_days: float = 30.0
    ray: str | None = None
    """The Ray cluster's address (host:port or auto); None: the local executor."""
    ray_namespace: str = "gpupool"
    max_starts: int | None = None
    sites: Path | None = None
    no_isolation: bool = False
    demo: bool = False
    tls_cert: Path | None = None
    tls_key: Path | None = None
    limit_concurrency: int = DEFAULT_LIMIT_CONCURRENCY
    backlog: int = DEFAULT_BACKLOG
    open_metrics: bool = False
    open_docs: bool = False
    audit_days: float = 90.0
    standby: bool = True
    lost_retries: int = 3
    disk_floor_mib: float = DEFAULT_FLOOR_MIB
    disk_floor_pct: float = DEFAULT_FLOOR_PCT
    health_late_s: float | None = None


def uvicorn_options(opts: ServeOptions) -> dict[str, Any]:
    """What `serve` hands uvicorn besides the app: TLS files and connection limits."""
    if (opts.tls_cert is None) != (opts.tls_key is None):
        raise SpecError("--tls-cert and --tls-key go together: give the certificate and its key")
    for flag, path in (("--tls-cert", opts.tls_cert), ("--tls-key", opts.tls_key)):
        if path is not None and not path.is_file():
            raise SpecError(f"{flag} {path}: no such file; give the PEM file's path")
    if opts.limit_concurrency < 1 or opts.backlog < 1:
        raise SpecError("--limit-concurrency and --backlog must be at least 1")
    if not opts.audit_days > 0:
        raise SpecError(f"--audit-days must be more than 0, got {opts.audit_days}")
    options: dict[str, Any] = {
        # uvicorn refuses the connection that makes the count reach its limit
        "limit_concurrency": opts.limit_concurrency + 1,
        "backlog": opts.backlog,
    }
    if opts.tls_cert is not None:
        options["ssl_certfile"] = str(opts.tls_cert)
        options["ssl_keyfile"] = str(opts.tls_key)
    return options


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def open_storage(path: Path | None) -> StorageConfig:
    """The --config file's `storage:`; its shared directory made ready and proven
    writable from here, or the server refuses to start with the reason."""
    storage = load_storage(path)
    if storage.shared_dir is not None:
        try:
            prepare_shared(storage.shared_dir)
        except OSError as err:
            raise SpecError(
                f"storage.shared_dir {storage.shared_dir}: cannot prepare it "
                f"({err.strerror or err}); mount it, or fix its permissions"
            ) from None
        why = probe(storage.shared_dir, "server")
        if why:
            raise SpecError(f"storage.shared_dir: {why}")
    return storage


def load_service_config(path: Path | None, defaults: SchedulerConfig) -> SchedulerConfig:
    """`--config FILE`: the scheduling section of a scenario file (SCHEDULING_KEYS) over
    `defaults`; no file, or an empty one, is `defaults`. The quotas are checked against
    the fleet later, once it is known (gpupool.scheduler.config_schema.check_fleet)."""
    if path is None:
        return defaults
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise SpecError(
            f"{path}: cannot read the service config ({err.strerror or err}); "
            "check the --config path"
        ) from None
    except yaml.YAMLError as err:
        raise SpecError(f"{path}: not valid YAML: {err}") from None
    # isolation: containment.py; history: telemetry/history.py; storage: agent/storage.py;
    # network: loop/endpoints.py; telemetry_miss_limit: telemetry/misses.py
    sections = (
        ISOLATION_SECTION,
        HISTORY_SECTION,
        STORAGE_SECTION,
        NETWORK_SECTION,
        MISS_LIMIT_KEY,
        LABELS_SECTION,
    )
    allowed = SCHEDULING_KEYS | set(sections)
    top = SpecReader(str(path)).mapping({} if raw is None else raw, "top level", allowed)
    parse_miss_limit(top.get(MISS_LIMIT_KEY), str(path))  # refused before anything starts
    top = {k: v for k, v in top.items() if k not in sections}
    return parse_scheduling(top, str(path), defaults)


def service_scheduling(opts: ServeOptions) -> SchedulerConfig:
    """What the service's core decides by: LIVE_DEFAULTS, then the --config file, then
    the command line (--cycle, when given, overrides the file's cycle_s; --max-starts),
    and the demo teams for --demo with a file that names none. With --sites, the sites
    file alone gives the burst rules and site placement (live.py applies them over
    these), so the --config file must leave them out."""
    scheduling = load_service_config(opts.config, LIVE_DEFAULTS)
    if scheduling.autoscale_demand == "declared":
        raise SpecError(
            "autoscale.demand: declared follows peaks a driver declares (a scenario's load "
            "curves); the service measures its services' rates: choose reactive (the "
            "default) or forecast"
        )
    if opts.cycle_s is not None:
        if not opts.cycle_s > 0:
            raise SpecError(f"--cycle must be a positive number of seconds, got {opts.cycle_s}")
        scheduling = dataclasses.replace(scheduling, cycle_s=opts.cycle_s)
    if opts.demo and not scheduling.teams:
        scheduling = dataclasses.replace(
            scheduling, teams=(TeamQuota("serving", {}, {}), TeamQuota("research", {}, {}))
        )
    if opts.sites is not None:
        d = LIVE_DEFAULTS
        given = [
            key
            for key, value, default in (
                ("burst", scheduling.burst, d.burst),
                ("placement.site", scheduling.placement.site, d.placement.site),
                (
                    "placement.value_of_time_usd_per_h",
                    scheduling.placement.value_of_time_usd_per_h,
                    d.placement.value_of_time_usd_per_h,
                ),
            )
            if value != default
        ]
        if given:
            raise SpecError(
                f"{opts.config}: {', '.join(given)}: with --sites these come from "
                f"{opts.sites} (burst:, placement:, value_of_time_usd_per_h:); "
                "drop them from --config or from --sites"
            )
    if opts.max_starts is not None and opts.max_starts < 1:
        raise SpecError(f"--max-starts must be at least 1, got {opts.max_starts}")
    return dataclasses.replace(
        scheduling,
        max_starts_per_cycle=opts.max_starts
        if opts.max_starts is not None
        else (16 if opts.ray is not None else None),
    )


def with_fake_nodes(config: LiveConfig, fake_gpus: str | None) -> LiveConfig:
    """A fake fleet given as nodes (`--fake-gpus 2x8xA100-80GB@rack=r1,...`) is the
    service's declared fleet, each node with its labels (--config `labels:` win per key)."""
    nodes = fake_nodes(fake_gpus) if fake_gpus else ()
    if not nodes:
        return config
    return dataclasses.replace(
        config,
        nodes=tuple((n.name, n.model, n.gpu_count) for n in nodes),
        node_labels=merge_labels(((n.name, n.labels) for n in nodes), config.node_labels),
    )


def open_clock(start: str | None, speed: float) -> Clock:
    """The system clock, or with --clock-start one that starts then (and runs `speed`x)."""
    if start is None:
        if speed != 1.0:
            raise SpecError("--clock-speed needs --clock-start (the moment the clock starts at)")
        return SystemClock()
    try:
        at = float(start)
    except ValueError:
        try:
            moment = datetime.fromisoformat(start)
        except ValueError:
            raise SpecError(
                f"--clock-start {start!r}: give a UTC time like 2026-12-01T23:59:00 or Unix seconds"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        at = moment.timestamp()
    return StartedClock(at, speed)


def open_telemetry(fake: str | None, demo: bool, inlet: str | None = None) -> Telemetry:
    if inlet and not fake:
        raise SpecError("--fake-inlet is for a fake fleet: add --fake-gpus")
    if fake:
        return FakeTelemetry(fake, inlet_c=parse_inlet(inlet))
    try:
        return NvmlTelemetry()
    except NoGpuError as err:
        if demo:
            print(f"gpupool: {err}; the demo uses a fake fleet of 4xA100-80GB", file=sys.stderr)
            return FakeTelemetry("4xA100-80GB")
        raise


DEMO_JOBS = (
    ("train-a", "research", "training", 1, ["--steps", "120", "--step-s", "0.5", "--every", "10"]),
    ("train-b", "research", "training", 2, ["--steps", "240", "--step-s", "0.5", "--every", "20"]),
    ("batch-c", "research", "offline-inference", 1, ["--steps", "60", "--step-s", "0.5"]),
    ("chat", "serving", "online-inference", 1, ["--steps", "600", "--step-s", "0.5"]),
)


def submit_demo(store: Store) -> None:
    now = time.time()
    for name, team, kind, gpus, args in DEMO_JOBS:
        store.jobs.submit(
            NewJob(
                name=name,
                team=team,
                kind=kind,
                priority=100 if kind == "online-inference" else 50,
                gpu_count=gpus,
                command=(sys.executable, "-m", "gpupool.examples.ckpt_counter", *args),
                grace_s=10.0,
                checkpoint_every_s=10.0,
                owner="demo",
            ),
            now,
            idempotency_key=f"demo-{name}",
        )


def bootstrap_admin(store: Store) -> str:
    """The admin token a server without an active one makes for itself and prints once:
    named admin, or admin-<time> when a team or read-only token holds that name."""
    now = time.time()
    try:
        return store.auth.create_token("admin", None, now)
    except ConflictError:
        return store.auth.create_token(f"admin-{int(now)}", None, now)


def serve(opts: ServeOptions) -> int:
    import uvicorn

    from gpupool.server.api.app import create_app

    auth = opts.auth == "token"
    if not auth and not _loopback(opts.host):
        raise SpecError(
            f"--auth none is allowed only on a loopback address, not {opts.host}; "
            "drop --auth none or bind to 127.0.0.1"
        )
    state_dir: Path = opts.state_dir
    state_dir.mkdir(parents=True, exist_ok=True)
    scheduling = service_scheduling(opts)
    if opts.sites is not None and opts.ray is None:
        raise SpecError(
            "--sites places jobs over the nodes of a Ray cluster: add --ray ADDRESS "
            "(a machine's own GPUs join as a Ray node too, see docs/ray.md)"
        )
    if opts.ray is not None and opts.fake_gpus:
        raise SpecError(
            "--fake-gpus is for the local executor; on Ray each node declares its GPUs "
            "(a node without any reads as a fake fleet of what it declares)"
        )
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s gpupool %(levelname)s %(message)s"
    )
    logging.getLogger("gpupool").setLevel(logging.INFO)
    sites = load_sites(opts.sites) if opts.sites is not None else None
    served = uvicorn_options(opts)
    _check_loop_flags(opts)
    store = Store(database_url(opts.db, state_dir))
    store.migrate()
    isolation = service_isolation(opts.config, opts.no_isolation, opts.demo)
    config = LiveConfig(
        state_dir=state_dir,
        scheduling=scheduling,
        sample_s=opts.sample_s,
        scrape_s=opts.scrape_s,
        monitor_s=opts.monitor_s,
        sites=sites,
        retention_s=opts.retention_days * 86_400.0 if opts.retention_days > 0 else None,
        source=str(opts.config) if opts.config is not None else "the service's defaults",
        lost_retries=opts.lost_retries,
        disk_floor=DiskFloor(opts.disk_floor_mib, opts.disk_floor_pct),
        health_late_s=opts.health_late_s,
        history=load_history(opts.config),
        storage=open_storage(opts.config),
        network=load_network(opts.config),
        telemetry_miss_limit=load_miss_limit(opts.config),
        node_labels=load_labels(opts.config),
    )
    config = with_fake_nodes(config, opts.fake_gpus if opts.ray is None else None)
    scheme = "https" if opts.tls_cert is not None else "http"
    url = f"{scheme}://{opts.host}:{opts.port}"
    lease = controller_lease(store.url)
    active = lease.try_acquire()
    if not active and not opts.standby:
        raise SpecError(
            f"another gpupool serve ({lease.holder()}) controls this database (lease on "
            f"{lease.where}); stop it first, or drop --no-standby to stand by and take over "
            "when it ends"
        )
    if auth and not store.auth.has_admin():
        token = bootstrap_admin(store)
        print(f"admin token (shown once, keep it): {token}")
        print(f"  export GPUPOOL_URL={url} GPUPOOL_TOKEN={token}")
    elif not auth:
        print(f"  export GPUPOOL_URL={url}   (no authentication: loopback only)")
    print(f"  dashboard: {url}/  (sign in with a token)" if auth else f"  dashboard: {url}/")
    if auth and scheme == "http" and not _loopback(opts.host):
        print(
            "  warning: tokens cross the network in clear text; "
            "serve HTTPS with --tls-cert/--tls-key (or behind a TLS proxy)"
        )
    held: list[LiveService] = []
    apps: list[Any] = []
    stopping = threading.Event()
    restart = threading.Event()

    def restart_for(nodes: list[str]) -> None:
        """Nodes joined that the fleet does not have: stop serving (the jobs run on), then
        start again in place (`restart_in_place`), which adopts them with the new fleet."""
        if restart.is_set():
            return
        restart.set()
        print(f"gpupool: node(s) {', '.join(nodes)} joined: restarting to add them", flush=True)
        os.kill(os.getpid(), signal.SIGINT)  # uvicorn stops as on Ctrl-C

    def take_over() -> Any:
        """Build the live service (recovering from the database), start its loop."""
        live = _build_live(opts, config, store, lease, isolation)
        isolation.secure_state(
            state_dir, live.jobs_dir, sqlite_file(database_url(opts.db, state_dir))
        )
        live.on_lease_lost = _exit_on_lease_loss
        if opts.ray is not None:
            live.nodes.on_new_nodes = restart_for
        _announce(opts, live, url, state_dir)
        if opts.demo:
            submit_demo(store)
            print("demo jobs submitted; try: gpupool ls, gpupool top, gpupool logs -f 1")
        sys.stdout.flush()
        app = create_app(
            live,
            store,
            auth,
            open_metrics=opts.open_metrics,
            open_docs=opts.open_docs,
            audit_keep_days=opts.audit_days,
        )
        apps.append(app)
        held.append(live)
        live.start()
        return app

    if active:
        logging.getLogger("gpupool.server").info(
            "active controller: holds the lease on %s", lease.where
        )
        app: Any = take_over()
    else:
        from gpupool.server.ha.standby import Switch, standby_app, wait_for_lease

        switch = Switch(standby_app(lease, time.time()))
        print(
            f"gpupool standing by on {url}: another gpupool serve ({lease.holder()}) controls "
            f"this database (lease on {lease.where}); taking over when it ends"
        )
        sys.stdout.flush()

        def promote() -> None:
            try:
                switch.app = take_over()
            except BaseException:
                logging.getLogger("gpupool.server").critical(
                    "standby: could not take over; exiting so the lease is free", exc_info=True
                )
                _exit_on_lease_loss()

        wait_for_lease(lease, promote, stopping)
        app = switch
    try:
        uvicorn.run(
            app,
            host=opts.host,
            port=opts.port,
            log_level="warning",
            access_log=False,
            **served,
        )
    finally:
        stopping.set()
        for full in apps:
            full.state.audit.flush(5.0)
        for live in held:
            live.stop()
            live.telemetry.close()
        if opts.ray is not None and held:
            import ray

            ray.shutdown()
        lease.release()
    if restart.is_set():
        restart_in_place()
    return 0


def restart_in_place() -> None:
    """The same `gpupool serve` command again, in this process (its pid, so a supervisor
    sees no exit): it recovers from the database and adopts the running jobs."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "gpupool", *sys.argv[1:]])


def _check_loop_flags(opts: ServeOptions) -> None:
    if opts.lost_retries < 0:
        raise SpecError(f"--lost-retries must be 0 or more, got {opts.lost_retries}")
    if opts.disk_floor_mib < 0 or not 0 <= opts.disk_floor_pct <= 100:
        raise SpecError(
            "--disk-floor-mib must be 0 or more and --disk-floor-pct between 0 and 100, "
            f"got {opts.disk_floor_mib} and {opts.disk_floor_pct}"
        )
    if opts.health_late_s is not None and not opts.health_late_s > 0:
        raise SpecError(
            f"--health-late must be a positive number of seconds, got {opts.health_late_s}"
        )


def _exit_on_lease_loss() -> None:
    """Stop the whole server (uvicorn shuts down on SIGTERM): a controller without the
    lease must not schedule; restarted, it stands by."""
    os.kill(os.getpid(), signal.SIGTERM)


def _build_live(
    opts: ServeOptions, config: LiveConfig, store: Store, lease: Lease, isolation: Isolation
) -> LiveService:
    """The live service: on Ray, or on this machine with the jobs isolated as configured;
    says what the isolation cannot guarantee here."""
    if opts.ray is not None:
        live = _ray_live(opts, config, store, lease, isolation)
        for note in isolation.cannot_guarantee():
            print(f"gpupool: not guaranteed: {note}", file=sys.stderr)
        return live
    telemetry = open_telemetry(opts.fake_gpus, opts.demo, opts.fake_inlet)
    executor = LocalExecutor(isolation=isolation, address=config.network.node_address)
    for note in isolation.cannot_guarantee() + executor.cannot_guarantee():
        print(f"gpupool: not guaranteed: {note}", file=sys.stderr)
    return LiveService(
        config,
        store,
        executor,
        telemetry,
        open_clock(opts.clock_start, opts.clock_speed),
        lease=lease,
    )


def _announce(opts: ServeOptions, live: LiveService, url: str, state_dir: Path) -> None:
    print(
        f"gpupool serving on {url} ({len(live.inventory)} GPUs: "
        f"{', '.join(sorted({g.model for g in live.inventory}))}; state in {state_dir}; "
        f"controller lease on {live.lease.where if live.lease else '-'})"
    )
    if opts.ray is not None:
        for node in live.cluster.nodes:
            cloud = live.cloud is not None and node.name in live.cloud.names()
            print(
                f"  node {node.name}: {node.gpu_count}x{node.gpu_model}, site {node.cluster}"
                + (" (cloud: started on burst)" if cloud else "")
            )


def _ray_live(
    opts: ServeOptions,
    config: LiveConfig,
    store: Store,
    lease: Lease | None = None,
    isolation: Isolation | None = None,
) -> LiveService:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
    except ImportError:
        raise SpecError(
            "--ray needs Ray, an optional part of gpupool: pip install 'gpupool[ray]' "
            "(the local executor needs nothing more: leave out --ray)"
        ) from None
    from gpupool.server.executors.ray import RayExecutor
    from gpupool.server.executors.ray_launcher import AgentSettings
    from gpupool.server.loop.driver import ray_service

    try:
        ray.init(
            address=opts.ray,
            namespace=opts.ray_namespace,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise SpecError(
            f"cannot join the Ray cluster at {opts.ray}: {err}; start it with "
            "`ray start --head` and pass its address (host:port), or auto"
        ) from None
    return ray_service(
        config,
        store,
        open_clock(opts.clock_start, opts.clock_speed),
        executor=RayExecutor(
            namespace=opts.ray_namespace,
            agent=AgentSettings(
                contain=isolation is not None and isolation.enabled,
                log_max_bytes=isolation.log_max_bytes if isolation is not None else None,
                shared_dir=str(config.storage.shared_dir) if config.storage.shared_dir else None,
            ),
            isolation=isolation if isolation is not None and isolation.enabled else None,
        ),
        lease=lease,
    )

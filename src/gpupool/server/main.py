"""`gpupool serve`: the database, the executor, telemetry and the API in one process."""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import logging
import os
import signal
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from gpupool.cli.verbs import HELP
from gpupool.domain.quota import TeamQuota
from gpupool.errors import ConflictError, SpecError
from gpupool.ports.clock.base import Clock, StartedClock, SystemClock
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.config_schema import SCHEDULING_KEYS, parse_scheduling
from gpupool.server.executors.local import LocalExecutor
from gpupool.server.fleet.sites import load_sites
from gpupool.server.ha.lease import Lease, controller_lease
from gpupool.server.isolation.containment import SECTION as ISOLATION_SECTION
from gpupool.server.isolation.containment import Isolation, service_isolation, sqlite_file
from gpupool.server.loop.diskspace import DEFAULT_FLOOR_MIB, DEFAULT_FLOOR_PCT, DiskFloor
from gpupool.server.loop.driver import LIVE_DEFAULTS, LiveConfig, LiveService
from gpupool.server.store import NewJob, Store, database_url
from gpupool.server.telemetry.history import SECTION as HISTORY_SECTION
from gpupool.server.telemetry.history import load_history
from gpupool.server.telemetry.nvml import FakeTelemetry, NoGpuError, NvmlTelemetry, Telemetry
from gpupool.specfile import SpecReader

DEFAULT_PORT = 8642


def add_serve_parser(sub: Any) -> None:
    sp = sub.add_parser(
        "serve",
        help=HELP["serve"],
        description="Run the live scheduler on this machine's GPUs. Examples:\n"
        "  gpupool serve                                  # SQLite in --state-dir, NVML GPUs\n"
        "  gpupool serve --fake-gpus 4xA100-80GB --auth none\n"
        "  gpupool serve --db postgresql://user@127.0.0.1:5432/gpupool\n"
        "  gpupool serve --demo                           # what `make run` does\n"
        "  gpupool serve --ray 10.0.0.5:6379              # jobs run on a Ray cluster's nodes\n"
        "  gpupool serve --ray auto --sites sites.yaml    # several clusters, cloud burst\n"
        "On Ray, each node joins gpupool by declaring its name, GPU model, GPU indices and\n"
        "(optionally) site as custom resources; see docs/ray.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sp.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    sp.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    sp.add_argument(
        "--db",
        help="database URL: sqlite:///FILE or postgresql://... (default: SQLite in the state dir)",
    )
    sp.add_argument(
        "--state-dir",
        type=Path,
        default=Path(".gpupool"),
        help="where the SQLite file, job logs and checkpoints live (.gpupool)",
    )
    sp.add_argument(
        "--fake-gpus",
        help="run on a fake fleet, e.g. 4xA100-80GB or "
        "2xH100,2xRTX-4090: jobs run as real processes that get no GPU",
    )
    sp.add_argument(
        "--auth",
        choices=("token", "none"),
        default="token",
        help="token (default): bearer tokens; none: only when bound to loopback",
    )
    sp.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="YAML with a scenario's scheduling section: "
        + ", ".join(sorted(SCHEDULING_KEYS))
        + " (scenarios/README.md); absent keys keep the service defaults "
        "(1 s cycle, a 20%% online reserve once online inference is submitted, 60 s "
        "minimum runtime before preemption)",
    )
    sp.add_argument(
        "--cycle",
        type=float,
        default=None,
        help="scheduling cycle, s; overrides the config file's cycle_s (default: the "
        "file's cycle_s, else 1)",
    )
    sp.add_argument("--sample", type=float, default=1.0, help="telemetry sampling, s (1)")
    sp.add_argument(
        "--scrape",
        type=float,
        default=1.0,
        help="how often each service replica's /metrics is scraped, s (1)",
    )
    sp.add_argument(
        "--fake-inlet",
        metavar="GPU=C,...",
        help="with --fake-gpus: the air some fake GPUs breathe, e.g. 0=45,1=45 (a hot "
        "aisle; the others 30 C): their temperatures follow, for thermal placement",
    )
    sp.add_argument(
        "--clock-start",
        metavar="TIME",
        help="rehearse a schedule: the scheduler's clock starts at this UTC time "
        "(2026-12-01T23:59:00, or Unix seconds) instead of now",
    )
    sp.add_argument(
        "--clock-speed",
        type=float,
        default=1.0,
        help="with --clock-start: scheduler seconds per real second (1)",
    )
    sp.add_argument(
        "--monitor",
        type=float,
        default=300.0,
        help="reclaimable / scale-out evaluation window, s (300)",
    )
    sp.add_argument(
        "--retention-days",
        type=float,
        default=30.0,
        help="delete jobs that ended longer ago, with their events and job directories, "
        "checked hourly (30; 0 keeps everything)",
    )
    sp.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run jobs on the Ray cluster at ADDRESS (host:port of its GCS, or auto): "
        "each gpupool node of it is a node of the pool; NVML read on each node",
    )
    sp.add_argument(
        "--ray-namespace",
        default="gpupool",
        help="Ray namespace of the job and telemetry actors (gpupool)",
    )
    sp.add_argument(
        "--max-starts",
        type=int,
        metavar="N",
        help="start at most N jobs per cycle, the rest next cycle (default: 16 with --ray, "
        "where each start waits for Ray to start a worker; no bound otherwise)",
    )
    sp.add_argument(
        "--sites",
        type=Path,
        metavar="FILE",
        help="several clusters (needs --ray): the federation's sites, regions, prices and "
        "data locations, each node's site, burst rules and cloud nodes (docs/ray.md)",
    )
    sp.add_argument(
        "--no-isolation",
        action="store_true",
        help="run every job as the server's user even when root (default as root: each "
        "team's jobs as its own Unix user; see the isolation: section, docs/isolation.md)",
    )
    sp.add_argument(
        "--demo",
        action="store_true",
        help="fake fleet if no GPU, demo teams, a few demo jobs submitted",
    )
    add_access_flags(sp)
    add_loop_flags(sp)


DEFAULT_LIMIT_CONCURRENCY = 1024
"""Connections (and requests in progress) served at once; beyond it, 503 at once."""
DEFAULT_BACKLOG = 2048


def add_access_flags(sp: Any) -> None:
    """TLS, connection limits and what is open without a token."""
    g = sp.add_argument_group("access")
    g.add_argument("--tls-cert", type=Path, metavar="FILE", help="serve HTTPS: certificate (PEM)")
    g.add_argument("--tls-key", type=Path, metavar="FILE", help="with --tls-cert: its key (PEM)")
    g.add_argument(
        "--limit-concurrency",
        type=int,
        default=DEFAULT_LIMIT_CONCURRENCY,
        metavar="N",
        help="at most N connections and requests at once; more get 503 "
        f"({DEFAULT_LIMIT_CONCURRENCY})",
    )
    g.add_argument(
        "--backlog",
        type=int,
        default=DEFAULT_BACKLOG,
        metavar="N",
        help=f"connections waiting to be accepted ({DEFAULT_BACKLOG})",
    )
    g.add_argument(
        "--open-metrics",
        action="store_true",
        help="serve /metrics without a token (for a Prometheus that has none)",
    )
    g.add_argument(
        "--open-docs",
        action="store_true",
        help="serve /docs, /redoc and /openapi.json without a token",
    )
    g.add_argument(
        "--audit-days",
        type=float,
        default=90.0,
        metavar="DAYS",
        help="keep the audit trail this many days (90)",
    )


def add_loop_flags(sp: Any) -> None:
    """One controller per database, and the scheduler loop's limits."""
    sp.add_argument(
        "--standby",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="when another gpupool serve already controls the database: stand by (serve "
        "/healthz as the standby, refuse the rest with 503) and take over within a second "
        "of its end (default); --no-standby: refuse to start",
    )
    sp.add_argument(
        "--lost-retries",
        type=int,
        default=3,
        metavar="N",
        help="requeue a job lost (process vanished, node gone) at most N times, then fail it (3)",
    )
    sp.add_argument(
        "--disk-floor-mib",
        type=float,
        default=DEFAULT_FLOOR_MIB,
        metavar="MIB",
        help="launches wait (reason DiskFull) while the state directory's filesystem has "
        f"less free than the smaller of MIB and --disk-floor-pct ({DEFAULT_FLOOR_MIB:g})",
    )
    sp.add_argument(
        "--disk-floor-pct",
        type=float,
        default=DEFAULT_FLOOR_PCT,
        metavar="PCT",
        help=f"see --disk-floor-mib ({DEFAULT_FLOOR_PCT:g} %%)",
    )
    sp.add_argument(
        "--health-late",
        type=float,
        metavar="S",
        help="/healthz answers 503 when the scheduler loop's last completed cycle is older "
        "than S seconds (default: max(10, 5 cycles))",
    )


def uvicorn_options(args: argparse.Namespace) -> dict[str, Any]:
    """What `serve` hands uvicorn besides the app: TLS files and connection limits."""
    if (args.tls_cert is None) != (args.tls_key is None):
        raise SpecError("--tls-cert and --tls-key go together: give the certificate and its key")
    for flag, path in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)):
        if path is not None and not path.is_file():
            raise SpecError(f"{flag} {path}: no such file; give the PEM file's path")
    if args.limit_concurrency < 1 or args.backlog < 1:
        raise SpecError("--limit-concurrency and --backlog must be at least 1")
    if not args.audit_days > 0:
        raise SpecError(f"--audit-days must be more than 0, got {args.audit_days}")
    options: dict[str, Any] = {
        # uvicorn refuses the connection that makes the count reach its limit
        "limit_concurrency": args.limit_concurrency + 1,
        "backlog": args.backlog,
    }
    if args.tls_cert is not None:
        options["ssl_certfile"] = str(args.tls_cert)
        options["ssl_keyfile"] = str(args.tls_key)
    return options


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
    # isolation: see isolation.py; history: telemetry_history.py
    allowed = SCHEDULING_KEYS | {ISOLATION_SECTION, HISTORY_SECTION}
    top = SpecReader(str(path)).mapping({} if raw is None else raw, "top level", allowed)
    top = {k: v for k, v in top.items() if k not in (ISOLATION_SECTION, HISTORY_SECTION)}
    return parse_scheduling(top, str(path), defaults)


def service_scheduling(args: argparse.Namespace) -> SchedulerConfig:
    """What the service's core decides by: LIVE_DEFAULTS, then the --config file, then
    the command line (--cycle, when given, overrides the file's cycle_s; --max-starts),
    and the demo teams for --demo with a file that names none. With --sites, the sites
    file alone gives the burst rules and site placement (live.py applies them over
    these), so the --config file must leave them out."""
    scheduling = load_service_config(args.config, LIVE_DEFAULTS)
    if args.cycle is not None:
        if not args.cycle > 0:
            raise SpecError(f"--cycle must be a positive number of seconds, got {args.cycle}")
        scheduling = dataclasses.replace(scheduling, cycle_s=args.cycle)
    if args.demo and not scheduling.teams:
        scheduling = dataclasses.replace(
            scheduling, teams=(TeamQuota("serving", {}, {}), TeamQuota("research", {}, {}))
        )
    if args.sites is not None:
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
                f"{args.config}: {', '.join(given)}: with --sites these come from "
                f"{args.sites} (burst:, placement:, value_of_time_usd_per_h:); "
                "drop them from --config or from --sites"
            )
    if args.max_starts is not None and args.max_starts < 1:
        raise SpecError(f"--max-starts must be at least 1, got {args.max_starts}")
    return dataclasses.replace(
        scheduling,
        max_starts_per_cycle=args.max_starts
        if args.max_starts is not None
        else (16 if args.ray is not None else None),
    )


def parse_inlet(text: str | None) -> dict[int, float]:
    """--fake-inlet 0=45,1=45 -> {0: 45.0, 1: 45.0}."""
    out: dict[int, float] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        gpu, sep, temp = part.partition("=")
        try:
            if not sep:
                raise ValueError
            out[int(gpu)] = float(temp)
        except ValueError:
            raise SpecError(
                f"--fake-inlet {text!r}: write GPU=CELSIUS pairs, e.g. 0=45,1=45"
            ) from None
    return out


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


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gpupool.server.api.app import create_app

    auth = args.auth == "token"
    if not auth and not _loopback(args.host):
        raise SpecError(
            f"--auth none is allowed only on a loopback address, not {args.host}; "
            "drop --auth none or bind to 127.0.0.1"
        )
    state_dir: Path = args.state_dir
    state_dir.mkdir(parents=True, exist_ok=True)
    scheduling = service_scheduling(args)
    if args.sites is not None and args.ray is None:
        raise SpecError(
            "--sites places jobs over the nodes of a Ray cluster: add --ray ADDRESS "
            "(a machine's own GPUs join as a Ray node too, see docs/ray.md)"
        )
    if args.ray is not None and args.fake_gpus:
        raise SpecError(
            "--fake-gpus is for the local executor; on Ray each node declares its GPUs "
            "(a node without any reads as a fake fleet of what it declares)"
        )
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s gpupool %(levelname)s %(message)s"
    )
    logging.getLogger("gpupool").setLevel(logging.INFO)
    sites = load_sites(args.sites) if args.sites is not None else None
    served = uvicorn_options(args)
    _check_loop_flags(args)
    store = Store(database_url(args.db, state_dir))
    store.migrate()
    isolation = service_isolation(args.config, args.no_isolation, args.demo, args.ray is not None)
    config = LiveConfig(
        state_dir=state_dir,
        scheduling=scheduling,
        sample_s=args.sample,
        scrape_s=args.scrape,
        monitor_s=args.monitor,
        sites=sites,
        retention_s=args.retention_days * 86_400.0 if args.retention_days > 0 else None,
        source=str(args.config) if args.config is not None else "the service's defaults",
        lost_retries=args.lost_retries,
        disk_floor=DiskFloor(args.disk_floor_mib, args.disk_floor_pct),
        health_late_s=args.health_late,
        history=load_history(args.config),
    )
    scheme = "https" if args.tls_cert is not None else "http"
    url = f"{scheme}://{args.host}:{args.port}"
    lease = controller_lease(store.url)
    active = lease.try_acquire()
    if not active and not args.standby:
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
    if auth and scheme == "http" and not _loopback(args.host):
        print(
            "  warning: tokens cross the network in clear text; "
            "serve HTTPS with --tls-cert/--tls-key (or behind a TLS proxy)"
        )
    held: list[LiveService] = []
    apps: list[Any] = []
    stopping = threading.Event()

    def take_over() -> Any:
        """Build the live service (recovering from the database), start its loop."""
        live = _build_live(args, config, store, lease, isolation)
        isolation.secure_state(
            state_dir, live.jobs_dir, sqlite_file(database_url(args.db, state_dir))
        )
        live.on_lease_lost = _exit_on_lease_loss
        _announce(args, live, url, state_dir)
        if args.demo:
            submit_demo(store)
            print("demo jobs submitted; try: gpupool ls, gpupool top, gpupool logs -f 1")
        sys.stdout.flush()
        app = create_app(
            live,
            store,
            auth,
            open_metrics=args.open_metrics,
            open_docs=args.open_docs,
            audit_keep_days=args.audit_days,
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
            host=args.host,
            port=args.port,
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
        if args.ray is not None and held:
            import ray

            ray.shutdown()
        lease.release()
    return 0


def _check_loop_flags(args: argparse.Namespace) -> None:
    if args.lost_retries < 0:
        raise SpecError(f"--lost-retries must be 0 or more, got {args.lost_retries}")
    if args.disk_floor_mib < 0 or not 0 <= args.disk_floor_pct <= 100:
        raise SpecError(
            "--disk-floor-mib must be 0 or more and --disk-floor-pct between 0 and 100, "
            f"got {args.disk_floor_mib} and {args.disk_floor_pct}"
        )
    if args.health_late is not None and not args.health_late > 0:
        raise SpecError(
            f"--health-late must be a positive number of seconds, got {args.health_late}"
        )


def _exit_on_lease_loss() -> None:
    """Stop the whole server (uvicorn shuts down on SIGTERM): a controller without the
    lease must not schedule; restarted, it stands by."""
    os.kill(os.getpid(), signal.SIGTERM)


def _build_live(
    args: argparse.Namespace, config: LiveConfig, store: Store, lease: Lease, isolation: Isolation
) -> LiveService:
    """The live service: on Ray, or on this machine with the jobs isolated as configured;
    says what the isolation cannot guarantee here."""
    if args.ray is not None:
        live = _ray_live(args, config, store, lease)
        for note in isolation.cannot_guarantee():
            print(f"gpupool: not guaranteed: {note}", file=sys.stderr)
        return live
    telemetry = open_telemetry(args.fake_gpus, args.demo, args.fake_inlet)
    executor = LocalExecutor(isolation=isolation)
    for note in isolation.cannot_guarantee() + executor.cannot_guarantee():
        print(f"gpupool: not guaranteed: {note}", file=sys.stderr)
    return LiveService(
        config,
        store,
        executor,
        telemetry,
        open_clock(args.clock_start, args.clock_speed),
        lease=lease,
    )


def _announce(args: argparse.Namespace, live: LiveService, url: str, state_dir: Path) -> None:
    print(
        f"gpupool serving on {url} ({len(live.inventory)} GPUs: "
        f"{', '.join(sorted({g.model for g in live.inventory}))}; state in {state_dir}; "
        f"controller lease on {live.lease.where if live.lease else '-'})"
    )
    if args.ray is not None:
        for node in live.cluster.nodes:
            cloud = live.cloud is not None and node.name in live.cloud.names()
            print(
                f"  node {node.name}: {node.gpu_count}x{node.gpu_model}, site {node.cluster}"
                + (" (cloud: started on burst)" if cloud else "")
            )


def _ray_live(
    args: argparse.Namespace, config: LiveConfig, store: Store, lease: Lease | None = None
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
    from gpupool.server.loop.driver import ray_service

    try:
        ray.init(
            address=args.ray,
            namespace=args.ray_namespace,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise SpecError(
            f"cannot join the Ray cluster at {args.ray}: {err}; start it with "
            "`ray start --head` and pass its address (host:port), or auto"
        ) from None
    return ray_service(
        config,
        store,
        open_clock(args.clock_start, args.clock_speed),
        executor=RayExecutor(namespace=args.ray_namespace),
        lease=lease,
    )

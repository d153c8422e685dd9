"""`gpupool serve`: its flags, read into the typed options the server runs with.

The server (gpupool.server.main) knows nothing of argparse: this module parses the command
line into a ServeOptions and calls serve(). The flags' defaults are ServeOptions' own, so
`--help` shows what the server would use. To add a flag: a field on ServeOptions, the
argument here, and the field's line in serve_options().
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpupool.cli.verbs import HELP
from gpupool.scheduler.config_schema import SCHEDULING_KEYS
from gpupool.server.main import ServeOptions, serve

DEFAULTS = ServeOptions()


def add_serve_parser(sub: Any) -> None:
    """Add `gpupool serve` and its flags to the top-level subparsers."""
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
    sp.add_argument("--host", default=DEFAULTS.host, help="address to bind (default 127.0.0.1)")
    sp.add_argument(
        "--port", type=int, default=DEFAULTS.port, help=f"port (default {DEFAULTS.port})"
    )
    sp.add_argument(
        "--db",
        help="database URL: sqlite:///FILE or postgresql://... (default: SQLite in the state dir)",
    )
    sp.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULTS.state_dir,
        help="where the SQLite file, job logs and checkpoints live (.gpupool)",
    )
    sp.add_argument(
        "--fake-gpus",
        help="run on a fake fleet, e.g. 4xA100-80GB or "
        "2xH100,2xRTX-4090: jobs run as real processes that get no GPU; as nodes with "
        "labels (where they sit in the network, for `topology:` in --config): "
        "2x8xA100-80GB@rack=r1,2x8xA100-80GB@rack=r2",
    )
    sp.add_argument(
        "--auth",
        choices=("token", "none"),
        default=DEFAULTS.auth,
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
        default=DEFAULTS.cycle_s,
        help="scheduling cycle, s; overrides the config file's cycle_s (default: the "
        "file's cycle_s, else 1)",
    )
    sp.add_argument(
        "--sample", type=float, default=DEFAULTS.sample_s, help="telemetry sampling, s (1)"
    )
    sp.add_argument(
        "--scrape",
        type=float,
        default=DEFAULTS.scrape_s,
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
        default=DEFAULTS.clock_speed,
        help="with --clock-start: scheduler seconds per real second (1)",
    )
    sp.add_argument(
        "--monitor",
        type=float,
        default=DEFAULTS.monitor_s,
        help="reclaimable / scale-out evaluation window, s (300)",
    )
    sp.add_argument(
        "--retention-days",
        type=float,
        default=DEFAULTS.retention_days,
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
        default=DEFAULTS.ray_namespace,
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


def add_access_flags(sp: Any) -> None:
    """TLS, connection limits and what is open without a token."""
    g = sp.add_argument_group("access")
    g.add_argument("--tls-cert", type=Path, metavar="FILE", help="serve HTTPS: certificate (PEM)")
    g.add_argument("--tls-key", type=Path, metavar="FILE", help="with --tls-cert: its key (PEM)")
    g.add_argument(
        "--limit-concurrency",
        type=int,
        default=DEFAULTS.limit_concurrency,
        metavar="N",
        help="at most N connections and requests at once; more get 503 "
        f"({DEFAULTS.limit_concurrency})",
    )
    g.add_argument(
        "--backlog",
        type=int,
        default=DEFAULTS.backlog,
        metavar="N",
        help=f"connections waiting to be accepted ({DEFAULTS.backlog})",
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
        default=DEFAULTS.audit_days,
        metavar="DAYS",
        help="keep the audit trail this many days (90)",
    )


def add_loop_flags(sp: Any) -> None:
    """One controller per database, and the scheduler loop's limits."""
    sp.add_argument(
        "--standby",
        action=argparse.BooleanOptionalAction,
        default=DEFAULTS.standby,
        help="when another gpupool serve already controls the database: stand by (serve "
        "/healthz as the standby, refuse the rest with 503) and take over within a second "
        "of its end (default); --no-standby: refuse to start",
    )
    sp.add_argument(
        "--lost-retries",
        type=int,
        default=DEFAULTS.lost_retries,
        metavar="N",
        help="requeue a job lost (process vanished, node gone) at most N times, then fail it (3)",
    )
    sp.add_argument(
        "--disk-floor-mib",
        type=float,
        default=DEFAULTS.disk_floor_mib,
        metavar="MIB",
        help="launches wait (reason DiskFull) while the state directory's filesystem has "
        f"less free than the smaller of MIB and --disk-floor-pct ({DEFAULTS.disk_floor_mib:g})",
    )
    sp.add_argument(
        "--disk-floor-pct",
        type=float,
        default=DEFAULTS.disk_floor_pct,
        metavar="PCT",
        help=f"see --disk-floor-mib ({DEFAULTS.disk_floor_pct:g} %%)",
    )
    sp.add_argument(
        "--health-late",
        type=float,
        metavar="S",
        help="/healthz answers 503 when the scheduler loop's last completed cycle is older "
        "than S seconds (default: max(10, 5 cycles))",
    )


def serve_options(args: argparse.Namespace) -> ServeOptions:
    """The parsed `gpupool serve` command line as the server's options."""
    return ServeOptions(
        host=args.host,
        port=args.port,
        db=args.db,
        state_dir=args.state_dir,
        fake_gpus=args.fake_gpus,
        auth=args.auth,
        config=args.config,
        cycle_s=args.cycle,
        sample_s=args.sample,
        scrape_s=args.scrape,
        fake_inlet=args.fake_inlet,
        clock_start=args.clock_start,
        clock_speed=args.clock_speed,
        monitor_s=args.monitor,
        retention_days=args.retention_days,
        ray=args.ray,
        ray_namespace=args.ray_namespace,
        max_starts=args.max_starts,
        sites=args.sites,
        no_isolation=args.no_isolation,
        demo=args.demo,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        limit_concurrency=args.limit_concurrency,
        backlog=args.backlog,
        open_metrics=args.open_metrics,
        open_docs=args.open_docs,
        audit_days=args.audit_days,
        standby=args.standby,
        lost_retries=args.lost_retries,
        disk_floor_mib=args.disk_floor_mib,
        disk_floor_pct=args.disk_floor_pct,
        health_late_s=args.health_late,
    )


def run_serve(args: argparse.Namespace) -> int:
    """Run the server with the parsed flags; returns when it stops."""
    return serve(serve_options(args))

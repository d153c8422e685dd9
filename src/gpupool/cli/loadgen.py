"""`gpupool loadgen`: replay the Azure LLM arrivals against a service's replicas on loopback."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from gpupool.cli.table import render
from gpupool.cli.verbs import HELP

EXAMPLES = """\
examples:
  gpupool loadgen --service chat --ramp 5:60:5 --duration-s 600 --summary load.json
  gpupool loadgen --target http://127.0.0.1:9001 --target http://127.0.0.1:9002 \\
      --rps 20 --duration-s 60 --balance least-outstanding --windows windows.jsonl
  gpupool loadgen --service chat --profile 0:5,60:5,60:40,180:40,240:5 --duration-s 300

Each request is GET <replica>/generate?context_tokens=N&generated_tokens=M&tokens=M, with
the token counts of the trace row it replays (tokens: the output length, for replicas that
read one count, like gpupool.examples.chat_replica). Arrivals follow the trace's gaps,
time-compressed so the rate follows the profile (--ramp: rates at equal spacing over
--duration-s; --profile: time_s:rps points, linear in between, a repeated time is a step;
--rps: constant). The seed picks the trace row the replay starts from: the same seed sends
the same requests at the same times. With --service, the targets are the service's running
replicas, read from the gpupool server (GET /v1/services/NAME) every second, so replicas
added or removed while the load runs get or stop getting requests (a replica the server
marks "ready": false, not yet answering its scrapes, is left out until it is). Only
loopback targets (http://127.0.0.1:PORT) are accepted.

Open loop: when --max-in-flight requests are outstanding, the next one is counted as dropped
rather than sent late. Latency is the client's, from sending to the last byte of the answer.
Traces are looked up in GPUPOOL_TRACES or a shared/traces folder above the working directory.
"""


def add_loadgen_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `loadgen` command to the top-level subparsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "loadgen",
        help=HELP["loadgen"],
        description="Replay the Azure LLM inference 2023 arrivals, time-compressed onto a "
        "rate profile, as real HTTP requests to replicas on 127.0.0.1; report sent, ok, "
        "errors, rps and p50/p99 latency per window.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--service", metavar="NAME", help="send to this service's running replicas")
    where.add_argument(
        "--target",
        action="append",
        metavar="URL",
        help="a replica URL, http://127.0.0.1:PORT (repeat for several)",
    )
    rate = p.add_mutually_exclusive_group(required=True)
    rate.add_argument("--ramp", metavar="R1:R2:...", help="rps at equal spacing, e.g. 5:60:5")
    rate.add_argument(
        "--profile", metavar="T:RPS,...", help="time_s:rps points, e.g. 0:5,60:60,120:5"
    )
    rate.add_argument("--rps", type=float, help="a constant rate")
    p.add_argument("--duration-s", type=float, required=True, help="how long to send")
    p.add_argument("--seed", type=int, default=0, help="picks the replay's first trace row")
    p.add_argument(
        "--trace",
        choices=("conv", "code"),
        default="conv",
        help="Azure file to replay: conv (chat, default) or code (burstier)",
    )
    p.add_argument(
        "--smooth-s",
        type=float,
        default=60.0,
        help="trace seconds over which the trace's own trend is replaced by the profile; "
        "the gaps within keep their shape (default 60)",
    )
    p.add_argument(
        "--balance",
        choices=("round-robin", "least-outstanding"),
        default="round-robin",
        help="how a request picks its replica",
    )
    p.add_argument(
        "--max-in-flight", type=int, default=64, help="outstanding requests at most (default 64)"
    )
    p.add_argument("--timeout-s", type=float, default=5.0, help="per-request timeout")
    p.add_argument("--max-requests", type=int, help="stop after this many requests")
    p.add_argument("--path", default="/generate", help="request path (default /generate)")
    p.add_argument(
        "--window-s", type=float, default=5.0, help="window of the printed table and --windows"
    )
    p.add_argument("--windows", metavar="FILE", help="write one JSON line per window")
    p.add_argument("--requests", metavar="FILE", help="write one JSON line per request")
    p.add_argument(
        "--summary", metavar="FILE", help="write totals and 60 s windows as one JSON file"
    )
    p.add_argument(
        "--url", help="gpupool server for --service (default: GPUPOOL_URL, config, local)"
    )
    p.add_argument("--token", help="API token for --service (default: GPUPOOL_TOKEN or config)")
    p.add_argument("--ca-cert", metavar="FILE", help="CA certificate for an https --url")
    return p


def run_loadgen(args: argparse.Namespace) -> int:
    from gpupool import loadgen

    if args.ramp is not None:
        profile = loadgen.parse_ramp(args.ramp, args.duration_s)
    elif args.profile is not None:
        profile = loadgen.parse_profile(args.profile)
    else:
        profile = loadgen.RateProfile.constant(args.rps)
    stop = threading.Event()
    close: Callable[[], None] = lambda: None  # noqa: E731
    if args.service:
        from gpupool.client import Client, ca_cert_setting, client_settings

        url, token = client_settings(args.url, args.token)
        ca_cert = ca_cert_setting(args.ca_cert) if url.startswith("https://") else None
        client = Client(url, token, timeout_s=2.0, ca_cert=ca_cert)
        close = client.close
        targets = loadgen.service_targets(client.get_json, args.service)
    else:
        targets = loadgen.static_targets(args.target)
    max_requests = loadgen.MAX_REQUESTS if args.max_requests is None else args.max_requests
    print(
        f"loadgen: {profile.describe()} for {args.duration_s:g} s, trace {args.trace}, "
        f"seed {args.seed}, {args.balance}",
        file=sys.stderr,
    )
    # Ctrl-C ends the sending early but still reports what was sent.
    previous = signal.signal(signal.SIGINT, lambda _sig, _frame: stop.set())
    try:
        report = loadgen.run(
            profile,
            targets,
            args.duration_s,
            args.seed,
            trace=args.trace,
            smooth_s=args.smooth_s,
            balance=args.balance,
            max_in_flight=args.max_in_flight,
            timeout_s=args.timeout_s,
            max_requests=max_requests,
            path=args.path,
            stop=stop,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
        close()
    rows = [
        [
            f"{w.start_s:g}",
            round(w.target_rps, 1),
            round(w.rps, 1),
            w.ok,
            w.errors,
            "-" if w.p50_ms is None else round(w.p50_ms, 1),
            "-" if w.p99_ms is None else round(w.p99_ms, 1),
        ]
        for w in report.windows(args.window_s)
    ]
    print(
        render(
            ["from s", "target rps", "sent rps", "ok", "errors", "p50 ms", "p99 ms"],
            rows,
            title=f"loadgen per {args.window_s:g} s window",
        )
    )
    summary = report.summary()
    print(json.dumps({k: summary[k] for k in ("sent", "outcomes", "p50_ms", "p99_ms")}))
    if args.windows:
        report.write_windows(args.windows, args.window_s)
    if args.requests:
        report.write_requests(args.requests)
    if args.summary:
        report.write_summary(args.summary)
    return 0

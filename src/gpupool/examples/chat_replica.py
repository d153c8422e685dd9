"""An example replica of an online service: a stand-in chatbot that serves real HTTP at
its node's address and reports what it serves through the channel of docs/services.md.

    python -m gpupool.examples.chat_replica [--slots 4] [--ms-per-token 0.5]
        [--min-ms 5] [--max-ms 40]

It listens on $GPUPOOL_REPLICA_HOST:$PORT (the node's address, 127.0.0.1 when unset; the
service's `--port-env`, PORT by default); a port already taken there ends it at once with
exit code 3 and a sentence saying so (the scheduler replaces it). GET or POST
`/generate?tokens=N` (or `generated_tokens=N&context_tokens=C`, as gpupool.loadgen sends
a trace's requests) takes N * ms-per-token + C * ms-per-context-token, capped to
[min-ms, max-ms],
under a fixed number of concurrent slots (a semaphore: the replica's capacity), so a
request that finds every slot busy waits and latency really grows when the replica is
overloaded. Each request's latency, queueing included, is measured with prometheus_client
and served at `/metrics` (`gpupool_replica_requests_total`,
`gpupool_replica_request_latency_seconds`). SIGTERM stops it cleanly (exit 0) after
`--drain-s` more seconds of serving, and the requests in flight then finish: a replica
scaled down shows as `stopping` in the service's replicas, so clients leave it first.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from urllib.parse import parse_qs, urlparse

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gpupool.server.telemetry.replica_load import LATENCY, LATENCY_BUCKETS_S, REQUESTS

DEFAULT_TOKENS = 32
HOST_ENV = "GPUPOOL_REPLICA_HOST"
"""Where the scheduler tells a replica to listen: its node's address."""
JSON = "application/json"


class Replica:
    """The serving model: a request holds one of `slots` for its service time."""

    def __init__(
        self,
        slots: int,
        ms_per_token: float,
        min_ms: float,
        max_ms: float,
        ms_per_context_token: float = 0.0,
    ) -> None:
        self.slots = threading.BoundedSemaphore(slots)
        self.ms_per_token = ms_per_token
        self.ms_per_context_token = ms_per_context_token
        self.min_ms, self.max_ms = min_ms, max_ms
        self.registry = CollectorRegistry()
        self.requests = Counter(REQUESTS, "Requests this replica served", registry=self.registry)
        self.latency = Histogram(
            LATENCY,
            "Latency of each served request, waiting for a slot included",
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )

    def service_ms(self, tokens: int, context: int = 0) -> float:
        work = tokens * self.ms_per_token + context * self.ms_per_context_token
        return min(self.max_ms, max(self.min_ms, work))

    def generate(self, tokens: int, context: int = 0) -> dict[str, float]:
        started = time.perf_counter()
        with self.slots:
            time.sleep(self.service_ms(tokens, context) / 1000.0)
        took = time.perf_counter() - started
        self.latency.observe(took)
        self.requests.inc()
        return {"tokens": tokens, "latency_ms": round(took * 1000.0, 3)}


def handler_for(replica: Replica) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Without TCP_NODELAY a kept-alive connection waits ~40 ms (delayed ACK) on every
        # reply after the first: latency the client sees and /metrics never would.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per request would be the job's whole log

        def _reply(self, code: int, body: bytes, kind: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _generate(self) -> None:
            query = parse_qs(urlparse(self.path).query)
            given = query.get("tokens") or query.get("generated_tokens") or [str(DEFAULT_TOKENS)]
            try:
                tokens = int(given[0])
                context = int((query.get("context_tokens") or ["0"])[0])
            except ValueError:
                self._reply(400, b'{"detail": "token counts must be whole numbers"}', JSON)
                return
            if not (0 <= tokens <= 1_000_000 and 0 <= context <= 10_000_000):
                self._reply(400, b'{"detail": "token counts out of range"}', JSON)
                return
            body = json.dumps(replica.generate(tokens, context)).encode()
            self._reply(200, body, "application/json")

        def do_GET(self) -> None:
            path = urlparse(self.path).path
            if path == "/metrics":
                self._reply(200, generate_latest(replica.registry), CONTENT_TYPE_LATEST)
            elif path == "/generate":
                self._generate()
            elif path == "/healthz":
                self._reply(200, b"ok", "text/plain")
            else:
                self._reply(404, b'{"detail": "try /generate or /metrics"}', "application/json")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(min(length, 1 << 20))
            if urlparse(self.path).path == "/generate":
                self._generate()
            else:
                self._reply(404, b'{"detail": "POST /generate"}', "application/json")

    return Handler


class Server6(ThreadingHTTPServer):
    """On an IPv6 address."""

    address_family = socket.AF_INET6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="chat_replica", description=__doc__.split("\n\n")[0])
    p.add_argument("--slots", type=int, default=4, help="requests served at once (capacity)")
    p.add_argument("--ms-per-token", type=float, default=0.5, help="per generated token")
    p.add_argument("--ms-per-context-token", type=float, default=0.0, help="per prompt token")
    p.add_argument("--min-ms", type=float, default=5.0)
    p.add_argument("--max-ms", type=float, default=40.0)
    p.add_argument("--port-env", default="PORT", help="env var holding the port (default PORT)")
    p.add_argument(
        "--drain-s",
        type=float,
        default=2.0,
        help="after SIGTERM, go on serving this long before stopping (default 2)",
    )
    args = p.parse_args(argv)
    raw = os.environ.get(args.port_env)
    if not raw or not raw.isdigit():
        print(f"set {args.port_env} to the port to serve on", file=sys.stderr)
        return 2
    host = os.environ.get(HOST_ENV) or "127.0.0.1"
    replica = Replica(
        max(1, args.slots), args.ms_per_token, args.min_ms, args.max_ms, args.ms_per_context_token
    )
    try:
        kind = Server6 if ":" in host else ThreadingHTTPServer
        server = kind((host, int(raw)), handler_for(replica))
    except OSError as err:
        taken = err.errno == errno.EADDRINUSE
        why = "is taken by another process" if taken else f"cannot be listened on ({err})"
        print(f"chat_replica: {host}:{raw} {why}; exiting", file=sys.stderr, flush=True)
        return 3
    server.daemon_threads = False  # requests in flight finish before it exits
    server.block_on_close = True

    def drain_then_stop() -> None:
        time.sleep(args.drain_s)  # balancers re-read the replica list meanwhile
        server.shutdown()

    def stop(_sig: int, _frame: FrameType | None) -> None:
        threading.Thread(target=drain_then_stop, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    print(f"serving on {host}:{raw} with {args.slots} slots", flush=True)
    server.serve_forever(poll_interval=0.2)
    server.server_close()
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A service replica in the standard library alone, for jobs that run as a team's user who
cannot read gpupool's virtual environment: it serves GET /generate (one request per slot
at a time, `ms` milliseconds each, so latency grows when it is overloaded) and /metrics in
the Prometheus text format gpupool's scraper reads (`gpupool_replica_requests_total` and
the `gpupool_replica_request_latency_seconds` histogram, as gpupool.examples.chat_replica
exposes them), on $GPUPOOL_REPLICA_HOST:$PORT. SIGTERM ends it cleanly.

Usage: python3 plain_replica.py [--slots N] [--ms MS]"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, float("inf"))


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.buckets = [0] * len(BUCKETS_S)
        self.total_s = 0.0

    def observe(self, took_s: float) -> None:
        with self.lock:
            self.requests += 1
            self.total_s += took_s
            for k, bound in enumerate(BUCKETS_S):
                if took_s <= bound:
                    self.buckets[k] += 1

    def text(self) -> str:
        with self.lock:
            lines = [
                "# TYPE gpupool_replica_requests_total counter",
                f"gpupool_replica_requests_total {float(self.requests)}",
                "# TYPE gpupool_replica_request_latency_seconds histogram",
            ]
            for bound, count in zip(BUCKETS_S, self.buckets, strict=True):
                le = "+Inf" if bound == float("inf") else repr(bound)
                lines.append(
                    f'gpupool_replica_request_latency_seconds_bucket{{le="{le}"}} {float(count)}'
                )
            lines.append(f"gpupool_replica_request_latency_seconds_count {float(self.requests)}")
            lines.append(f"gpupool_replica_request_latency_seconds_sum {self.total_s}")
            return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--ms", type=float, default=20.0)
    args = parser.parse_args()
    slots = threading.Semaphore(args.slots)
    stats = Stats()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/metrics"):
                body = stats.text().encode()
                ctype = "text/plain; version=0.0.4; charset=utf-8"
            else:
                start = time.monotonic()
                with slots:
                    time.sleep(args.ms / 1000.0)
                stats.observe(time.monotonic() - start)
                body, ctype = b'{"ok": true}\n', "application/json"
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET  # noqa: N815 - the handler API names it so

        def log_message(self, *_: object) -> None:
            return

    host = os.environ.get("GPUPOOL_REPLICA_HOST", "127.0.0.1")
    server = ThreadingHTTPServer((host, int(os.environ["PORT"])), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"serving on {host}:{os.environ['PORT']}", flush=True)
    server.serve_forever(poll_interval=0.1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

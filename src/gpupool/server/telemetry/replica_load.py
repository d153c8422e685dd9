"""What a service's replicas serve, measured: the channel of docs/services.md.

Each replica serves Prometheus text at http://ADDRESS:$PORT/metrics (ADDRESS: its node's,
`Endpoint`) with the counter
`gpupool_replica_requests_total` and the histogram
`gpupool_replica_request_latency_seconds`. A background thread scrapes every running
replica (short timeout; a failed scrape is skipped), so the scheduler loop never waits on
a replica. From the samples of a window the service's rate (counter deltas) and its p99
latency (bucket deltas) are worked out and fed to the core as ServiceLoad.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import threading
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger(__name__)

REQUESTS = "gpupool_replica_requests"
"""The counter's family name (its sample is `gpupool_replica_requests_total`)."""
LATENCY = "gpupool_replica_request_latency_seconds"
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.0,
    5.0,
)
"""The histogram's buckets (seconds) a replica should use: fine around common SLOs."""


def url_of(host: str, port: int) -> str:
    """http://HOST:PORT, an IPv6 address in brackets."""
    try:
        v6 = ipaddress.ip_address(host).version == 6
    except ValueError:
        v6 = False
    return f"http://[{host}]:{port}" if v6 else f"http://{host}:{port}"


class Endpoint(NamedTuple):
    """Where a replica listens: its node's address and its port."""

    host: str
    port: int

    @property
    def url(self) -> str:
        return url_of(self.host, self.port)


@dataclass(frozen=True)
class ReplicaSample:
    """One scrape of one replica: requests served so far and the latency histogram's
    cumulative bucket counts (upper bound in seconds, +inf last)."""

    t_s: float
    requests: float
    buckets: tuple[tuple[float, float], ...]


def parse_metrics(text: str, t_s: float) -> ReplicaSample:
    """A replica's /metrics text as a sample; ValueError when the channel's metrics are
    missing (the replica does not speak it)."""
    requests: float | None = None
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == REQUESTS:
            for s in family.samples:
                if s.name == f"{REQUESTS}_total":
                    requests = (requests or 0.0) + float(s.value)
        elif family.name == LATENCY:
            for s in family.samples:
                if s.name == f"{LATENCY}_bucket":
                    le = float(s.labels["le"])
                    buckets[le] = buckets.get(le, 0.0) + float(s.value)
    if requests is None or not buckets:
        raise ValueError(f"no {REQUESTS}_total counter and {LATENCY} histogram in the metrics")
    return ReplicaSample(t_s, requests, tuple(sorted(buckets.items())))


def quantile_ms(buckets: Mapping[float, float], q: float) -> float | None:
    """The q-quantile (ms) of per-bucket cumulative counts, interpolated inside its
    bucket as Prometheus' histogram_quantile does; None without any request."""
    items = sorted(buckets.items())
    if not items or items[-1][1] <= 0:
        return None
    total = items[-1][1]
    rank = q * total
    lower_le, lower_count = 0.0, 0.0
    for le, count in items:
        if count >= rank:
            if math.isinf(le):
                return lower_le * 1000.0  # above the last finite bucket: its bound
            width = count - lower_count
            frac = (rank - lower_count) / width if width > 0 else 1.0
            return (lower_le + (le - lower_le) * frac) * 1000.0
        lower_le, lower_count = le, count
    return lower_le * 1000.0


@dataclass(frozen=True)
class Measured:
    """What a set of replicas served over a window."""

    rps: float
    p99_ms: float | None
    reporting: int


class LoadWindow:
    """The samples of each replica over the last `window_s`: rates and p99 from deltas
    (a counter that went back means the replica restarted: counted from zero)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.samples: dict[str, deque[ReplicaSample]] = {}

    def add(self, replica: str, sample: ReplicaSample) -> None:
        q = self.samples.setdefault(replica, deque())
        if q and sample.requests < q[-1].requests:
            q.clear()  # restarted: its old counts say nothing about the new process
        if q and sample.t_s <= q[-1].t_s:
            return
        q.append(sample)
        while len(q) > 2 and q[1].t_s <= sample.t_s - self.window_s:
            q.popleft()

    def keep(self, replicas: set[str]) -> None:
        for gone in set(self.samples) - replicas:
            del self.samples[gone]

    def measure(self, replicas: list[str], now: float, window_s: float | None = None) -> Measured:
        """Rate and p99 of these replicas together over the last window (default the
        whole one); a replica counts once it has two samples in it."""
        span = self.window_s if window_s is None else window_s
        rps = 0.0
        merged: dict[float, float] = {}
        reporting = 0
        for name in replicas:
            q = self.samples.get(name)
            if not q:
                continue
            last = q[-1]
            if last.t_s < now - span - 1e-9:
                continue  # stale: its scrapes fail
            first = next((s for s in q if s.t_s >= last.t_s - span - 1e-9), q[0])
            if first is last:
                first = q[-2] if len(q) > 1 else last
            if first is last:
                continue
            reporting += 1
            rps += (last.requests - first.requests) / (last.t_s - first.t_s)
            before = dict(first.buckets)
            for le, count in last.buckets:
                merged[le] = merged.get(le, 0.0) + count - before.get(le, 0.0)
        return Measured(rps, quantile_ms(merged, 0.99), reporting)


def scrape(at: Endpoint, timeout_s: float) -> str:
    with urllib.request.urlopen(f"{at.url}/metrics", timeout=timeout_s) as resp:
        body: bytes = resp.read(1 << 20)
    return body.decode("utf-8", "replace")


class Scraper:
    """Scrapes the targets it is given every `every_s` in its own thread; the loop sets
    targets and reads the window, it never waits on a replica."""

    def __init__(
        self,
        window: LoadWindow,
        clock: Callable[[], float],
        every_s: float = 1.0,
        timeout_s: float = 0.5,
        fetch: Callable[[Endpoint, float], str] = scrape,
        background: bool = True,
    ) -> None:
        """background False: nothing scrapes until `once()` is called (tests drive it)."""
        self.window = window
        self.clock = clock
        self.every_s = every_s
        self.timeout_s = timeout_s
        self.fetch = fetch
        self.background = background
        self.lock = threading.Lock()
        self.targets: dict[str, Endpoint] = {}
        self.failures: dict[str, str] = {}
        """The last scrape error of each target that failed (cleared on success)."""
        self.stopping = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="gpupool-scrape")
        self.thread: threading.Thread | None = None

    def set_targets(self, targets: Mapping[str, Endpoint]) -> None:
        with self.lock:
            self.targets = dict(targets)
            self.window.keep(set(targets))
            for gone in set(self.failures) - set(targets):
                del self.failures[gone]
        if targets and self.thread is None and self.background:
            self.thread = threading.Thread(target=self._run, name="gpupool-scraper", daemon=True)
            self.thread.start()

    def measure(self, replicas: list[str], now: float, window_s: float | None = None) -> Measured:
        with self.lock:
            return self.window.measure(replicas, now, window_s)

    def seen(self) -> set[str]:
        """Targets scraped at least once since they became targets."""
        with self.lock:
            return set(self.window.samples)

    def once(self) -> None:
        """Scrape every target once (in parallel, each bounded by the timeout)."""
        with self.lock:
            targets = dict(self.targets)
        futures = {
            name: self.pool.submit(self.fetch, at, self.timeout_s) for name, at in targets.items()
        }
        for name, fut in futures.items():
            try:
                text = fut.result(timeout=self.timeout_s + 1.0)
                sample = parse_metrics(text, self.clock())
            except Exception as err:  # a replica that is starting, gone or mute: skipped
                with self.lock:
                    self.failures[name] = f"{type(err).__name__}: {err}"[:300]
                continue
            with self.lock:
                if name in self.targets:
                    self.window.add(name, sample)
                    self.failures.pop(name, None)

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.once()
            except Exception:  # never let the scraper die: the loop reads stale data then
                log.exception("replica scrape failed")
            self.stopping.wait(self.every_s)

    def close(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
        self.pool.shutdown(wait=False, cancel_futures=True)

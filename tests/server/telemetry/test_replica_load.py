"""The replica channel: a real example replica over loopback HTTP, its /metrics parsed
with prometheus_client, rates and p99 from counter and bucket deltas, failed scrapes
skipped."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest

from gpupool.examples.chat_replica import Replica, handler_for
from gpupool.server.telemetry.replica_load import (
    Endpoint,
    LoadWindow,
    ReplicaSample,
    Scraper,
    parse_metrics,
    quantile_ms,
    scrape,
)

LOOP = "127.0.0.1"


@pytest.fixture()
def replica() -> Iterator[tuple[Replica, int]]:
    r = Replica(slots=1, ms_per_token=1.0, min_ms=10.0, max_ms=30.0)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(r))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield r, server.server_address[1]
    server.shutdown()
    server.server_close()
    thread.join(5)


def get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        body: bytes = resp.read()
        return body


def test_the_example_replica_serves_and_reports_its_latency(replica: tuple[Replica, int]) -> None:
    _, port = replica
    one = json.loads(get(port, "/generate?tokens=20"))
    assert 20.0 <= one["latency_ms"] < 200.0
    sample = parse_metrics(scrape(Endpoint(LOOP, port), 2.0), 1.0)
    assert sample.requests == 1.0
    # the one request sits in the first bucket that holds its latency, not in the one below
    # (a loaded host may stretch 20 ms of sleep past 25 ms: the bucket follows the latency)
    buckets = sorted(dict(sample.buckets).items())
    took_s = one["latency_ms"] / 1000.0
    first = next(i for i, (bound, _) in enumerate(buckets) if took_s <= bound)
    assert buckets[first][1] == 1.0
    assert first == 0 or buckets[first - 1][1] == 0.0
    assert dict(sample.buckets)[0.01] == 0.0


def test_latency_grows_when_requests_queue_for_the_slots(replica: tuple[Replica, int]) -> None:
    _, port = replica
    threads = [threading.Thread(target=get, args=(port, "/generate?tokens=30")) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    sample = parse_metrics(scrape(Endpoint(LOOP, port), 2.0), 1.0)
    assert sample.requests == 6
    # one slot, 30 ms each: the last of six waited for five others
    p99 = quantile_ms(dict(sample.buckets), 0.99)
    assert p99 is not None and p99 > 100.0


def test_quantile_interpolates_inside_its_bucket() -> None:
    buckets = {0.05: 50.0, 0.1: 100.0, float("inf"): 100.0}
    assert quantile_ms(buckets, 0.5) == pytest.approx(50.0)
    assert quantile_ms(buckets, 0.99) == pytest.approx(99.0)
    assert quantile_ms({0.1: 0.0, float("inf"): 0.0}, 0.99) is None
    assert quantile_ms({0.1: 0.0, float("inf"): 5.0}, 0.99) == pytest.approx(100.0)


def test_metrics_without_the_channel_are_refused() -> None:
    with pytest.raises(ValueError, match="gpupool_replica_requests_total"):
        parse_metrics("# TYPE other counter\nother_total 3\n", 0.0)


def sample(t: float, requests: float, fast: float) -> ReplicaSample:
    return ReplicaSample(t, requests, ((0.1, fast), (0.5, requests), (float("inf"), requests)))


def test_window_rates_and_p99_from_deltas_and_restarts() -> None:
    w = LoadWindow(10.0)
    w.add("a", sample(0.0, 100.0, 100.0))
    w.add("a", sample(10.0, 300.0, 295.0))  # 200 requests in 10 s, 5 slow (of 300)
    w.add("b", sample(0.0, 0.0, 0.0))
    w.add("b", sample(10.0, 100.0, 100.0))
    m = w.measure(["a", "b"], 10.0)
    assert m.rps == pytest.approx(30.0) and m.reporting == 2
    assert m.p99_ms is not None and 100.0 < m.p99_ms <= 500.0
    w.add("b", sample(11.0, 5.0, 5.0))  # b restarted: counts from its new process
    assert w.measure(["b"], 11.0).reporting == 0
    assert w.measure(["a"], 30.0).reporting == 0  # stale: its scrapes stopped


def test_scraper_skips_a_replica_that_does_not_answer(replica: tuple[Replica, int]) -> None:
    _, port = replica
    clock = [0.0]
    scraper = Scraper(LoadWindow(60.0), lambda: clock[0], timeout_s=0.3, background=False)
    try:
        dead = 9  # nothing listens on port 9 of loopback
        scraper.set_targets({"live": Endpoint(LOOP, port), "dead": Endpoint(LOOP, dead)})
        started = time.monotonic()
        scraper.once()
        for _ in range(5):
            get(port, "/generate?tokens=10")
        clock[0] = 2.0
        scraper.once()
        assert time.monotonic() - started < 3.0
        m = scraper.measure(["live", "dead"], 2.0)
        assert m.reporting == 1 and m.rps == pytest.approx(2.5)
        assert "dead" in scraper.failures and scraper.seen() == {"live"}
    finally:
        scraper.close()


def test_the_scraper_reads_a_replica_at_its_nodes_address() -> None:
    """A replica bound on 127.0.0.2 only (as on another node's address): scraped there,
    while the same port on 127.0.0.1 has nothing (so 127.0.0.1 would read nothing)."""
    r = Replica(slots=2, ms_per_token=0.1, min_ms=1.0, max_ms=5.0)
    server = ThreadingHTTPServer(("127.0.0.2", 0), handler_for(r))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    at = Endpoint("127.0.0.2", server.server_address[1])
    assert at.url == f"http://127.0.0.2:{at.port}"
    clock = [0.0]
    scraper = Scraper(LoadWindow(60.0), lambda: clock[0], timeout_s=0.5, background=False)
    try:
        with pytest.raises(OSError):
            scrape(Endpoint(LOOP, at.port), 0.5)
        scraper.set_targets({"r": at})
        scraper.once()
        for _ in range(4):
            urllib.request.urlopen(f"{at.url}/generate?tokens=5", timeout=5).close()
        clock[0] = 2.0
        scraper.once()
        m = scraper.measure(["r"], 2.0)
        assert m.reporting == 1 and m.rps == pytest.approx(2.0) and not scraper.failures
    finally:
        scraper.close()
        server.shutdown()
        server.server_close()
        thread.join(5)

"""The load generator: trace-shaped arrivals on a rate profile, sent as real HTTP on loopback."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest

from gpupool import loadgen
from gpupool.cli.main import main
from gpupool.errors import SpecError
from gpupool.loadgen import (
    CONNECTION_ERROR,
    DROPPED,
    HTTP_ERROR,
    NO_TARGET,
    OK,
    TIMEOUT,
    RateProfile,
    build_schedule,
    check_loopback,
    gap_cv,
    load_trace,
    replica_urls,
    static_targets,
)


@pytest.fixture(scope="module")
def conv(traces: Path) -> tuple[loadgen.TraceRequest, ...]:
    return load_trace("conv", traces)


@pytest.fixture(scope="module")
def code(traces: Path) -> tuple[loadgen.TraceRequest, ...]:
    return load_trace("code", traces)


class Replica:
    """A tiny loopback HTTP server that records what it was asked. `answer(n, query)` gives
    the n-th request's (status, delay_s)."""

    def __init__(self, answer: Callable[[int, dict[str, str]], tuple[int, float]]) -> None:
        self.answer = answer
        self.seen: list[dict[str, str]] = []
        self.lock = threading.Lock()
        replica = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_GET(self) -> None:
                query = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
                query["path"] = urlsplit(self.path).path
                with replica.lock:
                    n = len(replica.seen)
                    replica.seen.append(query)
                status, delay_s = replica.answer(n, query)
                time.sleep(delay_s)
                body = b'{"ok": true}'
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client timed out and hung up
                    pass

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Replica:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def fast(_n: int, _q: dict[str, str]) -> tuple[int, float]:
    return 200, 0.002


def window_counts(times: list[float], width_s: float, duration_s: float) -> np.ndarray:
    n = round(duration_s / width_s)
    return np.bincount(np.minimum((np.array(times) // width_s).astype(int), n - 1), minlength=n)


def profile_counts(profile: RateProfile, width_s: float, duration_s: float) -> np.ndarray:
    n = round(duration_s / width_s)
    edges = [profile.requests_until(k * width_s) for k in range(n + 1)]
    return np.diff(edges)


# ---------------------------------------------------------------------------------------------
# The profile and the schedule, without the network.


def test_profile_inverse_and_parsers() -> None:
    p = loadgen.parse_ramp("5:60:5", 100)
    assert p.points == ((0.0, 5.0), (50.0, 60.0), (100.0, 5.0))
    assert p.requests_until(100) == pytest.approx((5 + 60) / 2 * 100)
    for count in (1, 10, 500, 3000, 3249):
        t = p.time_of(count, 100)
        assert t is not None
        assert p.requests_until(t) == pytest.approx(count, abs=1e-6)
    assert p.time_of(3251, 100) is None
    step = loadgen.parse_profile("0:5,10:5,10:40")
    assert step.rps_at(9.9) == 5 and step.rps_at(10) == 40 and step.rps_at(99) == 40
    assert step.requests_until(20) == pytest.approx(50 + 400)
    for bad in ("0:5,10", "5:5", "0:5,3:-1", "0:5,10:5,9:5", "x:1"):
        with pytest.raises(SpecError):
            loadgen.parse_profile(bad)
    with pytest.raises(SpecError, match="5:60:5"):
        loadgen.parse_ramp("5:fast", 10)


def test_schedule_follows_the_profile(conv: tuple[loadgen.TraceRequest, ...]) -> None:
    profile = loadgen.parse_ramp("5:60:5", 300)
    sched = build_schedule(conv, profile, 300, seed=7)
    want = profile.requests_until(300)
    assert abs(len(sched) - want) / want < 0.01
    got = window_counts([r.at_s for r in sched], 10, 300)
    target = profile_counts(profile, 10, 300)
    rel = np.abs(got - target) / target
    assert np.median(rel) < 0.08, rel
    assert rel.max() < 0.35, rel
    # The trace's token counts come along with each arrival.
    row = sched[0].trace_row
    assert (sched[0].context_tokens, sched[0].generated_tokens) == (
        conv[row].context_tokens,
        conv[row].generated_tokens,
    )


def test_schedule_keeps_the_trace_burstiness(
    conv: tuple[loadgen.TraceRequest, ...], code: tuple[loadgen.TraceRequest, ...]
) -> None:
    """At a constant rate the replay's gaps vary as the trace's do within its minutes: the
    conversation trace's gap CV (1.09) stays near 1.03, and the code trace keeps its bursts
    (CV 13 in the file; its minute-long lulls are what the profile replaces, leaving about 7),
    far from a Poisson clock's 1."""
    flat = RateProfile.constant(40)
    replayed = {}
    for name, trace in (("conv", conv), ("code", code)):
        theta = loadgen.operational_times([r.arrival_s for r in trace], 60.0)
        kept = gap_cv(list(theta))  # the trace's gaps, each minute rescaled to its mean rate
        replayed[name] = gap_cv([r.at_s for r in build_schedule(trace, flat, 600, seed=3)])
        assert replayed[name] == pytest.approx(kept, rel=0.1), (name, kept, replayed[name])
    assert replayed["conv"] == pytest.approx(gap_cv([r.arrival_s for r in conv]), rel=0.1)
    assert replayed["code"] > 5


def test_schedule_is_deterministic_by_seed(conv: tuple[loadgen.TraceRequest, ...]) -> None:
    profile = RateProfile.constant(20)
    a = build_schedule(conv, profile, 60, seed=11)
    assert a == build_schedule(conv, profile, 60, seed=11)
    b = build_schedule(conv, profile, 60, seed=12)
    assert [r.trace_row for r in a] != [r.trace_row for r in b]
    assert len(build_schedule(conv, profile, 60, seed=11, max_requests=5)) == 5


def test_schedule_wraps_around_the_trace(conv: tuple[loadgen.TraceRequest, ...]) -> None:
    short = conv[:200]
    sched = build_schedule(short, RateProfile.constant(50), 20, seed=1)
    assert len(sched) == pytest.approx(1000, rel=0.05)
    assert {r.trace_row for r in sched} == set(range(200))
    assert all(b.at_s >= a.at_s for a, b in itertools.pairwise(sched))


# ---------------------------------------------------------------------------------------------
# Targets.


def test_only_loopback_targets() -> None:
    assert check_loopback("http://127.0.0.1:8000/") == "http://127.0.0.1:8000"
    assert check_loopback("http://127.0.0.2:80") == "http://127.0.0.2:80"
    for bad in (
        "http://10.0.0.1:80",
        "http://localhost:80",
        "http://example.com:80",
        "https://127.0.0.1:443",
        "http://127.0.0.1",
        "http://0.0.0.0:80",
        "127.0.0.1:80",
    ):
        with pytest.raises(SpecError, match=r"only sends to http://127\.0\.0\.1:PORT"):
            check_loopback(bad)


def test_non_loopback_target_is_refused_before_anything_is_sent(
    conv: tuple[loadgen.TraceRequest, ...],
) -> None:
    with Replica(fast) as rep:
        with pytest.raises(SpecError, match="refused"):
            loadgen.run(
                RateProfile.constant(20),
                lambda: [rep.url, "http://192.0.2.1:80"],
                2,
                trace_requests=conv,
            )
        assert rep.seen == []
    refused = ["loadgen", "--target", "http://192.0.2.1:80", "--rps", "5", "--duration-s", "1"]
    assert main(refused) == 2


def test_replica_urls_from_the_service_answer() -> None:
    doc = {
        "name": "chat",
        "replicas": [
            {"job_id": 1, "state": "running", "port": 9001},
            {"job_id": 2, "state": "pending", "port": None},
            {"job_id": 3, "state": "stopping", "port": 9003},
            {"job_id": 4, "state": "running", "port": 9004, "ready": True},
            {"job_id": 5, "state": "running", "port": 9005, "ready": False},
        ],
    }
    assert replica_urls(doc) == ["http://127.0.0.1:9001", "http://127.0.0.1:9004"]
    # a server that names each replica's URL: its node's address, used as given
    doc["replicas"][0]["url"] = "http://127.0.0.2:9001"
    assert replica_urls(doc)[0] == "http://127.0.0.2:9001"
    doc["replicas"][0]["url"] = "http://10.0.0.5:9001"  # another machine: the run refuses it
    with pytest.raises(SpecError, match="never to another host"):
        check_loopback(replica_urls(doc)[0])
    with pytest.raises(SpecError, match="replicas"):
        replica_urls({"name": "chat"})


# ---------------------------------------------------------------------------------------------
# Real HTTP on loopback.


def test_sent_rate_follows_the_profile_on_a_real_server(
    conv: tuple[loadgen.TraceRequest, ...],
) -> None:
    profile = loadgen.parse_ramp("5:40:5", 12)
    with Replica(fast) as rep:
        report = loadgen.run(profile, static_targets([rep.url]), 12, seed=5, trace_requests=conv)
    sched = build_schedule(conv, profile, 12, seed=5)
    assert report.count(OK) == len(sched) == len(rep.seen)
    assert len(sched) == pytest.approx(profile.requests_until(12), rel=0.1)
    # No request went early, most went on time (a stall of the whole machine delays some:
    # CI once saw 1.7 s), and each asked for its trace row's tokens.
    lags = [r.sent_s - r.scheduled_s for r in report.records if r.sent_s is not None]
    assert min(lags) >= 0 and np.median(lags) < 0.1, (min(lags), np.median(lags), max(lags))
    asked = sorted((int(q["context_tokens"]), int(q["generated_tokens"])) for q in rep.seen)
    assert asked == sorted((r.context_tokens, r.generated_tokens) for r in sched)
    assert all(q["tokens"] == q["generated_tokens"] for q in rep.seen)
    assert {q["path"] for q in rep.seen} == {"/generate"}
    # Per 3 s window, what was sent follows the profile's rise and fall.
    windows = report.windows(3.0)
    sent = np.array([w.rps for w in windows])
    target = np.array([w.target_rps for w in windows])
    assert target[0] < target[1] and target[2] > target[3]
    assert np.all(np.abs(sent - target) / target < 0.4), (sent, target)
    assert sent[1] + sent[2] > 2.5 * (sent[0] + sent[3]) / 2
    assert all(w.p99_ms is not None and w.p99_ms >= 2.0 for w in windows)
    assert report.windows_within(1000.0, window_s=3.0) == (4, 4)
    assert report.windows_within(1.0, window_s=3.0) == (0, 4)  # the replica sleeps 2 ms
    assert report.windows_within(1000.0, 3.0, counted=lambda w: w.start_s >= 6) == (2, 2)
    assert report.summary()["outcomes"][OK] == len(sched)


def test_errors_timeouts_and_drops_are_counted(conv: tuple[loadgen.TraceRequest, ...]) -> None:
    """The replica answers by the request's own token count (so what each request should
    have met is known): slow past the timeout, 503, or at once."""

    def flaky(_n: int, q: dict[str, str]) -> tuple[int, float]:
        kind = int(q["generated_tokens"]) % 5
        if kind == 1:
            return 200, 3.0  # past the 1 s timeout
        return (503, 0.0) if kind == 2 else (200, 0.0)

    with Replica(flaky) as rep:
        report = loadgen.run(
            RateProfile.constant(20),
            static_targets([rep.url]),
            3,
            seed=2,
            trace_requests=conv,
            timeout_s=1.0,
        )
        served = len(rep.seen)
    expected = {1: TIMEOUT, 2: HTTP_ERROR}
    assert [r.outcome for r in report.records] == [
        expected.get(r.generated_tokens % 5, OK) for r in report.records
    ]
    assert served == len(report.records) > 40
    assert report.count(TIMEOUT) > 3 and report.count(HTTP_ERROR) > 3
    assert all(r.status == 503 for r in report.records if r.outcome == HTTP_ERROR)
    assert all(r.latency_ms is None for r in report.records if r.outcome == TIMEOUT)
    assert sum(w.errors for w in report.windows(1.0)) == report.count(TIMEOUT, HTTP_ERROR)
    assert sum(w.timeouts for w in report.windows(1.0)) == report.count(TIMEOUT)
    # A window with a failed request does not count as within the SLO, whatever its p99.
    kept, counted = report.windows_within(10_000.0, window_s=1.0)
    assert counted == 3
    assert kept == sum(1 for w in report.windows(1.0) if w.errors == 0)

    # Open loop: with one request allowed in flight and a slow replica, the rest are dropped.
    with Replica(lambda n, q: (200, 0.4)) as slow:
        report = loadgen.run(
            RateProfile.constant(20),
            static_targets([slow.url]),
            2,
            seed=2,
            trace_requests=conv,
            max_in_flight=1,
        )
        assert report.count(OK) == len(slow.seen) <= 6
    assert report.count(DROPPED) == len(report.records) - report.count(OK) > 20

    # Nobody listening: connection errors, not a hang.
    with Replica(fast) as gone:
        dead = gone.url
    report = loadgen.run(
        RateProfile.constant(10), static_targets([dead]), 1, seed=2, trace_requests=conv
    )
    assert report.count(CONNECTION_ERROR) == len(report.records) > 0


def test_targets_are_refreshed_and_balanced(conv: tuple[loadgen.TraceRequest, ...]) -> None:
    """The target list changes while the load runs (replicas added, then none), and
    least-outstanding sends less to a slow replica than round-robin would. The list moves on
    what the replicas have served, not on a clock, so a loaded machine cannot shift it."""
    with Replica(fast) as a, Replica(fast) as b:

        def targets() -> list[str]:
            if len(a.seen) < 15:
                return [a.url]
            return [a.url, b.url] if len(b.seen) < 10 else []

        report = loadgen.run(RateProfile.constant(20), targets, 5, seed=4, trace_requests=conv)
        went = [r.target if r.outcome != NO_TARGET else None for r in report.records]
        first_b, first_none = went.index(b.url), went.index(None)
        assert first_b >= 15 and set(went[:first_b]) == {a.url}
        assert set(went[first_b:first_none]) == {a.url, b.url}
        assert first_none < len(went) and set(went[first_none:]) == {None}
        assert set(report.targets_seen) == {a.url, b.url}

    with Replica(fast) as quick, Replica(lambda n, q: (200, 0.3)) as slow:
        report = loadgen.run(
            RateProfile.constant(30),
            static_targets([quick.url, slow.url]),
            3,
            seed=4,
            trace_requests=conv,
            balance=loadgen.LEAST_OUTSTANDING,
        )
        assert report.count(OK) == len(report.records)
        # round-robin would send the slow one half; under 3/8 leaves room for a loaded host
        # (where the quick replica answers slower too: 33 against 65 in one CI run)
        assert len(slow.seen) < 0.6 * len(quick.seen), (len(slow.seen), len(quick.seen))


# ---------------------------------------------------------------------------------------------
# The command.


@contextmanager
def service_api(name: str, replicas: list[dict[str, object]]) -> Iterator[str]:
    """A loopback stand-in for the gpupool server's GET /v1/services/NAME."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = self.path == f"/v1/services/{name}"
            body = json.dumps(
                {"name": name, "replicas": replicas} if found else {"detail": "no such service"}
            ).encode()
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_cli_sends_to_a_service_s_running_replicas(
    tmp_path: Path,
    traces: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("GPUPOOL_TRACES", str(traces))
    with Replica(fast) as rep:
        port = int(rep.url.rsplit(":", 1)[1])
        replicas: list[dict[str, object]] = [
            {"job_id": 1, "state": "running", "port": port},
            {"job_id": 2, "state": "pending", "port": None},
        ]
        with service_api("chat", replicas) as api:
            summary = tmp_path / "summary.json"
            windows = tmp_path / "windows.jsonl"
            code = main(
                ["loadgen", "--service", "chat", "--url", api, "--ramp", "5:20", "--duration-s",
                 "3", "--window-s", "1", "--summary", str(summary), "--windows", str(windows)]
            )  # fmt: skip
            assert code == 0
            missing = main(
                ["loadgen", "--service", "nope", "--url", api, "--rps", "5", "--duration-s", "1"]
            )
            assert missing == 2
        doc = json.loads(summary.read_text())
        assert doc["outcomes"]["ok"] == doc["sent"] == len(rep.seen) > 20
        assert doc["targets_seen"] == [rep.url]
        lines = [json.loads(x) for x in windows.read_text().splitlines()]
        assert [w["start_s"] for w in lines] == [0, 1, 2]
        assert sum(w["ok"] for w in lines) == len(rep.seen)
    out = capsys.readouterr()
    assert "p99 ms" in out.out
    assert "no such service" in out.err or "nope" in out.err


def test_a_failing_target_source_keeps_the_last_list(
    conv: tuple[loadgen.TraceRequest, ...],
) -> None:
    """The gpupool API down for a moment must not stop the load; down from the start, the
    run stops before sending anything."""
    with Replica(fast) as rep:
        calls = []

        def flaky() -> list[str]:
            calls.append(1)
            if len(calls) > 1:
                raise ConnectionError("server restarting")
            return [rep.url]

        report = loadgen.run(RateProfile.constant(20), flaky, 2.5, seed=1, trace_requests=conv)
        assert report.count(OK) == len(report.records) == len(rep.seen) > 20
        assert len(report.refresh_errors) >= 1
        assert "server restarting" in report.refresh_errors[0]

        def down() -> list[str]:
            raise ConnectionError("no server")

        with pytest.raises(ConnectionError):
            loadgen.run(RateProfile.constant(20), down, 1, trace_requests=conv)

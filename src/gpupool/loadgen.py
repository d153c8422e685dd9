"""A load generator for online services: replays the Azure LLM inference 2023 arrivals,
time-compressed onto a target rate profile, as real HTTP requests to replicas on loopback.

Why a trace and not a Poisson clock: an autoscaler tuned on smooth arrivals is tuned on a
load nobody serves. The replay keeps the trace's short-range pattern (its inter-arrival gaps
and each request's prompt and output token counts) and replaces only its slow trend with the
profile asked for, so a test can say "5 to 60 rps and back" and still get real bursts.

The time change: over each `smooth_s` of trace time the trace's cumulative request count is
made linear (its "operational time"), and request j is sent at wall time t_j with
Lambda(t_j) = U_j, where Lambda is the profile's cumulative request count and U_j the
operational time of the j-th replayed request. Every trace block of `smooth_s` therefore
lands on exactly its count of profile requests, and within a block the gaps are the trace's
own, rescaled by one factor. The seed picks the trace row the replay starts from; the trace
wraps around when a run needs more requests than it holds.

Each request is GET <replica>/generate?context_tokens=C&generated_tokens=G&tokens=G: the
trace row's prompt and output lengths, and `tokens` (the output length, which sets a
decode-bound replica's service time) for replicas that read one count.

Open loop: a request is sent at its time whatever the replicas do; when `max_in_flight`
requests are already outstanding it is recorded as dropped (the client is the bottleneck,
not the service), so a slow service shows up as errors and latency, never as a quietly
lower rate. Targets are only loopback addresses (127.0.0.0/8): this tool must not be able
to load anyone else's server.
"""

from __future__ import annotations

import bisect
import ipaddress
import itertools
import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import numpy as np

from gpupool.errors import NotFoundError, SpecError
from gpupool.traces.azure_llm import read_azure_llm
from gpupool.traces.location import TRACES_ENV, find_traces_dir

AZURE_DIR = "azure-llm-inference-2023"
TRACE_FILES = {
    "conv": "AzureLLMInferenceTrace_conv.csv",
    "code": "AzureLLMInferenceTrace_code.csv",
}
"""The conversation trace is the chatbot's; the code trace (completions) is far burstier."""

ROUND_ROBIN = "round-robin"
LEAST_OUTSTANDING = "least-outstanding"
BALANCE_POLICIES = (ROUND_ROBIN, LEAST_OUTSTANDING)

OK = "ok"
HTTP_ERROR = "http_error"
TIMEOUT = "timeout"
CONNECTION_ERROR = "connection_error"
DROPPED = "dropped"
NO_TARGET = "no_target"
OUTCOMES = (OK, HTTP_ERROR, TIMEOUT, CONNECTION_ERROR, DROPPED, NO_TARGET)

REFRESH_S = 1.0
"""How often the target list is asked again: replicas come and go while the load runs."""
MAX_REQUESTS = 1_000_000
"""Hard cap on one run's requests, whatever the profile asks (about 4.6 h at 60 rps)."""
MAX_SLEEP_S = 0.25
"""The dispatcher never sleeps longer than this, so a stop is prompt."""


# ---------------------------------------------------------------------------------------------
# Rate profile.


@dataclass(frozen=True)
class RateProfile:
    """Requests per second over time: linear between points (t_s, rps), flat after the last.

    Two points at the same time make a step. The profile starts at t_s = 0.
    """

    points: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        if not self.points:
            raise SpecError("a rate profile needs at least one point (time_s, rps)")
        if self.points[0][0] != 0:
            raise SpecError(f"a rate profile starts at 0 s, not {self.points[0][0]:g} s")
        last_t = 0.0
        for t_s, rps in self.points:
            if not (math.isfinite(t_s) and math.isfinite(rps)):
                raise SpecError(f"rate profile point ({t_s}, {rps}) is not finite")
            if t_s < last_t:
                raise SpecError(
                    f"rate profile times must not go backwards: {t_s:g} s after {last_t:g} s"
                )
            if rps < 0:
                raise SpecError(f"rate profile rps must be >= 0, got {rps:g} at {t_s:g} s")
            last_t = t_s

    @classmethod
    def constant(cls, rps: float) -> RateProfile:
        return cls(((0.0, float(rps)),))

    @classmethod
    def ramp(cls, rates: Sequence[float], duration_s: float) -> RateProfile:
        """Rates at equal spacing over duration_s: (5, 60, 5) rises to 60 at the middle."""
        if not (math.isfinite(duration_s) and duration_s > 0):
            raise SpecError(f"a ramp needs a duration > 0 s, got {duration_s}")
        if len(rates) == 1:
            return cls.constant(rates[0])
        step = duration_s / (len(rates) - 1)
        return cls(tuple((k * step, float(r)) for k, r in enumerate(rates)))

    def rps_at(self, t_s: float) -> float:
        pts = self.points
        k = bisect.bisect_right([p[0] for p in pts], t_s) - 1
        if k < 0:
            return pts[0][1]
        if k >= len(pts) - 1:
            return pts[-1][1]
        (t0, r0), (t1, r1) = pts[k], pts[k + 1]
        return r0 + (r1 - r0) * (t_s - t0) / (t1 - t0)

    def _segments(self, end_s: float) -> list[tuple[float, float, float, float]]:
        """(t0, t1, rps at t0, rps at t1) up to end_s, the flat tail included."""
        segs: list[tuple[float, float, float, float]] = []
        pts = self.points
        for (t0, r0), (t1, r1) in itertools.pairwise(pts):
            if t1 > t0 and t0 < end_s:
                segs.append((t0, t1, r0, r1))
        if pts[-1][0] < end_s:
            segs.append((pts[-1][0], end_s, pts[-1][1], pts[-1][1]))
        return segs

    def requests_until(self, t_s: float) -> float:
        """Lambda(t): how many requests the profile asks for in [0, t_s)."""
        total = 0.0
        for t0, t1, r0, r1 in self._segments(t_s):
            dt = min(t1, t_s) - t0
            slope = (r1 - r0) / (t1 - t0)
            total += r0 * dt + slope * dt * dt / 2
        return total

    def time_of(self, count: float, end_s: float) -> float | None:
        """Lambda^-1: the time by which the profile has asked for `count` requests, or None
        when that is after end_s."""
        done = 0.0
        for t0, t1, r0, r1 in self._segments(end_s):
            t_end = min(t1, end_s)
            dt = t_end - t0
            slope = (r1 - r0) / (t1 - t0)
            here = r0 * dt + slope * dt * dt / 2
            if done + here >= count:
                need = count - done
                if abs(slope) < 1e-12:
                    tau = need / r0 if r0 > 0 else 0.0
                else:  # r0 tau + slope tau^2 / 2 = need
                    disc = max(r0 * r0 + 2 * slope * need, 0.0)
                    tau = (math.sqrt(disc) - r0) / slope
                return t0 + min(max(tau, 0.0), dt)
            done += here
        return None

    def describe(self) -> str:
        return " -> ".join(f"{r:g} rps @{t:g}s" for t, r in self.points)


def parse_ramp(text: str, duration_s: float) -> RateProfile:
    """'5:60:5' -> 5 rps at 0, 60 at the middle of duration_s, 5 at the end."""
    try:
        rates = [float(part) for part in text.split(":")]
    except ValueError:
        raise SpecError(
            f"--ramp {text!r}: give rates in rps separated by ':', e.g. 5:60:5"
        ) from None
    return RateProfile.ramp(rates, duration_s)


def parse_profile(text: str) -> RateProfile:
    """'0:5,60:60,120:60,180:5' -> (time_s:rps) points, linear in between; repeat a time for
    a step ('0:5,60:5,60:40')."""
    points: list[tuple[float, float]] = []
    for part in text.split(","):
        bits = part.strip().split(":")
        try:
            if len(bits) != 2:
                raise ValueError
            points.append((float(bits[0]), float(bits[1])))
        except ValueError:
            raise SpecError(
                f"--profile {text!r}: give time_s:rps points separated by commas, "
                "e.g. 0:5,60:60,120:5"
            ) from None
    return RateProfile(tuple(points))


# ---------------------------------------------------------------------------------------------
# Trace and schedule.


@dataclass(frozen=True)
class TraceRequest:
    """One trace row, as the replay needs it: its trace time and its token counts."""

    arrival_s: float
    context_tokens: int
    generated_tokens: int


def trace_path(trace: str, traces_dir: Path | None = None) -> Path:
    """The Azure file for 'conv' or 'code', under traces_dir or the folder gpupool finds
    ($GPUPOOL_TRACES, else a shared/traces above the working directory)."""
    if trace not in TRACE_FILES:
        raise SpecError(f"unknown trace {trace!r}; choose from {', '.join(TRACE_FILES)}")
    folder = traces_dir if traces_dir is not None else find_traces_dir()
    if folder is None:
        raise NotFoundError(
            f"no traces folder found; set {TRACES_ENV} to the folder holding "
            f"{AZURE_DIR}/ (…/shared/traces)"
        )
    path = folder / AZURE_DIR / TRACE_FILES[trace]
    if not path.is_file():
        raise NotFoundError(
            f"{path} does not exist; set {TRACES_ENV} to the folder holding {AZURE_DIR}/"
        )
    return path


def load_trace(trace: str = "conv", traces_dir: Path | None = None) -> tuple[TraceRequest, ...]:
    arrivals, _ = read_azure_llm(trace_path(trace, traces_dir))
    return tuple(TraceRequest(a.arrival_s, a.context_tokens, a.generated_tokens) for a in arrivals)


def operational_times(arrival_s: Sequence[float], smooth_s: float) -> np.ndarray:
    """Theta(s_i): the trace's cumulative count made linear within each block of smooth_s,
    so each block's requests span exactly their count and keep their gaps' shape."""
    if not (math.isfinite(smooth_s) and smooth_s > 0):
        raise SpecError(f"smooth_s must be > 0 s, got {smooth_s}")
    s = np.asarray(arrival_s, dtype=float)
    if s.size == 0:
        raise SpecError("the trace has no requests")
    span = float(s[-1]) + 1e-9
    n_blocks = max(1, math.ceil(span / smooth_s))
    edges = np.minimum(np.arange(n_blocks + 1) * smooth_s, span)
    block = np.minimum((s // smooth_s).astype(int), n_blocks - 1)
    counts = np.bincount(block, minlength=n_blocks).astype(float)
    before = np.concatenate(([0.0], np.cumsum(counts)[:-1]))
    width = edges[1:] - edges[:-1]
    rate = np.divide(counts, width, out=np.zeros_like(counts), where=width > 0)
    theta: np.ndarray = before[block] + (s - edges[block]) * rate[block]
    return theta


@dataclass(frozen=True)
class ScheduledRequest:
    """One request of the run: when to send it (s from the start) and what to ask for."""

    index: int
    at_s: float
    context_tokens: int
    generated_tokens: int
    trace_row: int


def build_schedule(
    trace: Sequence[TraceRequest],
    profile: RateProfile,
    duration_s: float,
    seed: int = 0,
    smooth_s: float = 60.0,
    max_requests: int = MAX_REQUESTS,
) -> tuple[ScheduledRequest, ...]:
    """The whole run, decided before the first request: deterministic by seed."""
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise SpecError(f"duration_s must be > 0, got {duration_s}")
    if max_requests < 0:
        raise SpecError(f"max_requests must be >= 0, got {max_requests}")
    theta = operational_times([r.arrival_s for r in trace], smooth_s)
    gaps = np.diff(theta, prepend=theta[0])
    gaps[0] = 1.0  # the wrap from the last row back to the first: one mean gap
    n = len(trace)
    start = int(np.random.default_rng(seed).integers(n))
    wanted = min(profile.requests_until(duration_s), float(max_requests))
    out: list[ScheduledRequest] = []
    u = 0.0
    row = start
    first = True
    while len(out) < max_requests:
        u += 1.0 if first else float(gaps[row])
        first = False
        if u > wanted + 1e-9:
            break
        at = profile.time_of(u, duration_s)
        if at is None:
            break
        req = trace[row]
        out.append(ScheduledRequest(len(out), at, req.context_tokens, req.generated_tokens, row))
        row = (row + 1) % n
    return tuple(out)


def gap_cv(times_s: Sequence[float]) -> float:
    """Coefficient of variation of the gaps between consecutive times: 1 for Poisson."""
    g = np.diff(np.asarray(times_s, dtype=float))
    if g.size < 2 or g.mean() <= 0:
        return float("nan")
    return float(g.std() / g.mean())


# ---------------------------------------------------------------------------------------------
# Targets.


def check_loopback(url: str) -> str:
    """The URL, with no trailing slash, if it is http:// on a loopback IP; else SpecError."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if parts.scheme != "http" or not loopback or parts.port is None:
        raise SpecError(
            f"load target {url!r} refused: the load generator only sends to "
            "http://127.0.0.1:PORT (a loopback address with a port), never to another host"
        )
    return url.rstrip("/")


def replica_urls(service: Mapping[str, Any]) -> list[str]:
    """URLs of a service's running replicas, from GET /v1/services/NAME:
    {"name": ..., "replicas": [{"job_id": .., "state": "running", "port": 12345,
    "url": "http://127.0.0.2:12345", ...}]} (a server that gives no `url`: 127.0.0.1 and
    the port); a replica marked "ready": false is left out until it is ready. The run
    checks each with `check_loopback`: a replica on another host stops it."""
    replicas = service.get("replicas")
    if not isinstance(replicas, list):
        raise SpecError(
            f"service {service.get('name')!r}: the answer has no 'replicas' list; "
            "is the server a gpupool with services?"
        )
    urls = []
    for rep in replicas:
        # `ready` (when the server says it): the replica answered a scrape, so its port is
        # open; a replica still starting would only turn requests into connection errors.
        if (
            isinstance(rep, Mapping)
            and rep.get("state") == "running"
            and rep.get("ready", True) is not False
        ):
            port, url = rep.get("port"), rep.get("url")
            if isinstance(url, str) and url:
                urls.append(url)
            elif isinstance(port, int) and 0 < port < 65536:
                urls.append(f"http://127.0.0.1:{port}")
    return urls


def service_targets(fetch: Callable[[str], Any], name: str) -> Callable[[], list[str]]:
    """Targets from the gpupool API: the running replicas of service `name`. `fetch(path)`
    returns the decoded JSON of GET path (the CLI passes its API client's)."""
    path = f"/v1/services/{quote(name, safe='')}"

    def targets() -> list[str]:
        doc = fetch(path)
        if not isinstance(doc, Mapping):
            raise SpecError(f"GET {path} did not answer a JSON object")
        return replica_urls(doc)

    return targets


def static_targets(urls: Iterable[str]) -> Callable[[], list[str]]:
    fixed = [check_loopback(u) for u in urls]
    return lambda: list(fixed)


# ---------------------------------------------------------------------------------------------
# Results.


@dataclass(frozen=True)
class RequestRecord:
    """What happened to one scheduled request, as the client saw it."""

    index: int
    scheduled_s: float
    outcome: str
    target: str | None = None
    sent_s: float | None = None
    latency_ms: float | None = None
    status: int | None = None
    context_tokens: int = 0
    generated_tokens: int = 0


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100): a value that was measured, None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class WindowStats:
    """One window of the run, by scheduled time: [start_s, start_s + window_s)."""

    start_s: float
    window_s: float
    target_rps: float
    sent: int
    ok: int
    errors: int
    dropped: int
    timeouts: int
    rps: float
    ok_rps: float
    p50_ms: float | None
    p99_ms: float | None


@dataclass(frozen=True)
class Report:
    """A finished run: every request's record, and the settings that made them."""

    profile: RateProfile
    duration_s: float
    seed: int
    trace: str
    balance: str
    records: tuple[RequestRecord, ...]
    wall_s: float
    targets_seen: tuple[str, ...] = ()
    refresh_errors: tuple[str, ...] = field(default=())

    def count(self, *outcomes: str) -> int:
        return sum(1 for r in self.records if r.outcome in outcomes)

    def windows(self, window_s: float = 5.0) -> list[WindowStats]:
        if not window_s > 0:
            raise SpecError(f"window_s must be > 0, got {window_s}")
        n = max(1, math.ceil(self.duration_s / window_s - 1e-9))
        buckets: list[list[RequestRecord]] = [[] for _ in range(n)]
        for rec in self.records:
            buckets[min(int(rec.scheduled_s // window_s), n - 1)].append(rec)
        out = []
        for k, recs in enumerate(buckets):
            start = k * window_s
            width = min(window_s, self.duration_s - start)
            sent = [r for r in recs if r.sent_s is not None]
            ok = [r.latency_ms for r in recs if r.outcome == OK and r.latency_ms is not None]
            target = self.profile.requests_until(start + width) - self.profile.requests_until(start)
            out.append(
                WindowStats(
                    start_s=start,
                    window_s=width,
                    target_rps=target / width,
                    sent=len(sent),
                    ok=len(ok),
                    errors=sum(1 for r in recs if r.outcome != OK),
                    dropped=sum(1 for r in recs if r.outcome == DROPPED),
                    timeouts=sum(1 for r in recs if r.outcome == TIMEOUT),
                    rps=len(sent) / width,
                    ok_rps=len(ok) / width,
                    p50_ms=percentile(ok, 50),
                    p99_ms=percentile(ok, 99),
                )
            )
        return out

    def windows_within(
        self,
        p99_ms: float,
        window_s: float = 60.0,
        counted: Callable[[WindowStats], bool] | None = None,
    ) -> tuple[int, int]:
        """(windows whose p99 is within p99_ms and that lost no request, windows counted):
        an SLO kept "for 99% of minutes". Windows with no requests, or that `counted`
        leaves out (a scale-up settling), are not counted."""
        kept = total = 0
        for w in self.windows(window_s):
            if w.sent + w.dropped == 0 or (counted is not None and not counted(w)):
                continue
            total += 1
            if w.errors == 0 and w.p99_ms is not None and w.p99_ms <= p99_ms:
                kept += 1
        return kept, total

    def summary(self) -> dict[str, Any]:
        ok = [r.latency_ms for r in self.records if r.outcome == OK and r.latency_ms is not None]
        lags = [(r.sent_s - r.scheduled_s) * 1000 for r in self.records if r.sent_s is not None]
        return {
            "profile": self.profile.describe(),
            "duration_s": self.duration_s,
            "seed": self.seed,
            "trace": self.trace,
            "balance": self.balance,
            "wall_s": round(self.wall_s, 3),
            "scheduled": len(self.records),
            "target_requests": round(self.profile.requests_until(self.duration_s), 1),
            "sent": sum(1 for r in self.records if r.sent_s is not None),
            "outcomes": {o: self.count(o) for o in OUTCOMES},
            "p50_ms": percentile(ok, 50),
            "p99_ms": percentile(ok, 99),
            "send_lag_p99_ms": percentile(lags, 99),
            "targets_seen": list(self.targets_seen),
            "refresh_errors": list(self.refresh_errors[:10]),
        }

    def write_windows(self, path: str | Path, window_s: float = 5.0) -> None:
        """One JSON object per window, one per line."""
        with Path(path).open("w", encoding="utf-8") as out:
            for w in self.windows(window_s):
                out.write(json.dumps(asdict(w)) + "\n")

    def write_requests(self, path: str | Path) -> None:
        with Path(path).open("w", encoding="utf-8") as out:
            for r in self.records:
                out.write(json.dumps(asdict(r)) + "\n")

    def write_summary(self, path: str | Path, window_s: float = 60.0) -> None:
        doc = self.summary() | {"windows": [asdict(w) for w in self.windows(window_s)]}
        Path(path).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# Sending.


class _Balancer:
    """Picks a target per request; the target list may change between picks."""

    def __init__(self, policy: str) -> None:
        if policy not in BALANCE_POLICIES:
            raise SpecError(
                f"unknown balance policy {policy!r}; choose from {', '.join(BALANCE_POLICIES)}"
            )
        self.policy = policy
        self.targets: list[str] = []
        self.outstanding: dict[str, int] = {}
        self.turn = 0
        self.lock = threading.Lock()

    def set_targets(self, targets: list[str]) -> None:
        with self.lock:
            self.targets = targets

    def acquire(self) -> str | None:
        with self.lock:
            if not self.targets:
                return None
            n = len(self.targets)
            order = [self.targets[(self.turn + k) % n] for k in range(n)]
            self.turn = (self.turn + 1) % n
            if self.policy == LEAST_OUTSTANDING:
                pick = min(order, key=lambda t: self.outstanding.get(t, 0))
            else:
                pick = order[0]
            self.outstanding[pick] = self.outstanding.get(pick, 0) + 1
            return pick

    def release(self, target: str) -> None:
        with self.lock:
            self.outstanding[target] -= 1


def run(
    profile: RateProfile,
    targets: Callable[[], Sequence[str]],
    duration_s: float,
    seed: int = 0,
    *,
    trace: str = "conv",
    trace_requests: Sequence[TraceRequest] | None = None,
    smooth_s: float = 60.0,
    balance: str = ROUND_ROBIN,
    max_in_flight: int = 64,
    timeout_s: float = 5.0,
    max_requests: int = MAX_REQUESTS,
    path: str = "/generate",
    stop: threading.Event | None = None,
) -> Report:
    """Send the schedule for `profile` to the URLs `targets()` returns (asked again every
    second), and record each request. Returns when the schedule is done and every request
    has its answer or its timeout; `stop` ends it early. Non-loopback targets raise SpecError.
    """
    if max_in_flight < 1:
        raise SpecError(f"max_in_flight must be >= 1, got {max_in_flight}")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise SpecError(f"timeout_s must be > 0, got {timeout_s}")
    requests = trace_requests if trace_requests is not None else load_trace(trace)
    schedule = build_schedule(requests, profile, duration_s, seed, smooth_s, max_requests)
    balancer = _Balancer(balance)
    records: dict[int, RequestRecord] = {}
    seen: dict[str, None] = {}
    refresh_errors: list[str] = []
    slots = threading.BoundedSemaphore(max_in_flight)
    stop = stop or threading.Event()

    def refresh(first: bool = False) -> None:
        """A failing source keeps the last list, except at the start: a service that does
        not exist should stop the run, not turn every request into no_target."""
        try:
            got = [check_loopback(u) for u in targets()]
        except SpecError:
            raise
        except Exception as exc:
            if first:
                raise
            if len(refresh_errors) < 100:  # one a second at most; the first ones tell
                refresh_errors.append(f"{type(exc).__name__}: {exc}")
            return
        for u in got:
            seen.setdefault(u, None)
        balancer.set_targets(got)

    http = httpx.Client(
        timeout=httpx.Timeout(timeout_s),
        limits=httpx.Limits(max_connections=max_in_flight, max_keepalive_connections=max_in_flight),
    )
    pool = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="loadgen")
    t0 = time.monotonic()

    def record(
        req: ScheduledRequest,
        outcome: str,
        target: str | None = None,
        sent_s: float | None = None,
        latency_ms: float | None = None,
        status: int | None = None,
    ) -> None:
        records[req.index] = RequestRecord(
            index=req.index,
            scheduled_s=req.at_s,
            outcome=outcome,
            target=target,
            sent_s=sent_s,
            latency_ms=latency_ms,
            status=status,
            context_tokens=req.context_tokens,
            generated_tokens=req.generated_tokens,
        )

    def send(req: ScheduledRequest, target: str) -> None:
        sent = time.monotonic()
        params = {
            "context_tokens": req.context_tokens,
            "generated_tokens": req.generated_tokens,
            "tokens": req.generated_tokens,
        }
        try:
            resp = http.get(target + path, params=params)
            latency_ms = (time.monotonic() - sent) * 1000
            outcome = OK if resp.is_success else HTTP_ERROR
            record(req, outcome, target, sent - t0, latency_ms, resp.status_code)
        except httpx.TimeoutException:
            record(req, TIMEOUT, target, sent - t0)
        except httpx.HTTPError:
            record(req, CONNECTION_ERROR, target, sent - t0)
        finally:
            balancer.release(target)
            slots.release()

    done = threading.Event()

    def refresher() -> None:
        """Asks for the targets on its own thread: a slow answer (an API under load) must
        not hold back the requests due meanwhile and then send them in one burst."""
        while not done.wait(REFRESH_S) and not stop.is_set():
            refresh()

    poller = threading.Thread(target=refresher, name="loadgen-targets", daemon=True)
    try:
        refresh(first=True)
        poller.start()
        for req in schedule:
            due = t0 + req.at_s
            while not stop.is_set():
                now = time.monotonic()
                if now >= due:
                    break
                time.sleep(min(due - now, MAX_SLEEP_S))
            if stop.is_set() or time.monotonic() - t0 > duration_s + 1.0:
                break
            target = balancer.acquire()
            if target is None:
                record(req, NO_TARGET)
                continue
            if not slots.acquire(blocking=False):
                balancer.release(target)
                record(req, DROPPED, target)
                continue
            pool.submit(send, req, target)
    finally:
        done.set()
        if poller.is_alive():
            poller.join(timeout=30.0)
        pool.shutdown(wait=True)
        http.close()
    return Report(
        profile=profile,
        duration_s=duration_s,
        seed=seed,
        trace=trace if trace_requests is None else "given",
        balance=balance,
        records=tuple(records[k] for k in sorted(records)),
        wall_s=time.monotonic() - t0,
        targets_seen=tuple(seen),
        refresh_errors=tuple(refresh_errors),
    )

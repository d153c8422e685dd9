"""Acceptance: an online service through the real `gpupool serve` process (fake fleet of
8 A100-80GB, loopback only) follows a load that ramps from 5 to 60 requests/s and back.

The replicas are the example chat replica (2 slots, 20-60 ms a request: a replica
saturates near 50 rps, so one replica alone would break the SLO at the peak). The load
is an open-loop Poisson client of this test (bounded in time and requests) that re-reads
the ready replicas from GET /v1/services/chat every second and spreads requests over
them. Time is compressed: the autoscaler's look-ahead, load window and scale-down
stabilisation are seconds, and a "minute" of the SLO check is a 5-s window of
client-measured latencies. Checked: replicas go up and down with reasons in the event
log, the client-side p99 is within the SLO in >= 99% of the windows after each scale-up
has settled (5 s), and `gpupool service show` prints replicas, rps and p99.
"""

from __future__ import annotations

import itertools
import json
import random
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from service_proc import Server, cli, wait_for

CONFIG = """\
teams:
  - {name: web}
preemption: {min_runtime_s: 0, max_per_job: 3}
autoscale: {lookahead_s: 8, down_stable_s: 6, load_window_s: 4}
"""
SLO_MS = 200.0
WINDOW_S = 5.0
SETTLE_S = 5.0
PROFILE = ((0.0, 5.0), (40.0, 60.0), (60.0, 60.0), (90.0, 5.0), (110.0, 5.0))
"""(seconds since the start, rps): linear in between."""


def rate_at(t: float) -> float:
    for (t0, r0), (t1, r1) in itertools.pairwise(PROFILE):
        if t0 <= t <= t1:
            return r0 + (r1 - r0) * (t - t0) / (t1 - t0)
    return PROFILE[-1][1]


class Load:
    """Open-loop client: Poisson arrivals at rate_at(t), round robin over ready replicas."""

    def __init__(self, url: str, seed: int = 7) -> None:
        self.url = url
        self.rng = random.Random(seed)
        self.replicas: list[str] = []
        self.done: list[tuple[float, float]] = []  # (sent at, latency ms)
        self.errors = 0
        self.lock = threading.Lock()

    def refresh(self, http: httpx.Client) -> None:
        try:
            s = http.get(f"{self.url}/v1/services/chat", timeout=2.0).json()
        except (httpx.HTTPError, ValueError):
            return
        self.replicas = [r["url"] for r in s["replicas"] if r["ready"]]

    def one(self, http: httpx.Client, target: str, tokens: int, sent: float) -> None:
        try:
            r = http.get(f"{target}/generate", params={"tokens": tokens}, timeout=10.0)
            ok = r.status_code == 200
        except httpx.HTTPError:
            ok = False
        took = (time.monotonic() - sent) * 1000.0
        with self.lock:
            if ok:
                self.done.append((sent, took))
            else:
                self.errors += 1

    def run(self, duration_s: float) -> float:
        start = time.monotonic()
        limits = httpx.Limits(max_connections=128, max_keepalive_connections=64)
        with httpx.Client(limits=limits) as http, ThreadPoolExecutor(96) as pool:
            next_refresh = 0.0
            t = 0.0
            k = 0
            while t < duration_s and k < 20_000:
                now = time.monotonic() - start
                if now >= next_refresh:
                    self.refresh(http)
                    next_refresh = now + 1.0
                if t > now:
                    time.sleep(min(t - now, 0.05))
                    continue
                if self.replicas:
                    target = self.replicas[k % len(self.replicas)]
                    pool.submit(self.one, http, target, self.rng.randint(20, 60), start + t)
                    k += 1
                t += self.rng.expovariate(rate_at(t))
        return start


def scale_events(url: str) -> list[tuple[float, int, int, str]]:
    s = httpx.get(f"{url}/v1/services/chat", timeout=5).json()
    out = []
    for e in s["events"]:
        m = re.search(r": (\d+) -> (\d+)$", e["message"])
        if e["kind"] == "service-scaled" and m:
            out.append((e["at"], int(m.group(1)), int(m.group(2)), e["message"]))
    return out


@pytest.mark.slow
def test_replicas_follow_a_ramp_and_keep_the_slo(tmp_path: Path) -> None:
    (tmp_path / "service.yaml").write_text(CONFIG, encoding="utf-8")
    server = Server(
        tmp_path / "state",
        "--fake-gpus",
        "8xA100-80GB",
        "--auth",
        "none",
        "--config",
        str(tmp_path / "service.yaml"),
        "--cycle",
        "0.25",
        "--sample",
        "0.5",
        "--scrape",
        "0.5",
    ).start()
    try:
        url = server.url
        made = cli(
            url,
            "service",
            "create",
            "chat",
            "--team",
            "web",
            "--gpu-mem",
            "16GiB",
            "--replicas",
            "1..8",
            "--slo-p99-ms",
            str(int(SLO_MS)),
            "--replica-rps",
            "15",
            "--grace",
            "2",
            "--",
            sys.executable,
            "-m",
            "gpupool.examples.chat_replica",
            "--slots",
            "2",
            "--ms-per-token",
            "1",
            "--min-ms",
            "20",
            "--max-ms",
            "60",
        )
        assert made.returncode == 0, made.stderr
        wait_for(
            lambda: any(
                r["ready"]
                for r in httpx.get(f"{url}/v1/services/chat", timeout=5).json()["replicas"]
            ),
            30,
            "the first replica to serve",
        )
        load = Load(url)
        peak_show: list[str] = []

        def show_at_peak() -> None:
            time.sleep(55.0)
            peak_show.append(cli(url, "service", "show", "chat").stdout)

        shower = threading.Thread(target=show_at_peak, daemon=True)
        shower.start()
        wall0 = time.time()
        start = load.run(PROFILE[-1][0])
        shower.join(30)
        mono_to_wall = wall0 - start

        events = scale_events(url)
        ups = [e for e in events if e[2] > e[1]]
        downs = [e for e in events if e[2] < e[1]]
        log = "\n".join(e[3] for e in events)
        assert max(e[2] for e in events) >= 4, log  # 60 rps at 15 rps/replica
        assert len(ups) >= 3 and downs, log
        assert all("rps" in e[3] for e in events), log

        # client-side p99 per compressed minute, after each scale-up has settled
        windows: dict[int, list[float]] = {}
        for sent, took in load.done:
            windows.setdefault(int((sent - start) // WINDOW_S), []).append(took)
        up_at = [e[0] - mono_to_wall - start for e in ups]
        kept = judged = 0
        report = []
        for w, lat in sorted(windows.items()):
            lo = w * WINDOW_S
            settling = any(u - WINDOW_S < lo < u + SETTLE_S for u in up_at)
            lat.sort()
            p99 = lat[max(0, int(0.99 * len(lat)) - 1)]
            report.append(
                f"{lo:5.0f}s n={len(lat):4d} p99={p99:6.1f} ms{' settling' if settling else ''}"
            )
            if settling or len(lat) < 20:
                continue
            judged += 1
            kept += p99 <= SLO_MS
        table = "\n".join(report)
        assert judged >= len(windows) // 2, table
        assert kept >= 0.99 * judged, f"{kept}/{judged} windows within {SLO_MS} ms\n{table}"
        assert load.errors <= len(load.done) * 0.01, load.errors
        assert len(load.done) > 3000

        assert peak_show, "service show did not run"
        shown = peak_show[0]
        running = re.search(r"replicas: (\d+) running", shown)
        rps = re.search(r"rps: ([\d.]+)", shown)
        p99 = re.search(r"p99: ([\d.]+) ms", shown)
        assert running and int(running.group(1)) >= 4, shown
        assert rps and float(rps.group(1)) > 30.0, shown
        assert p99 and float(p99.group(1)) < SLO_MS, shown
        print(table)
        print(log)
        print(shown)
        (tmp_path / "figures.json").write_text(
            json.dumps({"windows": report, "events": log, "show": shown}), encoding="utf-8"
        )
    finally:
        cli(server.url, "service", "delete", "chat")
        wait_for(
            lambda: all(
                j["state"] in ("cancelled", "failed", "succeeded")
                for j in httpx.get(f"{server.url}/v1/jobs", timeout=5).json()["jobs"]
            ),
            30,
            "the replicas to stop",
        )
        server.stop()

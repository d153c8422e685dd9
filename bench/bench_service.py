"""The live service's speed targets, measured on a real `gpupool serve` process.

1. Job submission through the API: single-job POST /v1/jobs requests over 16 keep-alive
   connections (an asyncio client with raw HTTP/1.1, so the client costs little of the
   2 cores), on SQLite and on PostgreSQL (a throwaway server, as the tests start it).
   Targets: >= 2,000 jobs/s (SQLite), >= 1,000 jobs/s (PostgreSQL). The batch endpoint
   is measured too, for reference. Before them, submit -> process start on an idle fleet
   (target p50 <= 50 ms; `--submit-to-start` measures only that, and with
   `--baseline REV` also REV's server, a fresh server of each in alternation for
   `--rounds` rounds, and writes both to the submit_to_start block).
2. 1,000 running jobs: the server on a fake fleet of 1,000 GPUs holds 1,000 real
   processes (`sleep`); the CPU the server process spends over 30 s (telemetry every
   second, executor polls, scheduler cycles) must stay under 10% of one core.

Writes bench/results/service.json. Run: `.venv/bin/python bench/bench_service.py`.
`--throughput-only` measures only the submission rates (and updates only those in
service.json); `--baseline REV` with it also runs the server of REV (a `git archive`
of its src/) in alternation with this tree's, `--rounds` times each, and prints both.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from baseline import baseline_source
from machine import describe

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
from pgserver import PgServer  # noqa: E402
from service_proc import Server, reap_left_jobs  # noqa: E402

# Jobs wait behind one that holds the only GPU: what is measured is accepting them.
BODY = json.dumps({"command": ["sleep", "600"], "team": "bench", "gpus": 1}).encode()


async def _worker(port: int, n: int, counts: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = (
        b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY
    )
    for _ in range(n):
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
        if head.startswith(b"HTTP/1.1 201"):
            counts[0] += 1
    writer.close()


def submit_rate(port: int, total: int, connections: int = 16) -> float:
    counts = [0]

    async def run() -> None:
        await asyncio.gather(
            *(_worker(port, total // connections, counts) for _ in range(connections))
        )

    started = time.perf_counter()
    asyncio.run(run())
    wall = time.perf_counter() - started
    assert counts[0] == total // connections * connections, counts
    return counts[0] / wall


def batch_rate(url: str, batches: int = 10, size: int = 500) -> float:
    jobs = [{"command": ["sleep", "600"], "team": "bench", "gpus": 1}] * size
    with httpx.Client(timeout=60) as client:
        started = time.perf_counter()
        for _ in range(batches):
            r = client.post(f"{url}/v1/jobs/batch", json={"jobs": jobs})
            assert r.status_code == 201, r.text
        return batches * size / (time.perf_counter() - started)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def throughput(
    db: str | None, label: str, src: Path | None = None, quiet: bool = False
) -> dict[str, Any]:
    """Single and batch submission rates of one server (of this tree, or of `src`)."""
    env = None if src is None else {**os.environ, "PYTHONPATH": str(src)}
    with tempfile.TemporaryDirectory() as tmp:
        args = ["--fake-gpus", "1xA100-80GB", "--auth", "none"]
        if db:
            args += ["--db", db]
        server = Server(Path(tmp) / "state", *args, env=env).start()
        try:
            submit_rate(server.port, 320)  # warm up
            single = submit_rate(server.port, 4000)
            batch = batch_rate(server.url)
        finally:
            server.stop()
            reap_left_jobs()  # this server's own jobs only: others may be benchmarking
    if not quiet:
        print(f"{label}: {single:,.0f} jobs/s single requests, {batch:,.0f} jobs/s in batches")
    return {"single_jobs_per_s": round(single), "batch_jobs_per_s": round(batch)}


def _fresh_db(pg: PgServer, name: str) -> str:
    """A new empty database on the throwaway server, so each run starts from no jobs."""
    import psycopg

    base = pg.url.replace("+psycopg", "")
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return base.rsplit("/", 1)[0] + "/" + name


def compare(rev: str, rounds: int, databases: tuple[str, ...]) -> dict[str, Any]:
    """Single-request rates of REV's server and this tree's, alternating, fresh databases."""
    with tempfile.TemporaryDirectory() as tmp, PgServer() as pg:
        base = Path(tmp) / "baseline"
        out: dict[str, Any] = {"baseline": baseline_source(rev, base)[:12]}
        n = 0
        for db in databases:
            runs: dict[str, list[int]] = {"baseline": [], "this": []}
            for k in range(rounds):
                for who, src in (("baseline", base / "src"), ("this", ROOT / "src")):
                    n += 1
                    url = None if db == "sqlite" else _fresh_db(pg, f"bench_{n}")
                    rate = throughput(url, who, src, quiet=True)["single_jobs_per_s"]
                    runs[who].append(rate)
                    print(f"{db} round {k + 1} {who}: {rate:,} jobs/s single", flush=True)
            out[db] = {
                who: {"runs": r, "median": sorted(r)[len(r) // 2]} for who, r in runs.items()
            }
    return out


def running_jobs(n: int = 1000, window_s: float = 30.0) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(
            Path(tmp) / "state", "--fake-gpus", f"{n}xA100-80GB", "--auth", "none"
        ).start(timeout_s=60)
        try:
            jobs = [{"command": ["sleep", "600"], "team": "bench", "gpus": 1}] * 500
            with httpx.Client(timeout=120) as client:
                for _ in range(n // 500):
                    assert (
                        client.post(f"{server.url}/v1/jobs/batch", json={"jobs": jobs}).status_code
                        == 201
                    )
                deadline = time.monotonic() + 300
                while time.monotonic() < deadline:
                    running = client.get(f"{server.url}/v1/cluster").json()["queue"]["running"]
                    if running >= n:
                        break
                    time.sleep(1)
                assert running >= n, running
                time.sleep(5)  # let the launch burst settle
                assert server.proc is not None
                pid = server.proc.pid
                c0, t0 = cpu_s(pid), time.monotonic()
                time.sleep(window_s)
                c1, t1 = cpu_s(pid), time.monotonic()
                rss_mib = (
                    int(Path(f"/proc/{pid}/status").read_text().split("VmRSS:")[1].split()[0])
                    // 1024
                )
        finally:
            assert server.proc is not None
            server.proc.send_signal(signal.SIGINT)
            server.proc.wait(60)
            reap_left_jobs()
    share = (c1 - c0) / (t1 - t0)
    print(f"{n} running jobs: server CPU {100 * share:.2f}% of one core over {t1 - t0:.0f} s")
    return {
        "running": n,
        "cpu_pct_of_one_core": round(100 * share, 2),
        "window_s": round(t1 - t0),
        "server_rss_mib": rss_mib,
        "target_pct": 10,
    }


def submit_to_start(jobs: int = 30, gap_s: float = 0.3, tree: Path = ROOT) -> dict[str, Any]:
    """On an idle fleet, the time from sending POST /v1/jobs to the job's own process
    running: the job writes the clock (`date +%s.%N`, as the server's host sees it) as its
    first act. One job at a time, each on an idle GPU, `gap_s` apart. `tree`: the source
    tree whose `gpupool serve` is measured (its src/ first on the path)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONPATH=str(tree / "src"))
        server = Server(
            Path(tmp) / "state", "--fake-gpus", "8xA100-80GB", "--auth", "none", env=env
        )
        server.start()
        lags_ms: list[float] = []
        try:
            with httpx.Client(base_url=server.url, timeout=30) as client:
                for k in range(jobs):
                    mark = Path(tmp) / f"started-{k}"
                    body = {
                        "command": [
                            "sh",
                            "-c",
                            f"date +%s.%N > {mark}.tmp && mv {mark}.tmp {mark}",
                        ],
                        "team": "bench",
                        "gpus": 1,
                    }
                    sent = time.time()
                    r = client.post("/v1/jobs", json=body)
                    assert r.status_code == 201, r.text
                    deadline = time.monotonic() + 30
                    while not mark.exists() and time.monotonic() < deadline:
                        time.sleep(0.002)
                    assert mark.exists(), f"job {k} did not start within 30 s"
                    lags_ms.append(1000 * (float(mark.read_text()) - sent))
                    time.sleep(gap_s)
        finally:
            server.stop()
        reap_left_jobs()
    lags_ms.sort()
    p50 = lags_ms[len(lags_ms) // 2]
    p90 = lags_ms[int(len(lags_ms) * 0.9)]
    print(f"submit to process start, idle fleet: p50 {p50:.1f} ms, p90 {p90:.1f} ms")
    return {
        "jobs": jobs,
        "p50_ms": round(p50, 1),
        "p90_ms": round(p90, 1),
        "max_ms": round(lags_ms[-1], 1),
        "target_p50_ms": 50,
    }


def compare_submit_to_start(rev: str, rounds: int) -> dict[str, Any]:
    """This tree against a checkout of `rev`, a fresh server of each in alternation
    (baseline first), so that the load of a shared machine falls on both alike."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        commit = baseline_source(rev, base)
        runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "this": []}
        for _ in range(rounds):
            runs["baseline"].append(submit_to_start(tree=base))
            runs["this"].append(submit_to_start())

    def median_of(side: str, key: str) -> float:
        values = sorted(r[key] for r in runs[side])
        return values[len(values) // 2]

    summary = {
        side: {k: median_of(side, k) for k in ("p50_ms", "p90_ms", "max_ms")} for side in runs
    }
    print(f"baseline {rev} ({commit[:10]}): {summary['baseline']}; this tree: {summary['this']}")
    return {"rev": rev, "commit": commit, "rounds": rounds, "median_of_rounds": summary, **runs}


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--submit-to-start",
        action="store_true",
        help="measure only submit -> process start on an idle fleet (prints it, writes nothing)",
    )
    parser.add_argument(
        "--throughput-only",
        action="store_true",
        help="measure only the submission rates (writes only those into service.json)",
    )
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="with --throughput-only: also time REV's server, alternating, and write both "
        "to service.json's submit_rate_against_baseline block; with --submit-to-start: "
        "also measure a checkout of REV, in alternation with this tree, and write both to "
        "the submit_to_start block of service.json",
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternations for --baseline")
    parser.add_argument(
        "--databases",
        default="sqlite,postgresql",
        help="for --baseline: which of sqlite,postgresql to compare (default both)",
    )
    args = parser.parse_args()
    results: dict[str, Any] = {"machine": describe()}
    if args.submit_to_start and args.baseline:
        compared = compare_submit_to_start(args.baseline, args.rounds)
        out = ROOT / "bench" / "results" / "service.json"
        recorded = json.loads(out.read_text(encoding="utf-8"))
        recorded["submit_to_start"] = {
            "jobs": compared["this"][0]["jobs"],
            **compared["median_of_rounds"]["this"],
            "target_p50_ms": 50,
            "machine": describe(),
            "baseline": compared,
        }
        out.write_text(json.dumps(recorded, indent=2) + "\n", encoding="utf-8")
        print(json.dumps(recorded["submit_to_start"]["baseline"]["median_of_rounds"], indent=2))
        return 0
    if args.submit_to_start:
        print(json.dumps(submit_to_start(), indent=2))
        return 0
    if args.baseline:
        compared = compare(args.baseline, args.rounds, tuple(args.databases.split(",")))
        out = ROOT / "bench" / "results" / "service.json"
        recorded = json.loads(out.read_text(encoding="utf-8"))
        recorded["submit_rate_against_baseline"] = {"machine": describe(), **compared}
        out.write_text(json.dumps(recorded, indent=2) + "\n", encoding="utf-8")
        print(json.dumps(compared, indent=2))
        return 0
    out = ROOT / "bench" / "results" / "service.json"
    if args.throughput_only:
        results = {**json.loads(out.read_text(encoding="utf-8")), "machine": describe()}
    else:
        results["submit_to_start"] = submit_to_start()
    results["sqlite"] = throughput(None, "SQLite")
    with PgServer() as pg:
        results["postgresql"] = throughput(pg.url.replace("+psycopg", ""), "PostgreSQL")
    if not args.throughput_only:
        results["running_1000"] = running_jobs()
    results["targets"] = {
        "sqlite_jobs_per_s": 2000,
        "postgresql_jobs_per_s": 1000,
        "submit_to_start_p50_ms": 50,
        "cpu_pct_of_one_core": 10,
    }
    out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(results, indent=2))
    ok = (
        results["sqlite"]["single_jobs_per_s"] >= 2000
        and results["postgresql"]["single_jobs_per_s"] >= 1000
        and results["running_1000"]["cpu_pct_of_one_core"] < 10
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""One scheduling cycle of the live scheduler core on a busy cluster, at nine scales.

Every GPU is busy with running jobs and jobs wait (1-8 GPUs, four teams with guarantees,
a few online jobs): the steady state of a busy cluster. Each timed cycle follows a change
(a running job ends), so the policy really plans: it looks at the queue, starts what fits
in the freed GPUs and considers reclaiming. The grid is 1,000 / 10,000 / 100,000 GPUs
(8 per node) by 1,000 / 10,000 / 100,000 pending jobs, plus the 8,000-GPU, 10,000-job
point. Targets: <= 100 ms at 100,000 x 100,000 and <= 10 ms at 8,000 x 10,000 (median
of 10 cycles). Writes bench/results/cycle.json and cycle.md.

`--gpus N --pending M` runs one point only (and writes nothing). `--baseline REV` also
times the target points and 100,000 x 1,000 from a checkout of REV, each point in a
fresh process, in alternation with this tree (two rounds), and records both.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from gpupool.domain.lifecycle import JobState
from gpupool.domain.model import Cluster, JobKind, JobSpec, Node
from gpupool.domain.quota import TeamQuota
from gpupool.scheduler import Scheduler, SchedulerConfig
from machine import describe

ROOT = Path(__file__).resolve().parents[1]
GPUS = 8
GRID_GPUS = (1_000, 10_000, 100_000)
GRID_PENDING = (1_000, 10_000, 100_000)
TARGETS_MS = {(100_000, 100_000): 100.0, (8_000, 10_000): 10.0}
CYCLES = 10
COMPARED = ((8_000, 10_000), (100_000, 1_000), (100_000, 100_000))


def build(node_count: int, pending: int) -> Scheduler:
    """A cluster of `node_count` x 8 GPUs, every GPU running a job, `pending` jobs waiting;
    the four teams' guarantees together are 3/4 of the fleet."""
    teams = tuple(TeamQuota(f"t{k}", {"H100": node_count * GPUS * 3 // 16}, {}) for k in range(4))
    nodes = tuple(Node(f"n{i:06d}", "H100", GPUS, 1 << 20, 1 << 30) for i in range(node_count))
    config = SchedulerConfig(teams=teams, cycle_s=1.0, online_reserve=0.0)
    s = Scheduler(Cluster("bench", nodes), config)
    rng = np.random.default_rng(1)
    # fill every GPU with running jobs
    k = 0
    while int(s.state.whole_free.sum()) > 0:
        job = JobSpec(
            f"r{k}", gpu_count=int(rng.choice([1, 2, 4, 8])), team=f"t{k % 4}", duration_s=3600.0
        )
        s.submit(job, 0.0)
        if k % 512 == 511 or int(s.state.whole_free.sum()) <= 8:
            s.cycle(0.0)
        k += 1
    s.cycle(0.0)
    for job_id in [j for j, r in s.records.items() if r.state is not JobState.RUNNING]:
        s.finished(job_id, 0.0, JobState.CANCELLED)  # those that did not fit: not benched
    for i in range(pending):
        kind = JobKind.ONLINE if i % 500 == 0 else JobKind.TRAINING
        job = JobSpec(
            f"p{i}",
            gpu_count=int(rng.choice([1, 2, 4, 8], p=[0.4, 0.3, 0.2, 0.1])),
            team=f"t{i % 4}",
            kind=kind,
            priority=int(rng.integers(0, 3)),
            duration_s=float(rng.uniform(600, 36_000)),
            submit_s=1.0,
        )
        s.submit(job, 1.0)
    return s


def measure(gpus: int, pending: int) -> dict[str, object]:
    node_count = gpus // GPUS
    started = time.perf_counter()
    s = build(node_count, pending)
    setup = time.perf_counter() - started
    gc.collect()  # time the cycles, not a full collection of the set-up's garbage
    times = []
    running = [j for j, t in s.records.items() if t.state is JobState.RUNNING]
    for c in range(CYCLES):
        # something changed: a running job ends, so the cycle really plans
        s.finished(running[c], 10.0 + c, JobState.FINISHED)
        t0 = time.perf_counter()
        decisions = s.cycle(10.0 + c)
        times.append(time.perf_counter() - t0)
        assert s.waiting() > pending * 0.9, len(decisions)
    return {
        "gpus": gpus,
        "nodes": node_count,
        "pending": pending,
        "running": sum(1 for t in s.records.values() if t.state is JobState.RUNNING),
        "cycle_ms_median": round(1000 * statistics.median(times), 2),
        "cycle_ms_max": round(1000 * max(times), 2),
        "target_ms": TARGETS_MS.get((gpus, pending)),
        "setup_s": round(setup, 1),
    }


def table(points: list[dict[str, object]]) -> str:
    lines = [
        "| GPUs \\ pending | " + " | ".join(f"{p:,}" for p in GRID_PENDING) + " |",
        "|---|" + "---|" * len(GRID_PENDING),
    ]
    by = {(p["gpus"], p["pending"]): p for p in points}
    for g in GRID_GPUS:
        cells = [f"{by[(g, p)]['cycle_ms_median']} ms" for p in GRID_PENDING]
        lines.append(f"| {g:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def point_in_process(tree: Path, gpus: int, pending: int) -> float:
    """The median cycle of one point, measured by `tree`'s bench in a fresh process."""
    env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{tree / 'bench'}"}
    out = subprocess.run(
        [
            sys.executable,
            str(tree / "bench" / "bench_cycle.py"),
            "--gpus",
            str(gpus),
            "--pending",
            str(pending),
        ],
        env=env,
        cwd=tree / "bench",
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(json.loads(out)["cycle_ms_median"])


def compare(rev: str, rounds: int = 2) -> dict[str, object]:
    """This tree against a checkout of `rev`, point by point in alternation."""
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", rev], check=True, capture_output=True, text=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base), commit],
            check=True,
        )
        try:
            rows = []
            for gpus, pending in COMPARED:
                old, new = [], []
                for _ in range(rounds):
                    old.append(point_in_process(base, gpus, pending))
                    new.append(point_in_process(ROOT, gpus, pending))
                row = {"gpus": gpus, "pending": pending, "baseline_ms": old, "this_ms": new}
                print(json.dumps(row), flush=True)
                rows.append(row)
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False
            )
    return {"rev": rev, "commit": commit, "rounds": rounds, "points": rows}


def baseline_table(compared: dict[str, object]) -> str:
    rows = compared["points"]
    assert isinstance(rows, list)
    lines = [
        f"\n## Against {compared['rev']} ({str(compared['commit'])[:10]}), same machine, "
        "alternating, each a fresh process\n",
        "| GPUs x pending | baseline ms | this tree ms |",
        "|---|---|---|",
    ]
    for r in rows:
        old = " / ".join(f"{v:g}" for v in r["baseline_ms"])
        new = " / ".join(f"{v:g}" for v in r["this_ms"])
        lines.append(f"| {r['gpus']:,} x {r['pending']:,} | {old} | {new} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gpus", type=int, help="one point: this many GPUs (8 per node)")
    ap.add_argument("--pending", type=int, help="one point: this many pending jobs")
    ap.add_argument("--baseline", metavar="REV", help="also time the chief points from REV")
    args = ap.parse_args()
    if args.gpus or args.pending:
        print(json.dumps(measure(args.gpus or 8_000, args.pending or 10_000), indent=2))
        return 0
    points = []
    for gpus, pending in [(g, p) for g in GRID_GPUS for p in GRID_PENDING] + [(8_000, 10_000)]:
        point = measure(gpus, pending)
        print(json.dumps(point), flush=True)
        points.append(point)
    met = all(
        float(str(p["cycle_ms_median"])) <= float(str(p["target_ms"]))
        for p in points
        if p["target_ms"] is not None
    )
    result: dict[str, object] = {
        "machine": describe(),
        "cycles": CYCLES,
        "meets_targets": met,
        "points": points,
    }
    compared = compare(args.baseline) if args.baseline else None
    if compared is not None:
        result["baseline"] = compared
    out = ROOT / "bench" / "results" / "cycle.json"
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    md = out.with_suffix(".md")
    md.write_text(
        "# One scheduling cycle, median of 10 (bench/bench_cycle.py)\n\n"
        + table(points)
        + f"\n\n8,000 GPUs x 10,000 pending: {points[-1]['cycle_ms_median']} ms. "
        + "Machine: "
        + ", ".join(f"{k} {v}" for k, v in describe().items())
        + "\n"
        + (baseline_table(compared) if compared is not None else ""),
        encoding="utf-8",
    )
    print(md.read_text(encoding="utf-8"))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())

"""How long learned replays take, this tree against another commit, in the same run.

Replays a fixed set of learned-queue runs on ITP 2021 clusters (the base loads of
bench/results/learned.json and a few variants: wrong predictors, the Gittins rule, the
older `remaining` order, weights below 1) with the code of this working tree and with the
code of `--against` (checked out in a temporary git worktree), alternating so both see
the same machine load. A speed change must not change a decision: each run's decision log
is hashed, and the script exits 1 when a hash differs. Writes
bench/results/learned-speed.md and .json.

    .venv/bin/python bench/bench_learned_speed.py --against 1d63704
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parents[1]
TASKS: tuple[tuple[str, int, dict[str, Any]], ...] = (
    ("cluster02", 12, {}),
    ("cluster03", 21, {}),
    ("cluster04", 82, {}),
    ("cluster06", 14, {}),
    ("cluster07", 43, {}),
    ("cluster08", 11, {}),
    ("cluster09", 5, {}),
    ("cluster09", 5, {"predictor": "shuffled", "guarded": False}),
    ("cluster03", 17, {"predictor": "inverted"}),
    ("cluster06", 14, {"rule": "gittins"}),
    ("cluster03", 21, {"model_order": "remaining", "weight": 0.75, "max_spread": 16.0}),
    ("cluster02", 16, {"weight": 0.5}),
)


def replay_one(index: int) -> dict[str, Any]:
    """One task with whichever gpupool is first on the path (run in a child process)."""
    from bench_learned import GPUS_PER_NODE, cluster_jobs, origin_s
    from gpupool.learning.config import LearningConfig
    from gpupool.sim.replay.run import run_replay

    cluster, nodes, options = TASKS[index]
    jobs = cluster_jobs(cluster)
    started = time.perf_counter()
    r = run_replay(
        jobs,
        nodes,
        GPUS_PER_NODE,
        "learned",
        "consolidate",
        0,
        cluster,
        learning=LearningConfig(**options),
        origin_s=origin_s(),
    )
    wall_s = time.perf_counter() - started
    return {
        "mean_jct_h": r.metrics.avg_jct_s / 3600,
        "preemptions": r.metrics.preemptions,
        "decisions_sha256": hashlib.sha256(repr(r.log.decisions).encode()).hexdigest(),
        "wall_s": wall_s,
    }


def run_child(src: Path, index: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(src), PYTHONHASHSEED="0")
    code = (
        f"import sys, json; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        f"import bench_learned_speed as b; print(json.dumps(b.replay_one({index})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"replay {TASKS[index]} failed under {src}:\n{out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def label(task: tuple[str, int, dict[str, Any]]) -> str:
    cluster, nodes, options = task
    extra = ", ".join(f"{k}={v}" for k, v in options.items()) or "default"
    return f"{cluster} x{nodes} ({extra})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True, help="the commit to compare with (a git ref)")
    ap.add_argument("--tasks", type=int, default=len(TASKS), help="only the first N tasks")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from machine import describe

    commit = subprocess.run(
        ["git", "rev-parse", "--short", args.against],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpupool-against-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(tree), commit],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        try:
            for i, task in enumerate(TASKS[: args.tasks]):
                before = run_child(tree / "src", i)
                after = run_child(ROOT / "src", i)
                same = before["decisions_sha256"] == after["decisions_sha256"]
                rows.append({"task": label(task), "before": before, "after": after, "same": same})
                print(
                    f"[{i + 1}/{args.tasks}] {label(task)}: {before['wall_s']:.1f} s -> "
                    f"{after['wall_s']:.1f} s, decisions {'the same' if same else 'DIFFER'}",
                    flush=True,
                )
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False
            )
    total_before = sum(r["before"]["wall_s"] for r in rows)
    total_after = sum(r["after"]["wall_s"] for r in rows)
    record = {
        "benchmark": "learned-speed",
        "against": commit,
        "command": f"python bench/bench_learned_speed.py --against {args.against}",
        "machine": describe(),
        "rows": rows,
        "total_before_s": total_before,
        "total_after_s": total_after,
        "all_same": all(r["same"] for r in rows),
        "run_s": time.perf_counter() - started,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "learned-speed.json").write_text(json.dumps(record, indent=1) + "\n")
    machine = ", ".join(f"{k} {v}" for k, v in record["machine"].items())
    lines = [
        "# Learned replays: wall time against an earlier commit",
        "",
        f"Command: `{record['command']}` (one replay at a time, the two versions alternating).",
        "",
        f"Machine: {machine}",
        "",
        f"Before: commit {commit}. After: this tree. A row's decisions are the same when the "
        "SHA-256 of its decision log is.",
        "",
        "| replay | before s | after s | speed-up | decisions | mean JCT h |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        b, a = r["before"], r["after"]
        lines.append(
            f"| {r['task']} | {b['wall_s']:.1f} | {a['wall_s']:.1f} | "
            f"{b['wall_s'] / a['wall_s']:.2f}x | {'same' if r['same'] else 'DIFFER'} | "
            f"{a['mean_jct_h']:.2f} |"
        )
    lines += [
        f"| all | {total_before:.1f} | {total_after:.1f} | {total_before / total_after:.2f}x | "
        f"{'same' if record['all_same'] else 'DIFFER'} | |",
        "",
        f"Run time {record['run_s'] / 60:.1f} min.",
        "",
    ]
    (RESULTS / "learned-speed.md").write_text("\n".join(lines))
    print(
        f"total {total_before:.1f} s -> {total_after:.1f} s; wrote {RESULTS / 'learned-speed.md'}"
    )
    return 0 if record["all_same"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""The learned queue on each rule it can mix with: 2D-LAS and 2D-Gittins.

A side table to bench_learned.py: at the base load it found (bench/results/learned.json),
each in-band ITP 2021 cluster under las, gittins, learned mixing with las, and learned
mixing with gittins (the LightGBM predictor, guarded). Writes
bench/results/learned-rules.md and .json.

    python bench/bench_learned_rules.py [--clusters cluster02,cluster03]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import time
from pathlib import Path
from typing import Any

from bench_learned import GPUS_PER_NODE, cluster_jobs, origin_s
from gpupool.learning.config import LearningConfig
from gpupool.sim.replay.run import run_replay

RESULTS = Path(__file__).parent / "results"
VARIANTS = (
    ("las", "las", "las"),
    ("gittins", "gittins", "gittins"),
    ("learned (rule las)", "learned", "las"),
    ("learned (rule gittins)", "learned", "gittins"),
)


def run_one(task: tuple[str, int, str]) -> dict[str, Any]:
    cluster, nodes, label = task
    _, queue, rule = next(v for v in VARIANTS if v[0] == label)
    started = time.perf_counter()
    r = run_replay(
        cluster_jobs(cluster),
        nodes,
        GPUS_PER_NODE,
        queue,
        "consolidate",
        0,
        cluster,
        learning=LearningConfig(rule=rule),
        origin_s=origin_s(),
    )
    m = r.metrics
    return {
        "cluster": cluster,
        "nodes": nodes,
        "variant": label,
        "mean_jct_h": m.avg_jct_s / 3600,
        "p99_jct_h": m.p99_jct_s / 3600,
        "mean_queue_h": m.avg_queue_s / 3600,
        "preemptions": m.preemptions,
        "trusted_days": r.trusted_s / 86_400,
        "wall_s": time.perf_counter() - started,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clusters", default="", help="comma-separated; default: the in-band ones")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    base = json.loads((RESULTS / "learned.json").read_text())
    nodes = {s["cluster"]: s["nodes"] for s in base["search"] if s["in_band"]}
    clusters = [c for c in args.clusters.split(",") if c] or sorted(nodes)
    tasks = [(c, nodes[c], v[0]) for c in clusters for v in VARIANTS]
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with multiprocessing.Pool(args.workers) as pool:
        for k, row in enumerate(pool.imap_unordered(run_one, tasks), 1):
            rows.append(row)
            print(
                f"[{k}/{len(tasks)}] {row['cluster']} {row['variant']}: "
                f"{row['mean_jct_h']:.2f} h ({row['wall_s']:.0f} s)",
                flush=True,
            )
    rows.sort(key=lambda r: (r["cluster"], [v[0] for v in VARIANTS].index(r["variant"])))
    cpu = platform.processor() or platform.machine()
    machine = f"{cpu}, {multiprocessing.cpu_count()} cores, python {platform.python_version()}"
    out = {"machine": machine, "total_s": time.perf_counter() - started, "rows": rows}
    (RESULTS / "learned-rules.json").write_text(json.dumps(out, indent=1) + "\n")
    lines = [
        "# The learned queue on each rule: 2D-LAS and 2D-Gittins (ITP 2021, base load)",
        "",
        "Command: `python bench/bench_learned_rules.py` (node counts from bench/results/"
        "learned.json; LightGBM predictor, guarded; free preemption as in learned.md).",
        f"Machine: {machine}. Run time {out['total_s'] / 60:.1f} min.",
        "",
        "| cluster | nodes | queue | mean JCT h | p99 JCT h | mean queue h | preemptions |"
        " model trusted (days) | vs las |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    las = {r["cluster"]: r["mean_jct_h"] for r in rows if r["variant"] == "las"}
    for r in rows:
        rel = r["mean_jct_h"] / las[r["cluster"]] - 1 if r["cluster"] in las else float("nan")
        lines.append(
            f"| {r['cluster']} | {r['nodes']} | {r['variant']} | {r['mean_jct_h']:.2f} | "
            f"{r['p99_jct_h']:.2f} | {r['mean_queue_h']:.2f} | {r['preemptions']} | "
            f"{r['trusted_days']:.1f} | {rel:+.1%} |"
        )
    (RESULTS / "learned-rules.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

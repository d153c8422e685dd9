"""Reservations of specific GPUs with backfill (`reservations: true`) against today's
default (one EASY reservation per pool, counted in GPUs), on shipped scenarios.

For each scenario and policy, both settings: per width (GPUs per job), how many of the
jobs submitted in the first 72 h started by the horizon, as a share of the team's jobs
overall (the starvation measure: at least 0.5 for every width); the longest wait of any
job (`max_wait_s`, a job never started waiting until the horizon); utilisation, jobs
finished and the mean JCT of the finished. Writes bench/results/reservations.{json,md}.

    .venv/bin/python bench/bench_reservations.py [--only daynight-off]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpupool.sim.scenario.config import load_scenario
from gpupool.sim.scenario.runner import run_scenario
from machine import describe

ROOT = Path(__file__).resolve().parents[1]
RUNS = (
    ("daynight-off", "priority-quota"),
    ("daynight-off", "backfill"),
    ("daynight-on", "priority-quota"),
    ("itp-cluster02", "backfill"),
    ("itp-cluster02", "priority-quota"),
)
EARLY_S = 72 * 3600.0


def one(item: tuple[str, str, bool]) -> dict[str, Any]:
    name, policy, on = item
    cfg = load_scenario(ROOT / "scenarios" / f"{name}.yaml")
    cfg = replace(cfg, scheduling=replace(cfg.scheduling, policy=policy, reservations=on))
    t0 = time.perf_counter()
    result = run_scenario(cfg)
    s = result.summary
    early = [r for r in result.jobs if r["kind"] != "online-inference" and r["submit_s"] < EARLY_S]
    counts: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for r in early:
        counts[r["gpus"]][0] += 1
        counts[r["gpus"]][1] += r["start_s"] is not None
    overall = sum(c[1] for c in counts.values()) / max(1, len(early))
    return {
        "scenario": name,
        "policy": policy,
        "reservations": on,
        "early_jobs": len(early),
        "early_started_share": round(overall, 3),
        "early_by_width": {
            str(n): {
                "jobs": c[0],
                "started": c[1],
                "vs_overall": round(c[1] / c[0] / overall, 2) if c[0] and overall else None,
            }
            for n, c in sorted(counts.items())
        },
        "max_wait_h": round(s["max_wait_s"] / 3600, 1) if s["max_wait_s"] is not None else None,
        "utilization": s["gpu_hours_utilization"],
        "jobs_finished": s["jobs_finished"],
        "avg_jct_h": round(s["avg_jct_s"] / 3600, 2) if s.get("avg_jct_s") else None,
        "preemptions": s["preemptions"],
        "online_slo_attainment": s["online_slo_attainment"],
        "guarantee_violation_s": s["guarantee_violation_s"],
        "run_s": round(time.perf_counter() - t0, 1),
    }


def markdown(rows: list[dict[str, Any]], machine: dict[str, object]) -> str:
    lines = [
        "# Reservations with backfill: `reservations: true` against the default",
        "",
        "`bench/bench_reservations.py`. Early jobs: submitted in the first 72 h; per width,",
        "the share of them that started by the horizon over the share of all early jobs",
        "(at least 0.5 for every width: no width starves). Mean JCT is over the jobs that",
        "finished, which differ between the settings (wide jobs finish only with",
        "reservations), so it is no like-for-like measure of speed.",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores, Python {machine['python']}.",
        "",
        "| scenario | policy | reservations | started / early jobs | widths: started (x overall) "
        "| max wait h | util | finished | mean JCT h | SLO | below guar. s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        widths = ", ".join(
            f"{w}: {v['started']}/{v['jobs']} ({v['vs_overall']})"
            for w, v in r["early_by_width"].items()
        )
        lines.append(
            f"| {r['scenario']} | {r['policy']} | {'on' if r['reservations'] else 'off'} "
            f"| {round(r['early_started_share'] * r['early_jobs'])}/{r['early_jobs']} "
            f"| {widths} | {r['max_wait_h']} | {r['utilization']} | {r['jobs_finished']} "
            f"| {r['avg_jct_h']} | {r['online_slo_attainment']} | {r['guarantee_violation_s']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="", help="comma-separated scenario names")
    args = p.parse_args()
    only = {x for x in args.only.split(",") if x}
    items = [(n, pol, on) for n, pol in RUNS if not only or n in only for on in (False, True)]
    with ProcessPoolExecutor(max_workers=2) as pool:
        rows = list(pool.map(one, items))
    machine = describe()
    out = ROOT / "bench" / "results"
    (out / "reservations.json").write_text(
        json.dumps({"machine": machine, "runs": rows}, indent=1) + "\n", encoding="utf-8"
    )
    (out / "reservations.md").write_text(markdown(rows, machine), encoding="utf-8")
    print(markdown(rows, machine))
    return 0


if __name__ == "__main__":
    sys.exit(main())

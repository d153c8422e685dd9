"""The scenarios: islands vs pool, day/night windows, real ITP arrivals by policy.

Runs every scenario under scenarios/ (ITP ones under fifo, backfill and priority-quota),
two at a time, and writes bench/results/scenarios.json and scenarios.md.

`--only ROW,ROW` reruns those rows (e.g. `islands-pool,itp-cluster08/priority-quota`) and
keeps the other rows as recorded (the simulation is deterministic: a row whose decisions
a change cannot touch keeps its figures); the report says which rows were rerun.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from gpupool.sim.scenario.config import load_scenario
from gpupool.sim.scenario.runner import run_scenario
from machine import describe

ROOT = Path(__file__).resolve().parents[1]
RUNS = (
    [
        ("islands-static.yaml", None),
        ("islands-pool.yaml", None),
        ("daynight-off.yaml", None),
        ("daynight-on.yaml", None),
    ]
    + [
        (f"itp-{c}.yaml", p)
        for c in ("cluster02", "cluster08", "cluster09")
        for p in ("fifo", "backfill", "priority-quota")
    ]
    + [
        # no guarantees: online inference preempts training of any team (priority preemption)
        ("itp-cluster02-open.yaml", None),
    ]
    + [
        # elastic offline work lends GPUs to a diurnal service (resizing on, then off)
        ("serving-borrow.yaml", None),
        ("serving-borrow-off.yaml", None),
    ]
)


def one(item: tuple[str, str | None]) -> dict[str, object]:
    name, policy = item
    cfg = load_scenario(ROOT / "scenarios" / name)
    if policy is not None:
        cfg = replace(
            cfg, scheduling=replace(cfg.scheduling, policy=policy), name=f"{cfg.name}/{policy}"
        )
    result = run_scenario(cfg)
    return result.summary


def pct(x: object) -> str:
    return "-" if x is None else f"{100 * float(x):.2f}"  # type: ignore[arg-type]


def hours(seconds: object) -> str:
    return "-" if seconds is None else f"{float(seconds) / 3600:.2f}"  # type: ignore[arg-type]


def per_finished(r: dict[str, object]) -> str:
    """Training GPU-hours per finished training job: what a finished job cost, so that more
    GPU-hours are not read as more work done."""
    k = r["kinds"].get("training")  # type: ignore[attr-defined]
    if not k or not k["finished"]:
        return "-"
    return f"{k['gpu_hours'] / k['finished']:.1f}"


def wide(r: dict[str, object], key: str) -> int:
    """A by_gpus count summed over jobs of 4 or more GPUs."""
    widths = r["by_gpus"].items()  # type: ignore[attr-defined]
    return sum(int(w[key]) for g, w in widths if g != "share" and int(g) >= 4)


def daynight_section(by: dict[str, dict[str, object]]) -> list[str]:
    """Day/night: which training jobs the GPU-hours went to, by GPU count."""
    rows = [by[n] for n in ("daynight-off", "daynight-on") if n in by and "by_gpus" in by[n]]
    if not rows:
        return []
    out = ["", "## daynight: which training jobs the GPU-hours went to", ""]
    if len(rows) == 2:
        off, on = rows
        ratio = float(on["training_gpu_hours"]) / float(off["training_gpu_hours"])  # type: ignore[arg-type]
        gain = 100 * (ratio - 1)
        out += [
            f"daynight-on gives training {gain:+.1f}% GPU-hours ({on['training_gpu_hours']:,} "
            f"against {off['training_gpu_hours']:,}) and finishes {on['jobs_finished']} jobs "
            f"against {off['jobs_finished']} (mean JCT {hours(on['avg_jct_s'])} h against "
            f"{hours(off['avg_jct_s'])} h): {per_finished(on)} training GPU-h per "
            f"finished job against {per_finished(off)}, and it ends the horizon with "
            f"{on['unfinished_gpu_hours']:,} GPU-h in "
            f"{on['unfinished_started_jobs']} started, unfinished jobs; preemption lost "
            f"{on['lost_work_gpu_hours']} GPU-h. Jobs of 4 or more GPUs started: "
            f"{wide(off, 'started')} of {wide(off, 'jobs')} in daynight-off, "
            f"{wide(on, 'started')} of {wide(on, 'jobs')} in daynight-on.",
            "",
        ]
    out += [
        "| scenario | GPUs per job | jobs | started | finished | GPU-h | mean JCT h | "
        "oldest never started waited h |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for width, w in r["by_gpus"].items():  # type: ignore[attr-defined]
            out.append(
                f"| {r['scenario']} | {width} | {w['jobs']} | {w['started']} | "
                f"{w['finished']} | {w['gpu_hours']:,} | {w['avg_jct_h'] or '-'} | "
                f"{w['oldest_never_started_wait_h'] or '-'} |"
            )
    out += [
        "",
        "| scenario | GPU-h in finished jobs | GPU-h in unfinished jobs | started, unfinished | "
        "preemptions | lost work GPU-h |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['scenario']} | {r['finished_gpu_hours']:,} | {r['unfinished_gpu_hours']:,} | "
            f"{r['unfinished_started_jobs']} | {r['preemptions']} | {r['lost_work_gpu_hours']} |"
        )
    return out


def row_name(item: tuple[str, str | None]) -> str:
    stem = item[0].removesuffix(".yaml")
    return stem if item[1] is None else f"{stem}/{item[1]}"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--only",
        help="comma-separated rows to run again (the others are kept from the record): "
        + ", ".join(row_name(i) for i in RUNS),
    )
    args = ap.parse_args(argv)
    only: set[str] | None = None
    if args.only:
        only = set(args.only.split(","))
        unknown = only - {row_name(i) for i in RUNS}
        if unknown:
            ap.error(f"unknown rows {sorted(unknown)}; rows: {[row_name(i) for i in RUNS]}")
    out = Path(__file__).parent / "results"
    runs = [i for i in RUNS if only is None or row_name(i) in only]
    started = time.perf_counter()
    with ProcessPoolExecutor(2) as pool:
        fresh = {row_name(i): r for i, r in zip(runs, pool.map(one, runs), strict=True)}
    wall = time.perf_counter() - started
    if only is None:
        results = [fresh[row_name(i)] for i in RUNS]
        how = f"{len(results)} runs in {wall:.0f} s"
    else:
        old = json.loads((out / "scenarios.json").read_text(encoding="utf-8"))
        kept = {r["scenario"]: r for r in old["scenarios"]}
        results = [fresh.get(row_name(i)) or kept[row_name(i)] for i in RUNS]
        how = (
            f"{len(runs)} of {len(RUNS)} runs rerun in {wall:.0f} s ({', '.join(sorted(fresh))}; "
            "the others as recorded before)"
        )
    by = {r["scenario"]: r for r in results}
    lines = [
        "# Scenario results (issue 3)",
        "",
        f"{how} on {describe()['cpu']} "
        f"({describe()['cores']} cores). Reproduce: `make bench` or "
        "`gpupool simulate scenario scenarios/FILE.yaml`.",
        "",
        "| scenario | GPU-hours used % | online SLO % | training GPU-h | finished / submitted | "
        "mean JCT h | training GPU-h per finished training job | preemptions | "
        "below guarantee s | lost |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['scenario']} | {pct(r['gpu_hours_utilization'])} | "
            f"{pct(r['online_slo_attainment'])} | {r['training_gpu_hours']:,} | "
            f"{r['jobs_finished']} / {r['jobs_submitted']} | {hours(r['avg_jct_s'])} | "
            f"{per_finished(r)} | {r['preemptions']} | {r['guarantee_violation_s']} | "
            f"{r['jobs_lost']} |"
        )
    lines += daynight_section(by)
    for name in ("islands-static", "islands-pool"):
        r = by[name]
        lines += [
            "",
            f"## {name}: per team",
            "",
            "| team | GPU-h | util % | jobs | done | avg JCT h | p99 JCT h | avg queue h | "
            "SLO % | preempt | lost GPU-h | below guar. s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for team, t in r["teams"].items():  # type: ignore[attr-defined]
            lines.append(
                f"| {team} | {t['gpu_hours']:,} | {pct(t['utilization'])} | {t['jobs']} | "
                f"{t['finished']} | {t['avg_jct_h']} | {t['p99_jct_h']} | {t['avg_queue_h']} | "
                f"{pct(t['online_slo_attainment'])} | {t['preemptions']} | "
                f"{t['lost_work_gpu_h']} | {t['guarantee_violation_s']} |"
            )
    lines += [
        "",
        "## Real ITP arrivals: JCT by kind and policy",
        "",
        "| scenario | kind | jobs | done | avg JCT h | p99 JCT h | avg queue h |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if not str(r["scenario"]).startswith("itp-"):
            continue
        for kind, k in r["kinds"].items():  # type: ignore[attr-defined]
            lines.append(
                f"| {r['scenario']} | {kind} | {k['jobs']} | {k['finished']} | "
                f"{k['avg_jct_h']} | {k['p99_jct_h']} | {k['avg_queue_h']} |"
            )
    lines += [
        "",
        "## Borrowing: elastic offline work next to a diurnal service",
        "",
        "| scenario | resizing | resizes | online SLO % | preemptions | lost work GPU-h | "
        "offline GPU-h lost to borrowing (lent + restarts) | offline GPU-h | "
        "finished / submitted |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        b = r.get("borrowing")
        if not isinstance(b, dict):
            continue
        off = r["kinds"]["offline-inference"]  # type: ignore[index]
        lines.append(
            f"| {r['scenario']} | {'on' if b['resize_enabled'] else 'off'} | {b['resizes']} | "
            f"{pct(r['online_slo_attainment'])} | {r['preemptions']} | "
            f"{r['lost_work_gpu_hours']} | {b['offline_gpu_hours_lost_to_borrowing']} "
            f"({b['lent_gpu_hours']} + {b['restart_gpu_hours']}) | {off['gpu_hours']} | "
            f"{r['jobs_finished']} / {r['jobs_submitted']} |"
        )
    (out / "scenarios.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    payload = {"wall_s": round(wall, 1), "machine": describe(), "scenarios": results}
    (out / "scenarios.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

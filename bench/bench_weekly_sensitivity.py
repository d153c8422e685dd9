"""How far a rule's own weekly mean JCT moves when one job moves: the yardstick for the
weekly acceptance line of the learned order (learned <= 1.05 x max(R, SRTF) in at least 95%
of the weeks).

A replay of a heavy-tailed trace is chaotic week by week: a job submitted a minute later
starts, preempts and finishes others at other times, and the difference grows. This
replays the rule R (2D-Gittins by default) on one cell twice: as it is, and with one job
submitted `--shift-s` later (the first job after each `--days` day), and judges the
perturbed R against R with the weekly line's own rules (weeks by submit, from week 2 on,
at least 50 jobs; SRTF from the same record in the max). Any order that differs from R at
all, the learned one included, meets R's weeks through this chaos.

    GPUPOOL_TRACES=../shared/traces .venv/bin/python bench/bench_weekly_sensitivity.py \
        --traces pollux --days 22,40

The unperturbed rows (R and SRTF at the load, and the node count) come from the record
bench_learned.py wrote (learned-order-pollux.json or learned-order.json); the perturbed
replays run here. Writes bench/results/learned-weekly-sensitivity.md and .json (at
--load "+25% load": learned-weekly-sensitivity-load125.*; "-25% load": -load75; an ITP
cluster's name comes first: learned-weekly-sensitivity-cluster02-load125.*).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import bench_learned as bl
from learned_acceptance import COLD_WEEKS, MIN_WEEK_JOBS, SRTF, judged_weeks
from machine import describe

RESULTS = Path(__file__).parent / "results"
STEM_SUFFIX = {"base": "", "+25% load": "-load125", "-25% load": "-load75"}
"""The record of each load: learned-weekly-sensitivity.md at base load."""
BOUND = 1.05


def perturbed_jobs(cluster: str, day: float, shift_s: float) -> tuple[list[Any], str]:
    """The cell's jobs with the first one submitted on or after `day` moved `shift_s` later."""
    jobs = list(bl.cluster_jobs(cluster))
    t0 = min(j.submit_s for j in jobs)
    k = next(i for i, j in enumerate(jobs) if j.submit_s - t0 >= day * 86_400.0)
    moved = jobs[k]
    jobs[k] = replace(moved, submit_s=moved.submit_s + shift_s)
    jobs.sort(key=lambda j: (j.submit_s, j.job_id))
    return jobs, moved.job_id


def weekly_line(row: dict[str, Any], r: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    """The weekly acceptance line of `row` against R and SRTF, as learned_acceptance has it."""
    weeks = [
        {"week": w.week, "jobs": w.jobs, "mean_jct_h": w.mean_jct_h, "ratio": w.ratio}
        for w in judged_weeks(row, r, s)
    ]
    within = sum(w["ratio"] <= BOUND for w in weeks)
    return {
        "weeks": weeks,
        "within": within,
        "judged": len(weeks),
        "worst": max((w["ratio"] for w in weeks), default=0.0),
        "low": min((w["ratio"] for w in weeks), default=0.0),
    }


def render(data: dict[str, Any]) -> str:
    lines = [
        "# How far a rule's own weeks move when one job moves",
        "",
        f"Cell: {data['cell']} at {data['nodes']} nodes ({data.get('load', 'base')}), rule R = "
        f"{data['rule']}. "
        f"Each perturbed replay is R with one job submitted {data['shift_s']:g} s later; it is "
        "judged against R's own record with the weekly acceptance line (weeks by submit, "
        f"week {COLD_WEEKS} on, >= {MIN_WEEK_JOBS} jobs, ratio to max(R, SRTF) <= {BOUND}).",
        "",
        f"Command: `{data['command']}`",
        "",
        f"Machine: {', '.join(f'{k} {v}' for k, v in data['machine'].items())}",
        "",
        "| job moved | on day | whole trace / R | weeks within 1.05 | lowest week | highest week |",
        "|---|---:|---:|---:|---:|---:|",
        f"| none (the control) | - | {data['control']['whole_ratio']:.6f} | every week "
        f"{'identical' if data['control']['weeks_identical'] else 'NOT identical'} to R's "
        "record | | |",
    ]
    for p in data["perturbed"]:
        w = p["weekly"]
        lines.append(
            f"| {p['job']} | {p['day']:g} | {p['whole_ratio']:.3f} | {w['within']} of "
            f"{w['judged']} ({w['within'] / max(w['judged'], 1):.0%}) | {w['low']:.3f} | "
            f"{w['worst']:.3f} |"
        )
    lines += ["", "Week by week (mean JCT h; ratio to max(R, SRTF)):", ""]
    head = "| week | jobs | R | SRTF | " + " | ".join(
        f"moved on day {p['day']:g}" for p in data["perturbed"]
    )
    lines += [head + " |", "|---" * (4 + len(data["perturbed"])) + "|"]
    weeks = data["perturbed"][0]["weekly"]["weeks"]
    for k, w in enumerate(weeks):
        cells = [
            f"{p['weekly']['weeks'][k]['mean_jct_h']:.2f} ({p['weekly']['weeks'][k]['ratio']:.3f})"
            for p in data["perturbed"]
        ]
        r, s = data["r_weekly"][str(w["week"])][0], data["srtf_weekly"][str(w["week"])][0]
        row = f"| {w['week']} | {w['jobs']} | {r:.2f} | {s:.2f} | "
        lines.append(row + " | ".join(cells) + " |")
    lines += ["", *data.get("notes", [])]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", choices=("itp", "pollux"), default="pollux")
    ap.add_argument("--cluster", help="an ITP cluster (with --traces itp), e.g. cluster06")
    ap.add_argument("--days", default="22,40", help="comma-separated days: one replay each")
    ap.add_argument("--shift-s", type=float, default=60.0, help="how much later the job comes")
    ap.add_argument(
        "--load",
        choices=[x for x, _ in bl.LOADS],
        default="base",
        help="the cell's load, as bench_learned.py ran it (default base)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    bl.SOURCE["name"] = args.traces
    record_path = args.out / f"{bl.record_stem(args.traces)}.json"
    record = json.loads(record_path.read_text(encoding="utf-8"))
    cell = "philly-pollux" if args.traces == "pollux" else args.cluster
    if cell is None:
        ap.error("--traces itp needs --cluster")
    rule = record["mix"]["rule"]
    rows = [r for r in record["rows"] if r["cluster"] == cell and r["load"] == args.load]
    base = {r["policy"]: r for r in rows}
    if rule not in base or SRTF not in base:
        ap.error(f"{record_path} has no {args.load} {rule} and SRTF rows for {cell}: run it first")
    nodes = int(base[rule]["nodes"])
    started = time.perf_counter()
    perturbed = []
    control: dict[str, Any] = {}
    days = [float(x) for x in args.days.split(",") if x]
    # the control first: the same path with no job moved must give R's record exactly,
    # or the differences below would be the replay's, not the one job's
    for day, shift_s in [(days[0], 0.0), *((d, args.shift_s) for d in days)]:
        jobs, moved = perturbed_jobs(cell, day, shift_s)
        bl._JOBS[cell] = jobs
        t = time.perf_counter()
        row = bl.run_one((cell, args.load, nodes, rule))
        bl._JOBS.pop(cell)
        weekly = weekly_line(row, base[rule], base[SRTF])
        whole = row["mean_jct_h"] / base[rule]["mean_jct_h"]
        if shift_s == 0.0:
            same = row["weekly_mean_jct_h"] == base[rule]["weekly_mean_jct_h"]
            print(f"control (no job moved): whole trace {whole:.6f} x R, weeks identical: {same}")
            control = {"whole_ratio": whole, "weeks_identical": same}
            continue
        print(
            f"job {moved} moved on day {day:g}: whole trace {whole:.3f} x R, weeks within "
            f"{BOUND}: {weekly['within']} of {weekly['judged']}, worst {weekly['worst']:.3f} "
            f"({time.perf_counter() - t:.0f} s)",
            flush=True,
        )
        perturbed.append(
            {"job": moved, "day": day, "whole_ratio": whole, "weekly": weekly, "row": row}
        )
    data = {
        "benchmark": "learned-weekly-sensitivity",
        "command": "python bench/bench_weekly_sensitivity.py " + " ".join(sys.argv[1:]),
        "machine": describe(),
        "cell": cell,
        "load": args.load,
        "nodes": nodes,
        "rule": rule,
        "shift_s": args.shift_s,
        "r_weekly": base[rule]["weekly_mean_jct_h"],
        "srtf_weekly": base[SRTF]["weekly_mean_jct_h"],
        "control": control,
        "perturbed": perturbed,
        "total_s": time.perf_counter() - started,
    }
    own = "" if args.traces == "pollux" else f"-{cell}"
    stem = "learned-weekly-sensitivity" + own + STEM_SUFFIX[args.load]
    (args.out / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    (args.out / f"{stem}.md").write_text(render(data), encoding="utf-8")
    print(f"wrote {args.out}/{stem}.md in {data['total_s'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

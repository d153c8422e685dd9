"""`gpupool simulate fill|replay|scenario` and `gpupool policies`: policies proven on real
traces before they run a cluster."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from gpupool.cli.progress import ProgressBar
from gpupool.cli.table import render
from gpupool.cli.verbs import HELP
from gpupool.errors import SpecError
from gpupool.learning.config import PREDICTORS, LearningConfig
from gpupool.policies import cycle_names, placement_names, queue_names
from gpupool.sim.replay.fgd_paper import PAPER_POLICY_NAMES

FILL_POLICIES = tuple(PAPER_POLICY_NAMES)


def parse_seeds(text: str) -> list[int]:
    """'42', '42-51' or '1,5,9'."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part[1:]:
                lo, hi = part.split("-", 1)
                if int(hi) < int(lo):
                    raise SpecError(f"--seeds {text!r}: range {part} runs backwards")
                seeds.extend(range(int(lo), int(hi) + 1))
            elif part:
                seeds.append(int(part))
    except ValueError:
        raise SpecError(f"--seeds {text!r}: use N, N-M or N,M,...") from None
    if not seeds:
        raise SpecError("--seeds is empty")
    return seeds


def parse_policies(text: str) -> list[str]:
    if text == "all":
        return list(FILL_POLICIES)
    names = [p.strip() for p in text.split(",") if p.strip()]
    known = placement_names()
    for n in names:
        if n not in known:
            raise SpecError(f"unknown policy {n!r}; choose from {', '.join(known)} or 'all'")
    return names


def add_simulate_parsers(sub: Any) -> None:
    """`simulate` (fill, replay, scenario) and `policies`."""
    sim = sub.add_parser("simulate", help=HELP["simulate"])
    kinds = sim.add_subparsers(dest="kind", required=True)

    fill = kinds.add_parser(
        "fill",
        help="tasks arrive and never leave (the FGD paper's method)",
        description="Place tasks one by one until the workload reaches --tune x the cluster's "
        "GPU capacity; report allocation and fragmentation against arrived workload. "
        "Defaults to the embedded openb cluster and default task list.",
    )
    fill.add_argument("--nodes", help="openb node list CSV (default: embedded 1,213-node cluster)")
    fill.add_argument("--pods", help="openb pod list CSV (default: embedded default list)")
    fill.add_argument(
        "--policy", help=f"one placement policy: {', '.join(FILL_POLICIES)} (default fgd)"
    )
    fill.add_argument("--policies", help="comma-separated policies, or 'all' for the paper's six")
    fill.add_argument("--tune", type=float, default=1.3, help="workload / capacity (default 1.3)")
    fill.add_argument("--seed", type=int, default=42, help="seed for shuffle, tuning and ties")
    fill.add_argument("--seeds", help="several seeds, e.g. 42-51; medians are reported")
    fill.add_argument("--workers", type=int, default=None, help="parallel runs (default: cores)")
    fill.add_argument("--json", type=Path, help="write machine-readable results here")

    rep = kinds.add_parser(
        "replay",
        help="jobs arrive at submit times, queue, run and leave",
        description="Replay a job trace on a homogeneous cluster. A directory of cluster "
        "CSVs (e.g. the ITP raw-traces folder) replays each cluster on its own.",
    )
    rep.add_argument("--trace", required=True, type=Path, help="trace CSV file or directory")
    rep.add_argument(
        "--format",
        default="itp",
        choices=("itp", "elasticflow", "gavel", "pollux"),
        help="itp: ITP raw (job_id,submission_time,duration,num_gpu); elasticflow: ElasticFlow "
        "lists (ITP elasticflow-traces or the Philly VC list); gavel: Gavel's Philly msr "
        "*.trace.txt (one VC per file; run time = steps / V100 throughput of the model); "
        "pollux: Pollux's Philly list (timestamp,duration,num_gpus,gpu_time,cluster: every "
        "VC in one shared pool, the VC as the team, sorted by time)",
    )
    rep.add_argument("--nodes", default="auto", help="node count, or 'auto' (70%% mean load)")
    rep.add_argument("--gpus-per-node", type=int, default=8)
    rep.add_argument(
        "--queue",
        default="fifo",
        help=f"queue policy: {', '.join(queue_names())}. fifo: submit order, the head blocks; "
        "backfill: fifo with EASY backfill (a later job jumps the blocked head only if it "
        "cannot delay the head's reservation; oracle run times); sjf / srtf: shortest job / "
        "shortest remaining time first with oracle durations (the ceiling; srtf preempts); "
        "las: Tiresias 2D-LAS, queues by attained GPU service, first come first served in a "
        "queue, preemptive, no durations; gittins: Tiresias 2D-Gittins on the GPU-time of "
        "jobs finished so far, preemptive; learned: predicted GPU-time mixed with 2D-LAS, "
        "used only while the guard trusts the model (rules during the cold start and on drift)",
    )
    rep.add_argument(
        "--predictor",
        default="lightgbm",
        choices=PREDICTORS,
        help="learned queue: the GPU-time predictor. lightgbm: quantile LightGBM on features "
        "known at submit, retrained weekly on jobs finished by then; recent-median: quantiles "
        "of recent similar finished jobs; shuffled / inverted: deliberately wrong predictions, "
        "to see the guard fall back (default lightgbm)",
    )
    rep.add_argument(
        "--unguarded",
        action="store_true",
        help="learned queue: use the model whatever its accuracy once the cold start is over "
        "(an experiment: shows what the guard prevents)",
    )
    rep.add_argument(
        "--origin",
        type=float,
        default=None,
        help="learned queue: UTC epoch second of the trace's time 0, for hour and weekday "
        "features (default: 2021-03-04 for itp, the earliest day's midnight for pollux, else 0)",
    )
    rep.add_argument(
        "--policy", default="consolidate", help="placement policy (default consolidate)"
    )
    rep.add_argument("--seed", type=int, default=0)
    rep.add_argument("--json", type=Path, help="write machine-readable results here")
    rep.add_argument("--log", type=Path, help="write the decision log here")

    sc = kinds.add_parser(
        "scenario",
        help="teams, quotas, services and preemption on a shared pool (YAML scenario)",
        description="Run scenario files (see scenarios/README.md). Several files print a "
        "side-by-side comparison. Traces are looked up in GPUPOOL_TRACES or a shared/traces "
        "folder beside or above the scenario.",
    )
    sc.add_argument("files", nargs="+", type=Path, help="scenario YAML file(s)")
    sc.add_argument(
        "--json",
        type=Path,
        help='write results here (one file: its summary, and under key "review" the '
        "record `gpupool report --scenario` reads)",
    )
    sc.add_argument("--log", type=Path, help="write the decision log here (one file only)")
    sc.add_argument(
        "--jobs-csv",
        type=Path,
        help="write one row per job here (pool, times, GPU-hours, cost, energy, electricity "
        "cost, carbon); one file only",
    )
    sc.add_argument("--traces", type=Path, help="folder with the public traces")
    sc.add_argument(
        "--policies",
        help="run each file under these cycle policies instead of its own "
        "(comma-separated: fifo, backfill, priority-quota) and compare them",
    )
    sc.add_argument(
        "--value-of-time",
        metavar="VALUES",
        help="sweep energy.value_of_time (the tariff's currency per GPU-hour of delay, "
        "e.g. 0,0.1,0.3,1) on a price-aware scenario and print the curve against the "
        "scenario run blind: electricity and carbon saved, mean and p95 JCT increase, "
        "deadline misses, GPU-hours and the total bill (GPU-hours at the catalogue price "
        "plus electricity)",
    )
    sc.add_argument(
        "--workers", type=int, default=1, help="parallel runs for --value-of-time (default 1)"
    )

    sub.add_parser("policies", help=HELP["policies"])


def run_simulate(args: argparse.Namespace) -> int:
    if args.command == "policies":
        print("placement:", ", ".join(placement_names()))
        print("queue:    ", ", ".join(queue_names()))
        print("cycle:    ", ", ".join(cycle_names()))
        return 0
    if args.kind == "fill":
        return cmd_fill(args)
    if args.kind == "scenario":
        if args.value_of_time:
            from gpupool.cli.energy_curve import cmd_value_of_time

            return cmd_value_of_time(args)
        return cmd_scenario(args)
    return cmd_replay(args)


def cmd_fill(args: argparse.Namespace) -> int:
    import statistics

    from gpupool.sim.replay.experiments import (
        DEFAULT_NODES,
        DEFAULT_PODS,
        embedded,
        fill_batch,
        median_curves,
    )
    from gpupool.sim.replay.fgd_paper import FIGURE_POINTS

    if args.policy and args.policies:
        raise SpecError("give --policy or --policies, not both")
    policies = parse_policies(args.policies or args.policy or "fgd")
    seeds = parse_seeds(args.seeds) if args.seeds else [args.seed]
    if args.tune <= 0:
        raise SpecError("--tune must be > 0 (1.3 fills to 130% of GPU capacity)")
    nodes = Path(args.nodes) if args.nodes else embedded(DEFAULT_NODES)
    pods = Path(args.pods) if args.pods else embedded(DEFAULT_PODS)
    started = time.perf_counter()
    runs = fill_batch(
        nodes,
        pods,
        policies,
        seeds,
        args.tune,
        args.workers,
        ProgressBar(f"fill {len(policies)}x{len(seeds)} runs"),
    )
    wall = time.perf_counter() - started
    rows = []
    summary: dict[str, dict[str, list[float]]] = {}
    for policy in policies:
        mine = [r for r in runs if r.policy == policy]
        curves = median_curves(mine)
        summary[policy] = curves
        idx = {int(a): k for k, a in enumerate(curves["arrived_pct"])}
        rows.append(
            [policy]
            + [curves["unallocated_pct"][idx[p]] if p in idx else "-" for p in FIGURE_POINTS]
            + [curves["frag_rate_pct"][idx[100]] if 100 in idx else "-"]
            + [round(statistics.median(r.wall_s for r in mine), 2)]
        )
    what = "median of seeds " + args.seeds if len(seeds) > 1 else f"seed {seeds[0]}"
    print(
        render(
            ["policy"] + [f"unalloc@{p}%" for p in FIGURE_POINTS] + ["frag rate@100%", "run s"],
            rows,
            title=f"Unallocated GPU % by arrived workload — {pods.name} on {nodes.name}, "
            f"tune {args.tune}, {what}",
        )
    )
    print(f"\n{len(runs)} runs in {wall:.1f}s. Lower is better; fgd should lead past 95%.")
    if args.json:
        payload: dict[str, object]
        if len(runs) == 1:
            payload = runs[0].as_dict()
        else:
            payload = {"runs": [r.as_dict() for r in runs], "median": summary, "wall_s": wall}
        _write_json(args.json, payload)
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from gpupool.sim.replay.run import auto_nodes, run_replay
    from gpupool.traces.loaders import load_replay_trace

    if args.gpus_per_node <= 0:
        raise SpecError("--gpus-per-node must be at least 1")
    if args.queue not in queue_names():
        raise SpecError(f"unknown queue {args.queue!r}; choose from {', '.join(queue_names())}")
    traces = load_replay_trace(args.trace, args.format)
    learning = LearningConfig(predictor=args.predictor, guarded=not args.unguarded)
    origin_s = args.origin
    if origin_s is None:  # dated files carry theirs (Pollux's list); ITP's is its first day
        origin_s = ITP_ORIGIN_S if args.format == "itp" else traces[0][2].origin_s
    learned_lines: list[str] = []
    rows = []
    per_cluster: list[dict[str, float | int | str]] = []
    all_jct: list[np.ndarray] = []
    all_queue: list[np.ndarray] = []
    total_wall = 0.0
    busy = capacity = 0.0
    logs: list[str] = []
    for name, jobs, report in traces:
        if report.skipped:
            print(report.summary(), file=sys.stderr)
        if args.nodes == "auto":
            nodes = auto_nodes(jobs, args.gpus_per_node)
        else:
            try:
                nodes = int(args.nodes)
            except ValueError:
                raise SpecError(f"--nodes must be a number or 'auto', got {args.nodes!r}") from None
        result = run_replay(
            jobs,
            nodes,
            args.gpus_per_node,
            args.queue,
            args.policy,
            args.seed,
            name,
            ProgressBar(f"replay {name}"),
            learning=learning,
            origin_s=origin_s,
        )
        if result.guard_changes or result.retrains:
            learned_lines.append(_learned_summary(name, result))
        m = result.metrics
        total_wall += result.wall_s
        all_jct.append(m.jct_s)
        all_queue.append(m.queue_s)
        busy += m.utilization * nodes * args.gpus_per_node * m.makespan_s
        capacity += nodes * args.gpus_per_node * m.makespan_s
        row = {**m.as_dict(), "cluster": name, "nodes": nodes, "wall_s": round(result.wall_s, 3)}
        per_cluster.append(row)
        rows.append(
            [
                name,
                nodes,
                m.jobs,
                m.avg_jct_s / 3600,
                m.p50_jct_s / 3600,
                m.p99_jct_s / 3600,
                m.avg_queue_s / 3600,
                100 * m.utilization,
                m.makespan_s / 86400,
                result.wall_s,
            ]
        )
        if args.log:
            logs.append(result.log.render(result.node_names))
    jct = np.concatenate(all_jct) if all_jct else np.zeros(0)
    queue = np.concatenate(all_queue) if all_queue else np.zeros(0)
    total = {
        "jobs": sum(int(r["jobs"]) for r in per_cluster),
        "avg_jct_s": float(jct.mean()) if jct.size else float("nan"),
        "p50_jct_s": float(np.percentile(jct, 50)) if jct.size else float("nan"),
        "p99_jct_s": float(np.percentile(jct, 99)) if jct.size else float("nan"),
        "avg_queue_s": float(queue.mean()) if queue.size else float("nan"),
        "utilization": busy / capacity if capacity else 0.0,
        "makespan_s": max((float(r["makespan_s"]) for r in per_cluster), default=0.0),
        "wall_s": round(total_wall, 3),
    }
    headers = [
        "cluster",
        "nodes",
        "jobs",
        "avg JCT h",
        "p50 JCT h",
        "p99 JCT h",
        "avg queue h",
        "util %",
        "makespan d",
        "run s",
    ]
    if len(rows) > 1:
        rows.append(
            [
                "all",
                "",
                total["jobs"],
                total["avg_jct_s"] / 3600,
                total["p50_jct_s"] / 3600,
                total["p99_jct_s"] / 3600,
                total["avg_queue_s"] / 3600,
                100 * total["utilization"],
                "",
                total["wall_s"],
            ]
        )
    print(
        render(
            headers,
            rows,
            title=f"Replay: queue {args.queue}, placement {args.policy}, "
            f"{args.gpus_per_node} GPUs/node",
        )
    )
    for line in learned_lines:
        print(line)
    if args.json:
        payload: dict[str, object] = dict(total)
        if len(per_cluster) > 1:
            payload["clusters"] = per_cluster
        _write_json(args.json, payload)
    if args.log:
        args.log.write_text("".join(logs), encoding="utf-8")
    return 0


ITP_ORIGIN_S = 1_614_816_000.0
"""2021-03-04 00:00 UTC: second 0 of the Microsoft ITP 2021 trace (its README)."""


def _learned_summary(name: str, result: Any) -> str:
    """The guard's changes of a learned replay: how often, and when the model was trusted."""
    t0 = min((d.time_s for d in result.log.decisions), default=0.0)
    spans = []
    since = None
    for change in result.guard_changes:
        if change.after.value == "trusted":
            since = change.t_s
        elif since is not None:
            spans.append(f"day {(since - t0) / 86400:.1f}-{(change.t_s - t0) / 86400:.1f}")
            since = None
    if since is not None:
        spans.append(f"day {(since - t0) / 86400:.1f}-end")
    return (
        f"{name}: {len(result.retrains)} model(s) trained, {len(result.guard_changes)} guard "
        f"change(s), model trusted {result.trusted_s / 86400:.1f} days"
        + (f" ({', '.join(spans)})" if spans else " (never)")
    )


def _h(value: object) -> object:
    return "-" if value is None else value


def _learning_for(learning: LearningConfig, policy: str) -> LearningConfig:
    """A policy given on the command line: `learned` runs in the file's learning mode
    (shadow when it has none), any other policy with learning off."""
    from dataclasses import replace

    if policy != "learned":
        return replace(learning, mode="off")
    return learning if learning.mode != "off" else replace(learning, mode="shadow")


def cmd_scenario(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from gpupool.policies.registry import cycle_names
    from gpupool.sim.scenario.config import load_scenario
    from gpupool.sim.scenario.runner import run_scenario

    overrides = [p.strip() for p in args.policies.split(",")] if args.policies else [None]
    for name in overrides:
        if name is not None and name not in cycle_names():
            raise SpecError(
                f"unknown cycle policy {name!r}; choose from {', '.join(cycle_names())}"
            )
    configs = []
    for path in args.files:
        base = load_scenario(path)
        for name in overrides:
            configs.append(
                base
                if name is None
                else replace(
                    base,
                    name=f"{base.name}/{name}",
                    scheduling=replace(
                        base.scheduling,
                        policy=name,
                        learning=_learning_for(base.scheduling.learning, name),
                    ),
                )
            )
    if (args.log or args.jobs_csv) and len(configs) > 1:
        raise SpecError("--log and --jobs-csv take one scenario run at a time")
    results = []
    for cfg in configs:
        result = run_scenario(
            cfg, args.traces, ProgressBar(f"scenario {cfg.name}"), review=bool(args.json)
        )
        results.append(result)
        s = result.summary
        rows = []
        for team, t in s["teams"].items():
            rows.append(
                [
                    team,
                    t["gpu_hours"],
                    100 * t["utilization"],
                    t["jobs"],
                    t["finished"],
                    _h(t["avg_jct_h"]),
                    _h(t["p99_jct_h"]),
                    _h(t["avg_queue_h"]),
                    "-" if t["online_slo_attainment"] is None else 100 * t["online_slo_attainment"],
                    t["preemptions"],
                    t["lost_work_gpu_h"],
                    t["guarantee_violation_s"],
                ]
            )
        slo = s["online_slo_attainment"]
        print(
            render(
                [
                    "team",
                    "GPU-h",
                    "util %",
                    "jobs",
                    "done",
                    "avg JCT h",
                    "p99 JCT h",
                    "avg queue h",
                    "SLO %",
                    "preempt",
                    "lost GPU-h",
                    "below guar. s",
                ],
                rows,
                title=f"{cfg.name} ({cfg.scheduling.mode}, {cfg.scheduling.policy}): "
                f"GPU-hours used "
                f"{100 * s['gpu_hours_utilization']:.1f}%, online SLO "
                f"{'-' if slo is None else f'{100 * slo:.3f}%'}, jobs {s['jobs_finished']}/"
                f"{s['jobs_submitted']} finished, {s['jobs_lost']} lost",
            )
        )
        print(_resource_line(s))
        waited = s.get("waited_with") or {}
        if waited:  # why jobs waited: each reason code, with the jobs given it
            print("jobs waited with: " + ", ".join(f"{c} {n}" for c, n in waited.items()))
        print()
    if len(results) > 1:
        kinds = sorted({k for r in results for k in r.summary["kinds"]})
        krows = []
        for r in results:
            for k in kinds:
                ks = r.summary["kinds"].get(k)
                if ks:
                    krows.append(
                        [
                            r.name,
                            k,
                            ks["jobs"],
                            ks["finished"],
                            _h(ks["avg_jct_h"]),
                            _h(ks["p99_jct_h"]),
                            _h(ks["avg_queue_h"]),
                            ks["preemptions"],
                        ]
                    )
        print(
            render(
                [
                    "scenario",
                    "kind",
                    "jobs",
                    "done",
                    "avg JCT h",
                    "p99 JCT h",
                    "avg queue h",
                    "preempt",
                ],
                krows,
                title="By kind",
            )
        )
        print()
        rows = [
            [
                r.name,
                100 * r.summary["gpu_hours_utilization"],
                "-"
                if r.summary["online_slo_attainment"] is None
                else 100 * r.summary["online_slo_attainment"],
                r.summary["training_gpu_hours"],
                r.summary["jobs_finished"],
                _h(None if r.summary["avg_jct_s"] is None else r.summary["avg_jct_s"] / 3600),
                _h(r.summary.get("gpu_hours_per_finished_job")),
                r.summary["preemptions"],
                r.summary["guarantee_violation_s"],
                r.summary["jobs_lost"],
                r.wall_s,
            ]
            for r in results
        ]
        print(
            render(
                [
                    "scenario",
                    "util %",
                    "SLO %",
                    "training GPU-h",
                    "finished",
                    "mean JCT h",
                    "GPU-h/finished",
                    "preempt",
                    "below guar. s",
                    "lost",
                    "run s",
                ],
                rows,
                title="Comparison (GPU-h/finished: job GPU-hours per finished job)",
            )
        )
        print()
        wrows = [
            [
                r.name,
                width,
                w["jobs"],
                w["started"],
                w["finished"],
                w["gpu_hours"],
                _h(w["avg_jct_h"]),
                _h(w["oldest_never_started_wait_h"]),
            ]
            for r in results
            for width, w in r.summary.get("by_gpus", {}).items()
        ]
        print(
            render(
                [
                    "scenario",
                    "GPUs/job",
                    "jobs",
                    "started",
                    "finished",
                    "GPU-h",
                    "mean JCT h",
                    "oldest unstarted wait h",
                ],
                wrows,
                title="By GPUs per job: which jobs the GPU-hours went to",
            )
        )
        print()
        print(
            render(
                ["scenario", "GPUs/job", "jobs", "started", "never started", "mean wait h",
                 "max wait h"],
                [
                    [r.name, width, w["jobs"], w["started"], w["never_started"],
                     round(w["mean_wait_s"] / 3600, 2), round(w["max_wait_s"] / 3600, 2)]
                    for r in results
                    for width, w in r.summary.get("by_width", {}).items()
                ],
                title="Waits by width (to the first start; a job never started waited until "
                "the horizon)",
            )
        )  # fmt: skip
        print()
        print(
            render(
                [
                    "scenario",
                    "cost $",
                    "avg JCT h",
                    "deadline miss",
                    "energy kWh",
                    "electricity",
                    "carbon kg",
                    "bursts",
                    "reclaims",
                    "remote refused",
                ],
                [
                    [
                        r.name,
                        r.summary["cost_usd"],
                        _h(
                            None
                            if r.summary["avg_jct_s"] is None
                            else r.summary["avg_jct_s"] / 3600
                        ),
                        r.summary["deadline_misses"],
                        r.summary["energy_kwh"],
                        f"{r.summary['electricity_cost']:.2f} {r.summary['electricity_currency']}",
                        "-" if r.summary["carbon_kg"] is None else r.summary["carbon_kg"],
                        r.summary["bursts"],
                        r.summary["reclaims"],
                        r.summary["rejected_remote_placements"],
                    ]
                    for r in results
                ],
                title="Cost, energy and placement",
            )
        )
    if args.json:
        bodies = [
            r.summary | ({} if r.review is None else {"review": r.review.to_json()})
            for r in results
        ]
        payload: object = bodies[0] if len(bodies) == 1 else {"scenarios": bodies}
        _write_json(args.json, payload, indent=None)
    if args.log:
        args.log.write_text(results[0].log.render(results[0].node_names), encoding="utf-8")
    if args.jobs_csv:
        _write_rows(args.jobs_csv, results[0].jobs)
    return 0


def _resource_line(s: dict[str, object]) -> str:
    jct = s["avg_jct_s"]
    parts = [
        f"cost ${s['cost_usd']:,.2f}",
        f"avg JCT {'-' if jct is None else f'{float(jct) / 3600:.2f} h'}",  # type: ignore[arg-type]
        f"deadline misses {s['deadline_misses']}/{s['jobs_with_deadline']}",
        f"energy {s['energy_kwh']:,.1f} kWh",
        f"electricity {s['electricity_cost']:,.2f} {s['electricity_currency'] or ''}".rstrip(),
        "carbon -" if s["carbon_kg"] is None else f"carbon {s['carbon_kg']:,.1f} kg",
    ]
    if s["bursts"] or s["reclaims"]:
        parts.append(f"bursts {s['bursts']}, reclaims {s['reclaims']}")
    if s["rejected_remote_placements"]:
        parts.append(f"remote placements refused {s['rejected_remote_placements']}")
    return "  " + "; ".join(parts)


def _write_rows(path: Path, rows: list[dict[str, object]]) -> None:
    import csv

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["job_id"])
            writer.writeheader()
            writer.writerows(rows)
    except OSError as exc:
        raise SpecError(f"cannot write {path}: {exc.strerror}; choose a writable path") from None
    print(f"wrote {path}", file=sys.stderr)


def _write_json(path: Path, payload: object, indent: int | None = 2) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(payload, indent=indent, allow_nan=True, sort_keys=indent is None)
        path.write_text(text + "\n", encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot write {path}: {exc.strerror}; choose a writable path") from None
    print(f"wrote {path}", file=sys.stderr)

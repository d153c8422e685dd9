"""Does any job starve for its width? Every shipped scenario with its own policy, and a
scenario of our own (a team capped just above its widest jobs, a stream of narrow ones)
under every cycle policy; each with `reservations` off and on.

A job starves here when it fits its team's maximum, has waited at least 48 h and is still
unstarted at the horizon. The issue asks for none where the teams can serve their load;
a team's load is its submitted GPU-hours (work x GPUs) over what its maximum can serve in
the horizon (in static mode: what its island, its guarantee, can serve), so an overloaded
team (load > 1: daynight-off's training) is shown apart. So is a job that waited while the
whole pool was full (its GPUs allocated at least FULL_POOL of the time, on average, from
the job's submission to the horizon): every team may be within its own load while together
they ask more than the pool has (review-planted's second half, with the 64-GPU fine-tune);
there the question is whether a width is passed over, which `width starts` answers: the
lowest share of a width's jobs that started, over the share of all the team's jobs.
Writes bench/results/starvation.{json,md}.

    .venv/bin/python bench/bench_starvation.py [--only daynight-off] [--workers 2]
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

from gpupool.domain.model import JobKind, JobSpec
from gpupool.domain.quota import QuotaBook
from gpupool.sim.scenario.config import ScenarioConfig, load_scenario, parse_scenario
from gpupool.sim.scenario.generators import GenContext, build_workload
from gpupool.sim.scenario.runner import run_scenario
from gpupool.sim.scenario.workload import Workload
from gpupool.traces.location import find_traces_dir
from machine import describe

ROOT = Path(__file__).resolve().parents[1]
STARVED_AFTER_S = 48 * 3600.0
FULL_POOL = 0.9
"""A pool whose GPUs were allocated this share of a job's wait, on average, had no room."""
POLICIES = ("fifo", "backfill", "priority-quota", "las", "gittins")
CAPPED = "capped-team"
"""Our own: one team capped at 16 of 32 GPUs, 16-GPU jobs among a stream of 1-GPU ones."""


def capped_team() -> tuple[dict[str, Any], Workload]:
    """Four 8-GPU nodes; team `wide` may hold 16 GPUs: a 16-GPU job of 4 h every 12 h,
    and a 1-GPU job of 2 h every 20 min (about 11 of its 16 GPUs busy on average: the
    team can serve its load, but its narrow jobs always hold part of its 16)."""
    raw = {
        "name": CAPPED,
        "horizon_h": 168,
        "cycle_s": 60,
        "cluster": [{"gpu_type": "H200", "nodes": 4, "gpus_per_node": 8}],
        "teams": [
            {"name": "wide", "guaranteed": {"H200": 16}, "max": {"H200": 16}},
            {"name": "other", "guaranteed": {"H200": 16}},
        ],
        "workload": [],
    }
    h = 3600.0
    jobs = [
        JobSpec(f"w{k:02d}", gpu_count=16, team="wide", submit_s=k * 12 * h, duration_s=4 * h)
        for k in range(12)
    ]
    jobs += [
        JobSpec(f"n{k:04d}", team="wide", submit_s=1200.0 * k + 60, duration_s=2 * h)
        for k in range(int(150 * h / 1200))
    ]
    jobs += [
        JobSpec(f"o{k:03d}", gpu_count=4, team="other", submit_s=k * 3 * h, duration_s=6 * h)
        for k in range(50)
    ]
    return raw, Workload(jobs=tuple(sorted(jobs, key=lambda j: (j.submit_s, j.job_id))))


def runs(only: str | None) -> list[tuple[str, str, bool]]:
    shipped = sorted(p.stem for p in (ROOT / "scenarios").glob("*.yaml"))
    items = [(name, "", on) for name in shipped for on in (False, True)]
    items += [(CAPPED, policy, on) for policy in POLICIES for on in (False, True)]
    return [i for i in items if only is None or i[0] == only]


def one(item: tuple[str, str, bool]) -> dict[str, Any]:
    name, policy, on = item
    workload: Workload | None = None
    if name == CAPPED:
        raw, workload = capped_team()
        cfg: ScenarioConfig = parse_scenario(raw)
    else:
        cfg = load_scenario(ROOT / "scenarios" / f"{name}.yaml")
        ctx = GenContext(cfg.horizon_s, find_traces_dir(ROOT / "scenarios"))
        workload = build_workload(cfg.workload, cfg.seed, ctx)
    sched = cfg.scheduling
    cfg = replace(cfg, scheduling=replace(sched, policy=policy or sched.policy, reservations=on))
    t0 = time.perf_counter()
    result = run_scenario(cfg, workload=workload)
    horizon = cfg.horizon_s
    pools: dict[str, int] = defaultdict(int)
    for p in cfg.pools:
        pools[p.key] += p.nodes * p.gpus_per_node
    quotas = QuotaBook(cfg.scheduling.teams, pools, ())
    work: dict[str, float] = defaultdict(float)
    for job in workload.jobs:
        if job.kind is not JobKind.ONLINE and job.submit_s < horizon:
            work[job.team] += job.gpu_count * min(job.duration_s or 0.0, horizon - job.submit_s)
    starved: dict[str, int] = defaultdict(int)
    in_full_pool: dict[str, int] = defaultdict(int)
    submitted: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    by_hour = result.utilization_by_hour
    capacity: dict[str, float] = {}
    static = cfg.scheduling.mode == "static"
    for r in result.jobs:
        team, pool = r["team"], r["pool"]
        limit = quotas.maximum(team, pool, 0.0)
        if static:  # each team is confined to its island: whole nodes of its guarantee
            limit = min(limit, quotas.guaranteed(team, pool, 0.0))
        capacity[team] = max(capacity.get(team, 0.0), limit * horizon)
        waited = horizon - r["submit_s"]
        if r["kind"] != "online-inference" and r["gpus"] <= limit:
            for key in ((team, r["gpus"]), (team, 0)):
                submitted[key][0] += 1
                submitted[key][1] += r["start_s"] is not None
        if (
            r["kind"] != "online-inference"
            and r["start_s"] is None
            and r["gpus"] <= limit
            and waited >= STARVED_AFTER_S
        ):
            starved[team] += 1
            hours = by_hour[int(r["submit_s"] // 3600) :]
            if hours and sum(hours) / len(hours) >= FULL_POOL:
                in_full_pool[team] += 1
    load = {t: round(work[t] / capacity[t], 2) if capacity.get(t) else None for t in work}
    served = [t for t, v in load.items() if v is not None and v <= 1.0]
    width_starts = {}  # the lowest started share of a width, over the team's share
    for team in sorted(starved):
        total, ran = submitted[(team, 0)]
        shares = [n_ran / n for (t, w), (n, n_ran) in submitted.items() if t == team and w and n]
        if total and ran and shares:
            width_starts[team] = round(min(shares) / (ran / total), 2)
    return {
        "scenario": name,
        "policy": cfg.scheduling.policy,
        "reservations": on,
        "starved": dict(sorted(starved.items())),
        "starved_where_served": sum(n - in_full_pool[t] for t, n in starved.items() if t in served),
        "starved_in_full_pool": dict(sorted(in_full_pool.items())),
        "width_starts": width_starts,
        "team_load": dict(sorted(load.items())),
        "max_wait_h": round(result.summary["max_wait_s"] / 3600, 1),
        "avg_jct_h": round(result.summary["avg_jct_s"] / 3600, 2)
        if result.summary.get("avg_jct_s")
        else None,
        "utilization": result.summary["gpu_hours_utilization"],
        "guarantee_violation_s": result.summary["guarantee_violation_s"],
        "preemptions": result.summary["preemptions"],
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="one scenario (a file name without .yaml, or capped-team)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    items = runs(args.only)
    started = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        rows = list(pool.map(one, items))
    for r in rows:
        print(
            f"{r['scenario']:22} {r['policy']:15} res={'on ' if r['reservations'] else 'off'} "
            f"starved={r['starved']} where-served={r['starved_where_served']} "
            f"load={r['team_load']} jct={r['avg_jct_h']} max_wait={r['max_wait_h']} "
            f"viol_s={r['guarantee_violation_s']} preempt={r['preemptions']} wall={r['wall_s']}",
            file=sys.stderr,
        )
    out = ROOT / "bench" / "results"
    payload = {
        "machine": describe(),
        "wall_s": round(time.perf_counter() - started, 1),
        "runs": rows,
    }
    if args.only is None:
        (out / "starvation.json").write_text(json.dumps(payload, indent=1) + "\n")
        (out / "starvation.md").write_text(markdown(payload))
    return 0


def markdown(payload: dict[str, Any]) -> str:
    lines = [
        "# Starvation by width: jobs that fit their team's maximum, waited 48 h, never started",
        "",
        "`.venv/bin/python bench/bench_starvation.py` (every shipped scenario with its own",
        "policy; `capped-team`, our own, under every cycle policy). Team load: submitted",
        "GPU-hours over what the team's maximum serves in the horizon; a team above 1 cannot",
        "serve its load and is not counted in `where served`. In static mode a team's",
        "maximum is its island (its guarantee): it can use no other GPU. `in a full pool`:",
        f"starved jobs whose pool had its GPUs allocated >= {FULL_POOL:.0%} of their wait, on",
        "average (not counted in `where served`: the pool had no room for anyone).",
        "`width starts`: for each team with starved jobs, the lowest share of one width's",
        "jobs that started over the share of all its jobs (the issue asks >= 0.5 where a",
        "team or the pool is overloaded).",
        "",
        f"Machine: {payload['machine']}. Wall: {payload['wall_s']} s.",
        "",
        "| scenario | policy | reservations | starved (by team) | where served "
        "| in a full pool | width starts | team load "
        "| max wait h | mean JCT h | util | guarantee violation s | preemptions |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in payload["runs"]:
        starved = ", ".join(f"{t}: {n}" for t, n in r["starved"].items()) or "none"
        load = ", ".join(f"{t}: {v}" for t, v in r["team_load"].items())
        full = ", ".join(f"{t}: {n}" for t, n in r["starved_in_full_pool"].items()) or "-"
        widths = ", ".join(f"{t}: {v}" for t, v in r["width_starts"].items()) or "-"
        lines.append(
            f"| {r['scenario']} | {r['policy']} | {'on' if r['reservations'] else 'off'} "
            f"| {starved} | {r['starved_where_served']} | {full} | {widths} | {load} "
            f"| {r['max_wait_h']} "
            f"| {r['avg_jct_h']} | {r['utilization']} | {r['guarantee_violation_s']} "
            f"| {r['preemptions']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())

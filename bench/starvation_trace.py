"""Why one job starved: every job that started while it waited, sorted into the work older
than it, other teams' jobs inside their guarantee, and younger borrowers, with their
GPU-hours. A diagnostic for bench_starvation.py's findings; it wraps the priority-quota
policy's plan to read each cycle's view (the policy's decisions are unchanged).

  GPUPOOL_TRACES=../shared/traces .venv/bin/python bench/starvation_trace.py \\
      itp-cluster02 itp-c3e3
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import gpupool.policies.cycle.priority_quota as pq
from gpupool.policies.contract import Command, CycleView, Start
from gpupool.sim.scenario.config import load_scenario
from gpupool.sim.scenario.generators import GenContext, build_workload
from gpupool.sim.scenario.runner import run_scenario
from gpupool.traces.location import find_traces_dir

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", help="a shipped scenario (file name without .yaml)")
    ap.add_argument("job", help="the starved job's id, or its start")
    args = ap.parse_args(argv)
    cfg = load_scenario(ROOT / "scenarios" / f"{args.scenario}.yaml")
    ctx = GenContext(cfg.horizon_s, find_traces_dir(ROOT / "scenarios"))
    workload = build_workload(cfg.workload, cfg.seed, ctx)
    cfg = replace(cfg, scheduling=replace(cfg.scheduling, reservations=True))
    target = next(j for j in workload.jobs if j.job_id.startswith(args.job))
    kinds = ("older", "entitled", "younger borrower")
    starts = dict.fromkeys(kinds, 0)
    gpu_h = dict.fromkeys(kinds, 0.0)
    plan = pq.PriorityQuotaPolicy.plan

    def traced(self: pq.PriorityQuotaPolicy, view: CycleView) -> list[Command]:
        out = plan(self, view)
        if view.now_s < target.submit_s:
            return out
        usage = view.usage_after_lends()
        waiting = {p.spec.job_id: p for p in view.pending}
        for c in out:
            p = waiting.get(c.job_id) if isinstance(c, Start) else None
            if p is None:
                continue
            s = p.spec
            room = view.quotas.guaranteed(s.team, p.gpu_type, view.now_s)
            if s.submit_s < target.submit_s:
                kind = kinds[0]
            elif usage.get((s.team, p.gpu_type), 0) + s.gpu_count <= room:
                kind = kinds[1]
            else:
                kind = kinds[2]
            starts[kind] += 1
            gpu_h[kind] += s.gpu_count * (s.duration_s or 0.0) / 3600.0
        return out

    pq.PriorityQuotaPolicy.plan = traced  # type: ignore[method-assign]
    try:
        result = run_scenario(cfg, workload=workload)
    finally:
        pq.PriorityQuotaPolicy.plan = plan  # type: ignore[method-assign]
    row = next(r for r in result.jobs if r["job_id"] == target.job_id)
    waited_h = ((row["start_s"] or cfg.horizon_s) - target.submit_s) / 3600.0
    pool = sum(p.nodes * p.gpus_per_node for p in cfg.pools)
    started = "never" if row["start_s"] is None else f"at {row['start_s'] / 3600:.1f} h"
    print(
        f"{target.job_id} ({target.team}, {target.gpu_count} GPUs, "
        f"{(target.duration_s or 0) / 3600:.1f} h of work) submitted at "
        f"{target.submit_s / 3600:.1f} h, started {started}: "
        f"waited {waited_h:.1f} h, {pool * waited_h:,.0f} GPU-hours of pool"
    )
    for kind in kinds:
        print(f"  {kind:17s} {starts[kind]:4d} starts {gpu_h[kind]:9,.0f} GPU-hours of work")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

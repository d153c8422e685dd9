"""Right-sizing, heterogeneity, energy and multi-cluster: the aware/blind scenario pairs.

Runs scenarios/{hetero,energy,multicluster}-{blind,aware}.yaml two at a time, times the
planner over every shipped model shape x catalogue GPU, and writes
bench/results/resources.json and resources.md with the machine described.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from gpupool.sim.scenario.config import load_scenario
from gpupool.sim.scenario.runner import run_scenario
from gpupool.sizing.catalog import load_catalog
from gpupool.sizing.planner import PlanRequest, plan
from gpupool.sizing.shapes import get_shape, shape_names
from machine import describe
from usage import no_options

ROOT = Path(__file__).resolve().parents[1]
PAIRS = ("hetero", "energy", "energy-caiso", "multicluster")
KEYS = (
    "cost_usd",
    "avg_jct_s",
    "deadline_misses",
    "energy_kwh",
    "electricity_cost",
    "carbon_kg",
    "bursts",
    "reclaims",
    "rejected_remote_placements",
    "online_slo_attainment",
    "jobs_finished",
    "jobs_lost",
)


def one(name: str) -> dict[str, Any]:
    result = run_scenario(load_scenario(ROOT / "scenarios" / f"{name}.yaml"))
    out = dict(result.summary)
    if name.startswith("multicluster"):
        far = next(r for r in result.jobs if r["job_id"] == "far-data")
        out["far_data"] = far
    return out


def planner_timing() -> dict[str, Any]:
    catalog = load_catalog()
    shapes = shape_names()
    started = time.perf_counter()
    options = 0
    for name in shapes:
        for task in ("inference", "training"):
            request = PlanRequest(shape=get_shape(name), task=task, tokens=1e8)
            options += len(plan(request, catalog))
    wall = time.perf_counter() - started
    return {
        "shapes": len(shapes),
        "gpus": len(catalog),
        "plans": 2 * len(shapes),
        "options": options,
        "wall_s": round(wall, 3),
        "ms_per_plan": round(1000 * wall / (2 * len(shapes)), 2),
    }


def fmt(x: object) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.2f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def main() -> int:
    names = [f"{p}-{mode}" for p in PAIRS for mode in ("blind", "aware")]
    started = time.perf_counter()
    with ProcessPoolExecutor(2) as pool:
        results = dict(zip(names, pool.map(one, names), strict=True))
    wall = time.perf_counter() - started
    timing = planner_timing()
    machine = describe()
    lines = [
        "# Right-sizing, energy and multi-cluster scenarios (issue 4)",
        "",
        f"{len(names)} runs in {wall:.0f} s on {machine['cpu']} ({machine['cores']} cores). "
        "Reproduce: `make bench` or `gpupool simulate scenario scenarios/X-blind.yaml "
        "scenarios/X-aware.yaml`.",
        "",
        "| scenario | " + " | ".join(KEYS) + " |",
        "|---" * (len(KEYS) + 1) + "|",
    ]
    for name in names:
        r = results[name]
        lines.append(f"| {name} | " + " | ".join(fmt(r.get(k)) for k in KEYS) + " |")
    lines += ["", "## Aware against blind", ""]
    for p in PAIRS:
        b, a = results[f"{p}-blind"], results[f"{p}-aware"]
        parts = [
            f"cost {100 * (a['cost_usd'] / b['cost_usd'] - 1):+.1f}%",
            f"mean JCT {100 * (a['avg_jct_s'] / b['avg_jct_s'] - 1):+.1f}%",
            f"deadline misses {b['deadline_misses']} -> {a['deadline_misses']}",
        ]
        if b["electricity_cost"]:
            parts.append(
                f"electricity {100 * (a['electricity_cost'] / b['electricity_cost'] - 1):+.1f}%"
                f" ({b['electricity_cost']:,.0f} -> {a['electricity_cost']:,.0f} "
                f"{a['electricity_currency']})"
            )
            parts.append(f"energy {b['energy_kwh']:,.0f} -> {a['energy_kwh']:,.0f} kWh")
            if b["carbon_kg"]:
                parts.append(
                    f"carbon {100 * (a['carbon_kg'] / b['carbon_kg'] - 1):+.1f}% "
                    f"({b['carbon_kg']:,.0f} -> {a['carbon_kg']:,.0f} kg)"
                )
        if p == "multicluster":
            fb, fa = b["far_data"], a["far_data"]
            parts.append(
                f"far-data (20 min, 1.35 TB in us-east): blind {fb['pool']} "
                f"transfer {fb['transfer_s'] / 3600:.1f} h, JCT "
                f"{(fb['end_s'] - fb['submit_s']) / 3600:.2f} h; aware {fa['pool']} "
                f"transfer {fa['transfer_s'] / 3600:.1f} h, JCT "
                f"{(fa['end_s'] - fa['submit_s']) / 3600:.2f} h"
            )
            parts.append(f"bursts/reclaims aware {a['bursts']}/{a['reclaims']}")
        lines.append(f"- **{p}**: " + "; ".join(parts))
    lines += [
        "",
        "## Planner",
        "",
        f"{timing['plans']} plans ({timing['shapes']} model shapes x inference/training, each "
        f"over {timing['gpus']} GPU types x counts 1,2,4,8): {timing['wall_s']} s, "
        f"{timing['ms_per_plan']} ms per plan.",
        "",
    ]
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "resources.md").write_text("\n".join(lines), encoding="utf-8")
    (out / "resources.json").write_text(
        json.dumps(
            {"machine": machine, "wall_s": round(wall, 1), "planner": timing, "runs": results},
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    no_options(__doc__)
    sys.exit(main())

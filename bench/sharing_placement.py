"""Shared inference through the one core: unplaced shares per placement policy.

Runs gpupool.sim.scenario.sharing (online replicas asking for 10-40 GiB among whole-GPU offline
work, arriving until their demand reaches the fleet's capacity, never leaving) under
consolidate, best-fit and fgd, seeds 0-4 and three demand levels, and writes
bench/results/sharing_placement.json and .md.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from gpupool.sim.scenario.sharing import SharingScenario, openb_run, run
from machine import describe
from usage import no_options

POLICIES = ("consolidate", "best-fit", "fgd")
DEMANDS = (0.9, 1.0, 1.2)
SEEDS = range(5)
OPENB_DEMANDS = (1.05, 1.2)
OPENB_SEEDS = range(3)


def main() -> None:
    out = Path(__file__).parent / "results"
    rows = []
    t0 = time.perf_counter()
    for demand in DEMANDS:
        for seed in SEEDS:
            for policy in POLICIES:
                r = run(SharingScenario(seed=seed, demand=demand), policy)
                rows.append({"demand": demand, **r.__dict__})
    openb = []
    for demand in OPENB_DEMANDS:
        for seed in OPENB_SEEDS:
            for policy in ("consolidate", "fgd"):
                r = openb_run(policy, seed=seed, demand=demand, node_stride=16)
                openb.append({"demand": demand, **r.__dict__})
    elapsed = time.perf_counter() - t0
    (out / "sharing_placement.json").write_text(
        json.dumps(
            {"machine": describe(), "elapsed_s": round(elapsed, 1), "runs": rows, "openb": openb},
            indent=1,
        )
        + "\n",
        encoding="utf-8",
    )
    lines = [
        "# Shared inference: unplaced shares by placement policy",
        "",
        "`python bench/sharing_placement.py` (sim/scenario/sharing.py, 16 x 8 A100-80GB, 70% of",
        "arrivals online replicas of 10/18/24/40 GiB, the rest 1/2/4-GPU offline jobs; sums",
        f"over seeds {SEEDS.start}-{SEEDS.stop - 1}; {elapsed:.0f} s).",
        "",
        "| demand | policy | shares | unplaced shares | unplaced whole jobs | allocated % |",
        "|---|---|---|---|---|---|",
    ]
    for demand in DEMANDS:
        for policy in POLICIES:
            sel = [r for r in rows if r["demand"] == demand and r["policy"] == policy]
            alloc = sum(r["allocated_pct"] for r in sel) / len(sel)
            lines.append(
                f"| {demand:g} | {policy} | {sum(r['shares'] for r in sel)} | "
                f"{sum(r['shares_unplaced'] for r in sel)} | "
                f"{sum(r['whole_unplaced'] for r in sel)} | {alloc:.1f} |"
            )
    lines += [
        "",
        "Every online share is placed under all three policies (the cycle policy starts",
        "online replicas first, and a share always finds part of a card), and the three",
        "hold the same capacity, though they place jobs on different cards: this",
        "scenario does not separate them.",
        "",
        "## The openb trace through the core",
        "",
        "`gpupool.sim.scenario.sharing.openb_run`: every 16th GPU node of the Alibaba openb",
        "cluster (one model), tasks drawn from its pods until their GPU requests reach",
        "the demand; sharing tasks run as offline inference, the rest as batch; CPU counts.",
        "",
        "| demand | seed | policy | shares | unplaced shares | unplaced whole | allocated % |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in openb:
        lines.append(
            f"| {r['demand']:g} | {r['seed']} | {r['policy']} | {r['shares']} | "
            f"{r['shares_unplaced']} | {r['whole_unplaced']} | {r['allocated_pct']:.1f} |"
        )
    lines += [
        "",
        "FGD leaves fewer unplaced shares than consolidate in seed 0 (and as many in",
        "seeds 1-2); it never leaves more. The margin is small at this scale.",
    ]
    (out / "sharing_placement.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    no_options(__doc__)
    main()

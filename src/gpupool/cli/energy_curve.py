"""`gpupool simulate scenario FILE --value-of-time 0,0.1,...`: the time-against-money curve
of a price-aware scenario, as a table and (--json) as rows."""

from __future__ import annotations

import argparse
import json

from gpupool.cli.table import render
from gpupool.errors import SpecError
from gpupool.sim.scenario.config import load_scenario
from gpupool.sim.scenario.sweep import curve_rows, parse_values, value_of_time_curve


def _cell(value: object) -> object:
    return "-" if value is None else value


def cmd_value_of_time(args: argparse.Namespace) -> int:
    values = parse_values(args.value_of_time)
    if args.log or args.jobs_csv or args.policies:
        raise SpecError(
            "--value-of-time runs its own set of runs: drop --log, --jobs-csv and --policies"
        )
    if args.workers < 1:
        raise SpecError(f"--workers must be >= 1, got {args.workers}")
    out = {}
    for path in args.files:
        cfg = load_scenario(path)
        print(f"{cfg.name}: {len(values) + 2} runs ({args.workers} at a time)...", flush=True)
        rows = curve_rows(value_of_time_curve(cfg, values, args.traces, args.workers))
        out[cfg.name] = rows
        currency = rows[0]["currency"]
        print(
            render(
                [
                    f"value of time ({currency}/GPU-h)",
                    "electricity saved %",
                    "carbon saved %",
                    "mean JCT h",
                    "mean JCT +%",
                    "p95 JCT +%",
                    "deadline misses",
                    "GPU-h",
                    f"total {currency}",
                    "total vs blind %",
                ],
                [
                    [
                        r["point"],
                        _cell(r["electricity_saving_pct"]),
                        _cell(r["carbon_saving_pct"]),
                        r["mean_jct_h"],
                        _cell(r["mean_jct_increase_pct"]),
                        _cell(r["p95_jct_increase_pct"]),
                        r["deadline_misses"],
                        r["gpu_hours"],
                        r["total_cost"],
                        _cell(r["total_cost_vs_blind_pct"]),
                    ]
                    for r in rows
                ],
                title=f"{cfg.name}: value of time against the same scenario run blind "
                "(total: GPU-hours at the catalogue price plus electricity)",
            )
        )
        print()
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return 0

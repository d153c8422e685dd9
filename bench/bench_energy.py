"""The value of time against electricity: `energy.value_of_time` swept on the price-aware
scenarios (Guangdong time-of-use, CAISO wholesale with carbon), each against the same
scenario run blind. Writes bench/results/energy.json and energy.md with the machine
described. The same curve prints with
`gpupool simulate scenario scenarios/energy-aware.yaml --value-of-time 0,0.05,...`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from gpupool.sim.scenario.config import load_scenario
from gpupool.sim.scenario.sweep import curve_rows, value_of_time_curve
from machine import describe

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = {
    # the tariff's currency per GPU-hour of delay
    "energy-aware": (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 1.0),
    "energy-caiso-aware": (0.0, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1),
}
COLUMNS = (
    ("point", "value of time"),
    ("electricity_saving_pct", "electricity saved %"),
    ("carbon_saving_pct", "carbon saved %"),
    ("mean_jct_h", "mean JCT h"),
    ("mean_jct_increase_pct", "mean JCT +%"),
    ("p95_jct_increase_pct", "p95 JCT +%"),
    ("deadline_misses", "deadline misses"),
    ("gpu_hours", "GPU-h"),
    ("total_cost", "total"),
    ("total_cost_vs_blind_pct", "total vs blind %"),
)


def markdown(payload: dict[str, Any]) -> str:
    m = payload["machine"]
    lines = [
        "# Value of time against electricity (`energy.value_of_time`)",
        "",
        f"{m['cpu']} ({m['cores']} cores), {payload['wall_s']} s. Reproduce: "
        "`.venv/bin/python bench/bench_energy.py`, or one curve with "
        "`gpupool simulate scenario scenarios/energy-aware.yaml --value-of-time "
        "0,0.1,0.2,0.3 --workers 2`.",
        "",
        "Each row is one run of the scenario; percentages are against the same scenario run "
        "blind (no deferral, no caps). `price only` is the scenario as shipped: deferral to "
        "the cheapest window within the deadline and caps while power is dearer than the "
        "mean. A value of time is the tariff's currency per GPU-hour of delay: deferral holds "
        "a job only while the electricity saved beats the GPUs' delay at that value, and a "
        "power cap is set only while its energy is worth more than the GPU-hours it adds at "
        "the value of time plus the GPU's catalogue price (total = GPU-hours at the "
        "catalogue price, converted with data/currencies.csv, plus electricity).",
    ]
    for name, rows in payload["curves"].items():
        currency = rows[0]["currency"]
        lines += ["", f"## {name} ({currency})", ""]
        lines.append("| " + " | ".join(h for _, h in COLUMNS) + " |")
        lines.append("|" + "---|" * len(COLUMNS))
        for r in rows:
            cells = [
                "-" if r[k] is None else f"{r[k]:,}" if isinstance(r[k], float) else str(r[k])
                for k, _ in COLUMNS
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    curves = {}
    for name, values in SWEEPS.items():
        cfg = load_scenario(ROOT / "scenarios" / f"{name}.yaml")
        curves[name] = curve_rows(value_of_time_curve(cfg, values, workers=args.workers))
        print(name, "done", round(time.perf_counter() - t0, 1), "s", flush=True)
    payload = {
        "machine": describe(),
        "wall_s": round(time.perf_counter() - t0, 1),
        "curves": curves,
    }
    out = ROOT / "bench" / "results"
    (out / "energy.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    (out / "energy.md").write_text(markdown(payload), encoding="utf-8")
    print(markdown(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

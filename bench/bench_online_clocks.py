"""Clocks that follow load for online inference: scenarios/online-clocks.yaml with
`energy.online_clocks` off and on. Writes bench/results/online-clocks.json and .md with the
machine described: the services' card energy and the cluster's, SLO attainment (requests,
and hourly windows whose p99 met the SLO) and the SM clock locks set and freed."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpupool.sim.scenario.config import load_scenario
from gpupool.sim.scenario.runner import run_scenario
from machine import describe
from usage import no_options

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "online-clocks.yaml"


def one(on: bool) -> dict[str, Any]:
    cfg = load_scenario(SCENARIO)
    e = cfg.scheduling.energy
    clocks = replace(e.online_clocks, enabled=on)
    cfg = replace(cfg, scheduling=replace(cfg.scheduling, energy=replace(e, online_clocks=clocks)))
    t0 = time.perf_counter()
    result = run_scenario(cfg, review=True)
    s = result.summary
    assert result.review is not None
    slo = {
        str(w["name"]): float(w.get("slo_p99_ms", 200.0))
        for w in cfg.workload
        if w["generator"] == "azure-service"
    }
    windows = result.review.latency
    met = sum(1 for w in windows if w.p99_ms <= slo[w.service] + 1e-9)
    return {
        "online_clocks": on,
        "serving_energy_kwh": s["teams"]["serving"]["energy_kwh"],
        "cluster_energy_kwh": s["energy_kwh"],
        "online_slo_attainment": s["online_slo_attainment"],
        "windows": len(windows),
        "windows_within_slo": met,
        "clock_locks": s["clock_locks"],
        "clock_unlocks": s["clock_unlocks"],
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def main() -> int:
    t0 = time.perf_counter()
    off, on = one(False), one(True)
    saved = 1.0 - on["serving_energy_kwh"] / off["serving_energy_kwh"]
    payload = {
        "machine": describe(),
        "wall_s": round(time.perf_counter() - t0, 1),
        "runs": [off, on],
        "serving_energy_saved": round(saved, 4),
    }
    out = ROOT / "bench" / "results"
    (out / "online-clocks.json").write_text(json.dumps(payload, indent=2) + "\n", "utf-8")
    m = payload["machine"]
    rows = [
        f"| {'on' if r['online_clocks'] else 'off'} | {r['serving_energy_kwh']:.1f} | "
        f"{r['cluster_energy_kwh']:.1f} | {100 * r['online_slo_attainment']:.3f}% | "
        f"{r['windows_within_slo']} of {r['windows']} | {r['clock_locks']} / {r['clock_unlocks']} |"
        for r in (off, on)
    ]
    text = "\n".join(
        [
            "# Clocks that follow load for online inference",
            "",
            f"{m['cpu']} ({m['cores']} cores), {payload['wall_s']} s. Reproduce: "
            "`.venv/bin/python bench/bench_online_clocks.py` (scenarios/online-clocks.yaml, "
            "72 h, two services on 16 A100-80GB).",
            "",
            "| online_clocks | services' card energy kWh | cluster kWh | requests within SLO | "
            "hourly windows with p99 within SLO | SM clock locks set / freed |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
            f"Services' card energy saved: {100 * saved:.1f}%. The latency and power of a "
            "locked clock are decode's published clock points (data/energy.json, "
            "`latency`): an assumption until a lent GPU measures a clock sweep.",
        ]
    )
    (out / "online-clocks.md").write_text(text + "\n", "utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    no_options(__doc__)
    raise SystemExit(main())

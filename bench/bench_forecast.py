"""Demand forecasts against simple opponents: `gpupool learn forecast` on real and shaped series.

Series:
- Helios Venus (SC '21), GPU-job submissions: the 10-minute counts as shipped (read from
  ../shared/traces/helios/, never copied: non-commercial licence) and summed to hours;
  jobs (`submit_gpu_job`) and GPUs asked (`submit_gpu_num`).
- The Azure service shape (scenario generator `azure-service`: Azure LLM 2023's minute
  burstiness tiled over a raised-cosine day, the shape the simulator's services follow),
  42 days of requests counted per 10 minutes as a Poisson process (seed 0): as the
  generator makes it (every day alike), and with weekends at 70% (an assumption: the
  2024 week-long trace, which would say, is not reachable here). Synthetic around one
  measured hour.

Each at horizons 1 h and 24 h, rolling origin after a 14-day cold start, weekly retrains.
Writes bench/results/learned-forecast.{json,md}. Reproduce:
`GPUPOOL_TRACES=../shared/traces .venv/bin/python bench/bench_forecast.py`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from gpupool.learning.forecast import ForecastSettings, evaluate
from gpupool.sim.scenario.generators.services import azure_envelope
from gpupool.sim.scenario.generators.traces import azure_minute_shape
from gpupool.traces.series import Series, read_series
from machine import describe
from usage import no_options

ROOT = Path(__file__).resolve().parents[1]
TRACES = Path(os.environ.get("GPUPOOL_TRACES", ROOT.parent / "shared" / "traces"))
HORIZONS = {"1h": 3600.0, "24h": 86_400.0}


def hourly(s: Series) -> Series:
    per = round(3600.0 / s.step_s)
    y = s.array()
    n = len(y) // per * per
    return Series(s.start_s, 3600.0, tuple(y[:n].reshape(-1, per).sum(axis=1).tolist()), s.name)


def azure_shape(weekend: float, days: int = 42, seed: int = 0) -> Series:
    az = TRACES / "azure-llm-inference-2023"
    minute = np.array(
        azure_minute_shape(
            (az / "AzureLLMInferenceTrace_code.csv", az / "AzureLLMInferenceTrace_conv.csv")
        )
    )
    t = np.arange(days * 1440) * 60.0
    of_day = np.arange(t.size) % 1440  # the generator makes one day and repeats it
    rps = azure_envelope(t, 14.0, 20.0, 4.0) * minute[of_day % minute.size]
    rps *= np.where((t // 86_400.0) % 7 >= 5, weekend, 1.0)
    per10 = rps.reshape(-1, 10).sum(axis=1) * 60.0  # expected requests per 10 minutes
    counts = np.random.default_rng(seed).poisson(per10).astype(np.float64)
    return Series(0.0, 600.0, tuple(counts.tolist()), "azure-service requests")


def one(label: str, series: Series) -> dict[str, Any]:
    t0 = time.perf_counter()
    scores = evaluate(series, list(HORIZONS.values()), ForecastSettings())
    out: dict[str, Any] = {
        "series": label,
        "steps": len(series.values),
        "step_s": series.step_s,
        "horizons": {},
    }
    for name, h in HORIZONS.items():
        sc = scores[h]
        opp = {m: round(v, 4) for m, v in sc.rel_mae.items() if m != "learned"}
        best = min(opp, key=lambda m: opp[m])
        out["horizons"][name] = {
            "learned": round(sc.rel_mae["learned"], 4),
            "opponents": opp,
            "best_opponent": best,
            "vs_best": round(sc.rel_mae["learned"] / opp[best] - 1.0, 4),
            "p90_coverage": round(sc.p90_coverage, 4),
            "origins": sc.origins,
        }
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out), flush=True)
    return out


def main() -> int:
    t0 = time.perf_counter()
    helios = TRACES / "helios" / "venus_cluster_throughput_10min.csv"
    runs = []
    for column, what in (("submit_gpu_job", "GPU jobs"), ("submit_gpu_num", "GPUs asked")):
        raw = read_series(helios, column)
        runs.append(one(f"Helios Venus {what} submitted, per 10 min", raw))
        runs.append(one(f"Helios Venus {what} submitted, per hour", hourly(raw)))
    runs.append(one("Azure service shape, every day alike, requests per 10 min", azure_shape(1.0)))
    runs.append(one("Azure service shape, weekends at 70%, requests per 10 min", azure_shape(0.7)))
    payload = {"machine": describe(), "wall_s": round(time.perf_counter() - t0, 1), "runs": runs}
    out = ROOT / "bench" / "results"
    (out / "learned-forecast.json").write_text(json.dumps(payload, indent=2) + "\n", "utf-8")
    m = payload["machine"]
    rows = []
    for r in runs:
        for name, h in r["horizons"].items():
            rows.append(
                f"| {r['series']} | {name} | {h['learned']:.3f} | "
                f"{h['opponents'][h['best_opponent']]:.3f} ({h['best_opponent']}) | "
                f"{100 * h['vs_best']:+.1f}% | {100 * h['p90_coverage']:.1f}% |"
            )
    text = "\n".join(
        [
            "# Demand forecasts: the learned forecaster against simple opponents",
            "",
            f"{m['cpu']} ({m['cores']} cores), {payload['wall_s']} s. Reproduce: "
            "`GPUPOOL_TRACES=../shared/traces .venv/bin/python bench/bench_forecast.py` "
            "(one series: `gpupool learn forecast --series FILE.csv --json OUT`).",
            "",
            "Rolling origin after a 14-day cold start, retrained weekly on the past only. "
            "Relative MAE: mean absolute error over the mean actual value. Opponents: last "
            "value, same hour yesterday, median of the same hour over the last 7 days.",
            "",
            "| series | horizon | learned rel. MAE | best opponent | learned vs best | "
            "learned p90 coverage |",
            "|---|---|---|---|---|---|",
            *rows,
        ]
    )
    (out / "learned-forecast.md").write_text(text + "\n", "utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    no_options(__doc__)
    raise SystemExit(main())

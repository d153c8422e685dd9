"""Scaling a service on its demand forecast against the reactive rule, in the simulator.

The service: an online service whose rate follows the simulator's Azure shape (Azure LLM
2023's minute burstiness, read from ../shared/traces/, tiled over a raised-cosine day), with
a day-to-day level that wanders (an AR(1) in log, sd 0.08 a day; seeded) and weekends at
75% (both assumptions: the week-long Azure trace that would say is not reachable here),
35 days, sampled each minute. The world feeds the core the offered rate each cycle
(ServiceRate, as the live service does with its scraped rate); the core decides:

- `reactive`: replicas for the highest rate measured over the last look-ahead (10 min);
- `forecast`: replicas for the learned p90 of the peak over the next 20 min, while its
  error over the last 7 days beats the simple opponents, else reactive; the first 14 days
  are the cold start (reactive);
- `forecast, shifted 12 h`: the same, with every forecast the one made 12 hours earlier
  (a wrong model): the guard must keep it out.

Each at headroom 1.0, 1.05, 1.1 (the default), 1.15, 1.2 and 1.3, with the live service's look-ahead
(600 s) and scale-down wait (300 s). Judged after the cold start (days 14-35): GPU-hours
held by the service's replicas and SLO attainment (requests served within the p99 SLO).
The acceptance compares at equal or better attainment: for each reactive setting, the
cheapest forecast setting whose attainment is at least as high.

Writes bench/results/learned-autoscale.{json,md}. Reproduce:
`GPUPOOL_TRACES=../shared/traces .venv/bin/python bench/bench_autoscale_forecast.py`
(`--days`, `--headrooms` for a quicker look; `--tables-only` redraws the tables from the
.json).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpupool.scheduler.commands import LearnGuard
from gpupool.sim.scenario.config import parse_scenario
from gpupool.sim.scenario.generators.services import azure_envelope
from gpupool.sim.scenario.generators.traces import azure_minute_shape
from gpupool.sim.scenario.workload import LoadCurve, ServiceSpec, Workload
from gpupool.sim.scenario.world import ScenarioSim
from machine import describe

ROOT = Path(__file__).resolve().parents[1]
TRACES = Path(os.environ.get("GPUPOOL_TRACES", ROOT.parent / "shared" / "traces"))
DAY_S = 86_400.0
COLD_DAYS = 14
REPLICA_RPS = 10.0


def load_curve(days: int, seed: int = 0) -> LoadCurve:
    az = TRACES / "azure-llm-inference-2023"
    minute = np.array(
        azure_minute_shape(
            (az / "AzureLLMInferenceTrace_code.csv", az / "AzureLLMInferenceTrace_conv.csv")
        )
    )
    t = np.arange(days * 1440) * 60.0
    rng = np.random.default_rng(seed)
    level = np.empty(days)
    x = 0.0
    for d in range(days):
        x = 0.7 * x + rng.normal(0.0, 0.08)
        level[d] = np.exp(x)
    day = (t // DAY_S).astype(int)
    weekend = np.where(day % 7 >= 5, 0.75, 1.0)
    rps = azure_envelope(t, 14.0, 300.0, 75.0) * minute[np.arange(t.size) % minute.size]
    rps = rps * level[day] * weekend
    return LoadCurve(tuple(t.tolist()), tuple(rps.tolist()))


class Meter(ScenarioSim):
    """The world, keeping each hour's requests and those served within the SLO."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hour_req: dict[int, float] = {}
        self.hour_ok: dict[int, float] = {}

    def serve(self, now: float, end: float) -> None:
        stats = self.service_stats["chat"]
        req, ok = stats.requests, stats.ok
        super().serve(now, end)
        h = int(now // 3600)
        self.hour_req[h] = self.hour_req.get(h, 0.0) + stats.requests - req
        self.hour_ok[h] = self.hour_ok.get(h, 0.0) + stats.ok - ok


@dataclass(frozen=True)
class Run:
    rule: str
    headroom: float
    gpu_h: float
    attainment: float
    requests: float
    """Requests offered after the cold start (the attainment's denominator)."""
    gpu_h_all: float
    attainment_all: float
    trusted_share: float
    guard: list[str]
    wall_s: float


def run_one(rule: str, headroom: float, days: int, curve: LoadCurve) -> Run:
    demand = "reactive" if rule == "reactive" else "forecast"
    auto: dict[str, Any] = {
        "demand": demand,
        "headroom": headroom,
        "lookahead_s": 600,
        "down_stable_s": 300,
    }
    if rule == "shifted":
        auto["forecast"] = {"fault": "shifted-12h"}
    cfg = parse_scenario(
        {
            "name": f"autoscale-{rule}",
            "horizon_h": days * 24,
            "cluster": [{"gpu_type": "H100-80GB", "nodes": 8, "gpus_per_node": 8}],
            "teams": [{"name": "web"}],
            "workload": [],
            "cycle_s": 60.0,
            "online_reserve": 0.0,
            "autoscale": auto,
        }
    )
    svc = ServiceSpec("chat", "web", curve, replica_rps=REPLICA_RPS, max_replicas=64)
    t0 = time.perf_counter()
    sim = Meter(cfg, Workload(services=(svc,)))
    sim.run()
    wall = time.perf_counter() - t0
    cold_h = COLD_DAYS * 24
    hours = range(len(sim.hour_gpu_s))
    after = [h for h in hours if h >= cold_h]
    req = sum(sim.hour_req.get(h, 0.0) for h in after)
    ok = sum(sim.hour_ok.get(h, 0.0) for h in after)
    guard = [
        f"day {c.t_s / DAY_S:.2f}: {c.state}: {c.reason}"
        for c in sim.learn_records
        if isinstance(c, LearnGuard)
    ]
    trusted = trusted_share(sim.learn_records, cold_h * 3600.0, days * DAY_S)
    total_req = sum(sim.hour_req.values())
    return Run(
        rule,
        headroom,
        sum(sim.hour_gpu_s[h] for h in after) / 3600.0,
        ok / req if req else 1.0,
        req,
        sum(sim.hour_gpu_s) / 3600.0,
        sum(sim.hour_ok.values()) / total_req if total_req else 1.0,
        trusted,
        guard,
        wall,
    )


def trusted_share(records: list[Any], t0: float, t1: float) -> float:
    """Share of [t0, t1] the forecast was trusted."""
    state, since, total = "cold", 0.0, 0.0
    for c in records:
        if not isinstance(c, LearnGuard):
            continue
        if state == "trusted":
            total += max(0.0, min(c.t_s, t1) - max(since, t0))
        state, since = c.state, c.t_s
    if state == "trusted":
        total += max(0.0, t1 - max(since, t0))
    return total / (t1 - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", type=int, default=35)
    ap.add_argument("--headrooms", default="1.0,1.05,1.1,1.15,1.2,1.3")
    ap.add_argument("--rules", default="reactive,forecast,shifted")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument(
        "--tables-only", action="store_true", help="redraw the .md from the .json in --out"
    )
    args = ap.parse_args()
    if args.tables_only:
        saved = json.loads((args.out / "learned-autoscale.json").read_text())
        saved["acceptance"] = judge([Run(**r) for r in saved["runs"]])
        (args.out / "learned-autoscale.json").write_text(json.dumps(saved, indent=1) + "\n")
        (args.out / "learned-autoscale.md").write_text(markdown(saved))
        return
    t0 = time.perf_counter()
    curve = load_curve(args.days)
    runs: list[Run] = []
    for rule in args.rules.split(","):
        for h in (float(x) for x in args.headrooms.split(",")):
            r = run_one(rule, h, args.days, curve)
            runs.append(r)
            print(
                f"{rule:9s} headroom {h:.2f}: {r.gpu_h:8.1f} GPU-h, attainment "
                f"{r.attainment:.5f}, trusted {r.trusted_share:.2f} ({r.wall_s:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    report = judge(runs)
    out: dict[str, Any] = {
        "machine": describe(),
        "days": args.days,
        "cold_start_days": COLD_DAYS,
        "wall_s": round(time.perf_counter() - t0, 1),
        "runs": [r.__dict__ for r in runs],
        "acceptance": report,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "learned-autoscale.json").write_text(json.dumps(out, indent=1) + "\n")
    (args.out / "learned-autoscale.md").write_text(markdown(out))
    print(markdown(out))


def as_good(a: Run, b: Run) -> bool:
    """a's SLO attainment is at least b's, to within one request (a float's last digits)."""
    return (1 - a.attainment) * a.requests <= (1 - b.attainment) * b.requests + 1.0


def interpolated_gpu_h(curve: list[Run], attainment: float) -> float | None:
    """GPU-hours the rule would need for this attainment, linear between its settings
    (None outside the range its settings reached)."""
    pts = sorted((r.attainment, r.gpu_h) for r in curve)
    for (a0, g0), (a1, g1) in itertools.pairwise(pts):
        if a0 <= attainment <= a1:
            return g0 if a1 == a0 else g0 + (g1 - g0) * (attainment - a0) / (a1 - a0)
    return None


def judge(runs: list[Run]) -> list[dict[str, Any]]:
    by = {(r.rule, r.headroom): r for r in runs}
    lines: list[dict[str, Any]] = []
    for (rule, h), r in sorted(by.items()):
        if rule != "reactive":
            continue
        fits = [f for f in runs if f.rule == "forecast" and as_good(f, r)]
        best = min(fits, key=lambda f: f.gpu_h) if fits else None
        saved = 1 - best.gpu_h / r.gpu_h if best else None
        lines.append(
            {
                "check": f"forecast: >= 15% fewer GPU-hours than reactive at headroom {h:.2f}, "
                "at equal or better SLO attainment (a measured forecast setting)",
                "pass": saved is not None and saved >= 0.15,
                "figures": (
                    f"reactive {r.gpu_h:.1f} GPU-h at {r.attainment:.5f}; forecast "
                    + (
                        f"{best.gpu_h:.1f} GPU-h at {best.attainment:.5f} (headroom "
                        f"{best.headroom:.2f}): {saved:+.1%} saved"
                        if best and saved is not None
                        else "reaches no setting as good"
                    )
                ),
            }
        )
        at = interpolated_gpu_h([f for f in runs if f.rule == "forecast"], r.attainment)
        lines.append(
            {
                "check": f"the same on the forecast's cost-attainment curve (linear between its "
                f"settings) at reactive headroom {h:.2f}'s attainment",
                "pass": at is not None and 1 - at / r.gpu_h >= 0.15,
                "figures": "outside the forecast's measured range"
                if at is None
                else f"forecast {at:.1f} GPU-h at {r.attainment:.5f}: "
                f"{1 - at / r.gpu_h:+.1%} saved",
            }
        )
        s = by.get(("shifted", h))
        if s is not None:
            ok = s.gpu_h <= 1.05 * r.gpu_h and (1 - s.attainment) <= 1.05 * (1 - r.attainment)
            lines.append(
                {
                    "check": f"shifted 12 h, guarded: within 1.05x of reactive at headroom {h:.2f} "
                    "(GPU-hours and SLO misses)",
                    "pass": ok,
                    "figures": (
                        f"{s.gpu_h / r.gpu_h:.3f}x GPU-h, misses {1 - s.attainment:.5f} vs "
                        f"{1 - r.attainment:.5f}; trusted {s.trusted_share:.0%} of the time"
                    ),
                }
            )
    return lines


def markdown(out: dict[str, Any]) -> str:
    m = out["machine"]
    lines = [
        "# Scaling a service on its demand forecast (simulator)",
        "",
        __doc__.split("\n\n", 1)[1].strip(),
        "",
        f"Machine: cpu {m.get('cpu')}, cores {m.get('cores')}; run time {out['wall_s']:.0f} s.",
        "",
        "| rule | headroom | GPU-h (days 14+) | SLO attainment (days 14+) | GPU-h (all) | "
        "attainment (all) | forecast trusted (days 14+) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in out["runs"]:
        lines.append(
            f"| {r['rule']} | {r['headroom']:.2f} | {r['gpu_h']:.1f} | {r['attainment']:.5f} | "
            f"{r['gpu_h_all']:.1f} | {r['attainment_all']:.5f} | {r['trusted_share']:.0%} |"
        )
    lines += ["", "## Acceptance", "", "| check | result | figures |", "|---|---|---|"]
    for a in out["acceptance"]:
        verdict = "PASS" if a["pass"] else "FAIL"
        lines.append(f"| {a['check']} | {verdict} | {a['figures']} |")
    lines += ["", "## The guard's changes", ""]
    for r in out["runs"]:
        if r["rule"] != "reactive" and r["headroom"] == 1.1:
            lines.append(f"- {r['rule']} (headroom 1.1):")
            lines += [f"  - {g}" for g in r["guard"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

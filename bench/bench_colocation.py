"""Co-location that predicts its slowdown (issue 34): the learned pair admission against the
utilisation-sum rule, on the Lucid measurements and in the simulator.

1. Leave-one-model-pair-out on the 1,388 measured Lucid pairs (read from
   ../shared/traces/lucid-colocation/, never copied: non-commercial licence): each pair is
   predicted by a model trained without its pair of models. The rule admits a pair when
   the two solo SM utilisations sum to at most a threshold calibrated to admit 73% of the
   pairs; the learned admission admits the same number of pairs, those with the highest
   predicted slower speed. Judged: the share of admitted pairs where a job ran below 0.85x.
2. The simulator (sim/scenario/colocation.py): single-GPU training jobs with the measured
   profiles arrive at 1.6x what 32 whole cards serve, for 72 h, seeds 0-2, through the one
   core; each pair runs at its measured speeds. Whole cards, sharing with the rule, with
   the rule tightened to the learned admission's rate, and with the learned admission
   (LOMPO models; its speed threshold chosen on the LOMPO predictions of part 1, as the
   lowest of 0.85-0.95 whose admitted pairs were slowed at most 5% of the time).

Writes bench/results/learned-colocation.{json,md}. Reproduce:
`PYTHONPATH=src GPUPOOL_TRACES=../shared/traces .venv/bin/python bench/bench_colocation.py`.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from gpupool.learning.colocation import (
    SLOW_SPEED,
    LompoModel,
    PredictorSettings,
    SpeedPredictor,
    SumRule,
    admit_top,
    lompo_folds,
    lompo_predictions,
    score_admission,
)
from gpupool.learning.colocation_admission import AdmissionMode, PairAdmissionPolicy
from gpupool.learning.colocation_config import RULE_ADMIT_SHARE
from gpupool.sim.scenario.colocation import ColocationScenario, run
from gpupool.traces.location import find_traces_dir
from gpupool.traces.lucid import LUCID_DIR, LucidData, read_lucid
from machine import describe
from usage import no_options

ROOT = Path(__file__).resolve().parents[1]
RULE_ADMITS = RULE_ADMIT_SHARE
"""The rule's admission rate the issue states (11% of the 73% it admits are slowed); the
configured rule's default bound admits the same share (learning/colocation_config.py)."""
THRESHOLDS = tuple(round(0.85 + 0.01 * i, 2) for i in range(11))
SIM_SLOW_BOUND = 0.05
SEEDS = (0, 1, 2)
DRIFT = (24 * 3600.0, 36 * 3600.0, 0.8)
LOADS = (1.6, 2.5)
"""Arrivals over the whole cards' capacity: at 1.6 the sharing modes serve nearly all the
work that arrives (their throughput is bounded by it), at 2.5 every mode is saturated."""
COMMAND = (
    "PYTHONPATH=src GPUPOOL_TRACES=../shared/traces .venv/bin/python bench/bench_colocation.py"
)


def pct(x: float) -> float:
    return round(100.0 * x, 2)


def offline(data: LucidData) -> dict[str, Any]:
    pairs, profiles = data.pairs, data.profiles
    t0 = time.perf_counter()
    pred = lompo_predictions(pairs, profiles)
    lompo_s = time.perf_counter() - t0
    truth = np.array([[p.first_speed, p.second_speed] for p in pairs])
    min_true = truth.min(axis=1)
    score = pred.min(axis=1)
    rule = SumRule.calibrated(pairs, profiles, RULE_ADMITS)
    by_rule = np.array([rule.admits(profiles[p.first], profiles[p.second]) for p in pairs])
    sums = np.array([profiles[p.first].sm_util_pct + profiles[p.second].sm_util_pct for p in pairs])
    r = score_admission(by_rule, min_true)
    learned = score_admission(admit_top(score, r.admitted_share), min_true)
    curve = []
    for share in (0.5, 0.6, 0.7, RULE_ADMITS, 0.8, 0.9):
        curve.append(
            {
                "admitted_pct": pct(share),
                "rule_slowed_pct": pct(
                    score_admission(admit_top(-sums, share), min_true).slowed_share_of_admitted
                ),
                "learned_slowed_pct": pct(
                    score_admission(admit_top(score, share), min_true).slowed_share_of_admitted
                ),
                "oracle_slowed_pct": pct(
                    score_admission(admit_top(min_true, share), min_true).slowed_share_of_admitted
                ),
            }
        )
    fixed = []
    for th in THRESHOLDS:
        s = score_admission(score >= th, min_true)
        fixed.append(
            {
                "min_speed": th,
                "admitted_pct": pct(s.admitted_share),
                "slowed_pct": pct(s.slowed_share_of_admitted),
                "rule_at_that_rate_slowed_pct": pct(
                    score_admission(
                        admit_top(-sums, s.admitted_share), min_true
                    ).slowed_share_of_admitted
                ),
            }
        )
    chosen = next(
        (f["min_speed"] for f in fixed if f["slowed_pct"] <= 100 * SIM_SLOW_BOUND), THRESHOLDS[-1]
    )
    # Why not better: pairs of models seen in training (random folds), and how close to
    # the line the admitted slowed pairs are.
    rng = np.random.default_rng(0)
    fold = rng.integers(0, 5, len(pairs))
    random_pred = np.full_like(pred, np.nan)
    for k in range(5):
        model = SpeedPredictor([p for p, f in zip(pairs, fold, strict=True) if f != k], profiles)
        test = [i for i in range(len(pairs)) if fold[i] == k]
        random_pred[test] = model.predict_many([pairs[i] for i in test], profiles)
    random_cv = score_admission(admit_top(random_pred.min(axis=1), r.admitted_share), min_true)
    adm = admit_top(score, r.admitted_share)
    bad = adm & (min_true < SLOW_SPEED)
    same = [abs(p.first_speed - p.second_speed) for p in pairs if p.first == p.second]
    return {
        "pairs": len(pairs),
        "profiles": len(profiles),
        "model_pairs": len(lompo_folds(pairs)),
        "slowed_pairs_pct": pct(float((min_true < SLOW_SPEED).mean())),
        "lompo_wall_s": round(lompo_s, 1),
        "settings": PredictorSettings().__dict__,
        "rule_max_sum_sm_pct": rule.max_sum_sm_pct,
        "rule": {
            "admitted_pct": pct(r.admitted_share),
            "slowed_pct": pct(r.slowed_share_of_admitted),
        },
        "learned_at_rule_rate": {
            "admitted_pct": pct(learned.admitted_share),
            "slowed_pct": pct(learned.slowed_share_of_admitted),
        },
        "speed_mae": round(float(np.abs(pred - np.minimum(truth, 1.0)).mean()), 4),
        "curve": curve,
        "fixed_thresholds": fixed,
        "chosen_min_speed": chosen,
        "random_5fold_at_rule_rate_slowed_pct": pct(random_cv.slowed_share_of_admitted),
        "admitted_slowed_within_0.05_of_line_pct": pct(
            float((min_true[bad] >= SLOW_SPEED - 0.05).mean()) if bad.any() else 0.0
        ),
        "same_config_pairs": len(same),
        "same_config_speed_gap_median": round(float(np.median(same)), 4),
        "speeds_above_1_pct": pct(float((truth > 1.0).mean())),
    }


def simulate(data: LucidData, off: dict[str, Any]) -> dict[str, Any]:
    pairs, profiles = data.pairs, data.profiles
    t0 = time.perf_counter()
    lompo = LompoModel(pairs, profiles)
    train_s = time.perf_counter() - t0
    rule = SumRule(off["rule_max_sum_sm_pct"])
    chosen = off["chosen_min_speed"]
    learned_rate = next(
        f["admitted_pct"] for f in off["fixed_thresholds"] if f["min_speed"] == chosen
    )
    tight = SumRule.calibrated(pairs, profiles, learned_rate / 100.0)
    modes: dict[str, Any] = {
        "whole": lambda: None,
        "rule": lambda: PairAdmissionPolicy(profiles, rule, mode=AdmissionMode.RULE),
        "rule-tight": lambda: PairAdmissionPolicy(profiles, tight, mode=AdmissionMode.RULE),
        "learned": lambda: PairAdmissionPolicy(profiles, rule, lompo, min_speed=chosen),
    }
    runs = []
    for load, seed in itertools.product(LOADS, SEEDS):
        sc = ColocationScenario(seed=seed, load=load)
        for mode, make in modes.items():
            t1 = time.perf_counter()
            r = run(sc, mode, pairs, profiles, make())
            runs.append(
                {
                    "load": load,
                    "seed": seed,
                    "mode": mode,
                    "throughput": round(r.throughput, 4),
                    "colocated_job_h": round(r.colocated_job_s / 3600, 1),
                    "slow_job_h": round(r.slow_job_s / 3600, 1),
                    "slow_pct": pct(r.slow_share),
                    "jobs_submitted": r.jobs_submitted,
                    "jobs_finished": r.jobs_finished,
                    "pairs_started": r.pairs_started,
                    "guard_changes": list(r.guard_changes),
                    "wall_s": round(time.perf_counter() - t1, 1),
                }
            )
            print(json.dumps(runs[-1]), flush=True)
    summary: dict[str, dict[str, Any]] = {}
    for load in LOADS:
        at = summary[str(load)] = {}
        for mode in modes:
            rs = [x for x in runs if x["mode"] == mode and x["load"] == load]
            co = sum(x["colocated_job_h"] for x in rs)
            at[mode] = {
                "throughput_mean": round(float(np.mean([x["throughput"] for x in rs])), 4),
                "slow_pct_pooled": pct(sum(x["slow_job_h"] for x in rs) / co) if co else 0.0,
                "guard_changes": sum(len(x["guard_changes"]) for x in rs),
            }
        for s in at.values():
            s["gain_over_whole_pct"] = pct(
                s["throughput_mean"] / at["whole"]["throughput_mean"] - 1
            )
    # The guard in the simulator: from hour 24 to 36 every co-located job runs at 0.8x its
    # measured speed (a synthetic drift the model cannot know).
    drift_sc = ColocationScenario(seed=0, load=LOADS[-1], drift=DRIFT)
    t1 = time.perf_counter()
    dr = run(drift_sc, "learned", pairs, profiles, modes["learned"]())
    drift = {
        "load": LOADS[-1],
        "seed": 0,
        "drift": list(DRIFT),
        "throughput": round(dr.throughput, 4),
        "slow_pct": pct(dr.slow_share),
        "guard_changes": list(dr.guard_changes),
        "wall_s": round(time.perf_counter() - t1, 1),
    }
    print(json.dumps(drift), flush=True)
    sc = ColocationScenario()
    return {
        "drift_run": drift,
        "scenario": sc.__dict__,
        "gpus": sc.nodes * sc.gpus_per_node,
        "lompo_models_train_s": round(train_s, 1),
        "learned_min_speed": chosen,
        "rule_tight_max_sum_sm_pct": tight.max_sum_sm_pct,
        "runs": runs,
        "summary": summary,
    }


def acceptance(off: dict[str, Any], sim: dict[str, Any]) -> list[dict[str, Any]]:
    rule, learned = off["rule"], off["learned_at_rule_rate"]
    runs = sim["runs"]

    def whole_of(x: dict[str, Any]) -> float:
        return float(
            next(
                y["throughput"]
                for y in runs
                if (y["load"], y["seed"], y["mode"]) == (x["load"], x["seed"], "whole")
            )
        )

    mine = [x for x in runs if x["mode"] == "learned"]
    per_seed = [x["throughput"] / whole_of(x) - 1.0 for x in mine]
    half = rule["slowed_pct"] / 2
    seeds = ", ".join(
        f"{x['load']}x/{x['seed']}: {100 * g:+.1f}%" for x, g in zip(mine, per_seed, strict=True)
    )
    slow_seeds = [x["slow_pct"] for x in mine]
    at_load = sim["summary"].items()
    gains = ", ".join(
        f"load {load}: {at['learned']['throughput_mean']:.3f} against "
        f"{at['whole']['throughput_mean']:.3f} ({at['learned']['gain_over_whole_pct']:+.1f}%)"
        for load, at in at_load
    )
    slows = ", ".join(
        f"load {load}: {at['learned']['slow_pct_pooled']:.2f}%" for load, at in at_load
    )
    return [
        {
            "line": "LOMPO on the Lucid pairs, at the rule's admission rate: at most half the "
            "rule's share of admitted pairs slowed below 0.85x",
            "figures": f"rule admits {rule['admitted_pct']:.1f}% of pairs, "
            f"{rule['slowed_pct']:.2f}% of them slowed; learned at the same rate: "
            f"{learned['slowed_pct']:.2f}% (needs <= {half:.2f}%)",
            "pass": learned["slowed_pct"] <= half,
        },
        {
            "line": "Simulator: sharing with the learned admission raises GPU-time throughput "
            ">= 10% over whole cards",
            "figures": f"{gains}; per load/seed {seeds}",
            "pass": min(per_seed) >= 0.10,
        },
        {
            "line": "Simulator: at most 5% of co-located job-time below 0.85x speed",
            "figures": f"seeds pooled, {slows} (per load and seed: "
            f"{', '.join(f'{x:.2f}%' for x in slow_seeds)})",
            "pass": max(slow_seeds) <= 5.0,
        },
    ]


def markdown(payload: dict[str, Any]) -> str:
    m, off, sim = payload["machine"], payload["offline"], payload["simulator"]
    lines = [
        "# Co-location that predicts its slowdown (issue 34)",
        "",
        f"{m['cpu']} ({m['cores']} cores, shared with other work), {payload['wall_s']} s. "
        f"Reproduce: `{COMMAND}`.",
        "",
        "Data: Lucid (Hu et al., ASPLOS '23), "
        f"{off['pairs']} pairs of training jobs measured together on one RTX 3090, "
        f"{off['profiles']} solo profiles, {off['model_pairs']} unordered pairs of models; "
        f"{off['slowed_pairs_pct']:.1f}% of the pairs have a job below 0.85x. Read from "
        "`../shared/traces/lucid-colocation/` (non-commercial licence; not in the project).",
        "",
        "## Acceptance",
        "",
        "| line | figures | result |",
        "|---|---|---|",
        *(
            f"| {a['line']} | {a['figures']} | {'PASS' if a['pass'] else 'FAIL'} |"
            for a in payload["acceptance"]
        ),
        "",
        "## Leave-one-model-pair-out",
        "",
        f"Predictor: LightGBM, monotone, {off['settings']['num_leaves']} leaves, "
        f"{off['settings']['rounds']} rounds, one thread, seed {off['settings']['seed']}; "
        f"{off['model_pairs']} folds in {off['lompo_wall_s']} s. Mean absolute error of a "
        f"job's speed (capped at 1): {off['speed_mae']:.3f}. The rule: solo SM "
        f"utilisations summed <= {off['rule_max_sum_sm_pct']:.1f}%.",
        "",
        "Slowed share of the admitted pairs at equal admission rates (oracle: the measured "
        "speeds themselves, the floor):",
        "",
        "| admitted | rule | learned | oracle |",
        "|---:|---:|---:|---:|",
        *(
            f"| {c['admitted_pct']:.0f}% | {c['rule_slowed_pct']:.2f}% | "
            f"{c['learned_slowed_pct']:.2f}% | {c['oracle_slowed_pct']:.2f}% |"
            for c in off["curve"]
        ),
        "",
        "The learned admission at fixed speed thresholds (both predicted speeds at least this):",
        "",
        "| min speed | admitted | slowed | rule at that rate |",
        "|---:|---:|---:|---:|",
        *(
            f"| {f['min_speed']:.2f} | {f['admitted_pct']:.1f}% | {f['slowed_pct']:.2f}% | "
            f"{f['rule_at_that_rate_slowed_pct']:.2f}% |"
            for f in off["fixed_thresholds"]
        ),
        "",
        "Why the 73% line is not halved:",
        f"- With every model pair seen in training (random 5-fold over pairs) the learned "
        f"admission at the rule's rate is at {off['random_5fold_at_rule_rate_slowed_pct']:.2f}%: "
        "holding the model pair out is not what limits it; the solo profiles (SM, bandwidth, "
        "memory) are.",
        f"- {off['admitted_slowed_within_0.05_of_line_pct']:.0f}% of the slowed pairs the learned "
        "admission lets in at that rate ran at 0.80-0.85x: just under the line.",
        f"- Measurement noise: {off['speeds_above_1_pct']:.1f}% of measured speeds are above 1; "
        f"{off['same_config_pairs']} pairs of two identical jobs differ by "
        f"{off['same_config_speed_gap_median']:.3f} in median between the two jobs' speeds.",
        "",
        "## Simulator",
        "",
        f"{sim['gpus']} RTX 3090-like cards, single-GPU training jobs (measured profiles whose "
        "every pairing was measured) arriving at "
        f"{' and '.join(str(x) for x in LOADS)}x the whole cards' capacity for "
        f"{sim['scenario']['horizon_s'] / 3600:.0f} h, work log-normal (median "
        f"{sim['scenario']['median_work_s'] / 3600:.0f} h), seeds "
        f"{', '.join(str(s) for s in SEEDS)}, through the one core (priority-quota, "
        "half-card shares). Each job of a pair runs at its measured speed (capped at 1). "
        f"Learned: LOMPO models ({sim['lompo_models_train_s']} s to train), both predicted "
        f"speeds >= {sim['learned_min_speed']:.2f} (chosen above: the lowest threshold whose "
        f"LOMPO slowed share is <= {100 * SIM_SLOW_BOUND:.0f}%), guarded. rule-tight: the sum "
        f"rule at <= {sim['rule_tight_max_sum_sm_pct']:.1f}%, admitting the share of pairs the "
        "learned threshold admits. Throughput: work done at solo speed per GPU-second.",
        "",
        "| load | mode | throughput (mean) | vs whole cards | co-located job-time below 0.85x | "
        "guard changes |",
        "|---:|---|---:|---:|---:|---:|",
        *(
            f"| {load} | {mode} | {s['throughput_mean']:.3f} | {s['gain_over_whole_pct']:+.1f}% | "
            f"{s['slow_pct_pooled']:.2f}% | {s['guard_changes']} |"
            for load, at in sim["summary"].items()
            for mode, s in at.items()
        ),
        "",
        f"The guard in the simulator (load {sim['drift_run']['load']}, seed 0, learned): from "
        f"hour {DRIFT[0] / 3600:.0f} to {DRIFT[1] / 3600:.0f} every co-located job runs at "
        f"{DRIFT[2]}x its measured speed. Its changes, from the core's decision log:",
        "",
        *(f"- {c}" for c in sim["drift_run"]["guard_changes"]),
        "",
        f"(throughput {sim['drift_run']['throughput']:.3f}, "
        f"{sim['drift_run']['slow_pct']:.2f}% of co-located job-time below 0.85x, drift "
        "included).",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    traces = find_traces_dir(ROOT)
    folder = traces / LUCID_DIR if traces is not None else None
    if folder is None or not folder.is_dir():
        print(f"no {LUCID_DIR} folder: set GPUPOOL_TRACES to …/shared/traces", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    data = read_lucid(folder)
    off = offline(data)
    print(json.dumps({k: v for k, v in off.items() if k not in ("curve", "fixed_thresholds")}))
    sim = simulate(data, off)
    payload: dict[str, Any] = {
        "machine": describe(),
        "command": COMMAND,
        "offline": off,
        "simulator": sim,
    }
    payload["acceptance"] = acceptance(off, sim)
    payload["wall_s"] = round(time.perf_counter() - t0, 1)
    out = ROOT / "bench" / "results"
    (out / "learned-colocation.json").write_text(json.dumps(payload, indent=1) + "\n", "utf-8")
    text = markdown(payload)
    (out / "learned-colocation.md").write_text(text, "utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    no_options(__doc__)
    raise SystemExit(main())

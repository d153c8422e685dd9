"""How well GPU-time is predicted on Microsoft ITP 2021, under a strict time split.

For each cluster the jobs are taken in submit order; each job finishes at submit +
duration (what an immediate-start schedule gives), and becomes training data only then.
Every job is predicted at its submit with the model of that moment and the History as it
stood (only jobs finished before it). Models are retrained weekly, the first once 100
jobs have finished. Compared on the same jobs: the LightGBM quantile model, the
recent-median yardstick, and the two deliberately wrong predictors (the LightGBM model's
predictions shuffled between jobs, and mirrored around the median).

Accuracy is what the guard measures: the share of q50 predictions within 2x of the
actual GPU-time, and Spearman's rank correlation. Besides the whole-trace figures, the
guard's view: windows of the guard's size (`GuardConfig.window_jobs` consecutive finished
jobs, in finish order, a step of 50), the median rank correlation within them (how well a
predictor ranks jobs that finish near each other, which is what an order needs), and the
share of those windows whose figures pass the guard's thresholds (`GuardConfig`
defaults). Writes bench/results/predictor-accuracy.md (and .json).

    .venv/bin/python bench/predictor_accuracy.py [--clusters cluster01,cluster02]
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from gpupool.domain.model import JobSpec
from gpupool.learning.baseline import RecentMedianPredictor
from gpupool.learning.faults import InvertedPredictor, ShuffledPredictor
from gpupool.learning.guard import GuardConfig, spearman
from gpupool.learning.history import History, JobFacts, Outcome
from gpupool.learning.lightgbm_model import LightGbmPredictor
from gpupool.learning.predictor import Predictor
from gpupool.traces.itp import read_itp
from machine import describe

STEP = 50
KINDS = ("lightgbm", "recent-median", "shuffled", "inverted")


def shared_itp() -> Path:
    for base in (Path(__file__).resolve().parents[2] / "shared", Path("/work/shared")):
        p = base / "traces" / "microsoft-itp-2021" / "raw-traces"
        if p.is_dir():
            return p
    raise SystemExit("shared/traces/microsoft-itp-2021 not found beside the repository")


def within_2x(pred: np.ndarray, actual: np.ndarray) -> float:
    r = pred / np.maximum(actual, 1e-9)
    return float(np.mean((r >= 0.5) & (r <= 2.0))) if r.size else float("nan")


def evaluate(jobs: list[JobSpec], guard: GuardConfig) -> dict[str, object]:
    started = time.perf_counter()
    submits = [j.submit_s for j in jobs]
    lgbm = LightGbmPredictor()
    median = RecentMedianPredictor(retrain_every_s=lgbm.settings.retrain_every_s)
    wrapped: dict[str, Predictor] = {
        "lightgbm": lgbm,
        "recent-median": median,
        "shuffled": ShuffledPredictor(lgbm, seed=0),
        "inverted": InvertedPredictor(lgbm),
    }
    history = History()
    pending: list[tuple[float, str, JobFacts, float]] = []
    rows: list[tuple[float, float, list[float]]] = []  # finish, actual, predictions by kind
    retrain_s = 0.0
    predict_s = 0.0
    predicted = 0
    for spec in sorted(jobs, key=lambda j: (j.submit_s, j.job_id)):
        t = spec.submit_s
        while pending and pending[0][0] <= t:
            finish, _, facts, gpu_s = heapq.heappop(pending)
            history.finished(Outcome(facts, finish, gpu_s))
        facts = JobFacts(spec.job_id, t, spec.gpu_count, spec.team, "", spec.name)
        history.submitted(facts)
        for p in (lgbm, median):  # the wrong ones share lgbm's model
            if p.retrain_due(history, t):
                a = time.perf_counter()
                p.retrain(history, t)
                retrain_s += time.perf_counter() - a if p is lgbm else 0.0
        duration = float(spec.duration_s or 0.0)
        gpu_s = duration * spec.gpu_count
        heapq.heappush(pending, (t + duration, spec.job_id, facts, gpu_s))
        a = time.perf_counter()
        first = lgbm.predict(facts, history)
        if first is not None:
            predict_s += time.perf_counter() - a
            predicted += 1
        got = [first] + [wrapped[k].predict(facts, history) for k in KINDS[1:]]
        if all(g is not None for g in got):
            rows.append((t + duration, gpu_s, [g.q50_gpu_s for g in got if g is not None]))
    rows.sort(key=lambda r: r[0])  # the order the guard sees outcomes in
    actual = np.asarray([r[1] for r in rows])
    preds = np.asarray([r[2] for r in rows]).reshape(-1, len(KINDS))
    window = guard.window_jobs
    out: dict[str, object] = {
        "jobs": len(jobs),
        "judged": len(rows),
        "retrains": 0 if lgbm.info is None else lgbm.info.version,
        "train_s": round(retrain_s, 2),
        "predict_ms": round(1000 * predict_s / max(predicted, 1), 3),
        "span_days": round((max(submits) - min(submits)) / 86_400, 1),
    }
    starts = range(0, len(rows) - window + 1, STEP) if len(rows) >= window else []
    for k, kind in enumerate(KINDS):
        p = preds[:, k]
        w2 = [within_2x(p[s : s + window], actual[s : s + window]) for s in starts]
        rho = [spearman(p[s : s + window], actual[s : s + window]) for s in starts]
        passing = [
            a >= guard.min_within_2x and b >= guard.min_rank_corr
            for a, b in zip(w2, rho, strict=True)
        ]
        out[kind] = {
            "within_2x": round(within_2x(p, actual), 3),
            "spearman": round(spearman(p, actual), 3),
            "windows": len(w2),
            "window_within_2x_p10": round(float(np.percentile(w2, 10)), 3) if w2 else None,
            "window_spearman_p10": round(float(np.percentile(rho, 10)), 3) if rho else None,
            "window_spearman_median": round(float(np.median(rho)), 3) if rho else None,
            "window_within_2x_p90": round(float(np.percentile(w2, 90)), 3) if w2 else None,
            "window_spearman_p90": round(float(np.percentile(rho, 90)), 3) if rho else None,
            "windows_passing": round(float(np.mean(passing)), 3) if passing else None,
            "window_series": [[round(a, 3), round(b, 3)] for a, b in zip(w2, rho, strict=True)],
        }
    out["wall_s"] = round(time.perf_counter() - started, 1)
    return out


CANDIDATES = (
    (GuardConfig().min_within_2x, GuardConfig().min_rank_corr),  # the defaults, first
    (0.30, 0.20),
    (0.25, 0.15),
    (0.25, 0.10),
    (0.20, 0.10),
    (0.30, 0.10),
    (0.0, 0.10),
)
"""(min within 2x, min rank correlation) pairs the guard's defaults are chosen among."""


def trusted_share(series: list[list[float]], w2_min: float, rho_min: float, margin: float) -> float:
    """Share of the windows in which a guard with these thresholds (and hysteresis) would
    trust the model, walking the windows in time order from a cold start."""
    trusted = False
    count = 0
    for w2, rho in series:
        if trusted and (w2 < w2_min or rho < rho_min):
            trusted = False
        elif not trusted and w2 >= w2_min + margin and rho >= rho_min + margin:
            trusted = True
        count += trusted
    return count / len(series) if series else float("nan")


def threshold_table(results: dict[str, dict[str, object]], margin: float) -> list[str]:
    lines = [
        "| min within 2x | min rho | "
        + " | ".join(f"{k} mean / min" for k in KINDS[:2])
        + " | "
        + " | ".join(f"{k} mean / max" for k in KINDS[2:])
        + " |",
        "|---:|---:|" + "---:|" * len(KINDS),
    ]
    for w2_min, rho_min in CANDIDATES:
        cells = [f"{w2_min:.2f}", f"{rho_min:.2f}"]
        for k, kind in enumerate(KINDS):
            shares = []
            for r in results.values():
                entry = r[kind]
                assert isinstance(entry, dict)
                series = entry["window_series"]
                assert isinstance(series, list)
                if series:
                    shares.append(trusted_share(series, w2_min, rho_min, margin))
            if not shares:
                cells.append("-")
                continue
            worst = min(shares) if k < 2 else max(shares)
            cells.append(f"{np.mean(shares):.2f} / {worst:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _f(x: object) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.2f}"
    return str(x)


def markdown(results: dict[str, dict[str, object]], guard: GuardConfig, command: str) -> str:
    lines = [
        "# GPU-time prediction on Microsoft ITP 2021 (strict time split)",
        "",
        f"Made by `{command}`. Each job predicted at its submit from jobs finished before it",
        "(finish = submit + duration), weekly retraining, first model at 100 finished jobs.",
        "w2x: share of q50 predictions within 2x of the actual GPU-time; rho: Spearman.",
        "",
        "| cluster | jobs | judged | days | lightgbm w2x | rho | recent-median w2x | rho "
        "| shuffled w2x | rho | inverted w2x | rho |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        cells = [name, _f(r["jobs"]), _f(r["judged"]), _f(r["span_days"])]
        for kind in KINDS:
            k = r[kind]
            assert isinstance(k, dict)
            cells += [_f(k["within_2x"]), _f(k["spearman"])]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"The guard's view: windows of {guard.window_jobs} finished jobs (step {STEP}); 10th "
        "percentile of each figure over the windows, the median rank correlation within",
        "them (rho in-window), and the share of windows passing the default",
        f"thresholds (within 2x >= {guard.min_within_2x:.2f} and "
        f"rho >= {guard.min_rank_corr:.2f}).",
        "",
        "| cluster | windows | lightgbm p10 w2x / rho | rho in-window | passing "
        "| recent-median rho in-window | passing "
        "| shuffled p90 w2x / rho | passing | inverted p90 w2x / rho | passing |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        lg, rm, sh, inv = (r[k] for k in KINDS)
        assert isinstance(lg, dict) and isinstance(rm, dict)
        assert isinstance(sh, dict) and isinstance(inv, dict)
        lines.append(
            f"| {name} | {lg['windows']} "
            f"| {_f(lg['window_within_2x_p10'])} / {_f(lg['window_spearman_p10'])} "
            f"| {_f(lg.get('window_spearman_median'))} | {_f(lg['windows_passing'])} "
            f"| {_f(rm.get('window_spearman_median'))} | {_f(rm['windows_passing'])} "
            f"| {_f(sh['window_within_2x_p90'])} / {_f(sh['window_spearman_p90'])} "
            f"| {_f(sh['windows_passing'])} "
            f"| {_f(inv['window_within_2x_p90'])} / {_f(inv['window_spearman_p90'])} "
            f"| {_f(inv['windows_passing'])} |"
        )
    lines += [
        "",
        f"Share of the windows in which a guard would trust each predictor (hysteresis margin "
        f"{guard.recover_margin:.2f}, cold start at the first window), over the clusters with "
        "windows: mean, and the worst case (min for the real predictors, max for the wrong).",
        "",
        *threshold_table(results, guard.recover_margin),
        "",
        "| cluster | retrains | training s (all) | ms per LightGBM prediction |",
        "|---|---:|---:|---:|",
    ]
    for name, r in results.items():
        lines.append(f"| {name} | {r['retrains']} | {_f(r['train_s'])} | {r['predict_ms']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clusters", default="", help="comma-separated cluster names (default all)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "predictor-accuracy"))
    ap.add_argument(
        "--tables-only",
        action="store_true",
        help="rewrite the .md from the .json of an earlier run (new thresholds, no rerun)",
    )
    args = ap.parse_args()
    wanted = {c for c in args.clusters.split(",") if c}
    guard = GuardConfig()
    out = Path(args.out)
    command = "python bench/predictor_accuracy.py" + (
        f" --clusters {args.clusters}" if args.clusters else ""
    )
    if args.tables_only:
        saved = json.loads(out.with_suffix(".json").read_text())
        out.with_suffix(".md").write_text(markdown(saved["clusters"], guard, command))
        return 0
    results: dict[str, dict[str, object]] = {}
    for path in sorted(shared_itp().glob("cluster*.csv")):
        if wanted and path.stem not in wanted:
            continue
        jobs, _ = read_itp(path)
        results[path.stem] = evaluate(jobs, guard)
        brief = {k: v for k, v in results[path.stem].items() if k not in KINDS}
        print(path.stem, json.dumps(brief), flush=True)
    out.with_suffix(".md").write_text(markdown(results, guard, command))
    out.with_suffix(".json").write_text(
        json.dumps({"machine": describe(), "clusters": results}, indent=1) + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

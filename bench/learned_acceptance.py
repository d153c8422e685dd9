"""The acceptance lines of the learned order ("never worse than the best rule", issue 34),
computed from bench_learned.py's rows; and the predictor's median in-window rank
correlation that every table carries.

R is the rule the learned order falls back to and mixes with (learning.rule, 2D-Gittins by
default); B the better of 2D-LAS and 2D-Gittins per (trace, cluster, load), in hindsight.
A cell is a (cluster, load). Weeks count by submit from the trace's first job; a week is
judged when it is past the cold start (14 days: week 2 on) and the learned replay finished
at least 50 of its jobs.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpupool.learning.guard import spearman

RULE_LABELS = {"las": "las", "gittins": "gittins"}
SRTF = "srtf (oracle)"
COLD_WEEKS = 2
MIN_WEEK_JOBS = 50
RHO_WINDOW, RHO_STEP = 500, 50


def median_in_window_rho(q50_and_taken: Sequence[tuple[float, float]]) -> float | None:
    """Median Spearman correlation of predicted median and GPU-time taken over windows of
    500 consecutive finished jobs (step 50), in finish order; None under one window."""
    if len(q50_and_taken) < RHO_WINDOW:
        return None
    arr = np.asarray(q50_and_taken, dtype=np.float64)
    rhos = [
        spearman(arr[k : k + RHO_WINDOW, 0], arr[k : k + RHO_WINDOW, 1])
        for k in range(0, len(arr) - RHO_WINDOW + 1, RHO_STEP)
    ]
    return float(statistics.median(rhos))


@dataclass(frozen=True)
class JudgedWeek:
    """One week the weekly line judges: a replay's mean JCT there against R's and SRTF's."""

    week: int
    jobs: int
    mean_jct_h: float
    r_h: float
    srtf_h: float

    @property
    def ratio(self) -> float:
        return self.mean_jct_h / max(self.r_h, self.srtf_h)


def judged_weeks(row: dict[str, Any], r: dict[str, Any], s: dict[str, Any]) -> list[JudgedWeek]:
    """The weeks of `row` the weekly line judges (past the cold start, at least 50 jobs,
    measured in R's and SRTF's replays too), in week order."""
    out = []
    for week, (mean_h, count) in row["weekly_mean_jct_h"].items():
        if int(week) < COLD_WEEKS or count < MIN_WEEK_JOBS:
            continue
        rw, sw = r["weekly_mean_jct_h"].get(week), s["weekly_mean_jct_h"].get(week)
        if rw is not None and sw is not None:
            out.append(JudgedWeek(int(week), count, mean_h, rw[0], sw[0]))
    return sorted(out, key=lambda w: w.week)


def _line(check: str, ok: bool | None, figures: str, detail: list[str]) -> dict[str, Any]:
    """ok None: not run (a row it needs is missing everywhere)."""
    return {"check": check, "pass": ok, "figures": figures, "detail": detail}


def acceptance(rows: Sequence[dict[str, Any]], rule: str) -> list[dict[str, Any]]:
    """The acceptance lines, each PASS, FAIL or NOT RUN with its figures."""
    by = {(r["cluster"], r["load"], r["policy"]): r for r in rows}
    cells = sorted({(r["cluster"], r["load"]) for r in rows})
    r_label = RULE_LABELS[rule]

    def jct(c: tuple[str, str], p: str) -> float | None:
        row = by.get((*c, p))
        return None if row is None else float(row["mean_jct_h"])

    def best(c: tuple[str, str]) -> float | None:
        las, git = jct(c, "las"), jct(c, "gittins")
        return None if las is None or git is None else min(las, git)

    out: list[dict[str, Any]] = []
    # 1. whole trace: learned <= 1.02 R and <= 1.05 B, every cell
    over, n, worst_r, worst_b = [], 0, 0.0, 0.0
    for c in cells:
        le, r, b = jct(c, "learned"), jct(c, r_label), best(c)
        if le is None or r is None or b is None:
            continue
        n += 1
        worst_r, worst_b = max(worst_r, le / r), max(worst_b, le / b)
        if le > 1.02 * r or le > 1.05 * b:
            over.append(f"{c[0]} {c[1]}: learned {le:.2f} h, R {r:.2f} h, B {b:.2f} h")
    out.append(
        _line(
            "guarded learned <= 1.02 x R and <= 1.05 x B, whole trace, every cell",
            None if n == 0 else not over,
            f"{n - len(over)} of {n} cells; worst {worst_r:.3f} x R, {worst_b:.3f} x B",
            over,
        )
    )
    # 2. the wrong predictors, guarded <= 1.05 R (unguarded shown)
    for policy, bound in (
        ("shuffled guarded", 1.05),
        ("inverted guarded", 1.05),
        ("shuffled unguarded", 1.05),
        ("inverted unguarded", 1.05),
    ):
        over, n, worst = [], 0, 0.0
        for c in cells:
            a, r = jct(c, policy), jct(c, r_label)
            if a is None or r is None:
                continue
            n += 1
            worst = max(worst, a / r)
            if a > bound * r:
                over.append(f"{c[0]} {c[1]}: {a:.2f} h vs R {r:.2f} h ({a / r:.3f} x)")
        shown = " (shown, not a line: no guard)" if "unguarded" in policy else ""
        out.append(
            _line(
                f"{policy} <= {bound:.2f} x R, whole trace, every cell{shown}",
                None if n == 0 else not over,
                f"{n - len(over)} of {n} cells; worst {worst:.3f} x R",
                over,
            )
        )
    # 3. weeks
    ratios: list[float] = []
    where: list[str] = []
    for c in cells:
        le, r, s = by.get((*c, "learned")), by.get((*c, r_label)), by.get((*c, SRTF))
        if le is None or r is None or s is None:
            continue
        for w in judged_weeks(le, r, s):
            ratios.append(w.ratio)
            if w.ratio > 1.05:
                where.append(
                    f"{c[0]} {c[1]} week {w.week}: {w.mean_jct_h:.2f} h, R {w.r_h:.2f} h, "
                    f"SRTF {w.srtf_h:.2f} h ({w.ratio:.3f} x)"
                )
    within = sum(x <= 1.05 for x in ratios)
    worst = max(ratios, default=0.0)
    out.append(
        _line(
            "every week (>= 50 jobs, after cold start): learned <= 1.05 x max(R, SRTF) in "
            ">= 95 % of (cell, week), none above 1.5 x",
            None if not ratios else within >= 0.95 * len(ratios) and worst <= 1.5,
            f"{within} of {len(ratios)} ({within / max(len(ratios), 1):.1%}); worst {worst:.3f} x",
            where,
        )
    )
    # 4. value
    eligible, wins, captures, lines = 0, 0, [], []
    for c in cells:
        le, b, s = jct(c, "learned"), best(c), jct(c, SRTF)
        row = by.get((*c, "learned"))
        rho = None if row is None else row.get("rho_in_window")
        if le is None or b is None or s is None or rho is None:
            continue
        if s > 0.9 * b or rho < 0.3:
            continue
        eligible += 1
        wins += le <= 0.95 * b
        capture = (b - le) / (b - s)
        captures.append(capture)
        raw = jct(c, "learned unguarded")  # the model's own order, no guard: its value
        lines.append(
            f"{c[0]} {c[1]}: learned {le:.2f} h, B {b:.2f} h, SRTF {s:.2f} h, rho {rho:.2f}: "
            f"{1 - le / b:+.1%} vs B, capture {capture:.0%}"
            + ("" if raw is None else f"; unguarded {raw:.2f} h ({raw / b:.3f} x B)")
        )
    med = statistics.median(captures) if captures else float("nan")
    out.append(
        _line(
            "value: where SRTF is >= 10 % better than B and rho in-window >= 0.3, learned <= "
            "0.95 x B on at least half, median capture of the B-to-SRTF gap >= 25 %",
            None if eligible == 0 else wins >= eligible / 2 and med >= 0.25,
            f"{eligible} eligible cells; {wins} at <= 0.95 x B; median capture {med:.0%}"
            if eligible
            else "no eligible cell among those run",
            lines,
        )
    )
    return out

"""bench_learned.py goes on from a run cut short only when that run was the same experiment,
and its acceptance checks count what the rows say."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_learned


def record(tmp_path: Path, mix: dict[str, Any] | None) -> None:
    data: dict[str, Any] = {
        "traces": "itp",
        "search": [
            {"cluster": "cluster02", "nodes": 12, "in_band": True},
            {"cluster": "cluster03", "nodes": 21, "in_band": True},
        ],
        "rows": [],
        "total_s": 60.0,
    }
    if mix is not None:
        data["mix"] = mix
    (tmp_path / f"{bench_learned.record_stem('itp')}.json").write_text(
        json.dumps(data), encoding="utf-8"
    )


def args(tmp_path: Path) -> argparse.Namespace:
    return argparse.Namespace(traces="itp", out=tmp_path, quick=False)


def test_resume_refuses_a_record_of_another_mix(tmp_path: Path) -> None:
    record(tmp_path, {**bench_learned.MIX, "weight": 0.5})
    with pytest.raises(SystemExit, match="another experiment"):
        bench_learned.earlier_run(args(tmp_path), ["cluster02"])


def test_a_record_older_than_an_option_ran_that_options_old_default(tmp_path: Path) -> None:
    old = {"weight": 0.75, "max_spread": 16.0, "model_order": "remaining"}
    record(tmp_path, old)
    data = json.loads(
        (tmp_path / f"{bench_learned.record_stem('itp')}.json").read_text(encoding="utf-8")
    )
    assert bench_learned.mix_of(data) == {**old, "rule": "las"}
    with pytest.raises(SystemExit, match="another experiment"):  # today's defaults differ
        bench_learned.earlier_run(args(tmp_path), ["cluster02"])


def test_resume_keeps_the_sizing_of_the_named_clusters(tmp_path: Path) -> None:
    record(tmp_path, dict(bench_learned.MIX))
    data = bench_learned.earlier_run(args(tmp_path), ["cluster03"])
    assert data is not None
    assert [s["cluster"] for s in data["search"]] == ["cluster03"]
    with pytest.raises(SystemExit, match="did not size"):
        bench_learned.earlier_run(args(tmp_path), ["cluster03", "cluster09"])


def test_no_record_starts_afresh(tmp_path: Path) -> None:
    assert bench_learned.earlier_run(args(tmp_path), ["cluster02"]) is None


def row(cluster: str, policy: str, jct_h: float, rho: float | None = None) -> dict[str, Any]:
    return {
        "cluster": cluster,
        "load": "base",
        "nodes": 4,
        "policy": policy,
        "mean_jct_h": jct_h,
        "rho_in_window": rho,
        "weekly_mean_jct_h": {"2": [jct_h, 60]},
    }


def test_the_safety_line_holds_learned_to_the_rule_and_the_best_rule(tmp_path: Path) -> None:
    rows = [
        row("a", "las", 10.0),
        row("a", "gittins", 9.0),
        row("a", "srtf (oracle)", 8.0),
        row("a", "learned", 9.1, rho=0.4),  # 1.011 x R, 1.011 x B
        row("b", "las", 9.0),
        row("b", "gittins", 10.0),  # B is las here
        row("b", "srtf (oracle)", 8.0),
        row("b", "learned", 10.1, rho=0.4),  # 1.01 x R but 1.12 x B
    ]
    first = bench_learned.checks(rows, ["a", "b"])[0]
    assert first["figures"].startswith("1 of 2 cells")
    assert first["pass"] is False
    rows[-1]["mean_jct_h"] = 9.4
    assert bench_learned.checks(rows, ["a", "b"])[0]["pass"] is True
    assert bench_learned.checks(rows, ["a"], rule="las")[0]["pass"] is True
    wrong = {c["check"]: c["pass"] for c in bench_learned.checks(rows, ["a", "b"])}
    assert all(ok is None for line, ok in wrong.items() if "shuffled" in line)  # not run


def test_the_value_line_counts_eligible_cells_and_captures() -> None:
    rows = [
        row("a", "las", 10.0),
        row("a", "gittins", 10.0),
        row("a", "srtf (oracle)", 6.0),  # 40 % better than B
        row("a", "learned", 9.0, rho=0.5),  # 10 % better: capture 25 %
        row("b", "las", 10.0),
        row("b", "gittins", 10.0),
        row("b", "srtf (oracle)", 6.0),
        row("b", "learned", 9.9, rho=0.1),  # rho too low: not eligible
    ]
    value = bench_learned.checks(rows, ["a", "b"])[-1]
    assert value["figures"] == "1 eligible cells; 1 at <= 0.95 x B; median capture 25%"
    assert value["pass"] is True
    rows[3]["mean_jct_h"] = 9.6
    assert bench_learned.checks(rows, ["a", "b"])[-1]["pass"] is False


def test_the_in_window_rank_correlation_is_a_median_over_windows() -> None:
    from learned_acceptance import median_in_window_rho

    assert median_in_window_rho([(1.0, 1.0)] * 499) is None
    exact = [(float(k), float(k)) for k in range(1_000)]
    assert median_in_window_rho(exact) == pytest.approx(1.0)
    inverse = [(float(k), float(-k)) for k in range(1_000)]
    assert median_in_window_rho(inverse) == pytest.approx(-1.0)


def test_the_weekly_sensitivity_judges_weeks_as_the_acceptance_line_does() -> None:
    """Weeks before the cold start's end and weeks of under 50 jobs are not judged; a week
    is measured against the larger of R and SRTF that week."""
    import bench_weekly_sensitivity as ws

    def weeks(*means: float) -> dict[str, Any]:
        counts = (900, 900, 900, 9)  # week 4 has too few jobs to judge
        return {"weekly_mean_jct_h": {str(k + 1): [m, counts[k]] for k, m in enumerate(means)}}

    line = ws.weekly_line(weeks(99.0, 11.0, 6.2, 99.0), weeks(10, 10, 4, 5), weeks(9, 8, 6, 5))
    assert [w["week"] for w in line["weeks"]] == [2, 3]
    assert line["weeks"][0]["ratio"] == pytest.approx(1.1)  # 11 against R's 10
    assert line["weeks"][1]["ratio"] == pytest.approx(6.2 / 6.0)  # against SRTF's 6
    assert (line["within"], line["judged"]) == (1, 2)
    assert line["worst"] == pytest.approx(1.1)

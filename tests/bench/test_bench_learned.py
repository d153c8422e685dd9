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
    (tmp_path / "learned.json").write_text(json.dumps(data), encoding="utf-8")


def args(tmp_path: Path) -> argparse.Namespace:
    return argparse.Namespace(traces="itp", out=tmp_path, quick=False)


def test_resume_refuses_a_record_of_another_mix(tmp_path: Path) -> None:
    record(tmp_path, {**bench_learned.MIX, "weight": 0.5})
    with pytest.raises(SystemExit, match="another experiment"):
        bench_learned.earlier_run(args(tmp_path), ["cluster02"])


def test_a_record_older_than_an_option_ran_that_options_old_default(tmp_path: Path) -> None:
    old = {"weight": 0.75, "max_spread": 16.0, "model_order": "remaining"}
    record(tmp_path, old)
    data = json.loads((tmp_path / "learned.json").read_text(encoding="utf-8"))
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


def row(cluster: str, policy: str, jct_h: float) -> dict[str, Any]:
    return {
        "cluster": cluster,
        "load": "base",
        "nodes": 4,
        "policy": policy,
        "mean_jct_h": jct_h,
        "weekly_mean_jct_h": {"0": [jct_h, 10]},
    }


def test_the_five_percent_check_counts_clusters_won(tmp_path: Path) -> None:
    rows = [
        row("a", "las", 10.0),
        row("a", "learned", 9.4),  # 6 % better: a win
        row("b", "las", 10.0),
        row("b", "learned", 9.6),  # 4 %: not enough
        row("c", "las", 10.0),
        row("c", "learned", 10.2),
    ]
    first = bench_learned.checks(rows, ["a", "b", "c"])[0]
    assert first["figures"] == "1 of 3 clusters"
    assert first["pass"] is False
    rows[3]["mean_jct_h"] = 9.5
    assert bench_learned.checks(rows, ["a", "b", "c"])[0]["pass"] is True

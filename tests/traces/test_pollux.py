"""Pollux's Philly list: every VC in one file, the VC as the team, sorted by time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpupool.cli.main import main
from gpupool.errors import SpecError
from gpupool.traces.loaders import load_replay_trace
from gpupool.traces.philly import read_pollux_philly

ROWS = """timestamp,duration,num_gpus,gpu_time,cluster
2017-10-09 07:01:55,66.0,1,66.0,11cb48
2017-10-09 06:13:03,2951.0,2,5902.0,6214e9
2017-10-08 23:59:59,10.0,1,10.0,6214e9
2017-10-09 06:13:03,0.0,1,0.0,6214e9
2017-10-10 01:00:00,7200.0,8,57600.0,b436b2
"""


def test_jobs_come_sorted_with_their_vc_as_the_team(tmp_path: Path) -> None:
    f = tmp_path / "philly.csv"
    f.write_text(ROWS)
    jobs, report = read_pollux_philly(f)
    assert report.rows == 5 and report.used == 4
    assert report.skipped == {"non-positive duration": 1}
    assert report.origin_s == 1_507_420_800.0  # 2017-10-08 00:00 UTC, the earliest day
    assert [j.job_id for j in jobs] == ["L4", "L3", "L2", "L6"]  # by time; ids are lines
    assert [j.team for j in jobs] == ["6214e9", "6214e9", "11cb48", "b436b2"]
    assert [j.submit_s for j in jobs] == [86_399.0, 108_783.0, 111_715.0, 176_400.0]
    assert [(j.gpu_count, j.duration_s) for j in jobs] == [
        (1, 10.0),
        (2, 2951.0),
        (1, 66.0),
        (8, 7200.0),
    ]
    [(name, same, _)] = load_replay_trace(f, "pollux")
    assert name == "philly" and same == jobs


def test_a_bad_row_names_its_line(tmp_path: Path) -> None:
    f = tmp_path / "philly.csv"
    f.write_text(ROWS + "yesterday,1,1,1,ab\n")
    with pytest.raises(SpecError, match=r"philly.csv:7: timestamp 'yesterday'"):
        read_pollux_philly(f)
    with pytest.raises(SpecError, match="reads one file"):
        load_replay_trace(tmp_path, "pollux")


def test_replay_runs_the_list_as_one_pool(tmp_path: Path) -> None:
    f = tmp_path / "philly.csv"
    f.write_text(ROWS)
    out = tmp_path / "r.json"
    argv = ["simulate", "replay", "--trace", str(f), "--format", "pollux", "--nodes", "1"]
    assert main([*argv, "--json", str(out)]) == 0
    body = json.loads(out.read_text())
    assert body["jobs"] == 4, body

"""The command line, as a user drives it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.cli.main import main
from gpupool.cli.simulate import parse_seeds
from gpupool.errors import SpecError


def test_seed_ranges() -> None:
    assert parse_seeds("42-44") == [42, 43, 44]
    assert parse_seeds("1,5,9") == [1, 5, 9]
    with pytest.raises(SpecError, match="backwards"):
        parse_seeds("5-3")
    with pytest.raises(SpecError):
        parse_seeds("x")


def test_fill_json_has_the_paper_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fill.json"
    assert (
        main(["simulate", "fill", "--policy", "best-fit", "--seed", "42", "--json", str(out)]) == 0
    )
    data = json.loads(out.read_text())
    for key in ("arrived_pct", "alloc_pct", "unallocated_pct", "frag_amount_pct", "frag_rate_pct"):
        assert len(data[key]) == 131, key
    assert data["arrived_pct"][0] == 0 and data["arrived_pct"][-1] == 130
    assert data["wall_s"] > 0
    table = capsys.readouterr().out
    assert "best-fit" in table and "unalloc@130%" in table


def test_bad_input_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "fill", "--policies", "tetris"]) == 2
    assert "unknown policy 'tetris'" in capsys.readouterr().err
    assert main(["simulate", "fill", "--tune", "0"]) == 2
    assert "--tune" in capsys.readouterr().err
    assert main(["simulate", "replay", "--trace", "/nonexistent.csv"]) == 2
    assert "does not exist" in capsys.readouterr().err


def write_itp(path: Path) -> None:
    path.write_text(
        "job_id,submission_time,duration,num_gpu\na,0,100,8\nb,10,50,8\nc,20,5,1\nz,30,0,1\n",
        encoding="utf-8",
    )


def test_replay_json_and_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "cluster99.csv"
    write_itp(trace)
    out, log = tmp_path / "r.json", tmp_path / "r.log"
    argv = ["simulate", "replay", "--trace", str(trace), "--nodes", "1", "--json", str(out)]
    assert main([*argv, "--log", str(log)]) == 0
    data = json.loads(out.read_text())
    for key in (
        "jobs",
        "avg_jct_s",
        "p50_jct_s",
        "p99_jct_s",
        "avg_queue_s",
        "utilization",
        "makespan_s",
        "wall_s",
    ):
        assert key in data, key
    assert data["jobs"] == 3
    assert data["avg_jct_s"] == pytest.approx((100 + 140 + 135) / 3)
    assert "skipped (1 non-positive duration)" in capsys.readouterr().err
    assert log.read_text().splitlines()[0].startswith("0 0.000 start a ")
    assert main([*argv[:-4], "--nodes", "many"]) == 2


def test_module_entry_point_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpupool", "simulate", "replay", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--gpus-per-node" in done.stdout and "--queue" in done.stdout

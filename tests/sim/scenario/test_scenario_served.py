"""Which jobs a scenario's GPU-hours went to: finished jobs, mean JCT and GPU-hours per
finished job, by GPUs per job, next to the GPU-hour totals that hide them.

Expected figures are worked out by hand from the jobs' sizes and the calibrated start
overhead (5 s per process start), not read back from the simulator.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpupool.cli.main import main
from gpupool.domain.model import JobSpec
from gpupool.sim.scenario.config import parse_scenario
from gpupool.sim.scenario.runner import run_scenario
from gpupool.sim.scenario.workload import Workload

H = 3600.0
START_S = 5.0  # process start, charged on the GPUs (CheckpointModel.calibrated)


def test_served_summary_shows_the_wide_job_that_never_ran() -> None:
    """One 8-GPU node, 10 h. Two 4-GPU jobs start at 0: one does 2 h of work, one 20 h (so
    it still runs at the end). An 8-GPU job (1 h) arrives at 1 h and never gets the node;
    a 1-GPU job of 1 h arrives at 3 h and backfills beside the long job."""
    cfg = parse_scenario(
        {
            "name": "served",
            "horizon_h": 10,
            "cycle_s": 60,
            "cluster": [{"gpu_type": "H200", "nodes": 1, "gpus_per_node": 8}],
            "teams": [{"name": "t", "guaranteed": {"H200": 8}}],
            "workload": [],
        }
    )
    jobs = (
        JobSpec("short4", gpu_count=4, team="t", submit_s=0.0, duration_s=2 * H),
        JobSpec("long4", gpu_count=4, team="t", submit_s=0.0, duration_s=20 * H),
        JobSpec("wide8", gpu_count=8, team="t", submit_s=1 * H, duration_s=1 * H),
        JobSpec("one1", gpu_count=1, team="t", submit_s=3 * H, duration_s=1 * H),
    )
    s = run_scenario(cfg, workload=Workload(jobs=jobs)).summary
    assert s["jobs_finished"] == 2
    short_gpu_h = 4 * (2 * H + START_S) / H
    one_gpu_h = (1 * H + START_S) / H
    long_gpu_h = 4 * 10.0
    assert s["finished_gpu_hours"] == pytest.approx(short_gpu_h + one_gpu_h, abs=0.06)
    assert s["unfinished_gpu_hours"] == pytest.approx(long_gpu_h, abs=0.06)
    assert s["unfinished_started_jobs"] == 1
    spent = short_gpu_h + one_gpu_h + long_gpu_h
    assert s["gpu_hours_per_finished_job"] == pytest.approx(spent / 2, abs=0.05)
    by = s["by_gpus"]
    assert list(by) == ["1", "4", "8"]
    assert by["8"] == {
        "jobs": 1,
        "started": 0,
        "finished": 0,
        "gpu_hours": 0.0,
        "avg_jct_h": None,
        "oldest_never_started_wait_h": 9.0,
    }
    assert (by["4"]["jobs"], by["4"]["started"], by["4"]["finished"]) == (2, 2, 1)
    assert by["4"]["gpu_hours"] == pytest.approx(short_gpu_h + long_gpu_h, abs=0.06)
    assert by["4"]["avg_jct_h"] == pytest.approx(2.0, abs=0.01)
    assert by["4"]["oldest_never_started_wait_h"] is None
    assert (by["1"]["started"], by["1"]["finished"]) == (1, 1)
    # waits to the first start; the 8-GPU job that never started waited until the horizon
    widths = s["by_width"]
    assert list(widths) == ["1", "4", "8"]
    assert widths["8"] == {
        "jobs": 1,
        "started": 0,
        "finished": 0,
        "mean_wait_s": 9 * H,
        "max_wait_s": 9 * H,
        "never_started": 1,
    }
    assert widths["4"]["never_started"] == 0 and widths["4"]["max_wait_s"] < 60
    assert s["max_wait_s"] == 9 * H
    assert by["1"]["avg_jct_h"] == pytest.approx(1.0, abs=0.02)
    assert sum(w["gpu_hours"] for w in by.values()) == pytest.approx(spent, abs=0.1)


def _scenario(path: Path, name: str, training_max: int) -> Path:
    path.write_text(
        f"""
name: {name}
seed: 3
horizon_h: 24
cycle_s: 60
policy: priority-quota
cluster:
  - {{gpu_type: A100-80GB, nodes: 2, gpus_per_node: 8}}
teams:
  - {{name: training, guaranteed: {{A100-80GB: 4}}, max: {{A100-80GB: {training_max}}}}}
workload:
  - {{generator: backlog, name: train, team: training, count: 30, submit_h: 0, spread_h: 12,
     gpu_choices: [1, 8], gpu_weights: [0.7, 0.3], work_h_min: 1, work_h_max: 4}}
""",
        encoding="utf-8",
    )
    return path


def test_scenario_comparison_prints_finished_jobs_and_mean_jct(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capped = _scenario(tmp_path / "capped.yaml", "capped", 4)
    open_ = _scenario(tmp_path / "open.yaml", "open", 16)
    out_json = tmp_path / "out.json"
    assert main(["simulate", "scenario", str(capped), str(open_), "--json", str(out_json)]) == 0
    text = capsys.readouterr().out
    comparison = text[text.index("Comparison") :]
    for header in ("finished", "mean JCT h", "GPU-h/finished", "By GPUs per job"):
        assert header in comparison
    runs: list[dict[str, Any]] = json.loads(out_json.read_text())["scenarios"]
    capped_s, open_s = runs
    # A 4-GPU cap can never hold an 8-GPU job: the width table says so.
    assert capped_s["by_gpus"]["8"]["started"] == 0
    assert open_s["by_gpus"]["8"]["started"] > 0
    for s in runs:
        row = next(line for line in comparison.splitlines() if line.startswith(s["scenario"] + " "))
        assert f"{s['jobs_finished']}" in row.split()
        assert f"{s['avg_jct_s'] / 3600:.2f}" in row.split()

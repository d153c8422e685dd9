"""serving-borrow: a diurnal service next to elastic offline work, resizing on and off.

With resizing the service's peaks are served from cards the elastic jobs lend (they
shrink toward half their size and grow back), so fewer jobs are preempted and less
work is lost than when the replicas preempt whole jobs; the GPU-hours the offline team
lent are reported. About 8 s for both runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpupool.sim.scenario.config import load_scenario
from gpupool.sim.scenario.runner import run_scenario
from gpupool.traces.location import find_traces_dir

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"


def summary(name: str) -> dict[str, Any]:
    folder = find_traces_dir(SCENARIOS)
    if folder is None or not (folder / "azure-llm-inference-2023").is_dir():
        pytest.skip("needs the Azure LLM inference 2023 trace (shared/traces)")
    return dict(run_scenario(load_scenario(SCENARIOS / f"{name}.yaml")).summary)


def test_borrowing_keeps_the_slo_and_preempts_less_than_preemption_alone() -> None:
    on, off = summary("serving-borrow"), summary("serving-borrow-off")
    b_on, b_off = on["borrowing"], off["borrowing"]
    assert b_on["resize_enabled"] and not b_off["resize_enabled"]
    assert b_on["resizes"] > 0 and b_off["resizes"] == 0
    assert b_off["offline_gpu_hours_lost_to_borrowing"] == 0.0
    lost = b_on["offline_gpu_hours_lost_to_borrowing"]
    assert lost > 0 and lost == pytest.approx(
        b_on["lent_gpu_hours"] + b_on["restart_gpu_hours"], abs=0.02
    )
    assert b_on["by_team"] == {"batch": lost}
    assert on["online_slo_attainment"] >= 0.999
    assert on["online_slo_attainment"] >= off["online_slo_attainment"]
    assert on["preemptions"] < off["preemptions"]
    assert on["lost_work_gpu_hours"] < off["lost_work_gpu_hours"]
    offline_on = on["kinds"]["offline-inference"]["gpu_hours"]
    assert offline_on > off["kinds"]["offline-inference"]["gpu_hours"]
    assert on["jobs_finished"] >= off["jobs_finished"]

"""`sharing.admission` reaches the core through a scenario file as it does through the
service's --config: two bandwidth-heavy jobs the utilisation rule lets share one card are
kept apart by the learned admission when it is active, with the model's reason, and share
the card in shadow (where the rule decides and the model is only judged)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.domain.model import JobKind, JobSpec
from gpupool.learning.colocation_admission import AdmissionMode
from gpupool.sim.scenario.config import parse_scenario
from gpupool.sim.scenario.workload import Workload
from gpupool.sim.scenario.world import ScenarioSim
from lucid_files import PROFILES_CSV, write_lucid


def scenario_sim(tmp_path: Path, mode: str) -> ScenarioSim:
    (tmp_path / "profiles.csv").write_text(PROFILES_CSV, encoding="utf-8")
    write_lucid(tmp_path / "lucid")
    raw = {
        "name": "coloc",
        "horizon_h": 2,
        "cycle_s": 60,
        "online_reserve": 0,
        "cluster": [{"gpu_type": "A100-80GB", "nodes": 1, "gpus_per_node": 1}],
        "teams": [{"name": "ml"}],
        "workload": [],
        "sharing": {
            "max_sm_util_pct": None,
            "admission": {
                "decider": "learned",
                "mode": mode,
                "profiles": "profiles.csv",  # both relative to the scenario file
                "pairs": "lucid",
                "max_sum_sm_pct": 200,  # the rule admits every pair
            },
        },
    }
    cfg = parse_scenario(raw, str(tmp_path / "coloc.yaml"))
    jobs = tuple(
        JobSpec(
            f"h{k}",
            gpu_milli=500,
            team="ml",
            kind=JobKind.TRAINING,
            submit_s=float(k),
            duration_s=1800.0,
            name="heavy",
        )
        for k in range(2)
    )
    return ScenarioSim(cfg, Workload(jobs=jobs))


@pytest.mark.parametrize("mode", ["active", "shadow"])
def test_the_configured_admission_decides_in_the_simulator(tmp_path: Path, mode: str) -> None:
    sim = scenario_sim(tmp_path, mode)
    policy = sim.core.colocation
    assert policy is not None and sim.state.pair_admission is policy
    assert policy.mode is (AdmissionMode.LEARNED if mode == "active" else AdmissionMode.SHADOW)
    a, b = sim.workload.jobs
    why = policy.problem(b, (a,))
    sim.run()
    first, second = sim.runs["h0"].first_start_s, sim.runs["h1"].first_start_s
    assert first is not None and second is not None
    if mode == "active":
        assert why is not None and "predicted speeds" in why and "needs 0.85x" in why
        assert second >= first + 1800.0  # kept apart: it waited for the card
    else:
        assert why is None
        assert second < 120.0  # shared the card at once

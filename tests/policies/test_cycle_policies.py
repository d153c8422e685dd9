"""Every cycle policy keeps to the teams' maxima; the core would refuse the plan otherwise."""

from __future__ import annotations

import pytest

from gpupool.domain.model import JobSpec
from gpupool.sim.scenario.config import parse_scenario
from gpupool.sim.scenario.runner import run_scenario
from gpupool.sim.scenario.workload import Workload


@pytest.mark.parametrize("policy", ["fifo", "backfill", "priority-quota"])
def test_team_maximum_binds_under_every_policy(policy: str) -> None:
    cfg = parse_scenario(
        {
            "name": "max",
            "horizon_h": 4,
            "policy": policy,
            "online_reserve": 0.0,
            "cluster": [{"gpu_type": "H200", "nodes": 2, "gpus_per_node": 8}],
            "teams": [
                {"name": "capped", "guaranteed": {"H200": 4}, "max": {"H200": 4}},
                {"name": "other", "guaranteed": {"H200": 4}},
            ],
            "workload": [],
        }
    )
    # three 4-GPU jobs of the capped team first in the queue, then one of the other team
    jobs = [JobSpec(f"c{i}", gpu_count=4, team="capped", duration_s=3600.0) for i in range(3)]
    jobs.append(JobSpec("o0", gpu_count=4, team="other", submit_s=1.0, duration_s=3600.0))
    result = run_scenario(cfg, workload=Workload(jobs=tuple(jobs)))
    starts = {d.job_id: d.time_s for d in result.log.decisions if d.action == "start"}
    # the capped team runs one job at a time; its queued jobs do not block the other team
    assert sorted(t for j, t in starts.items() if j.startswith("c")) == [0.0, 3660.0, 7320.0]
    assert starts["o0"] == 60.0
    assert result.summary["jobs_lost"] == 0

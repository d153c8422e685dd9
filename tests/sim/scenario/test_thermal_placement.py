"""Thermal balancing in the scenario simulator: work goes to cool cards, hot ones are capped."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gpupool.domain.model import Cluster, JobSpec, Node
from gpupool.domain.state import ClusterState
from gpupool.policies.placement.coolest_first import CoolestFirstPolicy
from gpupool.sim.scenario.config import parse_scenario
from gpupool.sim.scenario.runner import run_scenario


def _scenario(aware: bool) -> dict[str, Any]:
    return {
        "name": f"thermal-{'aware' if aware else 'blind'}",
        "seed": 5,
        "horizon_h": 48,
        "policy": "backfill",
        "online_reserve": 0.0,
        "cluster": [{"gpu_type": "H100", "nodes": 4, "gpus_per_node": 8}],
        "teams": [{"name": "ml"}],
        # the last two nodes breathe 45 C air: a 620 W training step holds a card there at
        # about 45 + 44 = 89 C, against 74 C in the cool aisle
        "energy": {
            "thermal": {"aware": aware, "threshold_c": 80, "hot_nodes": 2, "hot_inlet_c": 45}
        },
        "workload": [
            {
                "generator": "backlog",
                "name": "train",
                "team": "ml",
                "count": 60,
                "spread_h": 36,
                "gpu_choices": [1, 2, 4],
                "gpu_weights": [0.4, 0.4, 0.2],
                "work_h_min": 1,
                "work_h_max": 6,
            }
        ],
    }


@pytest.fixture(scope="module")
def runs() -> tuple[dict[str, Any], dict[str, Any]]:
    blind = run_scenario(parse_scenario(_scenario(False))).summary
    aware = run_scenario(parse_scenario(_scenario(True))).summary
    return blind, aware


def test_blind_placement_leaves_hot_cards_hot_while_cool_ones_idle(
    runs: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    blind, _ = runs
    assert blind["thermal"]["max_temp_c"] > 85
    assert blind["thermal"]["gpu_hours_hot_while_cooler_idle"] > 1


def test_aware_placement_keeps_every_card_under_the_threshold(
    runs: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    blind, aware = runs
    assert aware["thermal"]["gpu_hours_hot_while_cooler_idle"] == 0
    assert aware["thermal"]["max_temp_c"] < 80.5
    assert aware["jobs_finished"] == blind["jobs_finished"] == 60


def test_coolest_first_picks_the_cool_node_and_its_coolest_gpus() -> None:
    nodes = tuple(Node(f"n{i}", "H100", 4, 64_000, 512_000) for i in range(3))
    state = ClusterState(Cluster("c", nodes))
    temps = np.array([[70.0, 70, 70, 70], [40, 55, 38, 60], [50, 50, 50, 50]])
    policy = CoolestFirstPolicy(temps)
    plan = policy.place(state, JobSpec("j", gpu_count=2), np.random.default_rng(0))
    assert plan is not None
    # node 2's hottest free card is 50 C, node 1's is 60 C: node 2; a 3-GPU job on node 1
    assert plan.shares[0].node == 2
    temps[2] = [80, 80, 80, 80]
    plan = policy.place(state, JobSpec("k", gpu_count=2), np.random.default_rng(0))
    assert plan is not None and plan.shares[0].node == 1 and plan.shares[0].gpus == (0, 2)

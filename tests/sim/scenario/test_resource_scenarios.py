"""The right-sizing issue's scenarios, end to end: hetero, energy and multi-cluster pairs.

Each pair runs the same fleet and work with the aware and the blind policy; the
acceptance figures (cost, JCT, electricity, deadlines, refused transfers, burst logs)
are asserted on the summaries the CLI prints and writes.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.sim.scenario.runner import ScenarioResult
from scenario_runs import scenario_run


def _run(name: str) -> ScenarioResult:
    return scenario_run(name)  # made once, shared with test_scenario_figures.py


@pytest.fixture(scope="module")
def hetero() -> tuple[dict[str, Any], dict[str, Any]]:
    return _run("hetero-blind").summary, _run("hetero-aware").summary


@pytest.fixture(scope="module")
def multicluster() -> tuple[ScenarioResult, ScenarioResult]:
    return _run("multicluster-blind"), _run("multicluster-aware")


@pytest.fixture(scope="module")
def energy() -> tuple[ScenarioResult, ScenarioResult]:
    return _run("energy-blind"), _run("energy-aware")


def test_summary_has_the_issue_keys(hetero: tuple[dict[str, Any], dict[str, Any]]) -> None:
    for key in (
        "cost_usd",
        "energy_kwh",
        "electricity_cost",
        "carbon_kg",
        "deadline_misses",
        "avg_jct_s",
        "bursts",
        "reclaims",
        "rejected_remote_placements",
    ):
        assert key in hetero[0], key
    assert "teams" in hetero[0] and "online_slo_attainment" in hetero[0]  # the policies keys


def test_hetero_aware_costs_a_fifth_less_without_slower_jobs(
    hetero: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    blind, aware = hetero
    assert blind["jobs_finished"] == blind["jobs_submitted"] - blind["jobs_cancelled"]
    assert aware["jobs_lost"] == blind["jobs_lost"] == 0
    assert aware["cost_usd"] <= 0.8 * blind["cost_usd"]
    assert aware["avg_jct_s"] <= blind["avg_jct_s"]
    assert aware["deadline_misses"] == 0


def test_hetero_aware_puts_small_models_on_the_cheap_cards(
    hetero: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    """Gavel's point: the 4090s carry the 7-8B batch inference, the H100s the compute-bound
    fine-tuning; a blind policy spreads work by free GPUs instead."""
    blind, aware = hetero
    assert aware["gpu_hours_by_type"]["RTX-4090"] > 0
    # fine-tuning (compute-bound) runs at its cheapest per token: H100, never 8 x 4090
    assert aware["kinds"]["training"]["gpu_hours"] < blind["kinds"]["training"]["gpu_hours"]


@pytest.mark.slow  # long: started first (tests/conftest.py orders slow modules first)
def test_energy_aware_cuts_electricity_and_misses_no_deadline(
    energy: tuple[ScenarioResult, ScenarioResult],
) -> None:
    blind, aware = (r.summary for r in energy)
    assert blind["jobs_with_deadline"] == aware["jobs_with_deadline"] > 1000
    assert aware["deadline_misses"] == 0
    assert blind["deadline_misses"] == 0
    assert aware["electricity_cost"] <= 0.85 * blind["electricity_cost"]
    assert aware["energy_kwh"] > 0 and aware["electricity_currency"] == "CNY"
    assert aware["carbon_kg"] is None  # no hourly carbon data for Guangdong: not made up
    assert aware["power_cap_commands"] > 0 and blind["power_cap_commands"] == 0
    assert aware["jobs_finished"] == blind["jobs_finished"]


def test_energy_on_a_grid_with_carbon_data_reports_and_cuts_carbon() -> None:
    """CAISO: price and carbon intensity by hour (derived shapes); deferral moves work to
    the solar hours, where both are lowest."""
    blind, aware = _run("energy-caiso-blind").summary, _run("energy-caiso-aware").summary
    assert aware["deadline_misses"] == blind["deadline_misses"] == 0
    assert blind["carbon_kg"] > 0 and aware["electricity_currency"] == "USD"
    assert aware["carbon_kg"] < 0.9 * blind["carbon_kg"]
    assert aware["electricity_cost"] < 0.9 * blind["electricity_cost"]


def test_energy_per_job_team_and_cluster_add_up(
    energy: tuple[ScenarioResult, ScenarioResult],
) -> None:
    aware = energy[1]
    s = aware.summary
    jobs_kwh = sum(row["energy_kwh"] for row in aware.jobs)
    team_kwh = sum(t["energy_kwh"] for t in s["teams"].values())
    cluster = next(iter(s["clusters"].values()))
    # jobs + idle = cluster = total; the team ledger holds exactly its jobs
    assert abs(team_kwh - jobs_kwh) < 0.01 * team_kwh
    assert (
        abs(cluster["energy_kwh"] - (jobs_kwh + cluster["idle_energy_kwh"]))
        < 0.01 * (cluster["energy_kwh"])
    )
    assert abs(cluster["energy_kwh"] - s["energy_kwh"]) < 0.05


def test_multicluster_aware_is_faster_and_refuses_the_far_data_case(
    multicluster: tuple[ScenarioResult, ScenarioResult],
) -> None:
    blind, aware = multicluster
    assert aware.summary["avg_jct_s"] < blind.summary["avg_jct_s"]
    assert aware.summary["rejected_remote_placements"] >= 1
    far_blind = next(r for r in blind.jobs if r["job_id"] == "far-data")
    far_aware = next(r for r in aware.jobs if r["job_id"] == "far-data")
    # blind sends 20 minutes of compute to the data's far side: 1.35 TB over 1 Gbps = 3 h
    assert far_blind["transfer_s"] == pytest.approx(3 * 3600, rel=0.01)
    assert far_aware["transfer_s"] == 0.0 and far_aware["pool"].startswith("east/")
    log = aware.log.render(aware.node_names)
    refusal = [line for line in log.splitlines() if "far-data" in line and "refused" in line]
    assert refusal and "transfer 3.0 h exceeds local queueing" in refusal[0]
    assert far_aware["end_s"] < far_blind["end_s"]


def test_multicluster_bursts_and_reclaims_with_reasons(
    multicluster: tuple[ScenarioResult, ScenarioResult],
) -> None:
    for result in multicluster:
        s = result.summary
        assert s["bursts"] >= 1 and s["reclaims"] >= 1
        assert s["cloud_cost_usd"] > 0
        assert len(s["burst_log"]) == s["bursts"] + s["reclaims"]
        assert all(e["reason"] for e in s["burst_log"])
        log = result.log.render(result.node_names)
        assert "cloud-burst" in log and "cloud-reclaim" in log


def test_multicluster_online_replicas_stay_within_their_latency_bound(
    multicluster: tuple[ScenarioResult, ScenarioResult],
) -> None:
    blind, aware = (r.summary for r in multicluster)
    assert aware["online_slo_attainment"] > 0.98
    assert blind["online_slo_attainment"] < aware["online_slo_attainment"]

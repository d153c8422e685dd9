"""One scheduling section for scenario files and `gpupool serve --config`.

The same keys, the same parser (gpupool.scheduler.config_schema), the same messages: a file
that configures a scenario's scheduling configures the live service the same way, only
the defaults for what the file leaves out differ (LIVE_DEFAULTS for the service).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.cli.main import build_parser, main
from gpupool.cli.serve import serve_options
from gpupool.domain.quota import QuotaWindow, TeamQuota
from gpupool.errors import SpecError
from gpupool.policies.preemption import PreemptionRules
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.config_schema import (
    SCHEDULING_KEYS,
    check_fleet,
    parse_scheduling,
)
from gpupool.server.loop.config import LIVE_DEFAULTS
from gpupool.server.main import ServeOptions, load_service_config, service_scheduling
from gpupool.sim.scenario.config import parse_scenario

# Every scheduling key, and every field of each nested section, given explicitly.
FULL = """\
teams:
  - {name: serving, guaranteed: {A100-80GB: 4}, max: {A100-80GB: 8}}
  - {name: research, guaranteed: {A100-80GB: 2, H100-80GB: 8}}
windows:
  - {from: "08:00", to: "20:00", teams: {serving: {guaranteed: 0.5, max: 0.75}}}
mode: pool
policy: backfill
cycle_s: 30
online_reserve: 0.1
online_reserve_on: online-seen
share_cap: 3
queue_depth: 16
autoscale: {lookahead_s: 300, headroom: 1.2, down_stable_s: 120, load_window_s: 30,
            demand: forecast, forecast: {judge_days: 5}}
preemption: {min_runtime_s: 120, max_per_job: 2, max_lost_work_s: 600, by_priority: true,
             reserve_vacate_s: 10}
checkpoint: {write_gbps: 0.5, restore_gbps: 1.5, process_start_s: 4}
placement: {gpu_type: cost-aware, site: blind, value_of_time_usd_per_h: 0.25}
energy:
  tariff: guangdong-tou
  site_tariffs: {}
  pue: 1.2
  price_aware: true
  power_capping: true
  deferral_slot_min: 30
  deferral_margin_h: 2
  thermal: {aware: true, threshold_c: 80, inlet_c: 25, hot_nodes: 1, hot_inlet_c: 38}
burst: {util_threshold: 0.8, sustain_min: 10, pending_gpus: 2, pending_sustain_min: 3,
        reclaim_util: 0.2, reclaim_sustain_min: 20, nodes_per_burst: 1}
"""

PARTIAL = """\
teams:
  - {name: serving, guaranteed: {A100-80GB: 1}}
  - {name: research}
policy: fifo
preemption: {max_per_job: 5}
"""

CLUSTER = [
    {"gpu_type": "A100-80GB", "nodes": 1, "gpus_per_node": 8},
    {"gpu_type": "H100-80GB", "nodes": 1, "gpus_per_node": 8},
]
FLEET = {"A100-80GB": 8, "H100-80GB": 8}


def as_scenario(section: dict[str, Any]) -> dict[str, Any]:
    return {"name": "s", "horizon_h": 1, "cluster": CLUSTER, "workload": [], "teams": [], **section}


def write(tmp_path: Path, text: str, name: str = "teams.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def fields(config: SchedulerConfig) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


def serve_args(*argv: str) -> ServeOptions:
    return serve_options(build_parser().parse_args(["serve", *argv]))


# ---- one section, two drivers ---------------------------------------------------------------
def test_full_section_parses_alike_as_scenario_and_as_service_config(tmp_path: Path) -> None:
    scenario = parse_scenario(as_scenario(yaml.safe_load(FULL))).scheduling
    service = load_service_config(write(tmp_path, FULL), LIVE_DEFAULTS)
    assert fields(service) == fields(scenario)
    assert service.cycle_s == 30.0 and service.online_reserve == 0.1
    assert service.preemption == PreemptionRules(
        120.0, 2, max_lost_work_s=600.0, by_priority=True, reserve_vacate_s=10.0
    )
    assert service.online_reserve_on == "online-seen"
    assert service.windows == (
        QuotaWindow(8 * 3600.0, 20 * 3600.0, {"serving": 0.5}, {"serving": 0.75}),
    )
    assert service.energy.deferral_slot_s == 1800.0  # minutes in the file
    assert service.energy.deferral_margin_s == 7200.0  # hours in the file
    assert service.energy.thermal.hot_nodes == 1
    assert service.burst is not None and service.burst["sustain_min"] == 10  # kept as written
    check_fleet(service, FLEET, "teams.yaml")


def test_partial_section_agrees_on_the_keys_given(tmp_path: Path) -> None:
    scenario = parse_scenario(as_scenario(yaml.safe_load(PARTIAL))).scheduling
    service = load_service_config(write(tmp_path, PARTIAL), LIVE_DEFAULTS)
    for name in ("teams", "policy"):
        assert getattr(service, name) == getattr(scenario, name), name
    assert service.teams == (
        TeamQuota("serving", {"A100-80GB": 1}, {}),
        TeamQuota("research", {}, {}),
    )
    assert service.preemption.max_per_job == scenario.preemption.max_per_job == 5
    # what the file leaves out comes from each driver's defaults
    assert scenario.preemption.min_runtime_s == 900.0
    assert service.preemption.min_runtime_s == 60.0


def test_service_defaults_apply_when_keys_are_absent(tmp_path: Path) -> None:
    assert load_service_config(None, LIVE_DEFAULTS) == LIVE_DEFAULTS
    assert load_service_config(write(tmp_path, ""), LIVE_DEFAULTS) == LIVE_DEFAULTS
    only_teams = load_service_config(write(tmp_path, "teams: [{name: a}]\n"), LIVE_DEFAULTS)
    assert only_teams == dataclasses.replace(LIVE_DEFAULTS, teams=(TeamQuota("a", {}, {}),))
    assert only_teams.cycle_s == 1.0
    assert only_teams.online_reserve == 0.2  # once online inference is submitted:
    assert only_teams.online_reserve_on == "online-seen"
    assert only_teams.preemption == PreemptionRules(60.0, 3, reserve_vacate_s=30.0)
    # a reserve the file sets holds from the start
    reserved = load_service_config(write(tmp_path, "online_reserve: 0.25\n"), LIVE_DEFAULTS)
    assert reserved.online_reserve_on == "always"


def test_scenario_defaults_are_unchanged() -> None:
    cfg = parse_scenario(as_scenario({"teams": []}))
    assert cfg.scheduling == SchedulerConfig()
    assert parse_scheduling({}, "x.yaml") == SchedulerConfig()


# ---- --cycle and the file ---------------------------------------------------------------------
def test_serve_without_flags_runs_with_the_options_defaults() -> None:
    assert serve_args() == ServeOptions()


def test_cycle_from_the_command_line_overrides_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "cycle_s: 5\n")
    assert service_scheduling(serve_args()).cycle_s == 1.0  # LIVE_DEFAULTS
    assert service_scheduling(serve_args("--config", str(path))).cycle_s == 5.0
    assert service_scheduling(serve_args("--config", str(path), "--cycle", "0.2")).cycle_s == 0.2
    assert service_scheduling(serve_args("--cycle", "2")).cycle_s == 2.0
    with pytest.raises(SpecError, match="--cycle must be a positive number"):
        service_scheduling(serve_args("--cycle", "0"))


def test_demo_teams_only_when_the_file_names_none(tmp_path: Path) -> None:
    demo = service_scheduling(serve_args("--demo"))
    assert [t.team for t in demo.teams] == ["serving", "research"]
    path = write(tmp_path, "teams: [{name: ml}]\n")
    assert [
        t.team for t in service_scheduling(serve_args("--demo", "--config", str(path))).teams
    ] == ["ml"]


def test_max_starts_is_still_the_command_lines() -> None:
    assert service_scheduling(serve_args()).max_starts_per_cycle is None
    assert service_scheduling(serve_args("--max-starts", "4")).max_starts_per_cycle == 4
    assert service_scheduling(serve_args("--ray", "auto")).max_starts_per_cycle == 16
    with pytest.raises(SpecError, match="--max-starts must be at least 1"):
        service_scheduling(serve_args("--max-starts", "0"))


def test_with_sites_the_sites_file_alone_gives_burst_and_site_placement(tmp_path: Path) -> None:
    sites = str(tmp_path / "sites.yaml")  # only its name matters here
    ok = write(tmp_path, "placement: {gpu_type: cost-aware}\n", "ok.yaml")
    assert service_scheduling(
        serve_args("--config", str(ok), "--sites", sites)
    ).placement.gpu_type == ("cost-aware")
    both = write(tmp_path, "burst: {sustain_min: 5}\nplacement: {site: locality-aware}\n")
    with pytest.raises(
        SpecError,
        match=rf"{re.escape(str(both))}: burst, placement.site: with --sites these come from",
    ):
        service_scheduling(serve_args("--config", str(both), "--sites", sites))
    assert service_scheduling(serve_args("--config", str(both))).burst == {"sustain_min": 5}


# ---- refused, naming the key ------------------------------------------------------------------
def test_unknown_key_is_refused_naming_it_and_the_allowed_ones(tmp_path: Path) -> None:
    path = write(tmp_path, "polcy: fifo\n")
    with pytest.raises(SpecError) as info:
        load_service_config(path, LIVE_DEFAULTS)
    message = str(info.value)
    assert message.startswith(f"{path}: top level: unknown key(s) polcy; allowed: ")
    assert message.endswith(
        ", ".join(
            sorted(
                SCHEDULING_KEYS
                | {"history", "isolation", "labels", "network", "storage", "telemetry_miss_limit"}
            )
        )
    )


def test_scenario_only_keys_are_not_service_keys(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"unknown key\(s\) cluster"):
        load_service_config(write(tmp_path, "cluster: []\n"), LIVE_DEFAULTS)


def test_serve_refuses_a_bad_config_before_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "polcy: fifo\n")
    argv = ["serve", "--config", str(path), "--state-dir", str(tmp_path / "state")]
    assert main([*argv, "--auth", "none", "--fake-gpus", "1xA100-80GB"]) == 2
    err = capsys.readouterr().err
    assert "unknown key(s) polcy; allowed: autoscale, burst" in err
    assert not (tmp_path / "state" / "gpupool.db").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("teams: [", "not valid YAML"),
        ("- teams\n", "top level: expected a mapping"),
        ("teams: {a: 1}\n", "teams: expected a list of teams"),
        ("teams: [{guaranteed: {A100-80GB: 1}}]\n", r"teams\[0\]: missing name"),
        ("policy: tetris\n", "policy: 'tetris'; choose one of"),
        ("mode: islands\n", "mode: 'islands'; choose pool or static"),
        ("cycle_s: 0\n", "cycle_s: 0 is out of range"),
        ("preemption: {min_runtime: 0}\n", r"preemption: unknown key\(s\) min_runtime"),
        ("preemption: {max_per_job: 1.5}\n", "preemption.max_per_job: expected a whole number"),
        ("placement: {gpu_type: cheapest}\n", "placement.gpu_type: 'cheapest'"),
        (
            "teams: [{name: a, guaranteed: {H200: 8}, max: {H200: 2}}]\n",
            r"teams\[0\]: team a: need 0 <= guaranteed <= max",
        ),
    ],
)
def test_bad_values_are_refused_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SpecError, match=message) as info:
        load_service_config(path, LIVE_DEFAULTS)
    assert str(info.value).startswith(f"{path}: ")


def test_unreadable_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"cannot read the service config.*--config path"):
        load_service_config(tmp_path / "missing.yaml", LIVE_DEFAULTS)


def test_window_naming_an_unknown_team_is_refused(tmp_path: Path) -> None:
    text = "teams: [{name: a}]\nwindows: [{from: '09:00', to: '17:00', teams: {ghost: {}}}]\n"
    with pytest.raises(SpecError, match=r"windows\[0\]\.teams: unknown key\(s\) ghost; allowed: a"):
        load_service_config(write(tmp_path, text), LIVE_DEFAULTS)
    with pytest.raises(SpecError, match=r"windows\[0\]\.teams: unknown key\(s\) ghost"):
        parse_scenario(as_scenario(yaml.safe_load(text)))


def test_window_bad_clock_names_the_key(tmp_path: Path) -> None:
    text = "teams: [{name: a}]\nwindows: [{from: 9am, teams: {a: {guaranteed: 0.5}}}]\n"
    with pytest.raises(SpecError, match=r"windows\[0\]\.from: time of day '9am'.*HH:MM"):
        load_service_config(write(tmp_path, text), LIVE_DEFAULTS)


@pytest.mark.parametrize("count", ["1.5", "2.0", "true", "'4'"])
def test_fractional_gpu_count_is_refused(tmp_path: Path, count: str) -> None:
    text = f"teams: [{{name: a, guaranteed: {{A100-80GB: {count}}}}}]\n"
    key = re.escape("teams[0].guaranteed.A100-80GB")
    with pytest.raises(SpecError, match=rf"{key}: expected a whole number of GPUs, got"):
        load_service_config(write(tmp_path, text), LIVE_DEFAULTS)
    with pytest.raises(SpecError, match=rf"{key}: expected a whole number of GPUs"):
        parse_scenario(as_scenario(yaml.safe_load(text)))


def test_negative_gpu_count_is_refused(tmp_path: Path) -> None:
    text = "teams: [{name: a, max: {A100-80GB: -1}}]\n"
    with pytest.raises(SpecError, match=re.escape("teams[0].max.A100-80GB: -1 must be >= 0")):
        load_service_config(write(tmp_path, text), LIVE_DEFAULTS)


# ---- burst and energy --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("burst", "message"),
    [
        ("{sustain_s: 900}", r"burst: unknown key\(s\) sustain_s; allowed: nodes_per_burst"),
        ("{util_threshold: 90}", r"burst\.util_threshold: 90 is a utilisation: give it in 0\.\.1"),
        ("{reclaim_util: -0.1}", r"burst\.reclaim_util: -0.1 is out of range"),
        ("{sustain_min: fifteen}", r"burst\.sustain_min: expected a number"),
        ("{pending_gpus: 0.5}", r"burst\.pending_gpus: expected a whole number"),
        ("{nodes_per_burst: 0}", r"burst\.nodes_per_burst: 0 must be >= 1"),
        ("[1, 2]", "burst: expected a mapping"),
    ],
)
def test_burst_keys_are_checked(tmp_path: Path, burst: str, message: str) -> None:
    text = f"burst: {burst}\n"
    with pytest.raises(SpecError, match=message):
        load_service_config(write(tmp_path, text), LIVE_DEFAULTS)
    with pytest.raises(SpecError, match=message):
        parse_scenario(as_scenario(yaml.safe_load(text)))


def test_burst_is_kept_as_written(tmp_path: Path) -> None:
    raw = {"util_threshold": 0.8, "sustain_min": 10}
    assert parse_scheduling({"burst": raw}, "x.yaml").burst == raw
    assert parse_scheduling({"burst": None}, "x.yaml").burst is None
    assert parse_scheduling({}, "x.yaml", LIVE_DEFAULTS).burst is None


@pytest.mark.parametrize(
    ("energy", "message"),
    [
        ("{tarif: caiso-2024}", r"energy: unknown key\(s\) tarif; allowed: deferral_margin_h"),
        ("{deferral_slot_s: 900}", r"energy: unknown key\(s\) deferral_slot_s"),
        ("{deferral_slot_min: 0}", r"energy\.deferral_slot_min: 0 is out of range"),
        ("{deferral_margin_h: -1}", r"energy\.deferral_margin_h: -1 is out of range"),
        ("{pue: 0.9}", r"energy\.pue: 0.9 is below 1"),
        ("{price_aware: yes please}", r"energy\.price_aware: expected true or false"),
        ("{thermal: {hot: 1}}", r"energy\.thermal: unknown key\(s\) hot"),
        ("{thermal: {hot_nodes: 1.5}}", r"energy\.thermal\.hot_nodes: expected a whole number"),
        ("{site_tariffs: 3}", r"energy\.site_tariffs: expected a mapping"),
    ],
)
def test_energy_keys_are_checked(tmp_path: Path, energy: str, message: str) -> None:
    text = f"energy: {energy}\n"
    with pytest.raises(SpecError, match=message):
        load_service_config(write(tmp_path, text), LIVE_DEFAULTS)
    with pytest.raises(SpecError, match=message):
        parse_scenario(as_scenario(yaml.safe_load(text)))


def test_energy_units_and_defaults() -> None:
    e = parse_scheduling({"energy": {"deferral_slot_min": 5}}, "x.yaml").energy
    assert e.deferral_slot_s == 300.0
    assert e.deferral_margin_s == 3600.0  # default 1 h
    assert e.pue == 1.5 and e.tariff is None and not e.price_aware


# ---- the quotas against the fleet ------------------------------------------------------------
def test_guarantee_for_a_missing_gpu_model_names_the_key_and_the_fleet() -> None:
    cfg = parse_scheduling({"teams": [{"name": "a", "guaranteed": {"A100-40GB": 2}}]}, "x")
    with pytest.raises(SpecError) as info:
        check_fleet(cfg, FLEET, "teams.yaml")
    assert str(info.value) == (
        "teams.yaml: teams[0].guaranteed.A100-40GB: this fleet has no A100-40GB GPUs "
        "(it has A100-80GB, H100-80GB); fix the GPU model or drop the entry"
    )


def test_max_for_a_missing_gpu_model_is_refused() -> None:
    cfg = parse_scheduling({"teams": [{"name": "a"}, {"name": "b", "max": {"V100": 4}}]}, "x")
    with pytest.raises(SpecError, match=re.escape("teams[1].max.V100: this fleet has no V100")):
        check_fleet(cfg, FLEET, "teams.yaml")


def test_site_pools_are_named_site_slash_model() -> None:
    cfg = parse_scheduling({"teams": [{"name": "a", "guaranteed": {"A100-80GB": 2}}]}, "x")
    with pytest.raises(SpecError, match=r"it has east/A100-80GB, west/A100-80GB.*site/GPU model"):
        check_fleet(cfg, {"east/A100-80GB": 8, "west/A100-80GB": 8}, "x")
    ok = parse_scheduling({"teams": [{"name": "a", "guaranteed": {"east/A100-80GB": 2}}]}, "x")
    check_fleet(ok, {"east/A100-80GB": 8, "west/A100-80GB": 8}, "x")


def test_guarantee_above_the_pool_is_refused() -> None:
    cfg = parse_scheduling({"teams": [{"name": "a", "guaranteed": {"H100-80GB": 9}}]}, "x")
    with pytest.raises(
        SpecError,
        match=re.escape(
            "x: teams[0].guaranteed.H100-80GB: 9 GPUs guaranteed but the fleet has 8 "
            "H100-80GB GPUs; lower the guarantee"
        ),
    ):
        check_fleet(cfg, FLEET, "x")


def test_guarantees_adding_up_above_the_pool_are_refused() -> None:
    teams = [
        {"name": "a", "guaranteed": {"A100-80GB": 6}},
        {"name": "b", "guaranteed": {"A100-80GB": 4}},
    ]
    cfg = parse_scheduling({"teams": teams}, "x")
    with pytest.raises(SpecError, match=r"guarantees add up to 10 GPUs \(a 6, b 4\).*has 8"):
        check_fleet(cfg, FLEET, "x")


def test_a_max_above_the_pool_is_allowed() -> None:
    cfg = parse_scheduling({"teams": [{"name": "a", "max": {"A100-80GB": 100}}]}, "x")
    check_fleet(cfg, FLEET, "x")


def test_scenario_checks_its_quotas_against_its_cluster() -> None:
    raw = as_scenario({"teams": [{"name": "a", "guaranteed": {"A100-40GB": 1}}]})
    with pytest.raises(
        SpecError,
        match=re.escape(
            "<scenario>: teams[0].guaranteed.A100-40GB: this fleet has no A100-40GB GPUs "
            "(it has A100-80GB, H100-80GB)"
        ),
    ):
        parse_scenario(raw)

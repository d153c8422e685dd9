"""`sharing.admission`: parsed into the one configuration both drivers read (paths against
the configuration file's folder), and every mistake named with what to write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpupool.errors import SpecError
from gpupool.learning.colocation_admission import ColocationGuardConfig
from gpupool.learning.colocation_config import PairAdmissionConfig
from gpupool.scheduler.config_schema import parse_scheduling
from gpupool.server.loop.config import LIVE_DEFAULTS


def admission(raw: dict[str, Any], path: str = "/etc/gpupool/serve.yaml") -> PairAdmissionConfig:
    return parse_scheduling({"sharing": {"admission": raw}}, path).sharing.admission


def test_off_by_default_and_a_full_section_parses() -> None:
    assert parse_scheduling({}, "x.yaml").sharing.admission == PairAdmissionConfig()
    assert not PairAdmissionConfig().on
    got = admission(
        {
            "decider": "learned",
            "mode": "active",
            "profiles": "profiles.csv",
            "pairs": "/data/lucid-colocation",
            "max_sum_sm_pct": 120,
            "min_speed": 0.9,
            "guard": {"window_pairs": 50, "min_pairs": 40, "max_slowed_share": 0.2},
        }
    )
    assert got == PairAdmissionConfig(
        decider="learned",
        mode="active",
        profiles="/etc/gpupool/profiles.csv",  # relative to the configuration file
        pairs="/data/lucid-colocation",
        max_sum_sm_pct=120.0,
        min_speed=0.9,
        guard=ColocationGuardConfig(50, 40, 0.2, 0.05),
    )
    rule = admission({"decider": "rule", "profiles": "p.csv", "max_sum_sm_pct": 100})
    assert (rule.mode, rule.pairs, rule.max_sum_sm_pct) == ("shadow", None, 100.0)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"decider": "always"}, r"admission\.decider: 'always'; choose one of off, rule, learned"),
        ({"decider": "learned", "profiles": "p.csv"}, "the learned decider trains on measured"),
        ({"decider": "rule"}, "profiles: give the CSV of each job's solo profile"),
        ({"decider": "rule", "profiles": "p.csv"}, "the rule needs max_sum_sm_pct, or pairs"),
        ({"decider": "rule", "profiles": "p.csv", "pairs": "x", "mode": "active"}, "learned only"),
        ({"decider": "learned", "mode": "live"}, r"mode: 'live'; choose active or shadow"),
        ({"decider": "off", "min_speed": 1.5}, r"min_speed: 1\.5 is out of range; give 0\.\.1"),
        ({"profiles": 3}, r"admission\.profiles: 3; give a file or folder path"),
        ({"guard": {"window_pairs": 10, "min_pairs": 20}}, "need 1 <= min_pairs <= window_pairs"),
        ({"guard": {"window": 10}}, r"unknown key\(s\) window"),
        ({"deciders": "rule"}, r"unknown key\(s\) deciders"),
    ],
)
def test_mistakes_are_named_with_what_to_write(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message) as err:
        admission(raw, "serve.yaml")
    assert str(err.value).startswith("serve.yaml: sharing.admission")


def test_the_scenario_and_the_service_parse_it_alike(tmp_path: Path) -> None:
    raw = {"sharing": {"admission": {"decider": "rule", "profiles": "p.csv", "pairs": "l"}}}
    scenario = parse_scheduling(raw, str(tmp_path / "s.yaml")).sharing.admission
    live = parse_scheduling(raw, str(tmp_path / "s.yaml"), LIVE_DEFAULTS).sharing.admission
    assert scenario == live and scenario.profiles == str(tmp_path / "p.csv")

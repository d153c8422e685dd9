"""From `sharing.admission` to the core's admission, as both drivers build it: the job
profiles CSV (errors name the file and line), the measured pairs, a deterministic model."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.errors import SpecError, TraceFormatError
from gpupool.learning.colocation import SpeedPredictor
from gpupool.learning.colocation_admission import AdmissionMode
from gpupool.learning.colocation_config import PairAdmissionConfig
from gpupool.traces.colocation_setup import load_pair_admission
from gpupool.traces.job_profiles import read_job_profiles
from lucid_files import PROFILES_CSV, write_lucid


def csv_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "profiles.csv"
    path.write_text(text, encoding="utf-8")
    return path


def test_job_profiles_by_name(tmp_path: Path) -> None:
    got = read_job_profiles(csv_file(tmp_path, PROFILES_CSV))
    assert set(got) == {"light", "heavy"} and got["heavy"].key == "heavy"
    assert (got["heavy"].sm_util_pct, got["heavy"].mem_bw_util_pct, got["heavy"].mem_mib) == (
        40.0,
        90.0,
        2000.0,
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name,sm_util_pct,mem_mib\nx,1,2\n", r"profiles\.csv:1: missing column\(s\) mem_bw"),
        (PROFILES_CSV + "odd,x,1,2\n", r"profiles\.csv:4: sm_util_pct='x' is not a number"),
        (PROFILES_CSV + "odd,120,1,2\n", r":4: sm_util_pct=120 is not a percentage"),
        (PROFILES_CSV + "light,1,1,2\n", r":4: second profile for job name 'light'"),
        ("name,sm_util_pct,mem_bw_util_pct,mem_mib\n", r":1: no profiles"),
    ],
)
def test_a_bad_profiles_file_names_its_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TraceFormatError, match=message):
        read_job_profiles(csv_file(tmp_path, text))


def test_missing_files_name_the_key_to_fix(tmp_path: Path) -> None:
    assert load_pair_admission(PairAdmissionConfig(), "serve.yaml") is None
    absent = PairAdmissionConfig("rule", profiles=str(tmp_path / "no.csv"), max_sum_sm_pct=90)
    with pytest.raises(SpecError, match=r"serve\.yaml: sharing\.admission\.profiles: .*no\.csv"):
        load_pair_admission(absent, "serve.yaml")
    profiles = str(csv_file(tmp_path, PROFILES_CSV))
    no_pairs = PairAdmissionConfig("learned", profiles=profiles, pairs=str(tmp_path / "none"))
    with pytest.raises(SpecError, match=r"sharing\.admission\.pairs: .*none does not exist"):
        load_pair_admission(no_pairs, "serve.yaml")


def test_the_rule_and_the_learned_admission_are_built_alike_each_time(tmp_path: Path) -> None:
    profiles = str(csv_file(tmp_path, PROFILES_CSV))
    rule = load_pair_admission(
        PairAdmissionConfig("rule", profiles=profiles, max_sum_sm_pct=70), "c"
    )
    assert rule is not None and rule.mode is AdmissionMode.RULE and rule.model is None
    assert rule.rule.max_sum_sm_pct == 70.0 and set(rule.profiles) == {"light", "heavy"}
    pairs = str(write_lucid(tmp_path / "lucid"))
    cfg = PairAdmissionConfig("learned", profiles=profiles, pairs=pairs)
    a, b = load_pair_admission(cfg, "c"), load_pair_admission(cfg, "c")
    assert a is not None and b is not None and a.mode is AdmissionMode.SHADOW
    assert isinstance(a.model, SpeedPredictor) and isinstance(b.model, SpeedPredictor)
    assert a.model.booster.model_to_string() == b.model.booster.model_to_string()
    heavy, light = a.profiles["heavy"], a.profiles["light"]
    assert max(a.model.predict(heavy, heavy)) < 0.6 < min(a.model.predict(light, light))
    # the rule's default bound admits 73% of the measured pairs (calibrated on them)
    assert 40.0 < a.rule.max_sum_sm_pct < 120.0
    active = load_pair_admission(PairAdmissionConfig("learned", "active", profiles, pairs), "c")
    assert active is not None and active.mode is AdmissionMode.LEARNED

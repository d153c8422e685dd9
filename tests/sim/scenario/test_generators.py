"""Workload generators: determinism, independence of entries, statistics, errors."""

from __future__ import annotations

import csv
import math
from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.domain.model import JobKind
from gpupool.errors import SpecError
from gpupool.sim.scenario.generators import (
    GENERATORS,
    PARAMETERS,
    GenContext,
    azure_envelope,
    build_workload,
    lognormal_params,
)
from gpupool.sim.scenario.workload import Workload
from gpupool.traces.location import find_traces_dir

DAY = 86_400.0
HOUR = 3600.0
TRACES = find_traces_dir()
needs_traces = pytest.mark.skipif(
    TRACES is None, reason="public traces (shared/traces) not found; set GPUPOOL_TRACES"
)


def ctx(days: float = 7.0, traces: Path | None = TRACES) -> GenContext:
    return GenContext(horizon_s=days * DAY, traces_dir=traces)


def one(entry: Mapping[str, object], seed: int = 0, days: float = 7.0) -> Workload:
    return build_workload([entry], seed, ctx(days))


# --- determinism and independence ------------------------------------------------------------

ENTRIES: list[Mapping[str, object]] = [
    {"generator": "mixed", "team": "a"},
    {"generator": "backlog", "team": "b", "count": 50, "spread_h": 10},
    {"generator": "finetune", "team": "c"},
    {"generator": "diurnal-service", "team": "d"},
]


def test_same_seed_gives_identical_workload_and_another_seed_does_not() -> None:
    first = build_workload(ENTRIES, 7, ctx(traces=None))
    again = build_workload(ENTRIES, 7, ctx(traces=None))
    other = build_workload(ENTRIES, 8, ctx(traces=None))
    assert first == again
    assert first.jobs != other.jobs


def test_adding_an_entry_leaves_the_earlier_ones_identical() -> None:
    short = build_workload(ENTRIES[:2], 3, ctx(traces=None))
    longer = build_workload(
        [*ENTRIES[:2], {"generator": "mixed", "team": "z"}], 3, ctx(traces=None)
    )
    assert longer.jobs[: len(short.jobs)] == short.jobs
    assert len(longer.jobs) > len(short.jobs)


def test_an_entry_draws_the_same_whatever_the_other_entries_draw() -> None:
    before = build_workload(ENTRIES[:2], 5, ctx(traces=None))
    changed = [{**ENTRIES[0], "jobs_per_day": 90}, ENTRIES[1]]
    after = build_workload(changed, 5, ctx(traces=None))
    assert [j for j in after.jobs if j.team == "b"] == [j for j in before.jobs if j.team == "b"]
    assert len(after.jobs) > len(before.jobs)


def test_job_ids_are_unique_and_prefixed_by_entry_name() -> None:
    w = build_workload(
        [{"generator": "mixed", "team": "a"}, {"generator": "mixed", "team": "a", "name": "x"}],
        0,
        ctx(traces=None),
    )
    ids = [j.job_id for j in w.jobs]
    assert len(ids) == len(set(ids))
    assert {i.split("-")[0] for i in ids} == {"mixed0", "x"}


# --- finetune and backlog --------------------------------------------------------------------


def test_finetune_defaults_are_a_two_week_64_gpu_job() -> None:
    (job,) = one({"generator": "finetune", "team": "ml"}).jobs
    assert (job.gpu_count, job.duration_s, job.state_gib_per_gpu) == (64, 336 * HOUR, 17.5)
    assert (job.cpu_milli, job.mem_mib) == (64 * 8000, 64 * 65_536)
    assert job.kind is JobKind.TRAINING and job.checkpoint_interval_s == 3600.0


def test_finetune_count_and_gap() -> None:
    w = one({"generator": "finetune", "team": "ml", "count": 3, "gap_h": 5, "start_h": 1})
    assert [j.submit_s for j in w.jobs] == [1 * HOUR, 6 * HOUR, 11 * HOUR]


def test_backlog_spread_and_log_uniform_work() -> None:
    entry = {"generator": "backlog", "team": "b", "count": 4000, "submit_h": 2, "spread_h": 10}
    jobs = one(entry).jobs
    submits = np.array([j.submit_s for j in jobs])
    work_h = np.array([j.duration_s or 0.0 for j in jobs]) / HOUR
    assert len(jobs) == 4000
    assert submits.min() >= 2 * HOUR and submits.max() <= 12 * HOUR
    assert abs(submits.mean() - 7 * HOUR) < 0.2 * HOUR
    assert work_h.min() >= 2 and work_h.max() <= 24
    # log-uniform: the median is the geometric mean of the bounds, sqrt(2 * 24) ≈ 6.93 h
    assert abs(np.median(work_h) - math.sqrt(48)) < 0.5


# --- mixed -----------------------------------------------------------------------------------


def _mixed(days: float = 60.0, traces: Path | None = TRACES, **extra: object) -> Workload:
    entry: dict[str, object] = {"generator": "mixed", "team": "t", **extra}
    return build_workload([entry], 11, ctx(days, traces))


def test_mixed_arrival_count_and_day_night_ratio_match_the_thinned_poisson_process() -> None:
    w = _mixed(traces=None, jobs_per_day=40, day_factor=2.0, night_factor=0.5)
    expected = 40 * 60 * (2.0 + 0.5) / 2  # 12 h at each factor per day
    assert abs(len(w.jobs) - expected) < 4 * math.sqrt(expected)
    hours = np.array([(j.submit_s % DAY) / HOUR for j in w.jobs])
    day = np.count_nonzero((hours >= 9) & (hours < 21))
    night = len(hours) - day
    assert 0.85 * 4.0 < day / night < 1.15 * 4.0


def test_mixed_gpu_counts_follow_weights_and_offline_jobs_are_single_gpu() -> None:
    w = _mixed(traces=None, gpu_choices=[1, 4, 8], gpu_weights=[2, 1, 1], offline_share=0.25)
    training = [j for j in w.jobs if j.kind is JobKind.TRAINING]
    offline = [j for j in w.jobs if j.kind is JobKind.OFFLINE]
    counts = Counter(j.gpu_count for j in training)
    for gpus, weight in ((1, 0.5), (4, 0.25), (8, 0.25)):
        assert abs(counts[gpus] / len(training) - weight) < 0.04
    assert abs(len(offline) / len(w.jobs) - 0.25) < 0.04
    assert all(j.gpu_count == 1 and j.gpu_milli == 1000 for j in offline)
    assert all((j.duration_s or 0) <= 6 * HOUR for j in offline)
    assert all(0.1 * HOUR <= (j.duration_s or 0) <= 72 * HOUR for j in w.jobs)
    assert all(j.cpu_milli == 8000 * j.gpu_count for j in w.jobs)
    assert all(2 <= j.state_gib_per_gpu <= 20 for j in w.jobs)


@needs_traces
def test_mixed_work_follows_the_philly_runtimes_times_scale() -> None:
    assert TRACES is not None
    runtimes = np.loadtxt(TRACES / "philly" / "philly_runtime.csv", skiprows=1)
    for scale in (1.0, 3.0):
        w = _mixed(jobs_per_day=200, offline_share=0, duration_scale=scale, max_work_h=1e4)
        work = np.array([j.duration_s or 0.0 for j in w.jobs])
        assert abs(np.median(work) / (np.median(runtimes) * scale) - 1) < 0.1
        # the empirical distribution: some work values are exact Philly runtimes times scale
        assert np.isin(work / scale, runtimes).mean() > 0.5


def test_mixed_falls_back_to_a_lognormal_with_philly_median_and_mean() -> None:
    mu, sigma = lognormal_params(1186.0, 14_613.0)
    assert math.exp(mu) == pytest.approx(1186.0)
    assert math.exp(mu + sigma**2 / 2) == pytest.approx(14_613.0)
    w = _mixed(traces=None, jobs_per_day=200, offline_share=0, min_work_h=0, max_work_h=1e6)
    work = np.array([j.duration_s or 0.0 for j in w.jobs])
    assert abs(np.median(work) / 1186.0 - 1) < 0.1
    assert abs(np.log(work).std() / sigma - 1) < 0.05


# --- services --------------------------------------------------------------------------------


def test_diurnal_service_defaults() -> None:
    (svc,) = one({"generator": "diurnal-service", "team": "web"}).services
    load = svc.load
    assert load.period_s == DAY
    assert [load.at(h * HOUR) for h in (0, 5, 9.5, 10, 12, 14, 14.5, 20)] == [
        20,
        20,
        20,
        1200,
        1200,
        1200,
        20,
        20,
    ]
    assert load.at(9 * HOUR + 50 * 60) == pytest.approx(20 + (1200 - 20) / 2)
    assert load.at(3 * DAY + 12 * HOUR) == 1200
    assert (svc.replica_rps, svc.slo_p99_ms, svc.base_p99_ms) == (20, 200, 120)


@settings(max_examples=60, deadline=None)
@given(
    start=st.floats(0, 23.99),
    hours=st.floats(0.01, 20),
    ramp=st.floats(0, 60),
    base=st.floats(0, 100),
    peak=st.floats(100, 5000),
    probe=st.floats(0.001, 0.999),
)
def test_diurnal_service_is_peak_inside_and_base_outside(
    start: float, hours: float, ramp: float, base: float, peak: float, probe: float
) -> None:
    entry = {
        "generator": "diurnal-service",
        "team": "t",
        "peak_start_h": start,
        "peak_hours": hours,
        "ramp_min": ramp,
        "base_rps": base,
        "peak_rps": peak,
    }
    load = one(entry).services[0].load
    inside = start * HOUR + probe * hours * HOUR
    assert load.at(inside) == pytest.approx(peak)
    outside_len = DAY - hours * HOUR - 2 * ramp * 60
    outside = (start + hours) * HOUR + ramp * 60 + probe * outside_len
    assert load.at(outside) == pytest.approx(base)
    anywhere = probe * 5 * DAY
    assert base - 1e-9 <= load.at(anywhere) <= peak + 1e-9


def _azure_minute_rates(folder: Path) -> np.ndarray:
    """Independent reading: wall-clock arrivals of both files, per whole common minute."""
    stamps = []
    for name in ("AzureLLMInferenceTrace_code.csv", "AzureLLMInferenceTrace_conv.csv"):
        with (folder / name).open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        secs = [
            datetime.strptime(r["TIMESTAMP"][:19], "%Y-%m-%d %H:%M:%S").timestamp()
            + float("0" + r["TIMESTAMP"][19:])
            for r in rows
        ]
        stamps.append(np.array(secs))
    origin = max(s[0] for s in stamps)
    end = min(s.max() for s in stamps)
    minutes = int((end - origin) // 60)
    counts, _ = np.histogram(np.concatenate(stamps) - origin, bins=np.arange(minutes + 1) * 60.0)
    return counts / 60.0


@needs_traces
def test_azure_service_mean_is_the_envelope_mean_and_shape_follows_the_trace() -> None:
    assert TRACES is not None
    entry = {"generator": "azure-service", "team": "llm", "day_rps": 800, "night_rps": 100}
    (svc,) = one(entry).services
    rps = np.array(svc.load.rps)
    times = np.array(svc.load.times_s)
    assert svc.load.period_s == DAY and len(rps) == 1440 and times[1] - times[0] == 60
    assert abs(rps.mean() / 450 - 1) < 0.03
    envelope = azure_envelope(times, 14.0, 800.0, 100.0)
    burst = rps / envelope
    assert abs(burst.mean() - 1) < 0.03
    measured = _azure_minute_rates(TRACES / "azure-llm-inference-2023")
    n = len(measured)
    assert 50 <= n <= 60
    assert np.corrcoef(burst[:n], measured)[0, 1] > 0.99
    assert np.corrcoef(burst[n : 2 * n], measured)[0, 1] > 0.99  # tiled
    # peak and trough of the day follow the envelope
    assert rps[13 * 60 : 15 * 60].mean() > 5 * rps[1 * 60 : 3 * 60].mean()


@needs_traces
def test_azure_service_file_choice_changes_the_shape() -> None:
    code = one({"generator": "azure-service", "team": "t", "file": "code"}).services[0]
    both = one({"generator": "azure-service", "team": "t"}).services[0]
    assert code.load.rps != both.load.rps
    # the code trace alone is far burstier than the merged one (it has empty minutes)
    assert np.std(code.load.rps) > np.std(both.load.rps)


# --- itp -------------------------------------------------------------------------------------


def _itp_window_count(path: Path, start_s: float, end_s: float) -> tuple[int, int]:
    """Independent count of usable jobs (and of those with 1 GPU) submitted in [start, end)."""
    seen: set[str] = set()
    total = single = 0
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row["job_id"] in seen:
                continue
            seen.add(row["job_id"])
            submit, gpus = float(row["submission_time"]), int(row["num_gpu"])
            if gpus > 0 and float(row["duration"]) > 0 and start_s <= submit < end_s:
                total += 1
                single += gpus == 1
    return total, single


@needs_traces
def test_itp_keeps_exactly_the_window_and_draws_the_online_share() -> None:
    assert TRACES is not None
    path = TRACES / "microsoft-itp-2021" / "raw-traces" / "cluster04.csv"
    entry = {
        "generator": "itp",
        "cluster": "cluster04",
        "start_day": 10,
        "days": 20,
        "online_share": 0.3,
    }
    jobs = one(entry).jobs
    total, single = _itp_window_count(path, 10 * DAY, 30 * DAY)
    assert len(jobs) == total
    submits = [j.submit_s for j in jobs]
    assert min(submits) >= 0 and max(submits) < 20 * DAY
    online = [j for j in jobs if j.kind is JobKind.ONLINE]
    assert all(j.gpu_count == 1 and j.priority == 100 for j in online)
    assert abs(len(online) / single - 0.3) < 4 * math.sqrt(0.3 * 0.7 / single)
    teams = Counter(j.team for j in jobs)
    assert set(teams) == {"t1", "t2", "t3", "t4"}
    assert all(abs(n / total - 0.25) < 0.03 for n in teams.values())
    prios = Counter(j.priority for j in jobs if j.kind is JobKind.TRAINING)
    assert abs(prios[0] / sum(prios.values()) - 0.6) < 0.03


@needs_traces
def test_itp_single_team_and_priority() -> None:
    entry = {"generator": "itp", "cluster": "cluster05", "team": "solo", "priority": 3}
    jobs = one(entry).jobs
    assert jobs and {j.team for j in jobs} == {"solo"}
    assert {j.priority for j in jobs if j.kind is JobKind.TRAINING} == {3}


@needs_traces
def test_itp_unknown_cluster_lists_the_known_ones() -> None:
    with pytest.raises(SpecError, match=r"cluster99.*cluster01, cluster02"):
        one({"generator": "itp", "cluster": "cluster99"})


# --- errors ----------------------------------------------------------------------------------


def test_unknown_generator_lists_the_known_names() -> None:
    with pytest.raises(SpecError) as err:
        build_workload([{"generator": "mixd", "team": "a"}], 0, ctx())
    assert "mixd" in str(err.value)
    assert all(name in str(err.value) for name in GENERATORS)


def test_unknown_key_names_entry_generator_key_and_allowed_keys() -> None:
    entries: list[Mapping[str, object]] = [
        {"generator": "finetune", "team": "a"},
        {"generator": "mixed", "team": "a", "jobs_per_dya": 3},
    ]
    with pytest.raises(SpecError) as err:
        build_workload(entries, 0, ctx())
    text = str(err.value)
    assert "entry 1" in text and "mixed" in text and "jobs_per_dya" in text
    assert all(key in text for key in PARAMETERS["mixed"])


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"gpu_weights": [1, 1]}, r"gpu_weights needs one weight per entry of gpu_choices \(6\)"),
        ({"gpu_weights": [0, 0, 0, 0, 0, 0]}, "gpu_weights must sum to more than 0"),
        ({"gpu_weights": [1, 1, 1, 1, 1, -1]}, "gpu_weights must be a list of numbers >= 0"),
        ({"gpu_choices": [1, 2.5, 4, 8, 16, 32]}, "gpu_choices must be a list of whole numbers"),
        ({"offline_share": 1.5}, r"offline_share must be a number in \[0, 1\]"),
        ({"jobs_per_day": True}, "jobs_per_day must be a number"),
        ({"jobs_per_day": "many"}, "jobs_per_day must be a number"),
        ({"end_h": -1}, "end_h must be a number >= 0"),
        ({"state_gib_min": 30}, "state_gib_min <= state_gib_max"),
    ],
)
def test_bad_parameters_say_what_to_fix(extra: dict[str, object], match: str) -> None:
    with pytest.raises(SpecError, match=match):
        one({"generator": "mixed", "team": "a", **extra})


def test_missing_team_and_duplicate_names_are_errors() -> None:
    with pytest.raises(SpecError, match="missing required parameter 'team'"):
        one({"generator": "backlog"})
    twice: list[Mapping[str, object]] = [{"generator": "backlog", "team": "a", "name": "x"}] * 2
    with pytest.raises(SpecError, match="name 'x' is already used by entry 0"):
        build_workload(twice, 0, ctx())


def test_service_checks() -> None:
    with pytest.raises(SpecError, match="base_p99_ms"):
        one({"generator": "diurnal-service", "team": "a", "base_p99_ms": 300})
    with pytest.raises(SpecError, match="exceed a day"):
        one({"generator": "diurnal-service", "team": "a", "peak_hours": 23, "ramp_min": 40})


@pytest.mark.parametrize(
    ("entry", "file"),
    [
        ({"generator": "itp", "cluster": "cluster05"}, "cluster05.csv"),
        ({"generator": "azure-service", "team": "a"}, "AzureLLMInferenceTrace_code.csv"),
    ],
)
def test_trace_generators_without_traces_say_which_file_and_how(
    entry: dict[str, object], file: str, tmp_path: Path
) -> None:
    for traces in (None, tmp_path):
        with pytest.raises(SpecError, match=rf"{file}.*GPUPOOL_TRACES"):
            build_workload([entry], 0, ctx(traces=traces))


def test_find_traces_dir_env_and_walk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.setenv("GPUPOOL_TRACES", str(tmp_path / "elsewhere"))
    assert find_traces_dir() == (tmp_path / "elsewhere").resolve()
    monkeypatch.delenv("GPUPOOL_TRACES")
    (tmp_path / "shared" / "traces").mkdir(parents=True)
    (tmp_path / "repo" / "deep").mkdir(parents=True)
    assert find_traces_dir(tmp_path / "repo" / "deep") == (tmp_path / "shared" / "traces").resolve()

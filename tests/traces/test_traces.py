"""Trace readers against the real shared traces and against small malformed files.

Expected values on real files are recomputed here with the csv module (or taken from the
trace READMEs), never from the readers themselves.
"""

from __future__ import annotations

import csv
import itertools
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpupool.domain.model import MILLI_PER_GPU, JobKind
from gpupool.errors import NotFoundError, SpecError, TraceFormatError
from gpupool.traces.azure_llm import RequestArrival, arrival_rate_per_s, read_azure_llm
from gpupool.traces.common import ReadReport
from gpupool.traces.itp import itp_cluster_files, read_itp
from gpupool.traces.openb import read_nodes, read_pods
from gpupool.traces.philly import read_elasticflow_philly, read_gavel_msr


def _shared_root() -> Path:
    # CI clones the repo beside shared/; a local checkout sits in /work/main.
    parents = Path(__file__).resolve().parents
    if len(parents) > 3:
        beside = parents[3] / "shared" / "traces"
        if beside.exists():
            return beside
    return Path("/work/shared/traces")


SHARED = _shared_root()


def shared(relative: str) -> Path:
    path = SHARED / relative
    if not path.exists():
        pytest.skip(f"shared trace {relative} not found under {SHARED} (shared/ not checked out)")
    return path


def write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def assert_balanced(report: ReadReport) -> None:
    assert report.rows == report.used + sum(report.skipped.values())


def csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


ITP_RAW_HEADER = "job_id,submission_time,duration,num_gpu"
ITP_EF_HEADER = (
    "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,duration"
)
PHILLY_HEADER = (
    "job_id,submit_time,real_iteration,model_name,ddl,batch_size,num_gpu,real_duration,duration,"
    "iteration"
)
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


# --------------------------------------------------------------------------- ITP, real files


def test_itp_cluster04_matches_independent_sums() -> None:
    path = shared("microsoft-itp-2021/raw-traces/cluster04.csv")
    rows = csv_rows(path)
    jobs, report = read_itp(path)
    assert len(jobs) == len(rows) == 15_802
    assert (report.rows, report.used, sum(report.skipped.values())) == (15_802, 15_802, 0)
    expected_gpu_s = sum(int(r["num_gpu"]) * float(r["duration"]) for r in rows)
    assert sum(j.gpu_count * (j.duration_s or 0.0) for j in jobs) == expected_gpu_s
    assert round(expected_gpu_s / 3600) == 705_683  # the trace's README: 705,683 GPU-hours
    assert max(j.gpu_count for j in jobs) == 64
    first = min(rows, key=lambda r: float(r["submission_time"]))
    assert jobs[0].job_id == first["job_id"]
    assert jobs[0].submit_s == float(first["submission_time"])
    assert all(a.submit_s <= b.submit_s for a, b in itertools.pairwise(jobs))
    assert {j.team for j in jobs} == {"cluster04"}
    assert {j.kind for j in jobs} == {JobKind.TRAINING}
    assert {j.gpu_milli for j in jobs} == {MILLI_PER_GPU}


def test_itp_all_raw_clusters_total_69351_jobs() -> None:
    root = shared("microsoft-itp-2021")
    files = itp_cluster_files(root)
    assert [f.name for f in files] == [f"cluster{n:02d}.csv" for n in range(1, 11)]
    assert all(f.parent.name == "raw-traces" for f in files)
    total = 0
    for f in files:
        jobs, report = read_itp(f)
        assert_balanced(report)
        assert len(jobs) == len(csv_rows(f))
        total += len(jobs)
    assert total == 69_351


def test_itp_elasticflow_form_has_same_jobs_as_raw() -> None:
    raw_jobs, _ = read_itp(shared("microsoft-itp-2021/raw-traces/cluster04.csv"))
    ef_path = shared("microsoft-itp-2021/elasticflow-traces/cluster04.csv")
    ef_jobs, report = read_itp(ef_path, fmt="elasticflow", cluster="itp-04")
    assert report.used == 15_802
    assert {j.team for j in ef_jobs} == {"itp-04"}
    key = [(j.job_id, j.submit_s, j.duration_s, j.gpu_count) for j in raw_jobs]
    assert [(j.job_id, j.submit_s, j.duration_s, j.gpu_count) for j in ef_jobs] == key


def test_itp_cluster_files_ignores_195job_list() -> None:
    folder = shared("microsoft-itp-2021/elasticflow-traces")
    assert (folder / "195job.csv").exists()
    files = itp_cluster_files(folder, fmt="elasticflow")
    assert len(files) == 10
    assert "195job.csv" not in {f.name for f in files}


# --------------------------------------------------------------------------- ITP, small files


def test_itp_sorts_by_submit_time_keeping_file_order_on_ties(tmp_path: Path) -> None:
    path = write(tmp_path, "cluster07.csv", [ITP_RAW_HEADER, "c,20,5,1", "a,10,5,2", "b,10,5,4"])
    jobs, report = read_itp(path)
    assert [j.job_id for j in jobs] == ["a", "b", "c"]
    assert [j.gpu_count for j in jobs] == [2, 4, 1]
    assert {j.team for j in jobs} == {"cluster07"}
    assert (report.rows, report.used) == (3, 3)


def test_itp_unusable_rows_are_counted(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "cluster01.csv",
        [
            ITP_RAW_HEADER,
            "ok1,0,100,1",
            "nogpu,1,100,0",
            "zerodur,2,0,1",
            "negdur,3,-5,1",
            "early,-1,100,1",
            "ok1,4,100,1",
            "ok2,5,100,8",
        ],
    )
    jobs, report = read_itp(path)
    assert [j.job_id for j in jobs] == ["ok1", "ok2"]
    assert jobs[0].submit_s == 0.0  # the first ok1 is kept, the later copy is not
    assert report.skipped == Counter(
        {
            "no GPU requested": 1,
            "non-positive duration": 2,
            "negative submit time": 1,
            "duplicate job id": 1,
        }
    )
    assert (report.rows, report.used) == (7, 2)
    assert_balanced(report)


def test_itp_non_numeric_num_gpu_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "cluster02.csv", [ITP_RAW_HEADER, "a,0,10,1", "b,1,10,1", "c,2,10,two"])
    with pytest.raises(TraceFormatError) as err:
        read_itp(path)
    assert err.value.path == str(path)
    assert err.value.line == 4
    assert "num_gpu" in err.value.problem and "'two'" in err.value.problem


def test_itp_elasticflow_non_numeric_duration(tmp_path: Path) -> None:
    path = write(tmp_path, "cluster03.csv", [ITP_EF_HEADER, "a,0,10,resnet50,99,32,1,long"])
    with pytest.raises(TraceFormatError) as err:
        read_itp(path, fmt="elasticflow")
    assert (err.value.path, err.value.line) == (str(path), 2)
    assert "duration" in err.value.problem


def test_itp_missing_header_column(tmp_path: Path) -> None:
    path = write(tmp_path, "cluster01.csv", ["job_id,submission_time,duration", "a,0,10"])
    with pytest.raises(TraceFormatError) as err:
        read_itp(path)
    assert (err.value.path, err.value.line) == (str(path), 1)
    assert "num_gpu" in err.value.problem


def test_itp_raw_file_read_as_elasticflow_is_missing_columns(tmp_path: Path) -> None:
    path = write(tmp_path, "cluster01.csv", [ITP_RAW_HEADER, "a,0,10,1"])
    with pytest.raises(TraceFormatError) as err:
        read_itp(path, fmt="elasticflow")
    assert err.value.line == 1
    assert "model_name" in err.value.problem


def test_itp_wrong_field_count(tmp_path: Path) -> None:
    path = write(tmp_path, "cluster01.csv", [ITP_RAW_HEADER, "a,0,10,1", "b,1,10,1,extra"])
    with pytest.raises(TraceFormatError) as err:
        read_itp(path)
    assert (err.value.path, err.value.line) == (str(path), 3)
    assert "expected 4 fields, found 5" in err.value.problem


def test_itp_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "cluster01.csv"
    path.write_text("", encoding="utf-8")
    with pytest.raises(TraceFormatError) as err:
        read_itp(path)
    assert (err.value.path, err.value.line) == (str(path), 1)
    assert "empty" in err.value.problem


def test_itp_missing_file(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        read_itp(tmp_path / "cluster99.csv")


def test_itp_unknown_format_lists_both(tmp_path: Path) -> None:
    path = write(tmp_path, "cluster01.csv", [ITP_RAW_HEADER, "a,0,10,1"])
    with pytest.raises(SpecError) as err:
        read_itp(path, fmt="philly")
    assert "raw" in str(err.value) and "elasticflow" in str(err.value)
    assert not isinstance(err.value, TraceFormatError)


def test_itp_cluster_files_in_a_folder(tmp_path: Path) -> None:
    for name in ("cluster10.csv", "cluster02.csv", "cluster01.csv", "195job.csv", "notes.csv"):
        write(tmp_path, name, [ITP_RAW_HEADER])
    (tmp_path / "cluster05.csv.bak").write_text("", encoding="utf-8")
    files = itp_cluster_files(tmp_path)
    assert files == [tmp_path / f"cluster{n}.csv" for n in ("01", "02", "10")]


def test_itp_cluster_files_single_file_and_format_subfolder(tmp_path: Path) -> None:
    single = write(tmp_path, "anything.csv", [ITP_RAW_HEADER])
    assert itp_cluster_files(single) == [single]
    sub = tmp_path / "elasticflow-traces"
    sub.mkdir()
    ef = write(sub, "cluster01.csv", [ITP_EF_HEADER])
    assert itp_cluster_files(tmp_path, fmt="elasticflow") == [ef]
    with pytest.raises(NotFoundError):
        itp_cluster_files(tmp_path, fmt="raw")  # no raw-traces/ and no cluster files here


def test_itp_cluster_files_nothing_found(tmp_path: Path) -> None:
    write(tmp_path, "195job.csv", [ITP_EF_HEADER])
    with pytest.raises(NotFoundError) as err:
        itp_cluster_files(tmp_path)
    assert "clusterNN.csv" in str(err.value)
    with pytest.raises(NotFoundError):
        itp_cluster_files(tmp_path / "absent")
    with pytest.raises(SpecError):
        itp_cluster_files(tmp_path, fmt="csv")


# --------------------------------------------------------------------------- Philly


def test_elasticflow_philly_103959_real() -> None:
    path = shared("philly/elasticflow_philly_103959.csv")
    rows = csv_rows(path)
    jobs, report = read_elasticflow_philly(path)
    assert len(jobs) == len(rows) == 876
    assert (report.rows, report.used) == (876, 876)
    assert Counter(j.gpu_count for j in jobs) == Counter(int(r["num_gpu"]) for r in rows)
    assert {j.gpu_count for j in jobs} == {1, 2, 4}
    expected = sum(int(r["num_gpu"]) * float(r["duration"]) for r in rows)
    assert sum(j.gpu_count * (j.duration_s or 0.0) for j in jobs) == expected
    by_id = {r["job_id"]: r for r in rows}
    last = jobs[-1]
    assert last.submit_s == max(float(r["submit_time"]) for r in rows)
    assert last.duration_s == float(by_id[last.job_id]["duration"])
    assert {j.team for j in jobs} == {"philly-103959"}


def test_elasticflow_philly_rules(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "my_list.csv",
        [
            PHILLY_HEADER,
            "1,30,10,vgg16,99,64,2,50,60,10",
            "2,10,10,vgg16,99,64,0,50,60,10",
            "3,20,10,vgg16,99,64,1,50,0,10",
            "1,40,10,vgg16,99,64,1,50,60,10",
            "4,-3,10,vgg16,99,64,1,50,60,10",
            "5,5,10,vgg16,99,64,4,50,70,10",
        ],
    )
    jobs, report = read_elasticflow_philly(path)
    assert [(j.job_id, j.gpu_count, j.duration_s) for j in jobs] == [("5", 4, 70.0), ("1", 2, 60.0)]
    assert {j.team for j in jobs} == {"my_list"}
    assert report.skipped == Counter(
        {
            "no GPU requested": 1,
            "non-positive duration": 1,
            "duplicate job id": 1,
            "negative submit time": 1,
        }
    )
    assert_balanced(report)


def test_elasticflow_philly_malformed(tmp_path: Path) -> None:
    bad = write(
        tmp_path,
        "p.csv",
        [PHILLY_HEADER, "1,0,10,vgg16,99,64,1,50,60,10", "2,0,10,vgg16,99,64,four,50,60,10"],
    )
    with pytest.raises(TraceFormatError) as err:
        read_elasticflow_philly(bad)
    assert (err.value.path, err.value.line) == (str(bad), 3)
    assert "num_gpu" in err.value.problem

    missing = write(tmp_path, "m.csv", [PHILLY_HEADER.replace(",duration,", ",dur,"), "x"])
    with pytest.raises(TraceFormatError) as err:
        read_elasticflow_philly(missing)
    assert err.value.line == 1 and "duration" in err.value.problem

    short = write(tmp_path, "s.csv", [PHILLY_HEADER, "1,0,10,vgg16,99,64,1,50,60"])
    with pytest.raises(TraceFormatError) as err:
        read_elasticflow_philly(short)
    assert err.value.line == 2 and "found 9" in err.value.problem

    empty = write(tmp_path, "e.csv", [])
    with pytest.raises(TraceFormatError) as err:
        read_elasticflow_philly(empty)
    assert err.value.line == 1
    with pytest.raises(NotFoundError):
        read_elasticflow_philly(tmp_path / "none.csv")


GAVEL_CMD = "cd %s/workloads && python3 train.py --batch_size 64"


def gavel_line(steps: str = "1000", arrival: str = "0.000000", scale: str = "1") -> str:
    return "\t".join(["ResNet-50 (batch size 64)", GAVEL_CMD, "-n", "1", steps, arrival, scale])


def test_gavel_msr_103959_real() -> None:
    path = shared("philly/gavel-msr-traces-seed0/103959.trace.txt")
    with path.open(newline="", encoding="utf-8") as handle:
        rows = [r for r in csv.reader(handle, delimiter="\t") if r]
    jobs, report = read_gavel_msr(path)
    assert len(jobs) == len(rows) == 986
    assert (report.rows, report.used) == (986, 986)
    assert sum(j.gpu_count for j in jobs) == sum(int(r[6]) for r in rows)
    assert jobs[1].job_id == "103959-1"
    assert jobs[1].submit_s == float(rows[1][5]) == 219316.0
    assert jobs[1].gpu_count == int(rows[1][6]) == 4
    assert jobs[-1].submit_s == max(float(r[5]) for r in rows)
    assert all(j.duration_s is not None and j.duration_s > 0 for j in jobs)
    assert {j.name for j in jobs} == {r[0] for r in rows}
    assert {j.team for j in jobs} == {"103959"}


def test_gavel_msr_all_vcs_total() -> None:
    folder = shared("philly/gavel-msr-traces-seed0")
    files = sorted(folder.glob("*.trace.txt"))
    assert len(files) == 15
    total = 0
    for f in files:
        jobs, report = read_gavel_msr(f)
        assert_balanced(report)
        total += len(jobs)
    assert total == 15_264  # the traces' README


def test_gavel_msr_rules_and_ids(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "vcx.trace.txt",
        [
            gavel_line(arrival="50.0", scale="8"),
            gavel_line(scale="0"),
            "",
            gavel_line(steps="0"),
            gavel_line(arrival="-1.0"),
            gavel_line(arrival="10.0", scale="2"),
        ],
    )
    jobs, report = read_gavel_msr(path)
    assert [(j.job_id, j.gpu_count, j.submit_s) for j in jobs] == [
        ("vcx-4", 2, 10.0),
        ("vcx-0", 8, 50.0),
    ]
    assert report.skipped == Counter(
        {"no GPU requested": 1, "non-positive step count": 1, "negative submit time": 1}
    )
    assert (report.rows, report.used) == (5, 2)
    assert_balanced(report)


def test_gavel_msr_malformed(tmp_path: Path) -> None:
    bad = write(tmp_path, "a.trace.txt", [gavel_line(), "", gavel_line(scale="x")])
    with pytest.raises(TraceFormatError) as err:
        read_gavel_msr(bad)
    assert (err.value.path, err.value.line) == (str(bad), 3)
    assert "scale_factor" in err.value.problem

    bad_arrival = write(tmp_path, "b.trace.txt", [gavel_line(arrival="soon")])
    with pytest.raises(TraceFormatError) as err:
        read_gavel_msr(bad_arrival)
    assert err.value.line == 1 and "arrival_time" in err.value.problem

    six = write(tmp_path, "c.trace.txt", [gavel_line(), gavel_line().rsplit("\t", 1)[0]])
    with pytest.raises(TraceFormatError) as err:
        read_gavel_msr(six)
    assert err.value.line == 2 and "found 6" in err.value.problem

    ten = write(tmp_path, "d.trace.txt", [gavel_line() + "\t1\t-1\tx"])
    with pytest.raises(TraceFormatError) as err:
        read_gavel_msr(ten)
    assert err.value.line == 1 and "found 10" in err.value.problem

    empty = write(tmp_path, "e.trace.txt", [])
    with pytest.raises(TraceFormatError) as err:
        read_gavel_msr(empty)
    assert (err.value.path, err.value.line) == (str(empty), 1)
    with pytest.raises(NotFoundError):
        read_gavel_msr(tmp_path / "none.trace.txt")


def test_gavel_msr_quote_in_command_does_not_merge_fields(tmp_path: Path) -> None:
    line = "\t".join(['A "quoted" job', 'echo "a\tb', "-n", "1", "10", "3.0", "2"])
    path = write(tmp_path, "q.trace.txt", ["\t".join(['Job "x', "cmd", "-n", "1", "10", "1", "1"])])
    jobs, _ = read_gavel_msr(path, {'Job "x': 1.0})
    assert [j.gpu_count for j in jobs] == [1]
    path2 = write(tmp_path, "q2.trace.txt", [line])
    with pytest.raises(TraceFormatError) as err:  # the tab inside the command is a field break
        read_gavel_msr(path2)
    assert "found 8" in err.value.problem


# --------------------------------------------------------------------------- Azure LLM


def _independent_seconds(stamp: str) -> float:
    # datetime keeps 6 digits; add the 7th (100 ns) digit by hand.
    head, frac = stamp.split(".")
    base = datetime.strptime(head, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    return base.timestamp() + int(frac.ljust(7, "0")) / 10**7


@pytest.mark.parametrize(
    ("name", "count"),
    [("AzureLLMInferenceTrace_code.csv", 8_819), ("AzureLLMInferenceTrace_conv.csv", 19_366)],
)
def test_azure_llm_real(name: str, count: int) -> None:
    path = shared(f"azure-llm-inference-2023/{name}")
    rows = csv_rows(path)
    arrivals, report = read_azure_llm(path)
    assert len(arrivals) == len(rows) == count
    assert (report.rows, report.used) == (count, count)
    start = _independent_seconds(rows[0]["TIMESTAMP"])
    assert arrivals[0].arrival_s == 0.0
    assert arrivals[-1].arrival_s == pytest.approx(
        _independent_seconds(rows[-1]["TIMESTAMP"]) - start, abs=1e-6
    )
    assert 3000 < arrivals[-1].arrival_s < 3700  # the trace's README: about one hour
    assert sum(a.context_tokens for a in arrivals) == sum(int(r["ContextTokens"]) for r in rows)
    assert sum(a.generated_tokens for a in arrivals) == sum(int(r["GeneratedTokens"]) for r in rows)
    assert arrivals[5].request_id == f"{path.stem}-5"
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(arrivals))
    rates = arrival_rate_per_s(arrivals, 60.0)
    assert sum(rates) * 60.0 == pytest.approx(count)


def test_azure_llm_keeps_100ns_resolution(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "t.csv",
        [
            AZURE_HEADER,
            "2023-11-16 23:59:59.9999999,10,1",
            "2023-11-17 00:00:00.0000000,10,1",
            "2023-11-17 00:00:00.0000005,10,1",
            "2023-11-17 00:00:02,10,1",
        ],
    )
    arrivals, _ = read_azure_llm(path)
    assert [a.arrival_s for a in arrivals] == pytest.approx(
        [0.0, 1e-7, 6e-7, 2.0000001], rel=1e-9, abs=1e-12
    )
    assert arrivals[1].arrival_s != arrivals[2].arrival_s  # a 6-digit parser merges these


def test_azure_llm_unusable_rows(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "t.csv",
        [
            AZURE_HEADER,
            "2023-11-16 18:00:10.0000000,-1,5",
            "2023-11-16 18:00:12.5000000,100,7",
            "2023-11-16 18:00:09.0000000,100,7",
            "2023-11-16 18:00:11.0000000,100,-2",
            "2023-11-16 18:00:11.0000000,300,9",
        ],
    )
    arrivals, report = read_azure_llm(path)
    assert arrivals == [
        RequestArrival("t-4", 1.0, 300, 9),
        RequestArrival("t-1", 2.5, 100, 7),
    ]
    assert report.skipped == Counter({"negative token count": 2, "timestamp before trace start": 1})
    assert (report.rows, report.used) == (5, 2)
    assert_balanced(report)


@pytest.mark.parametrize(
    ("lines", "line", "needle"),
    [
        (
            [AZURE_HEADER, "2023-11-16 18:00:10.0,1,1", "2023-11-16 18:00:11.0,many,1"],
            3,
            "ContextTokens",
        ),
        ([AZURE_HEADER, "2023-11-16 18:00:10.0,1,1", "yesterday,1,1"], 3, "TIMESTAMP"),
        ([AZURE_HEADER, "2023-02-30 18:00:10.0,1,1"], 2, "TIMESTAMP"),
        ([AZURE_HEADER, "2023-11-16 18:00:10.0,1"], 2, "found 2"),
        (["TIMESTAMP,ContextTokens", "2023-11-16 18:00:10.0,1"], 1, "GeneratedTokens"),
        ([], 1, "empty"),
    ],
)
def test_azure_llm_malformed(tmp_path: Path, lines: list[str], line: int, needle: str) -> None:
    path = write(tmp_path, "bad.csv", lines)
    with pytest.raises(TraceFormatError) as err:
        read_azure_llm(path)
    assert (err.value.path, err.value.line) == (str(path), line)
    assert needle in err.value.problem


def test_azure_llm_missing_file(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        read_azure_llm(tmp_path / "none.csv")


def test_arrival_rate_per_s_windows() -> None:
    arrivals = [RequestArrival(f"r{i}", t, 1, 1) for i, t in enumerate([0.0, 0.5, 1.9, 2.0, 5.5])]
    assert arrival_rate_per_s(arrivals, 2.0) == [1.5, 0.5, 0.5]
    assert arrival_rate_per_s(arrivals, 1.0) == [2.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    assert arrival_rate_per_s([], 1.0) == []


@pytest.mark.parametrize("window", [0.0, -1.0, float("nan"), float("inf")])
def test_arrival_rate_per_s_rejects_bad_window(window: float) -> None:
    with pytest.raises(SpecError):
        arrival_rate_per_s([RequestArrival("r", 0.0, 1, 1)], window)


# --------------------------------------------------------------------------- openb (existing)


def test_openb_gpu_nodes_real() -> None:
    path = shared("alibaba-gpu-2023-fgd/csv/openb_node_list_gpu_node.csv")
    rows = csv_rows(path)
    cluster, report = read_nodes(path)
    assert len(cluster.nodes) == len(rows) == 1213
    assert cluster.gpu_count == sum(int(r["gpu"]) for r in rows) == 6212
    per_model: Counter[str] = Counter()
    for node in cluster.nodes:
        per_model[node.gpu_model] += node.gpu_count
    assert per_model == Counter(
        {"G2": 4392, "T4": 842, "P100": 265, "V100M32": 204, "V100M16": 195, "G3": 312, "A10": 2}
    )
    assert (report.rows, report.used) == (1213, 1213)


def test_openb_all_nodes_skips_cpu_only() -> None:
    path = shared("alibaba-gpu-2023-fgd/csv/openb_node_list_all_node.csv")
    cluster, report = read_nodes(path)
    assert report.rows == 1523
    assert report.skipped == Counter({"nodes without GPUs": 310})
    assert cluster.gpu_count == 6212
    assert_balanced(report)


def test_openb_default_pods_real() -> None:
    path = shared("alibaba-gpu-2023-fgd/csv/openb_pod_list_default.csv")
    rows = csv_rows(path)
    jobs, report = read_pods(path)
    assert len(jobs) == len(rows) == 8152
    assert (report.rows, report.used) == (8152, 8152)
    expected_milli = sum(int(r["num_gpu"]) * int(r["gpu_milli"]) for r in rows)
    assert sum(j.total_gpu_milli for j in jobs) == expected_milli == 6_086_800
    assert sum(1 for j in jobs if j.gpu_count == 0) == 1088
    assert sum(1 for j in jobs if j.shares_gpu) == 3078
    assert sum(1 for j in jobs if j.gpu_count > 1) == 75


OPENB_POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli"


def test_openb_pod_gpu_milli_out_of_range_is_skipped(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "pods.csv",
        [OPENB_POD_HEADER, "p0,1000,1024,1,500", "p1,1000,1024,1,1500", "p2,0,0,0,0"],
    )
    jobs, report = read_pods(path)
    assert [j.job_id for j in jobs] == ["p0", "p2"]
    assert report.skipped == Counter({"gpu_milli outside 1..1000": 1})
    assert_balanced(report)


def test_openb_pod_non_numeric_cpu_names_line(tmp_path: Path) -> None:
    path = write(
        tmp_path, "pods.csv", [OPENB_POD_HEADER, "p0,1000,1024,1,500", "p1,lots,1024,1,500"]
    )
    with pytest.raises(TraceFormatError) as err:
        read_pods(path)
    assert (err.value.path, err.value.line) == (str(path), 3)
    assert "cpu_milli" in err.value.problem


def test_openb_node_malformed(tmp_path: Path) -> None:
    header = "sn,cpu_milli,memory_mib,gpu,model"
    bad = write(tmp_path, "nodes.csv", [header, "n1,96000,393216,8,G2", "n2,96000,393216,eight,G2"])
    with pytest.raises(TraceFormatError) as err:
        read_nodes(bad)
    assert (err.value.path, err.value.line) == (str(bad), 3)
    with pytest.raises(TraceFormatError) as err:
        read_nodes(write(tmp_path, "n2.csv", ["sn,cpu_milli,gpu,model", "n1,1,8,G2"]))
    assert err.value.line == 1 and "memory_mib" in err.value.problem
    with pytest.raises(NotFoundError):
        read_nodes(tmp_path / "none.csv")


# --------------------------------------------------------------------------- all readers


READERS: dict[str, tuple[Callable[[Path], Any], str]] = {
    "itp-raw": (read_itp, "cluster01.csv"),
    "itp-elasticflow": (lambda p: read_itp(p, fmt="elasticflow"), "cluster01.csv"),
    "philly": (read_elasticflow_philly, "philly.csv"),
    "gavel": (read_gavel_msr, "vc.trace.txt"),
    "azure": (read_azure_llm, "azure.csv"),
    "openb-pods": (read_pods, "pods.csv"),
    "openb-nodes": (read_nodes, "nodes.csv"),
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_rejects_empty_and_missing_files(tmp_path: Path, reader: str) -> None:
    read, name = READERS[reader]
    empty = tmp_path / name
    empty.write_text("", encoding="utf-8")
    with pytest.raises(TraceFormatError) as err:
        read(empty)
    assert (err.value.path, err.value.line) == (str(empty), 1)
    with pytest.raises(NotFoundError):
        read(tmp_path / "missing" / name)

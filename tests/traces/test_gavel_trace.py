"""Gavel's Philly msr traces: run times recovered from total_steps and the model's throughput.

Expected values are recomputed here with the csv module from the trace files and the packaged
throughput table, never taken from the reader under test.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from gpupool.cli.main import main
from gpupool.domain.model import JobKind
from gpupool.errors import NotFoundError, TraceFormatError
from gpupool.traces.loaders import load_replay_trace
from gpupool.traces.philly import (
    packaged_gavel_throughputs_path,
    read_gavel_msr,
    read_gavel_throughputs,
)

CMD = "cd %s/workloads && python3 train.py"


def table() -> dict[str, float]:
    with packaged_gavel_throughputs_path().open(newline="", encoding="utf-8") as handle:
        return {r["job_type"]: float(r["steps_per_s"]) for r in csv.DictReader(handle)}


def line(job_type: str, steps: int, arrival: float = 0.0, gpus: int = 1) -> str:
    return "\t".join([job_type, CMD, "-n", "1", str(steps), f"{arrival:.6f}", str(gpus)])


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{text}\n" for text in lines), encoding="utf-8")
    return path


def tsv_rows(path: Path) -> list[list[str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [r for r in csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE) if r]


@pytest.fixture
def gavel_folder(traces: Path) -> Path:
    folder = traces / "philly" / "gavel-msr-traces-seed0"
    if not folder.is_dir():
        pytest.skip("philly/gavel-msr-traces-seed0 is not in shared/traces")
    return folder


def test_packaged_table_is_one_v100_rate_per_model() -> None:
    with packaged_gavel_throughputs_path().open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 26  # Gavel's job table: 5 ResNet-18, 4 ResNet-50, 5 Transformer, ...
    assert {r["gpu_type"] for r in rows} == {"v100"}
    assert len({r["job_type"] for r in rows}) == len(rows)
    assert read_gavel_throughputs(packaged_gavel_throughputs_path()) == table()


def test_duration_is_steps_over_the_model_throughput(tmp_path: Path) -> None:
    rates = table()
    path = write(
        tmp_path / "vc1.trace.txt",
        [
            line("ResNet-50 (batch size 64)", 65_490, arrival=30.0, gpus=4),
            line("Recommendation (batch size 512)", 2_522, arrival=10.0),
        ],
    )
    jobs, report = read_gavel_msr(path)
    assert (report.rows, report.used) == (2, 2)
    rec, resnet = jobs  # sorted by submit time
    assert rec.duration_s == pytest.approx(2_522 / rates["Recommendation (batch size 512)"])
    # The rate is the single-GPU one whatever the GPU count: Gavel derived steps that way.
    assert resnet.duration_s == pytest.approx(65_490 / rates["ResNet-50 (batch size 64)"])
    assert (resnet.name, resnet.gpu_count, resnet.kind) == (
        "ResNet-50 (batch size 64)",
        4,
        JobKind.TRAINING,
    )
    assert rec.name == "Recommendation (batch size 512)" and rec.team == "vc1"


def test_a_given_throughput_table_replaces_the_packaged_one(tmp_path: Path) -> None:
    path = write(tmp_path / "vc.trace.txt", [line("MyNet", 500)])
    jobs, _ = read_gavel_msr(path, {"MyNet": 2.0})
    assert jobs[0].duration_s == 250.0


def test_an_unknown_model_is_refused(tmp_path: Path) -> None:
    path = write(
        tmp_path / "vc.trace.txt",
        [line("ResNet-18 (batch size 16)", 100_000), line("BERT (batch size 8)", 100)],
    )
    with pytest.raises(TraceFormatError) as err:
        read_gavel_msr(path)
    assert (err.value.path, err.value.line) == (str(path), 2)
    assert "'BERT (batch size 8)'" in err.value.problem
    assert "throughput" in err.value.problem


def test_malformed_throughput_tables_are_refused(tmp_path: Path) -> None:
    header = "job_type,gpu_type,steps_per_s"
    cases = {
        "twice.csv": ([header, "A3C,v100,8.2", "A3C,v100,8.3"], 3, "twice"),
        "zero.csv": ([header, "A3C,v100,0"], 2, "> 0"),
        "word.csv": ([header, "A3C,v100,fast"], 2, "steps_per_s"),
        "nameless.csv": ([header, ",v100,1.0"], 2, "job_type"),
        "columns.csv": (["job_type,steps"], 1, "steps_per_s"),
        "header_only.csv": ([header], 2, "no throughput"),
    }
    for name, (lines, at, words) in cases.items():
        path = write(tmp_path / name, lines)
        with pytest.raises(TraceFormatError) as err:
            read_gavel_throughputs(path)
        assert err.value.line == at, name
        assert words in err.value.problem, name


def test_the_table_reproduces_every_step_count_of_the_shared_traces(gavel_folder: Path) -> None:
    """Gavel wrote steps = int(whole Philly seconds x rate); a wrong rate breaks this."""
    rates = table()
    rows = [r for f in sorted(gavel_folder.glob("*.trace.txt")) for r in tsv_rows(f)]
    assert {r[0] for r in rows} == set(rates)
    for r in rows:
        steps, rate = int(r[4]), rates[r[0]]
        seconds = math.ceil(steps / rate - 1e-9)
        assert int(seconds * rate) == steps, r[:1] + r[4:]


def test_real_row_duration(gavel_folder: Path) -> None:
    path = gavel_folder / "103959.trace.txt"
    first = tsv_rows(path)[0]
    jobs, _ = read_gavel_msr(path)
    job = next(j for j in jobs if j.job_id == "103959-0")
    assert job.name == first[0]
    assert job.duration_s == pytest.approx(int(first[4]) / table()[first[0]])


def test_the_folder_loads_every_vc_and_every_job(gavel_folder: Path) -> None:
    files = sorted(gavel_folder.glob("*.trace.txt"))
    expected = {f.name.removesuffix(".trace.txt"): len(tsv_rows(f)) for f in files}
    loaded = load_replay_trace(gavel_folder, "gavel")
    assert {name: len(jobs) for name, jobs, _ in loaded} == expected
    assert len(expected) == 15
    assert sum(expected.values()) == 15_264  # the trace README's total
    for name, jobs, report in loaded:
        assert report.rows == report.used == expected[name]
        assert {j.team for j in jobs} == {name}
        assert all(j.duration_s is not None and j.duration_s > 0 for j in jobs)


def test_loader_reads_one_file_and_refuses_a_folder_without_traces(tmp_path: Path) -> None:
    one = write(tmp_path / "abc.trace.txt", [line("A3C", 8_233)])
    write(tmp_path / "notes.txt", ["not a trace"])
    assert [(n, len(j)) for n, j, _ in load_replay_trace(one, "gavel")] == [("abc", 1)]
    assert [n for n, _, _ in load_replay_trace(tmp_path, "gavel")] == ["abc"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(NotFoundError) as err:
        load_replay_trace(empty, "gavel")
    assert ".trace.txt" in str(err.value)


def test_cli_replays_a_gavel_trace(tmp_path: Path) -> None:
    rates = table()
    trace = write(
        tmp_path / "vc.trace.txt",
        [line("A3C", 8_233, arrival=0.0), line("CycleGAN", 4_918, arrival=5.0)],
    )
    out = tmp_path / "r.json"
    argv = ["simulate", "replay", "--trace", str(trace), "--format", "gavel", "--nodes", "1"]
    assert main([*argv, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["jobs"] == 2
    # One 8-GPU node, two 1-GPU jobs: neither waits, so each JCT is its run time.
    expected = (8_233 / rates["A3C"] + 4_918 / rates["CycleGAN"]) / 2
    assert data["avg_jct_s"] == pytest.approx(expected)

"""The Lucid co-location reader: small hand-made files (errors name file and line), and
the real files when the shared folder is there (counts recomputed here with csv)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gpupool.errors import NotFoundError, TraceFormatError
from gpupool.traces.location import find_traces_dir
from gpupool.traces.lucid import (
    LUCID_DIR,
    PAIRS_FILE,
    SOLO_FILE,
    profile_key,
    read_lucid,
    read_pairs,
    read_solo,
)

SOLO_HEADER = "model,dataset,batchsize,amp,speed,gpu_util,gmem_util,gmem,label"
PAIR_HEADER = (
    ",model1,dataset1,gpu_num1,batchsize1,amp1,speed1,"
    "model2,dataset2,gpu_num2,batchsize2,amp2,speed2,gpu_util,gmem_util,gmem"
)


def write(folder: Path, name: str, lines: list[str]) -> Path:
    path = folder / name
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def small(
    folder: Path, solo_extra: list[str] | None = None, pair_lines: list[str] | None = None
) -> Path:
    write(
        folder,
        SOLO_FILE,
        [
            SOLO_HEADER,
            "A,X,32,0,100.0,40.0,10.0,2000.0,0",
            "B,Y,64,1,50.0,90.0,60.5,8000.0,2",
            *(solo_extra or []),
        ],
    )
    write(
        folder,
        PAIRS_FILE,
        [PAIR_HEADER, *(pair_lines or ["0,A,X,1,32,0,0.97,B,Y,1,64,1,0.71,95.0,60.0,10000"])],
    )
    return folder


def test_reads_profiles_and_pairs(tmp_path: Path) -> None:
    data = read_lucid(small(tmp_path))
    a = data.profiles[profile_key("A", "X", 32, False)]
    b = data.profiles["B/Y/bs64/amp"]
    assert (a.sm_util_pct, a.mem_bw_util_pct, a.mem_mib, a.samples_per_s) == (
        40.0,
        10.0,
        2000.0,
        100.0,
    )
    assert b.amp and b.batch_size == 64 and b.key == "B/Y/bs64/amp"
    (pair,) = data.pairs
    assert (pair.first, pair.second) == (a.key, b.key)
    assert (pair.first_speed, pair.second_speed, pair.min_speed) == (0.97, 0.71, 0.71)
    assert pair.models == ("A", "B")


@pytest.mark.parametrize(
    ("solo_extra", "pair_line", "file", "line", "words"),
    [
        (["A,X,32,0,100.0,140.0,10.0,2000.0,0"], None, SOLO_FILE, 4, "percentage"),
        (["C,Z,32,2,100.0,40.0,10.0,2000.0,0"], None, SOLO_FILE, 4, "0 or 1"),
        (["A,X,32,0,100.0,40.0,10.0,2000.0,0"], None, SOLO_FILE, 4, "second solo profile"),
        (["C,Z,32,0,fast,40.0,10.0,2000.0,0"], None, SOLO_FILE, 4, "not a number"),
        (None, "0,A,X,1,32,0,0.9,Q,Y,1,64,1,0.7,95,60,1", PAIRS_FILE, 2, "no solo profile"),
        (None, "0,A,X,2,32,0,0.9,B,Y,1,64,1,0.7,95,60,1", PAIRS_FILE, 2, "gpu_num1 must be 1"),
        (None, "0,A,X,1,32,0,-0.2,B,Y,1,64,1,0.7,95,60,1", PAIRS_FILE, 2, "relative speed"),
        (None, "0,A,X,1,32,0,0.9,B,Y,1,64,1", PAIRS_FILE, 2, "expected 16 fields"),
    ],
)
def test_bad_rows_name_file_and_line(
    tmp_path: Path,
    solo_extra: list[str] | None,
    pair_line: str | None,
    file: str,
    line: int,
    words: str,
) -> None:
    small(tmp_path, solo_extra, [pair_line] if pair_line else None)
    with pytest.raises(TraceFormatError) as err:
        read_lucid(tmp_path)
    assert (err.value.path, err.value.line) == (str(tmp_path / file), line)
    assert words in err.value.problem


def test_missing_column_and_missing_folder(tmp_path: Path) -> None:
    write(tmp_path, SOLO_FILE, ["model,dataset,batchsize", "A,X,32"])
    with pytest.raises(TraceFormatError, match="missing column"):
        read_solo(tmp_path / SOLO_FILE)
    with pytest.raises(NotFoundError):
        read_lucid(tmp_path / "nowhere")
    with pytest.raises(NotFoundError):
        read_pairs(tmp_path / PAIRS_FILE, {})


def lucid_folder() -> Path:
    traces = find_traces_dir(Path(__file__).resolve().parent)
    folder = traces / LUCID_DIR if traces is not None else None
    if folder is None or not (folder / PAIRS_FILE).is_file():
        pytest.skip(f"the Lucid measurements ({LUCID_DIR}) are not in a shared traces folder")
    return folder


def test_real_files() -> None:
    folder = lucid_folder()
    data = read_lucid(folder)
    with (folder / PAIRS_FILE).open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    with (folder / SOLO_FILE).open(newline="", encoding="utf-8") as handle:
        solo = list(csv.DictReader(handle))
    assert len(data.pairs) == len(rows) == 1388
    assert len(data.profiles) == len(solo) == 66
    assert sum(p.first_speed for p in data.pairs) == pytest.approx(
        sum(float(r["speed1"]) for r in rows)
    )
    assert len({p.models for p in data.pairs}) == len(
        {tuple(sorted((r["model1"], r["model2"]))) for r in rows}
    )

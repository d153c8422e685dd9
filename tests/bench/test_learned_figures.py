"""The learned policy's table in docs/learned-results.md quotes the benchmark records as
they are.

The figures come from bench/results/learned.json (base load) and learned-rules.json; a
rerun of either that changes a figure must change that doc with it.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "learned-results.md"
HEADER = "| cluster | FIFO | backfill | 2D-LAS | 2D-Gittins | SRTF (oracle) |"
COLUMNS = ("fifo", "backfill", "las", "gittins", "srtf (oracle)", "learned")


def doc_rows() -> list[list[str]]:
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith(HEADER))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_doc_quotes_the_learned_benchmark() -> None:
    learned = json.loads((ROOT / "bench/results/learned.json").read_text(encoding="utf-8"))
    rules = json.loads((ROOT / "bench/results/learned-rules.json").read_text(encoding="utf-8"))
    base = {
        (r["cluster"], r["policy"]): r["mean_jct_h"] for r in learned["rows"] if r["load"] == "base"
    }
    on_gittins = {
        r["cluster"]: r["mean_jct_h"]
        for r in rules["rows"]
        if r["variant"] == "learned (rule gittins)"
    }
    rows = doc_rows()
    assert [f"cluster{r[0]}" for r in rows] == learned["checked_clusters"]
    for cells in rows:
        cluster = f"cluster{cells[0]}"
        expected = [f"{base[(cluster, p)]:.2f}" for p in COLUMNS]
        expected.append(f"{on_gittins[cluster]:.2f}")
        assert cells[1:] == expected, cluster

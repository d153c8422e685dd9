"""The learned policy's table in docs/learned-results.md quotes the benchmark records as
they are.

The figures come from bench/results/learned.json (base load) and learned-rules.json; a
rerun of either that changes a figure must change that doc with it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


NOW_HEADER = "| cell | load | nodes | 2D-LAS | 2D-Gittins (R) | SRTF (oracle) | learned |"
POLICIES = ("las", "gittins", "srtf (oracle)", "learned")


def test_the_doc_quotes_the_current_learned_order_record() -> None:
    """The table of the learned order now (2D-Gittins, shrunk bins, the pair judge) is the
    one bench_learned.py recorded, ITP and Philly-Pollux, every load run."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith(NOW_HEADER))
    shown = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        shown.append([cell.strip() for cell in line.strip("|").split("|")])
    expected = []
    for name in ("learned-order.json", "learned-order-pollux.json"):
        record = json.loads((ROOT / "bench/results" / name).read_text(encoding="utf-8"))
        cells: dict[tuple[str, str], dict[str, Any]] = {}
        for r in record["rows"]:
            cells.setdefault((r["cluster"], r["load"]), {})[r["policy"]] = r
        for load in ("base", "+25% load", "-25% load"):
            for (cluster, at), rows in sorted(cells.items()):
                if at != load or not all(p in rows for p in POLICIES):
                    continue
                las, r, srtf, learned = (rows[p]["mean_jct_h"] for p in POLICIES)
                rho = rows["learned"]["rho_in_window"]
                expected.append(
                    [
                        cluster,
                        load,
                        str(rows["learned"]["nodes"]),
                        *(f"{x:.2f}" for x in (las, r, srtf, learned)),
                        f"{learned / r:.3f}",
                        f"{learned / min(las, r):.3f}",
                        "-" if rho is None else f"{rho:.2f}",
                    ]
                )
    assert shown == expected

"""The review's tables as CSV files, one per table, with the HTML's numbers.

`cell` formats a value for both the CSV and the HTML table, so the two cannot disagree.
Besides the section tables, `summary.csv` holds the headline numbers and
`reconciliation.csv` the exact split (milli-GPU x ms) and the per-team allocated.
"""

from __future__ import annotations

import csv
from dataclasses import fields
from pathlib import Path

from gpupool.errors import GpupoolError
from gpupool.reports.review import Review


def cell(value: object) -> str:
    """One value as the review shows it: floats as Python writes them (already rounded by the
    review), booleans as yes/no, None as empty."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple | list):
        return " ".join(cell(v) for v in value)
    return str(value)


def write_csv(review: Review, directory: Path) -> list[Path]:
    """Write every table of `review` to `directory` (created if missing); the paths written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GpupoolError(f"cannot create the CSV folder {directory}: {exc.strerror}") from None
    written: list[Path] = []

    def put(name: str, header: list[str], rows: list[list[str]]) -> None:
        path = directory / f"{name}.csv"
        try:
            with path.open("w", newline="", encoding="utf-8") as fh:
                out = csv.writer(fh, lineterminator="\n")
                out.writerow(header)
                out.writerows(rows)
        except OSError as exc:
            raise GpupoolError(f"cannot write {path}: {exc.strerror}") from None
        written.append(path)

    s = review.summary
    put("summary", ["key", "value"], [[f.name, cell(getattr(s, f.name))] for f in fields(s)])
    r = review.reconciliation
    recon = [
        ["cluster", "capacity", str(r.capacity), cell(r.gpu_hours(r.capacity))],
        ["cluster", "allocated", str(r.allocated), cell(r.gpu_hours(r.allocated))],
        ["cluster", "idle", str(r.idle), cell(r.gpu_hours(r.idle))],
        ["cluster", "down", str(r.down), cell(r.gpu_hours(r.down))],
    ]
    recon += [[f"team:{t}", "allocated", str(v), cell(r.gpu_hours(v))] for t, v in r.by_team]
    put("reconciliation", ["scope", "part", "mgpu_ms", "gpu_h"], recon)
    for table in review.tables():
        put(table.name, list(table.columns()), [[cell(v) for v in row] for row in table.values()])
    return written

"""Shared CSV plumbing: strict column checks, typed fields, counted skips."""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpupool.errors import NotFoundError, TraceFormatError


@dataclass
class ReadReport:
    """What a reader did with a file: rows read, used, and skipped by reason."""

    path: str
    rows: int = 0
    used: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    origin_s: float = 0.0
    """Unix time of submit_s 0, where the file's times are dates (0: the file's own clock)."""

    def skip(self, reason: str) -> None:
        self.skipped[reason] += 1

    def summary(self) -> str:
        text = f"{self.path}: {self.rows} rows, {self.used} used"
        if self.skipped:
            reasons = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
            text += f", {sum(self.skipped.values())} skipped ({reasons})"
        return text


def open_rows(
    path: str | Path, required: Sequence[str], delimiter: str = ","
) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield (line number, row) for a CSV with a header; malformed rows raise."""
    p = Path(path)
    if not p.is_file():
        raise NotFoundError(f"trace file {p} does not exist; check the path")
    with p.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle, delimiter=delimiter)
        try:
            header = next(reader)
        except StopIteration:
            raise TraceFormatError(p, 1, "empty file: expected a header row") from None
        header = [h.strip() for h in header]
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceFormatError(
                p, 1, f"missing column(s) {', '.join(missing)}; header is {','.join(header)}"
            )
        for values in reader:
            line = reader.line_num
            if not values or all(not v.strip() for v in values):
                continue
            if len(values) != len(header):
                raise TraceFormatError(
                    p, line, f"expected {len(header)} fields, found {len(values)}"
                )
            yield line, dict(zip(header, values, strict=True))


def int_field(row: dict[str, str], name: str, path: str | Path, line: int) -> int:
    text = row[name].strip()
    try:
        return int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            raise TraceFormatError(path, line, f"{name}={text!r} is not a number") from None
        if not value.is_integer():
            raise TraceFormatError(path, line, f"{name}={text!r} is not a whole number") from None
        return int(value)


def float_field(row: dict[str, str], name: str, path: str | Path, line: int) -> float:
    text = row[name].strip()
    try:
        value = float(text)
    except ValueError:
        raise TraceFormatError(path, line, f"{name}={text!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise TraceFormatError(path, line, f"{name}={text!r} is not a finite number")
    return value

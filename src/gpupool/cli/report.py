"""`gpupool report`: the monthly review of the pool as one HTML file (and CSVs).

From the live service's database (`--db URL`) or a simulation result (`--scenario
RESULT.json`, written by `gpupool simulate scenario FILE --json RESULT.json`), over a
period in UTC (default: the data's own).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpupool.cli.verbs import HELP
from gpupool.errors import GpupoolError, SpecError
from gpupool.reports.review_data import ReviewData

EXAMPLES = """\
examples:
  gpupool report --scenario result.json --html review.html
  gpupool report --from 2026-11-01 --to 2026-12-01 --db postgresql://gpupool@db/gpupool \\
      --html review.html --csv review-csv/
  gpupool report --scenario result.json --from 2026-11-10T00:00 --to 2026-11-17 --html week.html

Dates are UTC: YYYY-MM-DD (midnight) or ISO (2026-11-01T08:00, 2026-11-01T08:00:00Z).
Sections, how the numbers reconcile and the recommendation rules: docs/review.md.
"""


def add_report_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `report` command to the top-level subparsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "report",
        help=HELP["report"],
        description="Build the pool's review for a period: capacity split exactly into "
        "allocated, idle and down; utilisation by GPU type, team and hour; allocated vs used "
        "per team and job; recommendations with evidence; queueing; GPU and electricity cost. "
        "Writes one self-contained HTML file (no network request when opened) and, with "
        "--csv, one CSV per table.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--db", metavar="URL", help="the live service's database URL")
    source.add_argument(
        "--scenario",
        type=Path,
        metavar="RESULT.json",
        help="a simulation result (gpupool simulate scenario FILE --json RESULT.json) or a "
        "review-data JSON file",
    )
    p.add_argument("--from", dest="start", metavar="DATE", help="period start, UTC (inclusive)")
    p.add_argument("--to", dest="end", metavar="DATE", help="period end, UTC (exclusive)")
    p.add_argument("--html", type=Path, required=True, metavar="OUT", help="write the HTML here")
    p.add_argument("--csv", type=Path, metavar="DIR", help="also write one CSV per table here")
    return p


def parse_date(text: str, flag: str) -> float:
    """'2026-11-01' (UTC midnight) or an ISO time ('2026-11-01T08:00', '...Z', '+01:00')."""
    raw = text.strip()
    try:
        when = datetime.fromisoformat(raw[:-1] + "+00:00" if raw.endswith("Z") else raw)
    except ValueError:
        raise SpecError(
            f"{flag} {text!r}: not a date; use YYYY-MM-DD or an ISO time like "
            "2026-11-01T08:00 (UTC unless it says otherwise)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _period(args: argparse.Namespace) -> tuple[float | None, float | None]:
    start = parse_date(args.start, "--from") if args.start else None
    end = parse_date(args.end, "--to") if args.end else None
    if start is not None and end is not None and not start < end:
        raise SpecError(
            f"--from {args.start} is not before --to {args.end}: give an earlier --from"
        )
    return start, end


def load(args: argparse.Namespace) -> ReviewData:
    """The review data for the command line's source and period (Unix times)."""
    start, end = _period(args)
    if args.db:
        try:
            source = importlib.import_module("gpupool.server.review_source")
        except ModuleNotFoundError as exc:
            if exc.name not in ("gpupool.server.review_source", "gpupool.server"):
                raise
            raise GpupoolError(
                "this gpupool cannot read a review from a database yet (no "
                "gpupool.server.review_source); use --scenario RESULT.json"
            ) from None
        if start is None or end is None:
            now = datetime.now(UTC)
            month = datetime(now.year, now.month, 1, tzinfo=UTC).timestamp()
            start = month if start is None else start
            end = now.timestamp() if end is None else end
        if not start < end:
            raise SpecError("--from is not before --to: give an earlier --from")
        data: ReviewData = source.review_from_db(args.db, start, end)
        return data
    data = ReviewData.read(args.scenario)
    o = data.origin_s
    lo, hi = data.start_s + o, data.end_s + o
    if (end is not None and end <= lo) or (start is not None and start >= hi):
        raise SpecError(
            f"{args.scenario} covers {_iso(lo)} to {_iso(hi)}; the period asked "
            f"({_iso(start or lo)} to {_iso(end or hi)}) is outside it: give --from/--to "
            "inside it"
        )
    start = lo if start is None else start
    end = hi if end is None else end
    if not start < end:
        raise SpecError("--from is not before --to: give an earlier --from")
    return replace(data, start_s=start - o, end_s=end - o)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(round(t), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _has_anything(data: ReviewData) -> bool:
    lo, hi = data.start_s, data.end_s
    return (
        any(a.end_s > lo and a.start_s < hi for a in data.allocations)
        or any(u.t_s + u.period_s > lo and u.t_s < hi for u in data.usage)
        or any(lo <= j.submit_s < hi for j in data.jobs)
        or any(lo <= x.t_s < hi for x in data.latency)
    )


def run_report(args: argparse.Namespace) -> int:
    """Build the review and write its HTML (and CSVs); say where."""
    from gpupool.reports.review import build_review
    from gpupool.reports.review_csv import write_csv
    from gpupool.reports.review_html import write_html

    data = load(args)
    if not data.gpus:
        raise SpecError("the review data lists no GPU: nothing to review")
    if not _has_anything(data):
        o = data.origin_s
        raise SpecError(
            f"nothing happened between {_iso(data.start_s + o)} and {_iso(data.end_s + o)} "
            "(no allocation, usage sample, job or latency sample): choose another --from/--to"
        )
    if not args.html.parent.exists():
        raise SpecError(f"--html {args.html}: folder {args.html.parent} does not exist")
    review = build_review(data)
    write_html(review, args.html)
    s = review.summary
    print(
        f"review {s.period_from} to {s.period_to}: {s.gpus} GPUs, {s.allocated_pct:.1f} % "
        f"allocated, {s.used_pct:.1f} % used, {s.recommendations} recommendations"
    )
    print(f"wrote {args.html}")
    if args.csv is not None:
        paths = write_csv(review, args.csv)
        print(f"wrote {len(paths)} CSV files to {args.csv}/")
    sys.stdout.flush()
    return 0

"""Running jobs whose run (since their last start) reached its time limit are stopped;
they end as failed once they have left (the driver's Finished)."""

from __future__ import annotations

from typing import ClassVar

from gpupool.domain.lifecycle import JobState
from gpupool.scheduler.book import JobBook
from gpupool.scheduler.commands import Command
from gpupool.scheduler.cycle.base import CycleContext


def duration_text(seconds: float) -> str:
    """4h, 90m, 1h30m, 45s: how a time limit reads in a reason."""
    total = round(seconds)
    h, rest = divmod(total, 3600)
    m, sec = divmod(rest, 60)
    parts = [f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (sec, "s")) if v]
    return "".join(parts) or f"{seconds:g}s"


class ExpireOverdue:
    name: ClassVar[str] = "expire-overdue"

    def __init__(self, book: JobBook) -> None:
        self.book = book

    def run(self, ctx: CycleContext) -> list[Command]:
        book = self.book
        if not book.timed:
            return []
        now = ctx.now_s
        out: list[Command] = []
        for job_id, r in book.running.items():
            if r.state is not JobState.RUNNING or book.elastic.resizing(job_id):
                continue
            limit = book.time_limit_s(r.spec)
            if limit is None or now - r.run_started_s < limit - 1e-9:
                continue
            out.append(book.expire(r, f"ran past its {duration_text(limit)} time limit", now))
        if out:
            book.dirty = True
        return out

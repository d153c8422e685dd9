"""Claimants whose victims ended by themselves (finished, failed, lost) start first, at
every call of the cycle: they waited for GPUs that are free now."""

from __future__ import annotations

from typing import ClassVar

from gpupool.scheduler.book import JobBook
from gpupool.scheduler.commands import Command
from gpupool.scheduler.cycle.base import CycleContext
from gpupool.scheduler.jobs import WAITING


class ReadyClaims:
    name: ClassVar[str] = "ready-claims"

    def __init__(self, book: JobBook) -> None:
        self.book = book

    def run(self, ctx: CycleContext) -> list[Command]:
        book = self.book
        out: list[Command] = []
        ready, book.ready_claims = book.ready_claims, []
        for claimant in ready:
            r = book.records[claimant]
            if r.state in WAITING:
                launch = book.start_anywhere(r, ctx.now_s, book.claim_nodes.pop(claimant, ()))
                if launch is not None:
                    out.append(launch)
        return out

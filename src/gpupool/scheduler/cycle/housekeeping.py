"""The cycle's first stages, which decide little and keep the inputs of the rest current:
fair-share usage of the last interval, the learned order's tick, victims maturing, the
progress estimate and the quota window."""

from __future__ import annotations

from collections import defaultdict
from typing import ClassVar, Protocol

from gpupool.domain.quota import QuotaBook, QuotaWindow
from gpupool.scheduler.book import JobBook
from gpupool.scheduler.commands import Command
from gpupool.scheduler.cycle.base import CycleContext
from gpupool.scheduler.ordering import CoreLearning


class FairShareUsage:
    """GPUs each team held since the last cycle, running and vacating, for fair share."""

    name: ClassVar[str] = "fair-share-usage"

    def __init__(self, book: JobBook, quotas: QuotaBook) -> None:
        self.book = book
        self.quotas = quotas

    def run(self, ctx: CycleContext) -> list[Command]:
        last, now = ctx.last_cycle_s, ctx.now_s
        if last is not None and now > last:
            book = self.book
            usage: dict[str, float] = defaultdict(float)  # running and vacating GPUs
            for (team, _), gpus in book.held.items():
                usage[team] += gpus
            for job_id in book.vacating:
                usage[book.running[job_id].spec.team] += book.running[job_id].spec.gpu_count
            self.quotas.record_usage(usage, now - last)
        return []


class LearningTick:
    """The ordered policies' order: retraining and the guard on the cycle's clock."""

    name: ClassVar[str] = "learning-tick"

    def __init__(self, book: JobBook, ordering: CoreLearning) -> None:
        self.book = book
        self.ordering = ordering

    def run(self, ctx: CycleContext) -> list[Command]:
        change, moved = self.ordering.tick(ctx.now_s)
        if moved or ctx.now_s > self.ordering.next_age_s:
            self.book.dirty = True  # a new model, another guard state, a job past its age
        return [change] if change is not None else []


class VictimsMature:
    """A victim reaching its minimum runtime or its next checkpoint changes what may be
    preempted without any event: plan again while jobs wait (built only when priority
    preemption or a lost-work bound is configured)."""

    name: ClassVar[str] = "victims-mature"

    def __init__(self, book: JobBook) -> None:
        self.book = book

    def run(self, ctx: CycleContext) -> list[Command]:
        book = self.book
        if book.queues.by_team:
            book.dirty = book.dirty or len(book.queues) > 0
        return []


class HasChoosers(Protocol):
    def has_choosers(self) -> bool: ...


class EstimateProgress:
    """Where no driver measures progress, the core estimates it when something reads it:
    a plan, jobs choosing a pool, price deferral or power caps."""

    name: ClassVar[str] = "estimate-progress"

    def __init__(self, book: JobBook, choosers: HasChoosers, always: bool) -> None:
        self.book = book
        self.choosers = choosers
        self.always = always

    def run(self, ctx: CycleContext) -> list[Command]:
        book = self.book
        if not book.measured and (book.dirty or self.choosers.has_choosers() or self.always):
            book.estimate_all(ctx.now_s)
        return []


class QuotaWindowStage:
    """A time-of-day window that begins or ends gives new guarantees: plan again."""

    name: ClassVar[str] = "quota-window"

    def __init__(self, book: JobBook, quotas: QuotaBook) -> None:
        self.book = book
        self.quotas = quotas
        self.window: QuotaWindow | str | None = "unset"
        self.since_s = 0.0
        """When the current quota window began."""

    def run(self, ctx: CycleContext) -> list[Command]:
        window = self.quotas.window(ctx.now_s)
        if window is not self.window:
            self.window, self.since_s = window, ctx.now_s
            self.book.dirty = True
        return []

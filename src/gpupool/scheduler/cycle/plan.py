"""The cycle policy's plan, validated and applied: the one stage that starts and preempts
jobs by the policy's rules (fifo, backfill, priority-quota, the ordered queues).

Planning is pure, so an unchanged view gives the same empty plan: the stage plans only
when the book says something changed (`dirty`). An ordered policy plans with the order its
LearnedOrdering gives now; in shadow mode the learned order plans on the same view too (a
scratch copy, its own copy of the random state) and only the difference is recorded
(LearnShadow): nothing of it is applied. Starts that would take a team past its job
limits are dropped and the plan is made once more with those teams hidden.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from gpupool.errors import PlanRejected
from gpupool.policies.contract import Claim, CyclePolicy, Preempt, Start
from gpupool.policies.placement.base import ScoringPolicy
from gpupool.scheduler.book import JobBook
from gpupool.scheduler.commands import Command
from gpupool.scheduler.cycle.base import CycleContext
from gpupool.scheduler.fleet import Fleet
from gpupool.scheduler.ordering import CoreLearning
from gpupool.scheduler.user_shares import priority_boosts
from gpupool.scheduler.view import cycle_view


def starts_of(plan: Sequence[Start | Preempt | Claim]) -> tuple[str, ...]:
    """The jobs a plan starts, now or once their victims left, in plan order."""
    return tuple(c.job_id for c in plan if not isinstance(c, Preempt))


class PolicyPlan:
    """Publishes `changed` (for WaitReasons) and `rank` (the order it planned with)."""

    name: ClassVar[str] = "policy-plan"

    def __init__(
        self,
        book: JobBook,
        fleet: Fleet,
        placement: ScoringPolicy,
        rng: np.random.Generator,
        policy: CyclePolicy,
        ordering: CoreLearning | None,
    ) -> None:
        self.book = book
        self.fleet = fleet
        self.placement = placement
        self.rng = rng
        self.policy = policy
        self.ordering = ordering
        self.over_limit = False
        """The last plan started more of a team than its limits allow (the rest dropped)."""
        self.next_boost_s = math.inf
        """When a waiting job next gains a priority point by aging: the order changes."""

    def run(self, ctx: CycleContext) -> list[Command]:
        book = self.book
        if ctx.now_s >= self.next_boost_s:  # a waiting job gained a priority point
            book.dirty = True
        ctx.published.changed = book.dirty or bool(ctx.out)
        out: list[Command] = []
        if book.dirty:
            book.dirty = False
            self.plan(ctx, out, shadow=True)
            if self.over_limit:  # once more, with the teams now at their limits hidden
                self.over_limit = book.dirty = False
                self.plan(ctx, out, shadow=False)
        return out

    def plan(self, ctx: CycleContext, out: list[Command], shadow: bool) -> None:
        now = ctx.now_s
        deferred = ctx.published.deferred
        book, fleet, policy = self.book, self.fleet, self.policy
        lg = self.ordering
        if lg is None:
            rank = boost = None
            aging_h = book.config.priority_aging_h
            if policy.orders_by_rank and (book.shares.active or aging_h is not None):
                queued = [book.records[j] for q in book.queues.by_team.values() for _, j in q]
                if aging_h is not None:
                    boost, self.next_boost_s = priority_boosts(now, queued, aging_h * 3600.0)
                rank = book.shares.rank(now, queued, book.running.values(), boost)
            view = cycle_view(book, fleet, self.placement, self.rng, now, deferred, rank, boost)
            commands = policy.plan(view)
            book.reservations = {r.job_id: r for r in view.reserved}
            self.apply(commands, now, out)
            return
        waiting = [book.records[job_id] for q in book.queues.by_team.values() for _, job_id in q]
        use, learned = lg.ranks(now, waiting)
        ctx.published.rank = use
        rng = copy.deepcopy(self.rng) if shadow and learned is not None else None
        view = cycle_view(book, fleet, self.placement, self.rng, now, deferred, use)
        plan = policy.plan(view)
        book.reservations = {r.job_id: r for r in view.reserved}
        if rng is not None and learned is not None:
            view = cycle_view(book, fleet, self.placement, self.rng, now, deferred, learned)
            view.rng = rng
            record = lg.shadow(now, starts_of(plan), starts_of(policy.plan(view)))
            if record is not None:
                out.append(record)
        self.apply(plan, now, out)

    def apply(
        self, commands: list[Start | Preempt | Claim], now: float, out: list[Command]
    ) -> None:
        book = self.book
        starts = 0
        limit = book.config.max_starts_per_cycle
        if book.config.team_limits:
            commands, dropped = book.within_limits(commands)
            if dropped:
                self.over_limit = True
        for c in commands:
            r = book.records.get(c.job_id)
            if r is None:
                raise PlanRejected(f"the plan names an unknown job {c.job_id}")
            if isinstance(c, Start):
                if limit is not None and starts >= limit:
                    book.dirty = True  # planned again next cycle
                    continue
                starts += 1
                book.drop_claim(c.job_id)  # GPUs freed before its victims left
                out.append(book.start(r, c.placement, now))
            elif isinstance(c, Preempt):
                out.append(book.preempt(r, c, now))
            else:
                launch = book.claim(c, now)
                if launch is not None:
                    out.append(launch)

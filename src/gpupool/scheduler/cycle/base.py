"""The stage contract: what a stage of the cycle receives, returns and may publish.

A stage is a small object built once per core with the collaborators it needs (the job
book, the fleet, its configuration section) and the state only it keeps. Each cycle the
core calls `run(ctx)` on every stage in the order of `cycle/order.py`; a stage returns the
commands it decided, changes shared state only through the job book's and the fleet's
methods, and hands later stages (or the next cycle) what they read of its decisions
through `ctx.published`, never through another stage's attributes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from gpupool.energy.powercap import CapPoint
from gpupool.scheduler.commands import Command


@dataclass
class Published:
    """What stages decided that other stages read, kept from cycle to cycle."""

    deferred: set[str] = field(default_factory=set)
    """PriceDeferral: jobs held for a cheaper price. Read by PolicyPlan and ElasticLend
    (they do not start them), WaitReasons, and CloudBurst, which runs before PriceDeferral
    and so reads the previous cycle's."""
    deferred_until: Mapping[str, float] = field(default_factory=dict)
    """PriceDeferral: when each held job is planned to start (WaitReasons)."""
    rank: Mapping[str, int] | None = None
    """PolicyPlan: the order an ordered policy planned with last (WaitReasons reads it)."""
    serving_clocks: Mapping[str, CapPoint] = field(default_factory=dict)
    """ServingClocks: the clock point each running online replica's cards should run at
    (PowerCaps sets them)."""
    changed: bool = False
    """PolicyPlan, before it plans: the view changed or an earlier stage of this cycle
    decided something, so waiting jobs' reasons may have changed (WaitReasons)."""


@dataclass(slots=True)
class CycleContext:
    """One cycle's inputs: built once per call of `Scheduler.cycle`, references only."""

    now_s: float
    last_cycle_s: float | None
    """When the stages last ran before this cycle (None: never)."""
    out: list[Command]
    """The commands decided so far in this call, in order."""
    published: Published


class Stage(Protocol):
    """One step of a scheduling cycle."""

    name: ClassVar[str]

    def run(self, ctx: CycleContext) -> Sequence[Command]:
        """The commands this stage decides at `ctx.now_s` (often none)."""
        ...

"""The order of a cycle's stages: this file and nowhere else.

EVERY_CALL runs at every call of `Scheduler.cycle`; EVERY_CYCLE once per `cycle_s` (again
at the same instant, when several events share one time). A stage the configuration does
not want is not built, and is skipped here. An earlier stage's decisions reach a later one
through `ctx.published` (see each stage's docstring for what it reads).
"""

from __future__ import annotations

from gpupool.scheduler.cycle.autoscale import ServiceAutoscale
from gpupool.scheduler.cycle.base import Stage
from gpupool.scheduler.cycle.burst import CloudBurst
from gpupool.scheduler.cycle.deferral import PriceDeferral
from gpupool.scheduler.cycle.elastic import ElasticGrow, ElasticLend
from gpupool.scheduler.cycle.expire import ExpireOverdue
from gpupool.scheduler.cycle.housekeeping import (
    EstimateProgress,
    FairShareUsage,
    LearningTick,
    QuotaWindowStage,
    VictimsMature,
)
from gpupool.scheduler.cycle.plan import PolicyPlan
from gpupool.scheduler.cycle.pool_choice import PoolChoice
from gpupool.scheduler.cycle.power_caps import PowerCaps
from gpupool.scheduler.cycle.ready_claims import ReadyClaims
from gpupool.scheduler.cycle.serving_clocks import ServingClocks
from gpupool.scheduler.cycle.wait_reasons import WaitReasons

EVERY_CALL: tuple[type[Stage], ...] = (ReadyClaims,)

EVERY_CYCLE: tuple[type[Stage], ...] = (
    FairShareUsage,  # fair-share usage of the interval since the last cycle
    LearningTick,  # the learned order retrains, its guard judges (ordered policies)
    VictimsMature,  # victims past their minimum runtime: plan again
    ExpireOverdue,  # jobs past their time limit are stopped
    EstimateProgress,  # progress where no driver measures it
    QuotaWindowStage,  # a time-of-day window begins or ends
    CloudBurst,  # cloud nodes start or are handed back
    ServiceAutoscale,  # services' replicas follow demand and the SLO
    PoolChoice,  # waiting jobs follow capacity to their best pool
    ElasticLend,  # elastic jobs lend GPUs to online work, before anyone is preempted
    PriceDeferral,  # deadline-bound work waits for cheaper hours
    PolicyPlan,  # the cycle policy's plan, validated and applied
    ElasticGrow,  # elastic jobs grow back onto idle cards
    WaitReasons,  # each waiting job's reason, when it changed
    ServingClocks,  # online services' clocks follow their load
    PowerCaps,  # power and clock caps per card
)


def in_order(built: dict[type[Stage], Stage], order: tuple[type[Stage], ...]) -> list[Stage]:
    """The built stages in `order`; a stage built but not in the order is an error."""
    unknown = set(built) - set(EVERY_CALL) - set(EVERY_CYCLE)
    if unknown:
        raise TypeError(f"stages in no order: {sorted(t.__name__ for t in unknown)}")
    return [built[t] for t in order if t in built]

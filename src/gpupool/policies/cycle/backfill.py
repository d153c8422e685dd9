"""backfill: fifo with EASY backfill. The blocked head gets a reservation, and a later job
may start now only if it ends before that reservation or uses GPUs the head will not need
then; starvation is bounded by the head's reservation."""

from __future__ import annotations

from gpupool.policies.cycle.fifo import FifoPolicy
from gpupool.policies.registry import register


class BackfillPolicy(FifoPolicy):
    name = "backfill"
    backfill = True


register("cycle", "backfill")(BackfillPolicy)

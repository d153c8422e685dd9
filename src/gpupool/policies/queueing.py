"""Queue policies for trace replay: which waiting job is offered to placement next."""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.policies.registry import register_queue


@dataclass(frozen=True)
class QueuePolicy:
    """Orders jobs by a key; `preemptive` lets a better-ranked job evict a running one.

    `blocking` stops at the first job that does not fit (strict order, no backfill).
    """

    name: str
    preemptive: bool
    blocking: bool


@register_queue("fifo")
def _fifo() -> QueuePolicy:
    return QueuePolicy("fifo", preemptive=False, blocking=True)


@register_queue("sjf")
def _sjf() -> QueuePolicy:
    return QueuePolicy("sjf", preemptive=False, blocking=True)


@register_queue("srtf")
def _srtf() -> QueuePolicy:
    return QueuePolicy("srtf", preemptive=True, blocking=False)

"""Queue policies for trace replay: which waiting job is offered to placement next."""

from __future__ import annotations

from gpupool.policies.base import QueuePolicy
from gpupool.policies.registry import register_queue

__all__ = ["QueuePolicy"]


@register_queue("fifo")
def _fifo() -> QueuePolicy:
    return QueuePolicy("fifo", preemptive=False, blocking=True)


@register_queue("sjf")
def _sjf() -> QueuePolicy:
    return QueuePolicy("sjf", preemptive=False, blocking=True)


@register_queue("srtf")
def _srtf() -> QueuePolicy:
    return QueuePolicy("srtf", preemptive=True, blocking=False)

"""Queue policies for trace replay: which waiting job is offered to placement next."""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.policies.registry import factory, register_queue


@dataclass(frozen=True)
class QueuePolicy:
    """A trace replay's queue order; `preemptive` lets a better-ranked job evict a running
    one, `blocking` stops at the first job that does not fit (strict order, no backfill).
    """

    name: str
    preemptive: bool
    blocking: bool


def queue_policy(name: str) -> QueuePolicy:
    """The queue policy registered under `name`."""
    policy: QueuePolicy = factory("queue", name)()
    return policy


@register_queue("fifo")
def _fifo() -> QueuePolicy:
    return QueuePolicy("fifo", preemptive=False, blocking=True)


@register_queue("sjf")
def _sjf() -> QueuePolicy:
    return QueuePolicy("sjf", preemptive=False, blocking=True)


@register_queue("srtf")
def _srtf() -> QueuePolicy:
    return QueuePolicy("srtf", preemptive=True, blocking=False)


@register_queue("backfill")
def _backfill() -> QueuePolicy:
    """FIFO with EASY backfill: a later job may jump the blocked head only if it cannot
    delay the head's reservation (oracle run times). Non-preemptive."""
    return QueuePolicy("backfill", preemptive=False, blocking=False)


@register_queue("las")
def _las() -> QueuePolicy:
    """Tiresias 2D-LAS: queues by attained GPU service, FCFS inside one; preemptive."""
    return QueuePolicy("las", preemptive=True, blocking=False)


@register_queue("gittins")
def _gittins() -> QueuePolicy:
    """Tiresias 2D-Gittins on the GPU-time of jobs finished so far; preemptive."""
    return QueuePolicy("gittins", preemptive=True, blocking=False)


@register_queue("learned")
def _learned() -> QueuePolicy:
    """Predicted GPU-time mixed with the rule order while the guard trusts the model."""
    return QueuePolicy("learned", preemptive=True, blocking=False)

"""The job state changes the loop writes, where one the database refuses is an event.

The loop writes a change with the state it expects the job in; a job that changed
meanwhile (an API cancel, say) makes the write an `IllegalTransition`, which is recorded
as an `error` event on the job instead of failing the stage."""

from __future__ import annotations

from typing import Any

from gpupool.errors import IllegalTransition
from gpupool.scheduler import Scheduler
from gpupool.server.store import Store


def transition(
    store: Store, job_id: int, to: str, now: float, expect: tuple[str, ...], **fields: Any
) -> None:
    """The job to state `to` from one of `expect`, with `fields`, and its event."""
    try:
        store.jobs.transition(job_id, to, now, expect=expect, **fields)
    except IllegalTransition as err:
        store.events.add("error", str(err), now, job_id=job_id)


def update(
    store: Store, job_id: int, now: float, expect: tuple[str, ...], event: str, **fields: Any
) -> None:
    """The job's `fields` in one of the states `expect`, with an event of kind `event`."""
    try:
        store.jobs.update(job_id, now, expect=expect, event=event, **fields)
    except IllegalTransition as err:
        store.events.add("error", str(err), now, job_id=job_id)


def requeue(scheduler: Scheduler, store: Store, job_id: int, now: float, why: str) -> None:
    """A running job back in the queue: the core loses it, the database says why."""
    scheduler.lost(str(job_id), now, why)
    transition(store, job_id, "suspended", now, ("running", "preempting"), reason=why)

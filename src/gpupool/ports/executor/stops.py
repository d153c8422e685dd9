"""What every executor does alike with the loop's stop requests: find the attempt it
watches, and record a stop so that the earliest deadline and a cancel win."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, TypeVar

from gpupool.errors import NotFoundError

T = TypeVar("T")


def watched(jobs: Mapping[str, T], job_id: str) -> T:
    """The executor's record of the attempt it watches for `job_id`; NotFoundError (in the
    contract's words) when there is none."""
    job = jobs.get(job_id)
    if job is None:
        raise NotFoundError(
            f"job {job_id} is not running on this executor; it may have ended already "
            "(poll reports that) or was never launched or adopted here"
        )
    return job


class Stoppable(Protocol):
    """An executor's record of one attempt, as far as a stop request changes it."""

    stop_kind: str | None
    """None until a stop is asked; then "preempt" or "cancel"."""
    grace_s: float
    deadline_s: float | None
    """When the SIGKILL is due, in the caller's clock."""


def ask_stop(job: Stoppable, kind: str, grace_s: float, now_s: float) -> None:
    """Record a stop of `kind` ("preempt" or "cancel") asked at `now_s`: the SIGKILL's
    deadline only ever moves earlier (with the grace that set it), and a cancel during a
    preemption wins, never the reverse."""
    grace_s = max(grace_s, 0.0)
    if job.deadline_s is None or now_s + grace_s < job.deadline_s:
        job.deadline_s, job.grace_s = now_s + grace_s, grace_s
    if job.stop_kind != "cancel":
        job.stop_kind = kind

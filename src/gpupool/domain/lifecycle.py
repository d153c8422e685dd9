"""The job lifecycle as a transition table; every other move is refused."""

from __future__ import annotations

from enum import StrEnum

from gpupool.errors import IllegalTransition


class JobState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    PREEMPTING = "preempting"
    SUSPENDED = "suspended"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNPLACEABLE = "unplaceable"


TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.RUNNING, JobState.CANCELLED, JobState.UNPLACEABLE}),
    # RUNNING -> SUSPENDED: the job was lost (its node died, it crashed) and goes back to
    # the queue to resume from its last checkpoint.
    JobState.RUNNING: frozenset(
        {
            JobState.FINISHED,
            JobState.FAILED,
            JobState.PREEMPTING,
            JobState.CANCELLED,
            JobState.SUSPENDED,
        }
    ),
    # A preempted job may still finish, fail or be cancelled within its grace period.
    JobState.PREEMPTING: frozenset(
        {JobState.SUSPENDED, JobState.FAILED, JobState.FINISHED, JobState.CANCELLED}
    ),
    JobState.SUSPENDED: frozenset({JobState.RUNNING, JobState.CANCELLED}),
    JobState.FINISHED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
    JobState.UNPLACEABLE: frozenset(),
}

TERMINAL: frozenset[JobState] = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)

STATE_NAMES: dict[JobState, str] = {
    JobState.PENDING: "pending",
    JobState.RUNNING: "running",
    JobState.PREEMPTING: "preempting",
    JobState.SUSPENDED: "suspended",
    JobState.FINISHED: "succeeded",
    JobState.FAILED: "failed",
    JobState.CANCELLED: "cancelled",
    JobState.UNPLACEABLE: "failed",
}
"""Each state as the server stores it and its API and command line show it: a finished
job has succeeded, and one the fleet cannot run has failed."""

TERMINAL_NAMES: frozenset[str] = frozenset(STATE_NAMES[s] for s in TERMINAL)
"""The shown names of the states a job never leaves (succeeded, failed, cancelled), for
clients that read states as the API sends them."""


def check_transition(job_id: str, old: JobState, new: JobState) -> JobState:
    """Return `new` if the table allows old -> new, else raise IllegalTransition."""
    if new not in TRANSITIONS[old]:
        allowed = ", ".join(sorted(s.value for s in TRANSITIONS[old])) or "nothing (terminal)"
        raise IllegalTransition(
            f"job {job_id}: cannot go from {old.value} to {new.value}; "
            f"from {old.value} it may go to {allowed}"
        )
    return new

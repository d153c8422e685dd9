"""A job's states in the database's words, the moves between them, and the columns a
move may change: the core's lifecycle (gpupool.domain.lifecycle) renamed for the store."""

from __future__ import annotations

from gpupool.domain.lifecycle import TRANSITIONS as CORE_TRANSITIONS
from gpupool.domain.lifecycle import JobState

KINDS: tuple[str, ...] = ("training", "online-inference", "offline-inference", "batch")
STATE_OF: dict[JobState, str] = {
    JobState.PENDING: "pending",
    JobState.RUNNING: "running",
    JobState.PREEMPTING: "preempting",
    JobState.SUSPENDED: "suspended",
    JobState.FINISHED: "succeeded",
    JobState.FAILED: "failed",
    JobState.CANCELLED: "cancelled",
    JobState.UNPLACEABLE: "failed",
}
"""The core's lifecycle in the database's words: a job the fleet cannot run has failed."""
STATES: tuple[str, ...] = tuple(dict.fromkeys(STATE_OF.values()))


def _transitions() -> dict[str, frozenset[str]]:
    """The store's table is the core's (core/lifecycle.TRANSITIONS), renamed."""
    out: dict[str, set[str]] = {name: set() for name in STATES}
    for state, allowed in CORE_TRANSITIONS.items():
        out[STATE_OF[state]] |= {STATE_OF[t] for t in allowed}
    return {name: frozenset(nxt) for name, nxt in out.items()}


TRANSITIONS: dict[str, frozenset[str]] = _transitions()
TERMINAL: frozenset[str] = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
ON_GPU: frozenset[str] = frozenset({"running", "preempting"})
"""States in which a job holds its GPUs (a preempting job still runs to its checkpoint)."""
LEARNING_MODES: tuple[str, ...] = ("shadow", "active")
"""How the learned policy may stand in the live service (off is the other policies)."""
SETTABLE: frozenset[str] = frozenset(
    {
        "gpus",
        "resize_gpus",
        "node",
        "pid",
        "pgid",
        "start_ticks",
        "attempts",
        "preemptions",
        "retries",
        "exit_code",
        "reason",
        "started_at",
        "ended_at",
        "cancel_requested",
        "held",
        "port",
    }
)
"""Columns transition() and update() may change; the job's spec is immutable once submitted."""
ROLES: tuple[str, ...] = ("admin", "team", "read-only")
"""admin: sees and does everything; team: sees the queue, acts for its one team; read-only:
sees the queue and the cluster, changes nothing and reads no team's logs."""

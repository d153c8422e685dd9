"""What /healthz says about the scheduler loop: when it last completed a cycle, its last
error and where, and whether it is late or dead.

The API keeps answering while the loop is stuck (a database lock, a full disk), so the
API answering proves nothing; the age of the last completed cycle does. Ages are measured
on the monotonic clock (the scheduler's clock may be a rehearsal clock running fast).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LoopError:
    at_s: float
    """Wall-clock time (Unix seconds)."""
    stage: str
    job_id: int | None
    message: str

    def view(self) -> dict[str, Any]:
        return {
            "at": self.at_s,
            "stage": self.stage,
            "job_id": self.job_id,
            "message": self.message,
        }


class LoopHealth:
    """Updated by the loop thread, read by the API threads (plain attribute swaps)."""

    def __init__(self, late_after_s: float) -> None:
        self.late_after_s = late_after_s
        self.started_mono: float | None = None
        self.last_cycle_mono: float | None = None
        self.last_cycle_at: float | None = None
        self.cycles = 0
        self.errors = 0
        self.last_error: LoopError | None = None
        self.died: str | None = None
        self.thread: threading.Thread | None = None

    def started(self, thread: threading.Thread) -> None:
        self.thread = thread
        self.started_mono = time.monotonic()

    def completed(self) -> None:
        self.last_cycle_mono = time.monotonic()
        self.last_cycle_at = time.time()
        self.cycles += 1

    def error(self, stage: str, message: str, job_id: int | None = None) -> None:
        self.errors += 1
        self.last_error = LoopError(time.time(), stage, job_id, message)

    def dead(self, why: str) -> None:
        self.died = why

    def view(self, stopping: bool = False) -> dict[str, Any]:
        """The loop's part of /healthz, with `ok` false when it is dead or late."""
        now = time.monotonic()
        running = self.thread is not None
        alive = running and self.thread is not None and self.thread.is_alive()
        since = self.last_cycle_mono if self.last_cycle_mono is not None else self.started_mono
        age = None if self.last_cycle_mono is None else round(now - self.last_cycle_mono, 3)
        problem = None
        if running and not alive and not stopping:
            problem = f"the scheduler loop has stopped: {self.died or 'it exited'}"
        elif running and since is not None and now - since > self.late_after_s:
            late = round(now - since, 1)
            problem = (
                f"the scheduler loop has not completed a cycle for {late} s "
                f"(late after {self.late_after_s:g} s)"
            )
            if self.last_error is not None:
                e = self.last_error
                problem += f"; last error in {e.stage}: {e.message}"
        return {
            "ok": problem is None,
            "problem": problem,
            "running": alive,
            "last_cycle_at": self.last_cycle_at,
            "age_s": age,
            "late_after_s": self.late_after_s,
            "cycles": self.cycles,
            "errors": self.errors,
            "last_error": None if self.last_error is None else self.last_error.view(),
        }

"""What the loop decided, kept for parity tests and benchmarks.

Every start, resume, preemption and resize with its time; every launch's GPUs; and, once
a test sets `commands` to a list, every command the core returned. The simulator keeps the
same records, which is how the parity tests compare the two drivers."""

from __future__ import annotations

from collections.abc import Callable

from gpupool.scheduler import Command


class DecisionRecord:
    def __init__(self) -> None:
        self.decisions: list[tuple[float, str, str]] = []
        """(time, action, job) of every start, resume and preemption: what parity compares."""
        self.placed: list[tuple[float, str, str, tuple[tuple[str, int], ...]]] = []
        """(time, start|resume, job, ((node, GPU index), ...)) of every launch."""
        self.on_decision: Callable[[float, str, str], None] | None = None
        self.commands: list[tuple[float, Command]] | None = None
        """When set, every command the core returned, with its time (parity tests)."""

    def decided(self, now: float, action: str, job_id: str) -> None:
        self.decisions.append((now, action, job_id))
        if self.on_decision is not None:
            self.on_decision(now, action, job_id)

"""One error hierarchy. Every message says what went wrong and what to do about it."""

from __future__ import annotations

from pathlib import Path


class GpupoolError(Exception):
    """Root of every error gpupool raises on purpose."""


class SpecError(GpupoolError):
    """The user asked for something malformed: fix the input and retry."""


class TraceFormatError(SpecError):
    """A trace file has a row gpupool cannot read."""

    def __init__(self, path: str | Path, line: int, problem: str) -> None:
        self.path = str(path)
        self.line = line
        self.problem = problem
        super().__init__(f"{self.path}:{line}: {problem}")


class NotFoundError(GpupoolError):
    """A named thing (policy, file, job, node) does not exist."""


class InfeasibleError(GpupoolError):
    """The request can never be satisfied by this cluster."""


class ConflictError(GpupoolError):
    """The request clashes with the current state."""


class PlanRejected(ConflictError):
    """A policy returned a plan the core refuses: the policy has a bug."""


class IllegalTransition(ConflictError):
    """A job was asked to move between states its lifecycle does not allow."""


class Unavailable(GpupoolError):
    """Infrastructure did not answer in time (a node, an actor): try again later."""

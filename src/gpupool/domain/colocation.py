"""The hook a co-location admission plugs into: may this sharing job join that card's
sharers? The cluster state asks it after its hard rules (online inference never next to
other work, the share cap, one team per card, measured load and memory) have passed, so
an admission can only refuse more, never admit what the rules forbid."""

from __future__ import annotations

from typing import Protocol

from gpupool.domain.model import JobSpec


class PairAdmission(Protocol):
    def problem(self, job: JobSpec, sharers: tuple[JobSpec, ...]) -> str | None:
        """Why `job` may not join a card held by `sharers` (never empty); None: it may."""
        ...

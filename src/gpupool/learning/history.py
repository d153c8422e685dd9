"""What the learner may know: facts at submit, outcomes once a job finished.

The driver appends submits and finishes in time order. Nothing here holds a job's
duration before its finish was appended, so a feature or a model built from a History
at time t cannot see the future of t.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass

from gpupool.errors import SpecError


@dataclass(frozen=True)
class JobFacts:
    """What is known about a job when it is submitted."""

    job_id: str
    submit_s: float
    gpu_count: int
    team: str = "default"
    gpu_type: str = ""
    name: str = ""
    """The job's name or model, where the trace or the submitter gives one."""


@dataclass(frozen=True)
class Outcome:
    """A finished job: its facts and the GPU service it took."""

    facts: JobFacts
    finish_s: float
    gpu_time_s: float
    """GPU-seconds of service to completion (GPUs x run time at full speed)."""


class History:
    """Submits and finishes seen so far, appended in nondecreasing time."""

    def __init__(self, keep_submits_s: float = 400 * 86_400.0) -> None:
        self.outcomes: list[Outcome] = []
        self._finish_times: list[float] = []
        self._submits: list[float] = []
        self._submit_lo = 0
        """Submits before this index are older than the kept window (dropped lazily)."""
        self._keep_submits_s = keep_submits_s
        self.first_submit_s: float | None = None
        self.submits_seen = 0

    @property
    def now_s(self) -> float:
        """The latest time appended (submit or finish)."""
        last_finish = self._finish_times[-1] if self._finish_times else float("-inf")
        last_submit = self._submits[-1] if len(self._submits) > self._submit_lo else float("-inf")
        return max(last_finish, last_submit)

    def submitted(self, facts: JobFacts) -> None:
        if len(self._submits) > self._submit_lo and facts.submit_s < self._submits[-1]:
            raise SpecError(
                f"job {facts.job_id} submitted at {facts.submit_s}s, before the last submit "
                f"({self._submits[-1]}s): submits must be appended in time order"
            )
        if self.first_submit_s is None:
            self.first_submit_s = facts.submit_s
        self.submits_seen += 1
        self._submits.append(facts.submit_s)
        self._submit_lo = bisect.bisect_left(
            self._submits, facts.submit_s - self._keep_submits_s, self._submit_lo
        )
        if self._submit_lo > 4096 and self._submit_lo * 2 > len(self._submits):
            del self._submits[: self._submit_lo]
            self._submit_lo = 0

    def finished(self, outcome: Outcome) -> None:
        if self._finish_times and outcome.finish_s < self._finish_times[-1]:
            raise SpecError(
                f"job {outcome.facts.job_id} finished at {outcome.finish_s}s, before the last "
                f"finish ({self._finish_times[-1]}s): finishes must be appended in time order"
            )
        if outcome.gpu_time_s < 0:
            raise SpecError(f"job {outcome.facts.job_id}: gpu_time_s must be >= 0")
        self.outcomes.append(outcome)
        self._finish_times.append(outcome.finish_s)

    def finished_by(self, t_s: float) -> int:
        """How many outcomes finished at or before t_s."""
        return bisect.bisect_right(self._finish_times, t_s)

    def outcomes_by(self, t_s: float) -> list[Outcome]:
        return self.outcomes[: self.finished_by(t_s)]

    def recent(self, n: int) -> Iterator[Outcome]:
        """The last n outcomes, newest first."""
        for k in range(len(self.outcomes) - 1, max(-1, len(self.outcomes) - 1 - n), -1):
            yield self.outcomes[k]

    def arrivals_since(self, t_s: float) -> int:
        """Submits at or after t_s (within the kept window)."""
        return len(self._submits) - bisect.bisect_left(self._submits, t_s, self._submit_lo)

    def arrivals_between(self, start_s: float, end_s: float) -> int:
        """Submits with start_s <= submit < end_s (within the kept window): the arrivals a
        job submitted at end_s knows of whatever was appended after it, and whichever of
        the jobs submitted at the same instant came first."""
        lo = bisect.bisect_left(self._submits, start_s, self._submit_lo)
        return max(0, bisect.bisect_left(self._submits, end_s, self._submit_lo) - lo)

    def span_s(self) -> float:
        """Time from the first submit to the latest event: how long the cluster was seen."""
        if self.first_submit_s is None:
            return 0.0
        return max(0.0, self.now_s - self.first_submit_s)

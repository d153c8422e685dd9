"""Per-team submit rate: a token bucket per team, refilled continuously.

A team with `submit_per_min: N` may submit a burst of up to N jobs, then N a minute;
a submission that finds too few tokens is refused with the seconds until there are
enough (the API answers 429 with Retry-After). The clock is passed in, so tests drive it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpupool.errors import GpupoolError


class RateLimited(GpupoolError):
    """Too many submissions: retry after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass
class _Bucket:
    tokens: float
    at_s: float


class SubmitRate:
    """Token buckets of the teams with a rate (team -> jobs per minute); others are free."""

    def __init__(self, per_min: Mapping[str, float], now: Callable[[], float]) -> None:
        self.per_min = dict(per_min)
        self.now = now
        self.buckets: dict[str, _Bucket] = {}
        self.lock = threading.Lock()

    def take(self, team: str, jobs: int = 1) -> None:
        """Spend `jobs` tokens of the team's bucket, or raise RateLimited spending none."""
        rate = self.per_min.get(team)
        if rate is None:
            return
        with self.lock:
            now = self.now()
            b = self.buckets.get(team)
            if b is None:
                b = self.buckets[team] = _Bucket(rate, now)
            b.tokens = min(rate, b.tokens + max(0.0, now - b.at_s) * rate / 60.0)
            b.at_s = now
            if jobs > rate:
                raise RateLimited(
                    f"team {team} may submit {rate:g} jobs a minute; this asks for {jobs} at "
                    f"once: split it into batches of at most {math.floor(rate)}",
                    60.0,
                )
            if b.tokens + 1e-9 < jobs:
                wait_s = (jobs - b.tokens) * 60.0 / rate
                raise RateLimited(
                    f"team {team} may submit {rate:g} jobs a minute and has used them; "
                    f"retry in {math.ceil(wait_s)} s",
                    wait_s,
                )
            b.tokens -= jobs

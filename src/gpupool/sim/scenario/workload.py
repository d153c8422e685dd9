"""What a scenario runs: batch jobs (JobSpec) and online-inference services with a load curve.

A service is not a job: its autoscaler turns the request rate into replica jobs (kind
online-inference, one GPU or a GPU share each) that come and go with the load.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from gpupool.domain.model import MILLI_PER_GPU, JobSpec
from gpupool.errors import SpecError
from gpupool.scheduler.jobs import ServiceTemplate

if TYPE_CHECKING:
    from gpupool.sim.scenario.usage import LatencyUpdate, UsageOverride
    from gpupool.sizing.planner import PlanRequest


@dataclass(frozen=True, slots=True)
class LoadCurve:
    """Requests per second over time: linear between samples, repeating every `period_s`
    (0 = no repeat, the last value holds)."""

    times_s: tuple[float, ...]
    rps: tuple[float, ...]
    period_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.times_s or len(self.times_s) != len(self.rps):
            raise SpecError("a load curve needs matching, non-empty times_s and rps")
        if any(b < a for a, b in zip(self.times_s, self.times_s[1:], strict=False)):
            raise SpecError("load curve times_s must not go backwards")
        if any(r < 0 for r in self.rps):
            raise SpecError("load curve rps must be >= 0")

    def at(self, t_s: float) -> float:
        if self.period_s > 0:
            t_s = self.times_s[0] + (t_s - self.times_s[0]) % self.period_s
        k = bisect.bisect_right(self.times_s, t_s)
        if k == 0:
            return self.rps[0]
        if k == len(self.times_s):
            return self.rps[-1]
        t0, t1 = self.times_s[k - 1], self.times_s[k]
        r0, r1 = self.rps[k - 1], self.rps[k]
        return r0 if t1 == t0 else r0 + (r1 - r0) * (t_s - t0) / (t1 - t0)

    def peak(self, t0_s: float, t1_s: float, step_s: float = 60.0) -> float:
        """Highest rate in [t0, t1], sampled every step_s (the autoscaler's look-ahead)."""
        n = max(1, math.ceil((t1_s - t0_s) / step_s))
        return max(self.at(t0_s + k * (t1_s - t0_s) / n) for k in range(n + 1))


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """An online-inference service with a p99 latency SLO, never preempted."""

    name: str
    team: str
    load: LoadCurve
    replica_rps: float
    """Requests/s one replica on a whole, unshared GPU serves within the SLO."""
    slo_p99_ms: float = 200.0
    base_p99_ms: float = 120.0
    """p99 latency of a replica at its rated load, alone on its GPU."""
    replica_gpu_milli: int = MILLI_PER_GPU
    min_replicas: int = 1
    max_replicas: int = 10_000
    gpu_models: frozenset[str] = field(default_factory=frozenset)
    priority: int = 100
    user_region: str | None = None
    """Where the service's users are; with latency_bound_ms, limits where replicas go."""
    latency_bound_ms: float | None = None

    @property
    def template(self) -> ServiceTemplate:
        """What the scheduling core needs of it: every field but the load curve."""
        return ServiceTemplate(**{f.name: getattr(self, f.name) for f in fields(ServiceTemplate)})

    def __post_init__(self) -> None:
        if self.replica_rps <= 0:
            raise SpecError(f"service {self.name}: replica_rps must be > 0")
        if not 0 < self.replica_gpu_milli <= MILLI_PER_GPU:
            raise SpecError(f"service {self.name}: replica_gpu_milli must be in 1..1000")
        if self.min_replicas < 0 or self.max_replicas < self.min_replicas:
            raise SpecError(f"service {self.name}: need 0 <= min_replicas <= max_replicas")


@dataclass(frozen=True)
class Workload:
    jobs: tuple[JobSpec, ...] = ()
    services: tuple[ServiceSpec, ...] = ()
    sized: Mapping[str, PlanRequest] = field(default_factory=dict)
    """Jobs given by a model instead of a GPU count: the scheduler sizes them per pool."""
    usage: Mapping[str, UsageOverride] = field(default_factory=dict)
    """The world's measured use, by job id or service name (entries' `usage:`); never
    read by the scheduler."""
    updates: Mapping[str, tuple[LatencyUpdate, ...]] = field(default_factory=dict)
    """Model updates that move a service's base p99 from a time on (entries' `update:`)."""

    def __add__(self, other: Workload) -> Workload:
        return Workload(
            self.jobs + other.jobs,
            self.services + other.services,
            {**self.sized, **other.sized},
            {**self.usage, **other.usage},
            {**self.updates, **other.updates},
        )

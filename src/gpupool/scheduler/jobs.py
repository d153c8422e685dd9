"""The core's record of a job and of a service, and the per-team queues.

A JobRecord holds what decisions need: state, pool, when it became runnable, how often
it was preempted, and the progress its driver measured (or the core's own estimate).
What a world needs to simulate a job (energy, heat, served requests) lives with the
world, not here.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from gpupool.domain.lifecycle import JobState
from gpupool.domain.model import MILLI_PER_GPU, JobSpec
from gpupool.policies.pool_choice import PoolOption

WAITING = (JobState.PENDING, JobState.SUSPENDED)


@dataclass(frozen=True)
class ServiceTemplate:
    """An online-inference service: the core creates, places and stops its replicas."""

    name: str
    team: str
    replica_rps: float
    """Requests/s one replica on a whole, unshared GPU serves within the SLO."""
    slo_p99_ms: float = 200.0
    base_p99_ms: float = 120.0
    replica_gpu_milli: int = MILLI_PER_GPU
    min_replicas: int = 1
    max_replicas: int = 10_000
    gpu_models: frozenset[str] = field(default_factory=frozenset)
    priority: int = 100
    user_region: str | None = None
    latency_bound_ms: float | None = None


@dataclass
class JobRecord:
    spec: JobSpec
    gpu_type: str
    ready_s: float
    """When it (last) became runnable: submit, or the end of its last preemption."""
    state: JobState = JobState.PENDING
    service: str | None = None
    options: tuple[PoolOption, ...] = ()
    """Pools the job could run on (one, unless it may choose a GPU type or site)."""
    preemptions: int = 0
    attempts: int = 0
    run_started_s: float = 0.0
    first_start_s: float | None = None
    end_s: float | None = None
    end_reason: str = ""
    vacate_at: float | None = None
    """When a stopped job is expected to have written its checkpoint."""
    # progress: measured by the driver (Progress), else estimated at speed 1
    done_s: float = 0.0
    saved_s: float = 0.0
    speed: float = 1.0
    overhead_s: float = 0.0
    cap_speed: float = 1.0
    start_done_s: float = 0.0
    """Work done when it last started (the estimate counts from there)."""
    start_overhead_s: float = 0.0

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    def estimate(self, now: float) -> None:
        """Progress where no driver measures it: work since the last start at speed 1,
        after the start overhead, saved at the last whole checkpoint interval."""
        ran = now - self.run_started_s
        before = self.start_overhead_s
        self.overhead_s = before - ran if before - ran > 0.0 else 0.0
        work = ran - before if ran - before > 0.0 else 0.0
        interval = self.spec.checkpoint_interval_s
        self.done_s = done = self.start_done_s + work
        self.saved_s = self.start_done_s + (work // interval) * interval if interval > 0 else done


class TeamQueues:
    """Each team's waiting jobs in the policy's order, kept sorted as jobs come and go."""

    def __init__(self, key: Callable[[JobSpec, float], tuple[object, ...]]) -> None:
        self.key = key
        self.by_team: dict[str, list[tuple[tuple[object, ...], str]]] = defaultdict(list)
        self.by_pool: dict[str, list[tuple[tuple[object, ...], str]]] = defaultdict(list)
        """The same entries by the pool each job waits for, in the same order."""
        self.entered: set[str] = set()
        """Jobs that joined a queue since the waiting reasons were last worked out."""

    def _entry(self, r: JobRecord) -> tuple[tuple[object, ...], str]:
        return (self.key(r.spec, r.ready_s), r.spec.job_id)

    def add(self, r: JobRecord) -> None:
        entry = self._entry(r)
        bisect.insort(self.by_team[r.spec.team], entry)
        bisect.insort(self.by_pool[r.gpu_type], entry)
        self.entered.add(r.spec.job_id)

    def remove(self, r: JobRecord) -> None:
        entry = self._entry(r)
        for queue in (self.by_team[r.spec.team], self.by_pool[r.gpu_type]):
            k = bisect.bisect_left(queue, entry)
            if k < len(queue) and queue[k] == entry:
                queue.pop(k)
        self.entered.discard(r.spec.job_id)

    def __len__(self) -> int:
        return sum(len(q) for q in self.by_team.values())

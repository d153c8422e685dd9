"""Elastic jobs' bookkeeping: their declared size, resizes in flight, last resize time.

An elastic job (`--gpus 2..4`, JobSpec.gpu_count_min) runs on any count in its range.
When an online-inference job (a service replica included) cannot be placed and no GPU is
free, the core shrinks running elastic jobs toward their minimum (Resize) before the
cycle policy would preempt anyone: the job checkpoints, its processes leave (the driver
reports Resized), the online job starts on the freed cards, and the elastic job
restarts on the rest. It stays RUNNING throughout and no preemption is counted. Once no
online job waits in its pool and cards are idle, it grows back after a hold-down
(ElasticConfig.grow_after_s) so that it does not flap with the load.

A shrinking job keeps its old placement in the core's state until Resized (its
processes still hold the cards); a growing job takes its new cards at once. Only jobs on
one node resize, and only on that node. The stages that decide resizes are
`cycle/elastic.py`; the job book carries them out (`JobBook.begin_resize`, `resized`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from gpupool.domain.model import JobSpec, NodeShare, Placement
from gpupool.scheduler.config import ElasticConfig
from gpupool.scheduler.jobs import JobRecord


@dataclass(frozen=True)
class PendingResize:
    """A Resize sent and not yet reported done (Resized)."""

    placement: Placement
    old_count: int
    lent_to: tuple[str, ...]
    """Online jobs waiting for the cards it gives up (empty: it grows)."""


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def current_of(share: NodeShare, gpus: list[int] | tuple[int, ...]) -> Placement:
    return Placement((replace(share, gpus=tuple(sorted(gpus))),))


class Elastic:
    """The core's elastic jobs: their declared size, resizes in flight, last resize time."""

    def __init__(self, config: ElasticConfig) -> None:
        self.config = config
        self.enabled = config.resize
        """Off where the driver's executor cannot restart a job on other GPUs (Ray)."""
        self.declared: dict[str, int] = {}
        """Each elastic job's GPU count as submitted (its maximum)."""
        self.pending: dict[str, PendingResize] = {}
        self.last_s: dict[str, float] = {}
        self.claimants: set[str] = set()
        """Online jobs waiting for cards an elastic job is giving back: the core starts
        them once it has (Resized); the cycle policy does not see them meanwhile, so it
        neither preempts for them nor gives them cards another online job needs."""
        self.idle_since: dict[str, float] = {}
        """Since when cards it could grow onto have been idle (reset when none are)."""
        self.resizes = 0

    # ---- bookkeeping hooks ----------------------------------------------------------------
    def track(self, job: JobSpec) -> None:
        if job.elastic:
            self.declared[job.job_id] = self.declared.get(job.job_id, job.gpu_count)

    def fraction(self, r: JobRecord) -> float:
        """Its speed relative to its declared size (work is measured at full size)."""
        full = self.declared.get(r.spec.job_id)
        return 1.0 if full is None else r.spec.gpu_count / full

    def hidden(self, claims: Mapping[str, object]) -> set[str]:
        """The online jobs waiting for a lend now (those whose claim is over forgotten)."""
        self.claimants.intersection_update(claims)
        return self.claimants

    def resizing(self, job_id: str) -> bool:
        return job_id in self.pending

    def ended(self, job_id: str) -> None:
        """It finished, failed or was lost: a resize in flight is void."""
        self.pending.pop(job_id, None)

    def full_size(self, r: JobRecord) -> None:
        """Back in the queue (preempted, lost): it waits for its declared size again."""
        full = self.declared.get(r.job_id)
        if full is not None and r.spec.gpu_count != full:
            r.spec = replace(r.spec, gpu_count=full)

    def forget(self, job_id: str) -> None:
        self.ended(job_id)
        self.declared.pop(job_id, None)
        self.last_s.pop(job_id, None)
        self.idle_since.pop(job_id, None)

    def restored(self, job: JobSpec, count: int) -> JobSpec:
        """A running elastic job found after a restart on `count` GPUs: the spec it runs as."""
        self.track(job)
        if job.elastic and job.gpu_count_min is not None and job.gpu_count_min <= count:
            return replace(job, gpu_count=min(count, job.gpu_count))
        return job

"""What the scenario world keeps beside the core's records: per job (Run), per service
(ServiceStats) and per cloud action (CloudEvent).

The world (world.py) writes these as it steps; the summary (summary.py) and the review
source (review_source.py) read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.domain.lifecycle import JobState
from gpupool.domain.model import JobSpec
from gpupool.scheduler import JobRecord


@dataclass
class Run:
    """A job as the world sees it: the core's record (state, pool, spec) and the world's
    measurements (work done, checkpoints, time held, GPU-seconds, power cap)."""

    rec: JobRecord
    done_s: float = 0.0
    saved_s: float = 0.0
    since_snapshot_s: float = 0.0
    overhead_s: float = 0.0
    lost_work_s: float = 0.0
    run_time_s: float = 0.0
    held_s: float = 0.0
    gpu_s: float = 0.0
    vacate_at: float | None = None
    speed: float = 1.0
    """Work done per second: co-location slowdown times the power cap's."""
    cap_frac: float | None = None
    """Power cap as a fraction of TDP while it runs; None: uncapped."""
    cap_speed: float = 1.0
    transfer_s: float = 0.0
    """Time spent moving its dataset to the site it ran at."""
    lent_gpu_s: float = 0.0
    """An elastic job's GPU-seconds below its declared size (lent to online work)."""
    resize_gpu_s: float = 0.0
    """GPU-seconds it held without working while checkpointing and restarting to resize."""
    started: bool = False

    @property
    def spec(self) -> JobSpec:
        return self.rec.spec

    @property
    def state(self) -> JobState:
        return self.rec.state

    @property
    def gpu_type(self) -> str:
        return self.rec.gpu_type

    @property
    def service(self) -> str | None:
        return self.rec.service

    @property
    def preemptions(self) -> int:
        return self.rec.preemptions

    @property
    def run_started_s(self) -> float:
        return self.rec.run_started_s

    @property
    def first_start_s(self) -> float | None:
        return self.rec.first_start_s

    @property
    def end_s(self) -> float | None:
        return self.rec.end_s

    @property
    def end_reason(self) -> str:
        return self.rec.end_reason

    @property
    def ready_s(self) -> float:
        return self.rec.ready_s


@dataclass
class ServiceStats:
    requests: float = 0.0
    ok: float = 0.0


@dataclass(frozen=True)
class CloudEvent:
    t_s: float
    action: str
    nodes: int
    reason: str

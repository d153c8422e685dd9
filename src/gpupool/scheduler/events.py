"""What drivers tell the core: things that happened, each with the time it happened.

The simulator's world and the live service (database, executor, telemetry, node probe)
produce the same events, so the core cannot tell them apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from gpupool.domain.lifecycle import JobState
from gpupool.domain.model import JobSpec
from gpupool.sizing.planner import PlanRequest


@dataclass(frozen=True)
class Submitted:
    t_s: float
    job: JobSpec
    sized: PlanRequest | None = None
    """A job given by its model: sized per GPU type when it arrives."""


@dataclass(frozen=True)
class Finished:
    """It ended by itself, failed, or was cancelled: its GPUs are free."""

    t_s: float
    job_id: str
    state: JobState = JobState.FINISHED
    reason: str = ""


@dataclass(frozen=True)
class Vacated:
    """A stopped job has written its checkpoint and left."""

    t_s: float
    job_id: str


@dataclass(frozen=True)
class Resized:
    """An elastic job being resized has checkpointed and its processes left: the GPUs it
    gives up are free, and it may start again on its new placement."""

    t_s: float
    job_id: str


@dataclass(frozen=True)
class Lost:
    """It died without finishing (crash, lost node): requeue from its checkpoint."""

    t_s: float
    job_id: str
    reason: str


@dataclass(frozen=True)
class NodeDown:
    t_s: float
    node: str
    reason: str = ""


@dataclass(frozen=True)
class GpuDown:
    """One GPU of a node failed (an XID error, uncorrected ECC errors, gone from the bus):
    it takes nothing new; its node's other GPUs work on."""

    t_s: float
    node: str
    gpu: int
    """The GPU's index within its node."""
    reason: str = ""


@dataclass(frozen=True)
class GpuUp:
    """A GPU that was down is healthy again: it takes work."""

    t_s: float
    node: str
    gpu: int


@dataclass(frozen=True)
class NodeUp:
    """A node is healthy again, or a cloud node the core started has joined."""

    t_s: float
    node: str


class JobProgress(NamedTuple):
    """A running job's work as its driver measures it (seconds of work at full speed)."""

    done_s: float
    saved_s: float
    speed: float
    overhead_s: float
    cap_speed: float


@dataclass(frozen=True)
class Progress:
    """Measured progress of jobs; without it the core estimates (speed 1, no slowdown)."""

    t_s: float
    jobs: Mapping[str, JobProgress]


@dataclass(frozen=True)
class GpuTemps:
    """GPU temperatures [node, gpu] and each node's inlet air, e.g. from NVML."""

    t_s: float
    temps_c: np.ndarray
    inlet_c: np.ndarray


@dataclass(frozen=True)
class GpuUsage:
    """What each card is doing, measured (NVML on a real GPU): [node, gpu] arrays as the
    core counts GPUs. NaN utilisation or -1 memory: no reading for that card."""

    t_s: float
    sm_util_pct: np.ndarray
    mem_used_mib: np.ndarray
    mem_total_mib: np.ndarray


@dataclass(frozen=True)
class ServiceDemand:
    """The peak request rate a service expects over the core's look-ahead."""

    t_s: float
    service: str
    peak_rps: float


@dataclass(frozen=True)
class ServiceRate:
    """The request rate arriving at a service, as measured at `t_s` (the simulator's offered
    load, the live service's scraped rate): the series the reactive and forecast rules of
    the autoscaler read (`autoscale.demand`)."""

    t_s: float
    service: str
    rps: float


@dataclass(frozen=True)
class ServiceLoad:
    """What a service's running replicas measured over the driver's last window: the
    requests per second they served together and the p99 latency of those requests
    (None: no request finished in the window). The SLO rule of the autoscaler reads it."""

    t_s: float
    service: str
    rps: float
    p99_ms: float | None
    replicas_reporting: int


@dataclass(frozen=True)
class Hold:
    """Someone put a waiting job on hold: it starts only once released. A job being
    requeued (stopping) is held once it has left."""

    t_s: float
    job_id: str


@dataclass(frozen=True)
class Release:
    """A held job may start again, in its old place in the queue."""

    t_s: float
    job_id: str


@dataclass(frozen=True)
class Requeue:
    """Someone asked a running job to stop (checkpoint and leave) and wait again."""

    t_s: float
    job_id: str
    reason: str = "requeued on request"


@dataclass(frozen=True)
class Drain:
    """No new job goes to this node; what runs there runs on. undo: take work again."""

    t_s: float
    node: str
    undo: bool = False


@dataclass(frozen=True)
class CycleAt:
    """In a recorded event stream: the driver ran a cycle at this time."""

    t_s: float


Event = (
    Submitted
    | Finished
    | Vacated
    | Resized
    | Lost
    | NodeDown
    | NodeUp
    | GpuDown
    | GpuUp
    | Progress
    | GpuTemps
    | GpuUsage
    | ServiceDemand
    | ServiceRate
    | ServiceLoad
    | Hold
    | Release
    | Requeue
    | Drain
)

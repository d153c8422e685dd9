"""What the loop's parts share and change: one lock, and the state more than one part reads.

A part keeps to itself what only it uses; what two parts share lives here, so that no part
reaches into another. Everything here is read and written under `lock`, except where a
field says otherwise (views that read a value the loop replaces whole)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from gpupool.domain.model import Placement
from gpupool.ports.telemetry.base import GpuSample
from gpupool.server.telemetry.monitor import Signals
from gpupool.server.telemetry.replica_load import Endpoint


@dataclass(eq=False)
class LoopState:
    """The loop's shared state: the lock and events, where the loop is, the jobs in
    flight between two of its stages, the latest measurements and when each periodic
    stage last ran."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    """The one lock: the loop's step holds it; the API's operations and views take it."""
    wake: threading.Event = field(default_factory=threading.Event)
    """Set to run a step early (a submit, a cancel, an exit)."""
    stopping: threading.Event = field(default_factory=threading.Event)
    stage: str = "start"
    """What the loop is doing now, for errors reported from deep inside (retries)."""
    loop_error: str | None = None
    """The last error of this step (cleared as each step begins), for the views."""
    gate: str | None = None
    """Why launches wait now (DiskFull, ReadOnly, LaunchFailing), or None."""
    seen_id: int = 0
    """The highest job id read in from the database."""
    evicting: dict[str, str] = field(default_factory=dict)
    """Jobs stopped because their node went bad: requeued when they exit."""
    resizing: dict[str, Placement] = field(default_factory=dict)
    """Elastic jobs whose processes are leaving for a resize: relaunched on these GPUs
    (the core's Launch) when they exit; the job stays running."""
    endpoints: dict[str, Endpoint] = field(default_factory=dict)
    """Where each replica whose process runs (or is starting) listens: its node's address
    and its port (dropped when its process ends)."""
    cancel_why: dict[str, str] = field(default_factory=dict)
    """Why the core cancelled a replica (scaled down, service deleted)."""
    wait_codes: dict[int, str] = field(default_factory=dict)
    """Each waiting job's last wait code: a new one is an event (the review's waits)."""
    samples: list[GpuSample] = field(default_factory=list)
    """The telemetry's latest readings (replaced whole at each sample)."""
    signals: Signals | None = None
    """The monitor rule's latest evaluation, and when it was made."""
    signals_at: float | None = None
    last_sample: float = -1e18
    last_probe: float = -1e18
    last_service_sample: float = -1e18
    next_purge: float = -1e18

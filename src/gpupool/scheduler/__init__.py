"""The decision core: fed events with their times, it returns commands.

    scheduler.py  the Scheduler: wires the parts, routes events, runs the cycle
    book.py       the job book: every job and the moves of its lifecycle
    fleet.py      nodes and pools, health, drains, cloud nodes, the online reserve
    view.py       what a cycle policy plans from (CycleView)
    cycle/        the cycle's stages, one plug-in each, in the order of cycle/order.py
    events.py     what drivers tell the core; commands.py: what it returns
    config.py     the one scheduling configuration; config_schema.py: its YAML form

Pure: it never reads a clock, a process or a database (mypy strict; no driver imported).
"""

from gpupool.scheduler.commands import (
    Burst,
    Cancel,
    Command,
    Decision,
    Defer,
    Expire,
    Launch,
    Reclaim,
    Resize,
    Scale,
    SetPowerCap,
    Stop,
    Wait,
)
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.events import (
    Drain,
    Event,
    Finished,
    GpuDown,
    GpuTemps,
    GpuUp,
    GpuUsage,
    Hold,
    JobProgress,
    Lost,
    NodeDown,
    NodeUp,
    Progress,
    Release,
    Requeue,
    Resized,
    ServiceDemand,
    ServiceLoad,
    ServiceRate,
    Submitted,
    Vacated,
)
from gpupool.scheduler.fleet import pool_key
from gpupool.scheduler.jobs import JobRecord, ServiceTemplate
from gpupool.scheduler.scheduler import Scheduler

__all__ = [
    "Burst",
    "Cancel",
    "Command",
    "Decision",
    "Defer",
    "Drain",
    "Event",
    "Expire",
    "Finished",
    "GpuDown",
    "GpuTemps",
    "GpuUp",
    "GpuUsage",
    "Hold",
    "JobProgress",
    "JobRecord",
    "Launch",
    "Lost",
    "NodeDown",
    "NodeUp",
    "Progress",
    "Reclaim",
    "Release",
    "Requeue",
    "Resize",
    "Resized",
    "Scale",
    "Scheduler",
    "SchedulerConfig",
    "ServiceDemand",
    "ServiceLoad",
    "ServiceRate",
    "ServiceTemplate",
    "SetPowerCap",
    "Stop",
    "Submitted",
    "Vacated",
    "Wait",
    "pool_key",
]

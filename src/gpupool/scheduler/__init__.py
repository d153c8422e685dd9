"""The decision core: fed events with their times, it returns commands (core.py)."""

from gpupool.scheduler.commands import (
    Burst,
    Cancel,
    Command,
    Decision,
    Defer,
    Launch,
    Reclaim,
    SetPowerCap,
    Stop,
)
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.core import Scheduler, pool_key
from gpupool.scheduler.events import (
    Event,
    Finished,
    GpuTemps,
    JobProgress,
    Lost,
    NodeDown,
    NodeUp,
    Progress,
    ServiceDemand,
    Submitted,
    Vacated,
)
from gpupool.scheduler.jobs import JobRecord, ServiceTemplate

__all__ = [
    "Burst",
    "Cancel",
    "Command",
    "Decision",
    "Defer",
    "Event",
    "Finished",
    "GpuTemps",
    "JobProgress",
    "JobRecord",
    "Launch",
    "Lost",
    "NodeDown",
    "NodeUp",
    "Progress",
    "Reclaim",
    "Scheduler",
    "SchedulerConfig",
    "ServiceDemand",
    "ServiceTemplate",
    "SetPowerCap",
    "Stop",
    "Submitted",
    "Vacated",
    "pool_key",
]

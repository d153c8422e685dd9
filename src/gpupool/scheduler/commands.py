"""What the core returns: commands a driver carries out (a process, an NVML call, a
cloud start), each decided, validated and logged by the core."""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.domain.model import JobSpec, Placement
from gpupool.energy.powercap import SetPowerCap


@dataclass(frozen=True)
class Launch:
    """Start (or resume) a job on these GPUs now."""

    job_id: str
    placement: Placement
    resume: bool
    spec: JobSpec | None = None
    """The job as the core runs it: sized and pointed at its pool, or a new replica."""
    service: str | None = None
    note: str = ""
    """Which GPU type it got and why (and a sized job's plan); "" if it had no choice."""


@dataclass(frozen=True)
class Stop:
    """Preempt a running job: it checkpoints and leaves (the driver says when)."""

    job_id: str
    reason: str


@dataclass(frozen=True)
class Resize:
    """Move an elastic job to this placement (fewer GPUs: lent to online work; more: given
    back): it checkpoints, its processes leave, and the driver reports Resized; the core
    then relaunches it there. The job stays running throughout."""

    job_id: str
    placement: Placement
    reason: str


@dataclass(frozen=True)
class Cancel:
    """End a job for good (a scaled-down replica): stop it with its grace period."""

    job_id: str
    reason: str


@dataclass(frozen=True)
class Expire:
    """A job ran past its time limit: stop it with its grace period; it ends as failed
    with this reason (the driver reports Finished(FAILED) once it has left)."""

    job_id: str
    reason: str


@dataclass(frozen=True)
class Wait:
    """Why a waiting job does not start: a reason code (Resources, Priority, JobLimit...;
    see gpupool.scheduler.waiting) and a sentence with the numbers. Sent when the reason
    changes; an empty reason: nothing holds it back any more."""

    job_id: str
    reason: str
    code: str = ""

    @property
    def text(self) -> str:
        """`Code: sentence`, as a driver shows it."""
        return f"{self.code}: {self.reason}" if self.code else self.reason


@dataclass(frozen=True)
class Burst:
    """Start these cloud nodes; the driver reports each with NodeUp once it joined."""

    nodes: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class Reclaim:
    """Stop these idle cloud nodes (already out of the pool)."""

    nodes: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class Defer:
    """A waiting job is held for cheaper hours; it still starts before its deadline."""

    job_id: str
    until_s: float
    reason: str


@dataclass(frozen=True)
class Scale:
    """A service's replica target changed: drivers record it as an event with its reason
    ("p99 241 ms > 200 ms at 35 rps/replica: 3 -> 4"). The new replicas come as Launches
    once placed; `dropped` are replicas that were still waiting and end without having
    run (running ones scaled down get a Cancel)."""

    service: str
    from_replicas: int
    to_replicas: int
    reason: str
    dropped: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return f"{self.reason}: {self.from_replicas} -> {self.to_replicas}"


@dataclass(frozen=True)
class LearnShadow:
    """What the learned policy would have started this cycle next to what the rules
    started. A record only: drivers write it to their log and carry nothing out."""

    t_s: float
    rule_starts: tuple[str, ...]
    learned_starts: tuple[str, ...]

    @property
    def agree(self) -> bool:
        return set(self.rule_starts) == set(self.learned_starts)


@dataclass(frozen=True)
class LearnGuard:
    """A learner's standing changed (cold, trusted, fell back, promoted, demoted), with the
    figures that decided it; drivers write it to their event log. `learner`: "order" (the
    learned job order) or "forecast <service>" (a service's demand forecast)."""

    t_s: float
    state: str
    reason: str
    learner: str = "order"

    @property
    def text(self) -> str:
        who = "learned policy" if self.learner == "order" else self.learner
        return f"{who} {self.state}: {self.reason}"


Decision = Launch | Stop
Command = (
    Launch
    | Stop
    | Cancel
    | SetPowerCap
    | Burst
    | Reclaim
    | Defer
    | Expire
    | Wait
    | Resize
    | Scale
    | LearnShadow
    | LearnGuard
)

__all__ = [
    "Burst",
    "Cancel",
    "Command",
    "Decision",
    "Defer",
    "Expire",
    "Launch",
    "LearnGuard",
    "LearnShadow",
    "Reclaim",
    "Resize",
    "Scale",
    "SetPowerCap",
    "Stop",
    "Wait",
]

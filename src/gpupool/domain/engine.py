"""The engine: asks a policy for a plan, validates it, applies it, and logs the decision."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from gpupool.domain.model import JobSpec, Placement
from gpupool.domain.state import BoolArray, ClusterState


class PlacementPolicy(Protocol):
    """Decides where one job goes. Pure: reads the state, never writes it."""

    name: str

    def place(
        self,
        state: ClusterState,
        job: JobSpec,
        rng: np.random.Generator,
        allowed: BoolArray | None = None,
    ) -> Placement | None: ...


@dataclass(frozen=True, slots=True)
class Decision:
    seq: int
    time_s: float
    action: str  # "start", "unplaced", "finish", "preempt"
    job_id: str
    placement: Placement | None = None

    def line(self, node_names: tuple[str, ...]) -> str:
        where = ""
        if self.placement is not None:
            where = " " + ";".join(
                f"{node_names[s.node]}:{','.join(map(str, s.gpus)) or '-'}@{s.gpu_milli}"
                for s in self.placement.shares
            )
        return f"{self.seq} {self.time_s:.3f} {self.action} {self.job_id}{where}"


@dataclass
class DecisionLog:
    """Every decision in order; the same trace and seed must give the same bytes."""

    decisions: list[Decision] = field(default_factory=list)
    keep: bool = True

    def add(self, time_s: float, action: str, job_id: str, placement: Placement | None) -> None:
        if self.keep:
            self.decisions.append(Decision(len(self.decisions), time_s, action, job_id, placement))

    def render(self, node_names: tuple[str, ...]) -> str:
        return "".join(d.line(node_names) + "\n" for d in self.decisions)


class Engine:
    def __init__(
        self,
        state: ClusterState,
        policy: PlacementPolicy,
        rng: np.random.Generator,
        log: DecisionLog | None = None,
    ) -> None:
        self.state = state
        self.policy = policy
        self.rng = rng
        self.log = log if log is not None else DecisionLog()

    def try_place(
        self, job: JobSpec, now_s: float = 0.0, log_miss: bool = True
    ) -> Placement | None:
        """Place the job now if the policy finds room; None leaves the state untouched.

        `log_miss=False` is for queues that simply retry later: a miss is not a decision.
        """
        plan = self.policy.place(self.state, job, self.rng)
        if plan is None:
            if log_miss:
                self.log.add(now_s, "unplaced", job.job_id, None)
            return None
        self.state.validate(job, plan)
        self.state.allocate(job, plan)
        self.log.add(now_s, "start", job.job_id, plan)
        return plan

    def note(self, job_id: str, now_s: float, action: str) -> None:
        """Record a decision that moves no resources (e.g. a job that can never fit)."""
        self.log.add(now_s, action, job_id, None)

    def apply(self, job: JobSpec, plan: Placement, now_s: float, action: str = "start") -> None:
        """Apply a plan made elsewhere (a cycle policy's Start command), after validation."""
        self.state.validate(job, plan)
        self.state.allocate(job, plan)
        self.log.add(now_s, action, job.job_id, plan)

    def release(self, job_id: str, now_s: float, action: str = "finish") -> Placement:
        placement = self.state.release(job_id)
        self.log.add(now_s, action, job_id, None)
        return placement

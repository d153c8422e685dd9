"""The simulator's driver for the live scheduler core: events in, decisions out.

Feeds a timed list of events (submissions, completions, node losses) to the same
`Scheduler` the live service runs, with preempted jobs leaving as soon as they are told
(a job that checkpoints instantly). It is the reference the live driver is compared with
(tests/test_parity.py): the same events must give the same decisions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpupool.core.lifecycle import JobState
from gpupool.core.model import Cluster, JobSpec
from gpupool.core.quota import TeamQuota
from gpupool.policies.cycle import PreemptionRules
from gpupool.scheduler import Decision, Launch, Scheduler


@dataclass(frozen=True)
class Submit:
    t_s: float
    job: JobSpec


@dataclass(frozen=True)
class Complete:
    t_s: float
    job_id: str
    ok: bool = True


@dataclass(frozen=True)
class NodeLoss:
    t_s: float
    node: str


Event = Submit | Complete | NodeLoss


def run_events(
    cluster: Cluster,
    events: Sequence[Event],
    teams: Sequence[TeamQuota] = (),
    policy: str = "priority-quota",
    rules: PreemptionRules | None = None,
) -> list[tuple[float, str, str]]:
    """(time, start|resume|preempt, job id) for every decision, in order."""
    scheduler = Scheduler(cluster, tuple(teams), policy, rules or PreemptionRules(60.0, 3))
    out: list[tuple[float, str, str]] = []

    def record(t: float, decisions: Sequence[Decision]) -> None:
        for d in decisions:
            if isinstance(d, Launch):
                out.append((t, "resume" if d.resume else "start", d.job_id))
            else:
                out.append((t, "preempt", d.job_id))
                record(t, scheduler.vacated(d.job_id, t))

    for ev in sorted(events, key=lambda e: e.t_s):
        t = ev.t_s
        if isinstance(ev, Submit):
            scheduler.submit(ev.job, t)
        elif isinstance(ev, Complete):
            state = JobState.FINISHED if ev.ok else JobState.FAILED
            scheduler.finished(ev.job_id, t, state)
        else:
            for job_id in scheduler.node_lost(ev.node, t):
                scheduler.lost(job_id, t, f"node {ev.node} lost")
        record(t, scheduler.cycle(t))
    return out

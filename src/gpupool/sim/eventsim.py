"""The simulator's driver for the live scheduler core: events in, decisions out.

Feeds a timed list of events (submissions, completions, node losses) to the same
`Scheduler` the live service runs, with preempted jobs leaving as soon as they are told
(a job that checkpoints instantly). It is the reference the live driver is compared with
(tests/parity/test_parity.py): the same events must give the same decisions.

`run_trace` drives the same core from a trace of jobs with run times instead: it works
out the completions itself and reports where every job ran, the reference the live
service on Ray is compared with (tests/ray/test_ray_parity.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpupool.domain.lifecycle import JobState
from gpupool.domain.model import Cluster, JobSpec
from gpupool.domain.quota import TeamQuota
from gpupool.errors import SpecError
from gpupool.policies.preemption import PreemptionRules
from gpupool.scheduler import (
    Command,
    Expire,
    Finished,
    GpuDown,
    GpuUp,
    Launch,
    NodeDown,
    Resize,
    Resized,
    Scheduler,
    SchedulerConfig,
    Stop,
    Submitted,
)
from gpupool.scheduler import Event as CoreEvent
from gpupool.scheduler.config import ElasticConfig
from gpupool.scheduler.events import CycleAt

RunEvent = Submitted | Finished | NodeDown | GpuDown | GpuUp
"""What `run_events` feeds the core: the core's own events, each handed to the call the
live driver makes for it (submit, finished, node_down or gpu_down then lost, gpu_up)."""


def _core(
    cluster: Cluster,
    teams: Sequence[TeamQuota],
    policy: str,
    rules: PreemptionRules | None,
    elastic: ElasticConfig | None = None,
    reservations: bool = False,
) -> Scheduler:
    """The core as the live service runs it by default: a cycle a second, the 20% online
    reserve once online inference was submitted (service.live.LIVE_DEFAULTS)."""
    config = SchedulerConfig(
        policy=policy,
        teams=tuple(teams),
        cycle_s=1.0,
        online_reserve=0.2,
        online_reserve_on="online-seen",
        preemption=rules or PreemptionRules(60.0, 3, reserve_vacate_s=30.0),
        elastic=elastic or ElasticConfig(),
        reservations=reservations,
    )
    return Scheduler(cluster, config)


def run_events(
    cluster: Cluster,
    events: Sequence[RunEvent],
    teams: Sequence[TeamQuota] = (),
    policy: str = "priority-quota",
    rules: PreemptionRules | None = None,
    elastic: ElasticConfig | None = None,
    reservations: bool = False,
) -> list[tuple[float, str, str]]:
    """(time, start|resume|preempt|expire|resize, job id) for every decision, in order.
    A resized elastic job restarts on its new GPUs at once, as a preempted job leaves."""
    scheduler = _core(cluster, teams, policy, rules, elastic, reservations)
    out: list[tuple[float, str, str]] = []

    def record(t: float, decisions: Sequence[Command]) -> None:
        for d in decisions:
            if isinstance(d, Launch):
                out.append((t, "resume" if d.resume else "start", d.job_id))
            elif isinstance(d, Stop):
                out.append((t, "preempt", d.job_id))
                record(t, scheduler.vacated(d.job_id, t))
            elif isinstance(d, Resize):
                out.append((t, "resize", d.job_id))
                record(t, scheduler.observe(Resized(t, d.job_id)))
            elif isinstance(d, Expire):  # past its time limit: it stops at once, failed
                out.append((t, "expire", d.job_id))
                scheduler.finished(d.job_id, t, JobState.FAILED, d.reason)

    for ev in sorted(events, key=lambda e: e.t_s):
        t = ev.t_s
        if isinstance(ev, Submitted):
            scheduler.submit(ev.job, t, sized=ev.sized)
        elif isinstance(ev, Finished):
            scheduler.finished(ev.job_id, t, ev.state, ev.reason)
        elif isinstance(ev, GpuDown):
            for job_id in scheduler.gpu_down(ev.node, ev.gpu, t, ev.reason):
                scheduler.lost(job_id, t, f"GPU {ev.gpu} of node {ev.node} failed")
        elif isinstance(ev, GpuUp):
            scheduler.gpu_up(ev.node, ev.gpu, t)
        else:
            for job_id in scheduler.node_down(ev.node, t, ev.reason):
                scheduler.lost(job_id, t, f"node {ev.node} lost")
        record(t, scheduler.cycle(t))
    return out


Placed = tuple[float, str, str, tuple[tuple[str, int], ...]]
"""(time, start|resume|preempt|expire|lost, job id, ((node name, local GPU index), ...)); a
preemption or a loss has an empty placement."""


def run_trace(
    cluster: Cluster,
    jobs: Sequence[JobSpec],
    teams: Sequence[TeamQuota] = (),
    policy: str = "priority-quota",
    rules: PreemptionRules | None = None,
    losses: Sequence[NodeDown] = (),
) -> list[Placed]:
    """Run a trace of jobs to the end on the live scheduler core; every launch with its
    placement, every preemption, and every job lost with a node, in order.

    At a loss, every job with a GPU on that node stops whole (a job across nodes too:
    no member runs on alone) and is requeued ("lost"); it keeps the work up to its last
    checkpoint (every `checkpoint_interval_s` of run time) and redoes the rest. The node
    stays down.

    A job arrives at its `submit_s` and ends `duration_s` of run time after it starts;
    a run that reaches its time limit first is stopped there and fails (the core's Expire).
    A preempted job checkpoints and leaves at once, keeping the work it has done: when it
    resumes it needs only the rest. At each event time the driver does what the live
    service does in one step: submissions, then completions, then cycles at that same
    time until the scheduler decides nothing more, with the jobs preempted in a cycle
    vacating (and their claimants starting) before the next cycle.
    """
    for job in jobs:
        if job.duration_s is None:
            raise SpecError(f"job {job.job_id}: a trace job needs a duration_s")
    scheduler = _core(cluster, teams, policy, rules)
    arrivals = sorted(jobs, key=lambda j: j.submit_s)  # stable: ties keep their order
    left = {j.job_id: float(j.duration_s or 0.0) for j in jobs}
    """Run time each job still needs."""
    since: dict[str, float] = {}
    """Running jobs: when they (re)started."""
    limit_s = {j.job_id: limit for j in jobs if (limit := scheduler.time_limit_s(j)) is not None}
    """Each run of these ends at its time limit, if not before."""
    out: list[Placed] = []

    def launched(t: float, d: Launch) -> None:
        where = tuple((cluster.nodes[s.node].name, g) for s in d.placement.shares for g in s.gpus)
        out.append((t, "resume" if d.resume else "start", d.job_id, where))
        since[d.job_id] = t

    every = {j.job_id: j.checkpoint_interval_s for j in jobs}
    down = sorted(losses, key=lambda e: e.t_s)
    k = 0
    while k < len(arrivals) or since:
        ends = [start + left[job_id] for job_id, start in since.items()]
        ends += [start + limit_s[job_id] for job_id, start in since.items() if job_id in limit_s]
        nexts = [*([arrivals[k].submit_s] if k < len(arrivals) else []), *[e.t_s for e in down]]
        t = min([*ends, *nexts])
        while k < len(arrivals) and arrivals[k].submit_s <= t:
            scheduler.submit(arrivals[k], t)
            k += 1
        while down and down[0].t_s <= t:
            node = down.pop(0).node
            for job_id in scheduler.node_down(node, t, f"node {node} lost"):
                ran = t - since.pop(job_id)
                left[job_id] -= ran - ran % every[job_id]  # back to its last checkpoint
                out.append((t, "lost", job_id, ()))
                scheduler.lost(job_id, t, f"node {node} lost")
        for job_id in sorted(since, key=lambda j: (since[j] + left[j], j)):
            if since[job_id] + left[job_id] <= t:
                del since[job_id]
                left[job_id] = 0.0
                scheduler.finished(job_id, t, JobState.FINISHED)
        while decisions := scheduler.cycle(t):
            stopped: list[str] = []
            for d in decisions:
                if isinstance(d, Launch):
                    launched(t, d)
                elif isinstance(d, Stop):
                    out.append((t, "preempt", d.job_id, ()))
                    left[d.job_id] -= t - since.pop(d.job_id)
                    stopped.append(d.job_id)
                elif isinstance(d, Expire):  # past its time limit: it stops at once, failed
                    out.append((t, "expire", d.job_id, ()))
                    del since[d.job_id]
                    scheduler.finished(d.job_id, t, JobState.FAILED, d.reason)
            for job_id in stopped:
                for d in scheduler.vacated(job_id, t):
                    if isinstance(d, Launch):
                        launched(t, d)
    return out


def replay(core: Scheduler, stream: Sequence[CoreEvent | CycleAt]) -> list[tuple[float, Command]]:
    """Feed a recorded event stream (events, and the times cycles ran) into a core; every
    command it returns, with the time, in order. A core that depends only on its inputs
    gives the recording driver's commands and decision log again."""
    out: list[tuple[float, Command]] = []
    for item in stream:
        if isinstance(item, CycleAt):
            out += [(item.t_s, c) for c in core.cycle(item.t_s)]
        else:
            out += [(item.t_s, c) for c in core.observe(item)]
    return out

"""The scheduler both the live service and the event simulator drive.

It owns the decisions and nothing else: which waiting job starts on which GPUs, and
which running job is preempted for whom. It never reads a clock, starts a process or
touches a database; drivers tell it what happened (a job arrived, finished, left after
its checkpoint, a node died) with the time it happened, and ask it for a cycle's
decisions. The simulator's event driver and the live service feed it the same way, so
the same events give the same decisions (tests/test_parity.py).

Planning uses the cycle policies of the scenario simulator (policies/cycle.py) over a
CycleView; every command is validated against the real ClusterState, the quota maxima,
the preemption rules and the lifecycle table before it is applied.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpupool.core.calibration import CheckpointModel
from gpupool.core.engine import DecisionLog, Engine
from gpupool.core.lifecycle import TERMINAL, JobState, check_transition
from gpupool.core.model import Cluster, JobSpec, Node, Placement
from gpupool.core.quota import QuotaBook, TeamQuota
from gpupool.core.state import BoolArray, ClusterState
from gpupool.errors import NotFoundError, PlanRejected, SpecError
from gpupool.policies.consolidate import ConsolidatePolicy
from gpupool.policies.cycle import (
    CYCLE_POLICIES,
    Claim,
    CycleView,
    PendingView,
    Preempt,
    PreemptionRules,
    RunningView,
    Start,
)
from gpupool.policies.pool_choice import PoolLoad, PoolOption, charge, pool_loads

PoolChooser = Callable[
    [JobSpec, Sequence[PoolOption], Mapping[str, PoolLoad], float], tuple[PoolOption | None, str]
]
"""Points a waiting job at one of its pools (None: nowhere acceptable) and says why."""


def pool_key(node: Node, multi_site: bool) -> str:
    """A pool is the nodes of one GPU model (of one site, when there are several)."""
    return f"{node.cluster}/{node.gpu_model}" if multi_site else node.gpu_model


@dataclass(frozen=True)
class Launch:
    """Start (or resume) a job on these GPUs now."""

    job_id: str
    placement: Placement
    resume: bool


@dataclass(frozen=True)
class Stop:
    """Preempt a running job: it checkpoints and leaves (the driver says when)."""

    job_id: str
    reason: str


Decision = Launch | Stop


@dataclass
class Ticket:
    spec: JobSpec
    gpu_type: str
    state: JobState = JobState.PENDING
    ready_s: float = 0.0
    started_s: float = 0.0
    preemptions: int = 0
    attempts: int = 0
    options: tuple[PoolOption, ...] = ()
    """The pools it could wait for, when a chooser points it at one each cycle."""
    reason: str = ""
    """Why it is unplaceable, when it is."""


@dataclass
class Scheduler:
    cluster: Cluster
    teams: Sequence[TeamQuota] = ()
    policy: str = "priority-quota"
    rules: PreemptionRules = field(default_factory=PreemptionRules)
    checkpoint: CheckpointModel = field(default_factory=CheckpointModel.calibrated)
    online_reserve: float = 0.0
    queue_depth: int = 32
    seed: int = 0
    log: DecisionLog = field(default_factory=DecisionLog)
    chooser: PoolChooser | None = None
    """With several sites: picks each waiting, never-started job's pool every cycle (the
    simulator's federation rules, policies/pool_choice.py). None: the first pool it allows."""
    pool_price: Mapping[str, float] = field(default_factory=dict)
    """$/GPU-hour per pool, for the chooser."""
    max_starts_per_cycle: int | None = None
    """Apply at most this many of a plan's starts; the rest are planned again next cycle
    (a live executor that takes long per launch keeps its loop responsive)."""

    def __post_init__(self) -> None:
        if self.policy not in CYCLE_POLICIES:
            raise SpecError(f"unknown policy {self.policy!r}; choose {', '.join(CYCLE_POLICIES)}")
        self.state = ClusterState(self.cluster)
        self.rng = np.random.default_rng(self.seed)
        self.placement = ConsolidatePolicy()
        self.engine = Engine(self.state, self.placement, self.rng, self.log)
        self.cycle_policy = CYCLE_POLICIES[self.policy]()
        self.multi_site = len({n.cluster for n in self.cluster.nodes}) > 1
        self.node_pool = [pool_key(n, self.multi_site) for n in self.cluster.nodes]
        self.pool_nodes: dict[str, BoolArray] = {
            key: np.array([k == key for k in self.node_pool], dtype=np.bool_)
            for key in sorted(set(self.node_pool))
        }
        self.pool_model = {
            k: n.gpu_model for k, n in zip(self.node_pool, self.cluster.nodes, strict=True)
        }
        self.pool_site = {
            k: n.cluster for k, n in zip(self.node_pool, self.cluster.nodes, strict=True)
        }
        self.healthy = np.ones(len(self.cluster.nodes), dtype=np.bool_)
        pool_gpus = {
            m: int(self.state.gpu_count[mask].sum()) for m, mask in self.pool_nodes.items()
        }
        self.pool_gpus = pool_gpus
        self.quotas = QuotaBook(tuple(self.teams), pool_gpus)
        self.reserve = {m: int(self.online_reserve * n) for m, n in pool_gpus.items()}
        self.tickets: dict[str, Ticket] = {}
        self.queue: list[tuple[tuple[object, ...], str]] = []
        self.claims: dict[str, set[str]] = {}
        self.claim_nodes: dict[str, tuple[int, ...]] = {}
        self.held: dict[tuple[str, str], int] = defaultdict(int)
        self.node_index = {n.name: i for i, n in enumerate(self.cluster.nodes)}
        self.dirty = True
        self.woken: list[Decision] = []
        """Claimants started when their victim ended or was lost: the next cycle's first."""

    # ---- what happened ----------------------------------------------------------------------
    def submit(self, job: JobSpec, now_s: float) -> Ticket:
        if job.job_id in self.tickets:
            raise SpecError(f"job {job.job_id} was submitted already")
        gpu_type = self._gpu_type(job)
        ticket = Ticket(job, gpu_type, ready_s=now_s)
        self.tickets[job.job_id] = ticket
        if self.chooser is not None:
            ticket.options = self._options(job)
            if len(ticket.options) > 1:
                picked, why = self.chooser(job, ticket.options, self.pool_loads(now_s), now_s)
                if picked is None:
                    ticket.reason = why
                else:
                    ticket.gpu_type = picked.pool
                    self.engine.note(job.job_id, now_s, f"pool {picked.pool}: {why}")
        if ticket.reason or job.gpu_count > self.pool_gpus.get(ticket.gpu_type, 0):
            ticket.state = check_transition(job.job_id, ticket.state, JobState.UNPLACEABLE)
            self.engine.note(job.job_id, now_s, "unplaceable")
            return ticket
        self._enqueue(ticket)
        self.dirty = True
        return ticket

    def restore(
        self,
        job: JobSpec,
        state: JobState,
        placement: Placement | None,
        now_s: float,
        preemptions: int = 0,
    ) -> None:
        """Rebuild a job after a restart, in the state the database holds."""
        ticket = Ticket(job, self._gpu_type(job), ready_s=now_s, preemptions=preemptions)
        if placement is not None and placement.nodes:
            ticket.gpu_type = self.node_pool[placement.nodes[0]]
        if self.chooser is not None:
            ticket.options = self._options(job)
        self.tickets[job.job_id] = ticket
        if state in (JobState.RUNNING, JobState.PREEMPTING) and placement is not None:
            self.state.validate(job, placement)
            self.state.allocate(job, placement)
            ticket.state = state
            ticket.started_s = now_s
            if state is JobState.RUNNING:
                self.held[(job.team, ticket.gpu_type)] += job.gpu_count
        elif state in (JobState.PENDING, JobState.SUSPENDED):
            ticket.state = state
            self._enqueue(ticket)
        else:
            ticket.state = state
        self.dirty = True

    def finished(self, job_id: str, now_s: float, state: JobState, reason: str = "") -> None:
        """The job ended by itself (or was cancelled): its GPUs are free."""
        t = self._ticket(job_id)
        if t.state in TERMINAL:
            return
        if t.state is JobState.RUNNING:
            self.held[(t.spec.team, t.gpu_type)] -= t.spec.gpu_count
        if t.state in (JobState.RUNNING, JobState.PREEMPTING):
            self.engine.release(job_id, now_s, "finish" if state is JobState.FINISHED else "stop")
        elif t.state in (JobState.PENDING, JobState.SUSPENDED):
            self._dequeue(t)
        if t.state is JobState.PREEMPTING and state is JobState.SUSPENDED:
            state = JobState.CANCELLED
        t.state = check_transition(job_id, t.state, state)
        self.claims.pop(job_id, None)
        self.dirty = True
        self.woken += self._wake_claims(job_id, now_s)

    def vacated(self, job_id: str, now_s: float) -> list[Decision]:
        """A preempted job has written its checkpoint and left: requeue it, and start the
        jobs that were waiting for its GPUs."""
        t = self._ticket(job_id)
        self.engine.release(job_id, now_s, "suspend")
        t.state = check_transition(job_id, t.state, JobState.SUSPENDED)
        t.ready_s = now_s
        self._enqueue(t)
        self.dirty = True
        return self._wake_claims(job_id, now_s)

    def lost(self, job_id: str, now_s: float, reason: str) -> None:
        """The job died without finishing (crash, lost node): back to the queue, to
        resume from its last checkpoint."""
        t = self._ticket(job_id)
        if t.state is JobState.RUNNING:
            self.held[(t.spec.team, t.gpu_type)] -= t.spec.gpu_count
        self.engine.release(job_id, now_s, f"lost ({reason})")
        t.state = check_transition(job_id, t.state, JobState.SUSPENDED)
        t.ready_s = now_s
        self._enqueue(t)
        self.dirty = True
        self.woken += self._wake_claims(job_id, now_s)

    def node_lost(self, node: str, now_s: float) -> list[str]:
        """A node died or turned unhealthy: nothing more goes there. Returns the jobs that
        ran on it (the driver stops them and reports each with `lost`)."""
        k = self.node_index.get(node)
        if k is None:
            raise NotFoundError(f"node {node} is not in this cluster")
        self.healthy[k] = False
        for mask in self.pool_nodes.values():
            mask[k] = False
        self.engine.note(f"node:{node}", now_s, "node-lost")
        self.dirty = True
        return sorted(
            job_id
            for job_id, p in self.state.placements.items()
            if k in p.nodes and self.tickets[job_id].state is JobState.RUNNING
        )

    def node_restored(self, node: str, now_s: float) -> None:
        """A node that was lost is healthy again: it takes work from the next cycle."""
        k = self.node_index.get(node)
        if k is None:
            raise NotFoundError(f"node {node} is not in this cluster")
        if self.healthy[k]:
            return
        self.healthy[k] = True
        self.pool_nodes[self.node_pool[k]][k] = True
        self.engine.note(f"node:{node}", now_s, "node-restored")
        self.dirty = True

    # ---- deciding -------------------------------------------------------------------------
    def cycle(self, now_s: float) -> list[Decision]:
        """One scheduling cycle: the policy's plan, validated and applied."""
        out: list[Decision] = self.woken
        self.woken = []
        if not self.dirty:
            return out
        if self.chooser is not None:
            self._rechoose(now_s)
        self.dirty = False
        starts = 0
        for command in self.cycle_policy.plan(self._view(now_s)):
            t = self.tickets.get(command.job_id)
            if t is None:
                raise PlanRejected(f"the plan names an unknown job {command.job_id}")
            if isinstance(command, Start):
                if self.max_starts_per_cycle is not None and starts >= self.max_starts_per_cycle:
                    self.dirty = True  # planned again next cycle
                    continue
                starts += 1
                out.append(self._start(t, command.placement, now_s))
            elif isinstance(command, Preempt):
                out.append(self._preempt(t, command, now_s))
            else:
                self._claim(t, command, now_s, out)
        return out

    def _claim(self, t: Ticket, command: Claim, now_s: float, out: list[Decision]) -> None:
        victims = {v for v in command.victims if self.tickets[v].state is JobState.PREEMPTING}
        if victims:
            self.claims[t.spec.job_id] = victims
            self.claim_nodes[t.spec.job_id] = command.nodes
            return
        placement = self.placement.place(self.state, t.spec, self.rng, self._allowed(t))
        if placement is not None:
            out.append(self._start(t, placement, now_s))

    def _start(self, t: Ticket, placement: Placement, now_s: float) -> Launch:
        job = t.spec
        if self.held[(job.team, t.gpu_type)] + job.gpu_count > self.quotas.maximum(
            job.team, t.gpu_type, now_s
        ):
            raise PlanRejected(f"job {job.job_id}: team {job.team} would exceed its maximum")
        if not all(self.healthy[k] for k in placement.nodes):
            raise PlanRejected(f"job {job.job_id}: the plan uses a node that is down")
        resume = t.state is JobState.SUSPENDED
        self.claims.pop(job.job_id, None)  # it found GPUs before its victims left
        self.claim_nodes.pop(job.job_id, None)
        self.engine.apply(job, placement, now_s, "resume" if resume else "start")
        self._dequeue(t)
        t.state = check_transition(job.job_id, t.state, JobState.RUNNING)
        t.started_s = now_s
        t.attempts += 1
        self.held[(job.team, t.gpu_type)] += job.gpu_count
        self.dirty = True
        return Launch(job.job_id, placement, resume)

    def _preempt(self, t: Ticket, command: Preempt, now_s: float) -> Stop:
        job = t.spec
        above = self.held[(job.team, t.gpu_type)] > self.quotas.guaranteed(
            job.team, t.gpu_type, now_s
        )
        self.rules.check(
            job, t.preemptions, above, now_s - t.started_s, command.reclaim, command.for_online_of
        )
        t.state = check_transition(job.job_id, t.state, JobState.PREEMPTING)
        t.preemptions += 1
        self.held[(job.team, t.gpu_type)] -= job.gpu_count
        self.engine.note(job.job_id, now_s, f"preempt ({command.reason})")
        self.dirty = True
        return Stop(job.job_id, command.reason)

    def _wake_claims(self, job_id: str, now_s: float) -> list[Decision]:
        out: list[Decision] = []
        for claimant, victims in list(self.claims.items()):
            victims.discard(job_id)
            if victims:
                continue
            del self.claims[claimant]
            t = self.tickets[claimant]
            if t.state not in (JobState.PENDING, JobState.SUSPENDED):
                continue
            allowed = self._allowed(t)
            nodes = self.claim_nodes.pop(claimant, ())
            placement = None
            if nodes:
                held = np.zeros_like(allowed)
                held[list(nodes)] = True
                placement = self.placement.place(self.state, t.spec, self.rng, allowed & held)
            if placement is None:
                placement = self.placement.place(self.state, t.spec, self.rng, allowed)
            if placement is not None:
                out.append(self._start(t, placement, now_s))
        return out

    # ---- pools of several sites ---------------------------------------------------------------
    def _options(self, job: JobSpec) -> tuple[PoolOption, ...]:
        return tuple(
            PoolOption(
                key,
                self.pool_model[key],
                self.pool_site[key],
                job.gpu_count,
                job.duration_s,
                self.pool_price.get(key, 0.0),
            )
            for key in self.pool_nodes
            if job.allows_model(self.pool_model[key]) and job.gpu_count <= self.pool_gpus[key]
        )

    def pool_loads(self, now_s: float) -> dict[str, PoolLoad]:
        """Free GPUs (of nodes up) and drain time of every pool, as the simulator counts."""
        work: dict[str, float] = defaultdict(float)
        for t in self.tickets.values():
            duration = t.spec.duration_s
            if duration is None:
                continue
            if t.state is JobState.RUNNING:
                left = max(0.0, duration - (now_s - t.started_s))
                work[t.gpu_type] += t.spec.gpu_count * left
            elif t.state in (JobState.PENDING, JobState.SUSPENDED):
                work[t.gpu_type] += t.spec.gpu_count * duration
        return pool_loads(self.state, self.pool_nodes, work)

    def _rechoose(self, now_s: float) -> None:
        """Waiting jobs that never ran follow capacity to their best pool (as sim/scenario)."""
        movable = [
            t
            for t in self.tickets.values()
            if len(t.options) > 1 and t.state is JobState.PENDING and t.attempts == 0
        ]
        if not movable:
            return
        loads = self.pool_loads(now_s)
        movable.sort(key=lambda t: (t.ready_s, t.spec.job_id))
        for t in movable[: self.queue_depth * 8]:
            picked, why = (
                self.chooser(t.spec, t.options, loads, now_s) if self.chooser else (None, "")
            )
            if picked is None:
                continue
            if picked.pool != t.gpu_type:
                self._dequeue(t)
                self.engine.note(t.spec.job_id, now_s, f"pool {picked.pool}: {why}")
                t.gpu_type = picked.pool
                self._enqueue(t)
            charge(loads, picked, self.state, self.pool_nodes)

    # ---- views ------------------------------------------------------------------------------
    def _view(self, now_s: float) -> CycleView:
        running: dict[str, RunningView] = {}
        vacating: set[str] = set()
        for job_id in self.state.placements:
            t = self.tickets[job_id]
            if t.state is JobState.PREEMPTING:
                vacating.add(job_id)
            duration = t.spec.duration_s
            running[job_id] = RunningView(
                spec=t.spec,
                gpu_type=t.gpu_type,
                run_started_s=t.started_s,
                preemptions=t.preemptions,
                vacate_s=self.checkpoint.write_s(t.spec.state_gib_per_gpu),
                lost_work_s=min(now_s - t.started_s, t.spec.checkpoint_interval_s),
                resume_s=self.checkpoint.resume_s(t.spec.state_gib_per_gpu),
                est_end_s=t.started_s + duration if duration is not None else float("inf"),
            )
        pending = [
            PendingView(
                t.spec,
                t.gpu_type,
                t.ready_s,
                self.checkpoint.write_s(t.spec.state_gib_per_gpu),
                t.preemptions,
            )
            for _, job_id in self.queue[: self.queue_depth * 4]
            for t in (self.tickets[job_id],)
        ]
        return CycleView(
            now_s=now_s,
            cycle_s=1.0,
            state=self.state,
            running=running,
            pending=pending,
            claimed=frozenset(self.claims),
            vacating=frozenset(vacating),
            quotas=self.quotas,
            pool_nodes=self.pool_nodes,
            team_nodes=None,
            reserve=self.reserve,
            rules=self.rules,
            rng=self.rng,
            placement=self.placement,
        )

    # ---- helpers ----------------------------------------------------------------------------
    def _gpu_type(self, job: JobSpec) -> str:
        for key in self.pool_nodes:
            if job.allows_model(self.pool_model[key]):
                return key
        raise SpecError(
            f"job {job.job_id} asks for {sorted(job.gpu_models)}; this cluster has "
            f"{', '.join(sorted(set(self.pool_model.values())))}"
        )

    def _allowed(self, t: Ticket) -> BoolArray:
        return self.pool_nodes[t.gpu_type].copy()

    def _ticket(self, job_id: str) -> Ticket:
        t = self.tickets.get(job_id)
        if t is None:
            raise NotFoundError(f"job {job_id} is not known to the scheduler")
        return t

    def _key(self, t: Ticket) -> tuple[tuple[object, ...], str]:
        return (self.cycle_policy.queue_key(t.spec, t.ready_s), t.spec.job_id)

    def _enqueue(self, t: Ticket) -> None:
        bisect.insort(self.queue, self._key(t))

    def _dequeue(self, t: Ticket) -> None:
        key = self._key(t)
        k = bisect.bisect_left(self.queue, key)
        if k < len(self.queue) and self.queue[k] == key:
            self.queue.pop(k)

    def waiting(self) -> int:
        return len(self.queue)

    def placements(self) -> Mapping[str, Placement]:
        return self.state.placements

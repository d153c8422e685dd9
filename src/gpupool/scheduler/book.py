"""The job book: every job the core knows, and the only code that moves a job through its
lifecycle (start, preempt, claim, stop, finish, vacate, lose, hold, release, requeue,
resize).

The book is the shared state of a cycle's stages: they read it, and change it only through
its methods, which keep its counts (GPUs held per team and pool, vacating jobs, claims,
queues) and the cluster state (through the engine) in step and validate every move against
the lifecycle table, the fleet and the quotas. Stages that keep state per job hear of a
job's start, end, hold, release and removal as a `JobWatcher`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace

import numpy as np

from gpupool.domain.engine import Engine
from gpupool.domain.lifecycle import TERMINAL, JobState, check_transition
from gpupool.domain.model import MILLI_PER_GPU, JobKind, JobSpec, Placement
from gpupool.domain.quota import QuotaBook
from gpupool.domain.state import ClusterState
from gpupool.domain.topology import spanned_level
from gpupool.errors import ConflictError, NotFoundError, PlanRejected
from gpupool.learning.history import JobFacts
from gpupool.policies.contract import Claim, Preempt, Reservation, Start
from gpupool.scheduler.commands import Command, Expire, Launch, Resize, Stop
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.elastic import Elastic, PendingResize
from gpupool.scheduler.fleet import Fleet
from gpupool.scheduler.jobs import WAITING, JobRecord, TeamQueues
from gpupool.scheduler.ordering import CoreLearning
from gpupool.scheduler.user_shares import UserShares
from gpupool.sizing.planner import PlanRequest

QueueEntry = tuple[tuple[object, ...], str]


class JobWatcher:
    """What a stage that keeps state per job hears from the book. Every hook is a no-op
    here; a stage overrides the ones it needs."""

    def started(self, r: JobRecord, first: bool) -> None:
        """The job got GPUs (`first`: for the first time)."""

    def ended(self, job_id: str) -> None:
        """It reached a terminal state (finished, failed, cancelled)."""

    def held(self, job_id: str) -> None:
        """It was put on hold."""

    def released(self, r: JobRecord) -> None:
        """Its hold was released."""

    def forgotten(self, job_id: str) -> None:
        """Its record was dropped (the driver deleted the job)."""


class JobBook:
    """The jobs, their queues and counts, and the moves of their lifecycle."""

    def __init__(
        self,
        config: SchedulerConfig,
        engine: Engine,
        fleet: Fleet,
        quotas: QuotaBook,
        queue_key: Callable[[JobSpec, float], tuple[object, ...]],
        ordering: CoreLearning | None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.state: ClusterState = engine.state
        self.fleet = fleet
        self.quotas = quotas
        self.ordering = ordering
        """The ordered policies' order (las, gittins, learned); None for the others."""
        self.elastic = Elastic(config.elastic)
        """Elastic jobs: their declared sizes and resizes in flight (scheduler/elastic.py)."""
        self.records: dict[str, JobRecord] = {}
        self.active: dict[str, JobRecord] = {}
        """Records not in a terminal state."""
        self.running: dict[str, JobRecord] = {}
        """Records holding GPUs: running, or preempted and still writing their checkpoint."""
        self.replicas: dict[str, dict[str, JobRecord]] = defaultdict(dict)
        self.queues = TeamQueues(queue_key)
        self.held: dict[tuple[str, str], int] = defaultdict(int)
        """GPUs each (team, pool) holds in running jobs; vacating ones excluded."""
        self.vacating: set[str] = set()
        """Running jobs writing their checkpoint before they leave (PREEMPTING)."""
        self.sized: dict[str, PlanRequest] = {}
        """Jobs given by their model: the planner's request of each (PlanRequest)."""
        self.claims: dict[str, set[str]] = {}
        """Each claimant's victims still writing their checkpoints."""
        self.claim_grace: dict[str, float] = {}
        self.claim_nodes: dict[str, tuple[int, ...]] = {}
        self.room_since: dict[tuple[str, str], float] = {}
        """When each (team, pool) last got room under its guarantee (a job left)."""
        self.ready_claims: list[str] = []
        """Claimants whose victims ended by themselves: the next cycle starts them first."""
        self.reservations: dict[str, Reservation] = {}
        """The GPUs the last plan kept for waiting jobs (`gpupool why`, the dashboard)."""
        self.on_hold: set[str] = set()
        """Jobs that start only once released (held while waiting, or once requeued)."""
        self.expiring: dict[str, str] = {}
        """Jobs stopped for running past their time limit: why, until the driver's Finished."""
        self.dirty = True
        """Something the policy looks at changed since its last (empty) plan. Planning is
        pure, so an unchanged view gives the same empty plan: skip it."""
        self.measured = False
        """A driver reports progress (Progress); else the core estimates it."""
        self.progress_s = 0.0
        """When the driver last measured progress (Progress)."""
        self.timed = bool(config.time_limit_s)
        """Some job may have a time limit (a kind's default, or its own)."""
        self.watchers: list[JobWatcher] = []
        self.shares = UserShares(config.fair_share)
        """Each team's users' GPU use: fair share inside a team (scheduler/user_shares.py)."""
        self.launch_note: Callable[[JobRecord], str] = lambda r: ""
        """Which GPU type a job got and why (set by the pool-choice stage)."""

    # ---- lookups --------------------------------------------------------------------------
    def record(self, job_id: str) -> JobRecord:
        r = self.records.get(job_id)
        if r is None:
            raise NotFoundError(f"job {job_id} is not known to the scheduler")
        return r

    def usage(self, team: str, pool: str) -> int:
        return self.held.get((team, pool), 0)

    def working(self) -> Iterator[tuple[JobRecord, Placement]]:
        """Running jobs (not those writing their checkpoint) with where they run."""
        for r in self.running.values():
            placement = self.state.placements.get(r.spec.job_id)
            if r.state is JobState.RUNNING and placement is not None:
                yield r, placement

    def time_limit_s(self, spec: JobSpec) -> float | None:
        """The job's own limit, else its kind's default (None: unlimited)."""
        if spec.time_limit_s is not None:
            return spec.time_limit_s
        return self.config.time_limit_s.get(spec.kind.value)

    def claim_eta_s(self, job_id: str) -> float | None:
        """When a job waiting for its victims should start: the latest time its victims
        are expected to have written their checkpoints (None: it waits for no victim)."""
        victims = self.claims.get(job_id)
        if not victims:
            return None
        times = [self.records[v].vacate_at for v in victims]
        known = [t for t in times if t is not None]
        return max(known) if known else None

    def pool_work_s(self) -> dict[str, float]:
        """GPU-seconds of work left in each pool: running jobs' and queued jobs' (those
        with a duration)."""
        work: dict[str, float] = defaultdict(float)
        for r in self.running.values():
            if r.spec.duration_s is not None:
                work[r.gpu_type] += r.spec.gpu_count * max(0.0, r.spec.duration_s - r.done_s)
        for q in self.queues.by_team.values():
            for _, job_id in q:
                r = self.records[job_id]
                if r.spec.duration_s is not None:
                    work[r.gpu_type] += r.spec.gpu_count * (r.spec.duration_s - r.done_s)
        return work

    # ---- progress ---------------------------------------------------------------------------
    def work_at(self, r: JobRecord, at: float) -> float:
        """Work a job has done by `at` (seconds at full speed): from the driver's last
        measurement, or from its last start."""
        if r.state is not JobState.RUNNING:
            return r.done_s
        if self.measured and self.progress_s >= r.run_started_s:
            base, since, overhead = r.done_s, self.progress_s, r.overhead_s
        else:
            base, since, overhead = r.start_done_s, r.run_started_s, r.start_overhead_s
        return base + max(0.0, at - since - overhead) * r.speed

    def speed_of(self, r: JobRecord, cap_speed: float | None = None) -> float:
        """Work per second: the power cap's slowdown times co-location's on shared GPUs,
        and a gang's all-reduce slowdown when it spans network domains."""
        cap = r.cap_speed if cap_speed is None else cap_speed
        if self.elastic.declared:
            cap *= self.elastic.fraction(r)  # an elastic job below its size runs slower
        placement = self.state.placements.get(r.spec.job_id)
        if placement is not None and len(placement.shares) > 1 and self.state.level_ids:
            level = spanned_level(self.state.level_ids, placement.nodes)
            cap *= self.state.topology.speed(placement.gpu_count, level)
        if placement is None or r.spec.gpu_milli == MILLI_PER_GPU:
            return cap  # a whole GPU is never shared
        speed = cap
        for share in placement.shares:
            for g in share.gpus:
                sharers = int(
                    self.state.online_on_gpu[share.node, g] + self.state.other_on_gpu[share.node, g]
                )
                speed = min(speed, self.config.colocation.speed(r.spec.kind, sharers))
        return speed

    def estimate_all(self, now: float) -> None:
        """No driver measures progress: every running job's estimate (JobRecord.estimate)."""
        running = JobState.RUNNING
        for r in self.running.values():
            if r.state is running:
                r.estimate(now)

    # ---- joining --------------------------------------------------------------------------
    def add(self, r: JobRecord, service: str | None) -> None:
        """A new or restored job's record (active; a replica joins its service)."""
        self.timed = self.timed or r.spec.time_limit_s is not None
        self.records[r.job_id] = r
        self.active[r.job_id] = r
        self.shares.note(r.spec)
        if service is not None:
            self.replicas[service][r.job_id] = r

    def learn_submitted(self, r: JobRecord) -> None:
        """Batch and training jobs are what the ordered policies order and learn from
        (online inference goes first anyway, and a replica never finishes by itself)."""
        if self.ordering is None or r.service is not None or r.spec.kind is JobKind.ONLINE:
            return
        job = r.spec
        model = self.fleet.pool_model.get(r.gpu_type, r.gpu_type)
        self.ordering.submitted(
            JobFacts(job.job_id, job.submit_s, job.gpu_count, job.team, model, job.name)
        )

    def enqueue(self, r: JobRecord) -> None:
        """Back in its team's queue, unless it is on hold (then it waits for release)."""
        if r.job_id not in self.on_hold:
            self.queues.add(r)

    def retarget(self, r: JobRecord, spec: JobSpec, pool: str) -> None:
        """A waiting job now waits for `pool` with `spec` (its GPU count, share and work
        there): its queue entries follow."""
        queued = r.state in WAITING and r.gpu_type
        if queued:
            self.queues.remove(r)
        r.spec = spec
        r.gpu_type = pool
        self.dirty = True
        if queued:
            self.queues.add(r)

    # ---- starting -------------------------------------------------------------------------
    def team_milli(self, team: str, pool: str) -> int:
        """GPU thousandths the team's running jobs hold in the pool: a share counts as its
        part of a GPU when a quota maximum is checked for a sharing job."""
        return sum(
            r.spec.total_gpu_milli
            for r in self.running.values()
            if r.spec.team == team and r.gpu_type == pool and r.state is JobState.RUNNING
        )

    def over_maximum(self, r: JobRecord, now: float) -> bool:
        """Whether starting the job now would take its team past its maximum."""
        job = r.spec
        limit = self.quotas.maximum(job.team, r.gpu_type, now)
        if job.shares_gpu:
            return self.team_milli(job.team, r.gpu_type) + job.gpu_milli > limit * MILLI_PER_GPU
        return self.held[(job.team, r.gpu_type)] + job.gpu_count > limit

    def start(self, r: JobRecord, placement: Placement, now: float) -> Launch:
        job = r.spec
        if self.over_maximum(r, now):
            raise PlanRejected(f"job {job.job_id}: team {job.team} would exceed its maximum")
        if not all(self.fleet.healthy[k] for k in placement.nodes):
            raise PlanRejected(f"job {job.job_id}: the plan uses a node that is down")
        if self.fleet.drained.intersection(placement.nodes):
            raise PlanRejected(f"job {job.job_id}: the plan uses a drained node")
        if job.job_id in self.on_hold:
            raise PlanRejected(f"job {job.job_id} is on hold")
        resumed = r.state is JobState.SUSPENDED
        self.engine.apply(job, placement, now, "resume" if resumed else "start")
        self.queues.remove(r)
        r.state = check_transition(job.job_id, r.state, JobState.RUNNING)
        self.held[(job.team, r.gpu_type)] += job.gpu_count
        self.running[job.job_id] = r
        self.dirty = True
        r.attempts += 1
        r.run_started_s = now
        ck = self.config.checkpoint
        r.overhead_s = ck.resume_s(job.state_gib_per_gpu) if resumed else ck.process_start_s
        first = r.first_start_s is None
        if first:
            r.first_start_s = now
            r.overhead_s += self.fleet.transfer_s(r.spec, r.gpu_type)
        for w in self.watchers:
            w.started(r, first)
        r.speed = self.speed_of(r)
        r.start_done_s, r.start_overhead_s = r.done_s, r.overhead_s
        return Launch(job.job_id, placement, resumed, job, r.service, self.launch_note(r))

    def start_anywhere(
        self, r: JobRecord, now: float, nodes: tuple[int, ...] = ()
    ) -> Launch | None:
        """Start a claimant where the placement finds room, preferring the nodes held for it."""
        if r.job_id in self.on_hold or (
            self.config.team_limits and self.limit_reason(r, self.running_counts())
        ):
            return None
        if self.over_maximum(r, now):
            return None  # its team filled up while its victims vacated: it waits its turn
        allowed = self.fleet.allowed(r.gpu_type, r.spec.team)
        placement = None
        if nodes:
            held = np.zeros_like(allowed)
            held[list(nodes)] = True
            placement = self.engine.policy.place(
                self.state, r.spec, self.engine.rng, allowed & held
            )
        if placement is None:
            placement = self.engine.policy.place(self.state, r.spec, self.engine.rng, allowed)
        if placement is None:
            return None
        return self.start(r, placement, now)

    # ---- stopping -------------------------------------------------------------------------
    def preempt(self, r: JobRecord, c: Preempt, now: float) -> Stop:
        job = r.spec
        above = self.held[(job.team, r.gpu_type)] > self.quotas.guaranteed(
            job.team, r.gpu_type, now
        )
        claimant = None
        if c.for_job is not None:
            claimant = self.record(c.for_job).spec
            if self.record(c.for_job).state not in WAITING:
                raise PlanRejected(f"job {c.for_job} is not waiting; it claims no GPUs")
        self.config.preemption.check(
            job,
            r.preemptions,
            above,
            now - r.run_started_s,
            c.reclaim,
            c.for_online_of,
            lost_work_s=r.done_s - r.saved_s,
            claimant=claimant,
        )
        self._to_vacating(r, now)
        r.preemptions += 1
        lost = r.done_s - r.saved_s
        r.done_s = r.saved_s
        r.vacate_at = now + self.config.checkpoint.write_s(job.state_gib_per_gpu)
        self.engine.note(job.job_id, now, f"preempt ({c.reason}; loses {lost:.0f}s)")
        return Stop(job.job_id, c.reason)

    def _to_vacating(self, r: JobRecord, now: float) -> None:
        """A running job is being stopped: it writes its checkpoint while its GPUs stay
        held in the state, and its team's count already has room."""
        job = r.spec
        r.state = check_transition(job.job_id, r.state, JobState.PREEMPTING)
        self.vacating.add(job.job_id)
        self.held[(job.team, r.gpu_type)] -= job.gpu_count
        self.room_since[(job.team, r.gpu_type)] = now
        self.dirty = True

    def requeue(self, job_id: str, now: float, reason: str) -> list[Command]:
        """Stop a running job as a preemption does (checkpoint, leave: Vacated), outside
        the preemption rules since someone asked; it then waits in the queue again."""
        r = self.record(job_id)
        if r.state is not JobState.RUNNING:
            where = "waiting in the queue already" if r.state in WAITING else r.state.value
            raise ConflictError(f"job {job_id} is {where}; only a running job can be requeued")
        if self.elastic.resizing(job_id):
            raise ConflictError(
                f"job {job_id} is being resized (checkpoint and restart); requeue it once "
                "it runs again"
            )
        job = r.spec
        if not self.measured:  # its work since the last cycle counts up to its checkpoint
            r.estimate(now)
        self._to_vacating(r, now)
        r.preemptions += 1
        r.done_s = r.saved_s
        r.vacate_at = now + self.config.checkpoint.write_s(job.state_gib_per_gpu)
        self.engine.note(job_id, now, f"requeue ({reason})")
        return [Stop(job_id, reason)]

    def expire(self, r: JobRecord, why: str, now: float) -> Expire:
        """Stop a job that ran past its time limit; it ends as failed once it has left."""
        job = r.spec
        r.state = check_transition(job.job_id, r.state, JobState.PREEMPTING)
        self.vacating.add(job.job_id)
        self.held[(job.team, r.gpu_type)] -= job.gpu_count
        self.room_since[(job.team, r.gpu_type)] = now
        self.expiring[job.job_id] = why
        self.engine.note(job.job_id, now, f"time limit ({why})")
        return Expire(job.job_id, why)

    # ---- claims -----------------------------------------------------------------------------
    def claim(self, c: Claim, now: float) -> Launch | None:
        """A claimant waits for its victims to leave (or starts now if none is leaving)."""
        victims = {v for v in c.victims if self.records[v].state is JobState.PREEMPTING}
        if victims:
            self.claims[c.job_id] = victims
            self.claim_nodes[c.job_id] = c.nodes
            self.claim_grace[c.job_id] = max(
                self.config.checkpoint.write_s(self.records[v].spec.state_gib_per_gpu)
                for v in victims
            )
            return None
        return self.start_anywhere(self.records[c.job_id], now)

    def drop_claim(self, job_id: str) -> None:
        """Its victims need not leave for it any more (it started, or was held)."""
        if self.claims.pop(job_id, None) is not None:
            self.claim_nodes.pop(job_id, None)
            self.claim_grace.pop(job_id, None)

    def wake_claims(self, job_id: str, at: float) -> list[Command]:
        """A victim left: claimants with no victim left start now."""
        out: list[Command] = []
        for claimant, victims in list(self.claims.items()):
            victims.discard(job_id)
            if victims:
                continue
            del self.claims[claimant]
            r = self.records[claimant]
            if r.state in WAITING:
                launch = self.start_anywhere(r, at, self.claim_nodes.pop(claimant, ()))
                if launch is not None:
                    out.append(launch)
        return out

    def release_claims(self, job_id: str) -> None:
        """A victim ended without vacating (it finished, failed or was lost): claimants
        left with no victim start at the next cycle's beginning."""
        for claimant, victims in list(self.claims.items()):
            victims.discard(job_id)
            if not victims:
                del self.claims[claimant]
                self.ready_claims.append(claimant)

    # ---- ending -----------------------------------------------------------------------------
    def finished(self, job_id: str, at: float, state: JobState, reason: str = "") -> list[Command]:
        """The job ended by itself (or was cancelled): its GPUs are free."""
        r = self.record(job_id)
        if r.state in TERMINAL:
            return []
        if self.ordering is not None:
            if state is JobState.FINISHED:
                self.ordering.finished(job_id, at, self.work_at(r, at) * r.spec.gpu_count)
            else:
                self.ordering.forget(job_id)
        if r.state is JobState.RUNNING:
            self.held[(r.spec.team, r.gpu_type)] -= r.spec.gpu_count
            self.room_since[(r.spec.team, r.gpu_type)] = at
        elif r.state in WAITING:
            self.queues.remove(r)
        if r.state in (JobState.RUNNING, JobState.PREEMPTING):
            self.engine.release(job_id, at, "finish" if state is JobState.FINISHED else "stop")
            self.shares.stopped(r, at)
        if r.state is JobState.PREEMPTING and state is JobState.CANCELLED:
            r.state = check_transition(job_id, r.state, JobState.SUSPENDED)
        r.state = check_transition(job_id, r.state, state)
        r.end_s, r.end_reason = at, reason
        self.dirty = True
        self.active.pop(job_id, None)
        self.running.pop(job_id, None)
        self.vacating.discard(job_id)
        self.claims.pop(job_id, None)
        self.on_hold.discard(job_id)
        self.expiring.pop(job_id, None)
        for w in self.watchers:
            w.ended(job_id)
        self.elastic.ended(job_id)
        if r.service is not None:
            self.replicas[r.service].pop(job_id, None)
        self.release_claims(job_id)
        return []

    def vacated(self, job_id: str, at: float) -> list[Command]:
        """A preempted job has written its checkpoint and left: requeue it, and start the
        jobs that were waiting for its GPUs."""
        r = self.record(job_id)
        self.engine.release(job_id, at, "suspend")
        self.shares.stopped(r, at)
        self.running.pop(job_id, None)
        self.vacating.discard(job_id)
        self.dirty = True
        r.state = check_transition(job_id, r.state, JobState.SUSPENDED)
        r.vacate_at = None
        r.ready_s = at
        self.elastic.full_size(r)
        self.enqueue(r)
        return self.wake_claims(job_id, at)

    def lost(self, job_id: str, at: float, reason: str) -> list[Command]:
        """The job died without finishing (crash, lost node): back to the queue, to
        resume from its last checkpoint."""
        r = self.record(job_id)
        if r.state is JobState.RUNNING:
            self.held[(r.spec.team, r.gpu_type)] -= r.spec.gpu_count
            self.room_since[(r.spec.team, r.gpu_type)] = at
        self.engine.release(job_id, at, f"lost ({reason})")
        if r.state in (JobState.RUNNING, JobState.PREEMPTING):
            self.shares.stopped(r, at)
        self.running.pop(job_id, None)
        self.vacating.discard(job_id)
        r.state = check_transition(job_id, r.state, JobState.SUSPENDED)
        r.vacate_at = None
        r.ready_s = at
        r.done_s = r.saved_s
        self.expiring.pop(job_id, None)  # it died before its stop: it waits again
        self.elastic.ended(job_id)
        self.elastic.full_size(r)
        self.enqueue(r)
        self.dirty = True
        self.release_claims(job_id)
        return []

    def forget(self, job_id: str) -> None:
        """Drop an ended job's record (its driver deleted the job)."""
        r = self.records.get(job_id)
        if r is not None and r.state in TERMINAL:
            del self.records[job_id]
            self.elastic.forget(job_id)
            self.sized.pop(job_id, None)
            for w in self.watchers:
                w.forgotten(job_id)

    # ---- holds ------------------------------------------------------------------------------
    def hold(self, job_id: str, now: float) -> None:
        """A waiting job starts only once released; a job being stopped (requeued) is
        held once it has left. A running job cannot be held: requeue it first."""
        r = self.record(job_id)
        if r.state in TERMINAL:
            raise ConflictError(f"job {job_id} has ended ({r.state.value}); nothing to hold")
        if r.state is JobState.RUNNING:
            raise ConflictError(
                f"job {job_id} is running; requeue it to stop it, then hold it while it waits"
            )
        if job_id in self.on_hold:
            return
        self.on_hold.add(job_id)
        if r.state in WAITING:
            self.queues.remove(r)
        self.drop_claim(job_id)  # its victims need not leave for it
        for w in self.watchers:
            w.held(job_id)
        self.engine.note(job_id, now, "hold")
        self.dirty = True

    def release(self, job_id: str, now: float) -> None:
        """A held job may start again, in its old place in the queue (its ready time)."""
        r = self.record(job_id)
        if job_id not in self.on_hold:
            raise ConflictError(f"job {job_id} is not on hold; nothing to release")
        self.on_hold.discard(job_id)
        if r.state in WAITING:
            self.queues.add(r)
            for w in self.watchers:
                w.released(r)
        self.engine.note(job_id, now, "release")
        self.dirty = True

    # ---- team limits --------------------------------------------------------------------------
    def running_counts(self) -> dict[str, tuple[int, int]]:
        """(running jobs, running jobs with no GPU) of each team with limits; jobs still
        leaving (preempted, stopped) count until they have left."""
        counts: dict[str, tuple[int, int]] = {}
        limits = self.config.team_limits
        for r in self.running.values():
            team = r.spec.team
            if team in limits:
                n, cpu = counts.get(team, (0, 0))
                counts[team] = (n + 1, cpu + (r.spec.gpu_count == 0))
        return counts

    def limit_reason(
        self, r: JobRecord, counts: Mapping[str, tuple[int, int]], planned: tuple[int, int] = (0, 0)
    ) -> str:
        """Why the team's limits keep this job from starting now ('' if they do not)."""
        team = r.spec.team
        limits = self.config.team_limits.get(team)
        if limits is None:
            return ""
        n, cpu = counts.get(team, (0, 0))
        n, cpu = n + planned[0], cpu + planned[1]
        if limits.max_running_jobs is not None and n >= limits.max_running_jobs:
            return f"team {team} at its limit of {limits.max_running_jobs} running jobs"
        if r.spec.gpu_count == 0 and limits.max_cpu_jobs is not None and cpu >= limits.max_cpu_jobs:
            return f"team {team} at its limit of {limits.max_cpu_jobs} running CPU-only jobs"
        return ""

    def under_limits(
        self, team: str, queue: list[QueueEntry], counts: Mapping[str, tuple[int, int]]
    ) -> list[QueueEntry]:
        """The part of a team's queue its limits let the policy see: nothing at the
        running limit, no CPU-only job at the CPU-only limit."""
        limits = self.config.team_limits[team]
        n, cpu = counts.get(team, (0, 0))
        if limits.max_running_jobs is not None and n >= limits.max_running_jobs:
            return []
        if limits.max_cpu_jobs is not None and cpu >= limits.max_cpu_jobs:
            return [e for e in queue if self.records[e[1]].spec.gpu_count > 0]
        return queue

    def within_limits(
        self, commands: list[Start | Preempt | Claim]
    ) -> tuple[list[Start | Preempt | Claim], bool]:
        """The plan less the starts and claims that would take a team past its limits,
        and less the preemptions made only for such claims (planned again next cycle);
        and whether anything was dropped."""
        counts = self.running_counts()
        planned: dict[str, tuple[int, int]] = defaultdict(lambda: (0, 0))
        dropped: set[str] = set()
        kept_victims: set[str] = set()
        dropped_victims: set[str] = set()
        for c in commands:
            if isinstance(c, Preempt):
                continue
            r = self.records.get(c.job_id)
            if r is None or r.spec.team not in self.config.team_limits:
                if isinstance(c, Claim):
                    kept_victims.update(c.victims)
                continue
            team = r.spec.team
            if self.limit_reason(r, counts, planned[team]):
                dropped.add(c.job_id)
                if isinstance(c, Claim):
                    dropped_victims.update(c.victims)
                continue
            n, cpu = planned[team]
            planned[team] = (n + 1, cpu + (r.spec.gpu_count == 0))
            if isinstance(c, Claim):
                kept_victims.update(c.victims)
        if not dropped:
            return commands, False
        self.dirty = True
        idle = dropped_victims - kept_victims
        kept = [
            c
            for c in commands
            if not (isinstance(c, Preempt) and c.job_id in idle) and c.job_id not in dropped
        ]
        return kept, True

    # ---- what a plan sees ---------------------------------------------------------------------
    def visible(
        self, now: float, deferred: set[str], rank: Mapping[str, int] | None = None
    ) -> list[JobRecord]:
        """The waiting jobs a cycle considers: the head of each team's queue, plus (further
        back) jobs small enough for the room left under the team's guarantee, so that a
        queue headed by big borrowing jobs cannot hide what the team is owed. With a
        `rank` (an ordered policy's), each queue is taken in that order inside each
        priority class. Deferred jobs wait for their price."""
        out: list[JobRecord] = []
        depth = self.config.queue_depth
        limits = self.config.team_limits
        counts = self.running_counts() if limits else {}
        for team, queue in self.queues.by_team.items():
            if rank is not None:
                queue = ranked(queue, rank)
            if deferred:
                queue = [e for e in queue if e[1] not in deferred]
            if team in limits:
                queue = self.under_limits(team, queue, counts)
            out += [self.records[job_id] for _, job_id in queue[:depth]]
            if len(queue) <= depth:
                continue
            rooms = {
                pool: self.quotas.guaranteed(team, pool, now) - self.usage(team, pool)
                for pool in self.fleet.pool_nodes
            }
            if max(rooms.values(), default=-1) < 0:
                continue  # nothing further back fits inside the guarantee
            extra = 0
            for _, job_id in queue[depth : depth * 16]:
                r = self.records[job_id]
                if r.spec.gpu_count <= rooms.get(r.gpu_type, 0):
                    out.append(r)
                    extra += 1
                    if extra >= depth:
                        break
        return out

    # ---- resizes --------------------------------------------------------------------------
    def begin_resize(
        self,
        r: JobRecord,
        placement: Placement,
        lent_to: tuple[str, ...],
        reason: str,
        now: float,
    ) -> Resize:
        """Record a resize and what it takes from the team now (a shrink frees its cards
        only once done; a growth takes its new cards at once)."""
        job = r.spec
        old = job.gpu_count
        new = placement.gpu_count
        ck = self.config.checkpoint
        if new > old:
            self.engine.release(job.job_id, now, "resize")
            r.spec = replace(job, gpu_count=new)
            self.engine.apply(r.spec, placement, now, "resize")
            self.held[(job.team, r.gpu_type)] += new - old
        elastic = self.elastic
        elastic.pending[job.job_id] = PendingResize(placement, old, lent_to)
        elastic.last_s[job.job_id] = now
        elastic.resizes += 1
        r.saved_s = r.done_s  # a resize checkpoints on demand: nothing is lost
        r.vacate_at = now + ck.write_s(job.state_gib_per_gpu)
        self.engine.note(job.job_id, now, f"resize ({reason})")
        self.dirty = True
        return Resize(job.job_id, placement, reason)

    def resized(self, job_id: str, at: float) -> list[Command]:
        """Its processes left: it gives up its lent cards (the online jobs start there)
        and starts again on its new placement."""
        p = self.elastic.pending.pop(job_id, None)
        r = self.records.get(job_id)
        if p is None or r is None or r.state is not JobState.RUNNING:
            return []
        job = r.spec
        new = p.placement.gpu_count
        if new < job.gpu_count:
            self.engine.release(job_id, at, "resize")
            r.spec = replace(job, gpu_count=new)
            self.engine.apply(r.spec, p.placement, at, "resize")
            self.held[(job.team, r.gpu_type)] -= job.gpu_count - new
            self.room_since[(job.team, r.gpu_type)] = at
        ck = self.config.checkpoint
        r.vacate_at = None
        r.attempts += 1
        r.run_started_s = at
        r.overhead_s = ck.resume_s(r.spec.state_gib_per_gpu)
        r.speed = self.speed_of(r)
        r.start_done_s, r.start_overhead_s = r.done_s, r.overhead_s
        self.elastic.last_s[job_id] = at
        self.dirty = True
        note = f"resized {p.old_count} -> {new} GPUs"
        launch = Launch(job_id, p.placement, True, r.spec, r.service, note)
        return [launch, *self.wake_claims(job_id, at)]

    def recover_resize(self, job_id: str, placement: Placement, now: float) -> None:
        """A resize in flight when the driver restarted (the job restored on its old
        GPUs): carry on with it; a growth takes its new cards again at once."""
        r = self.records.get(job_id)
        elastic = self.elastic
        if r is None or r.state is not JobState.RUNNING or job_id in elastic.pending:
            return
        old = r.spec.gpu_count
        if placement.gpu_count > old:
            current = self.state.placements[job_id]
            self.engine.release(job_id, now, "resize")
            grown = replace(r.spec, gpu_count=placement.gpu_count)
            try:
                self.engine.apply(grown, placement, now, "resize")
            except PlanRejected:  # its new cards are taken: it restarts where it was
                self.engine.apply(r.spec, current, now, "restore")
                placement = current
            else:
                r.spec = grown
                self.held[(r.spec.team, r.gpu_type)] += placement.gpu_count - old
        elastic.pending[job_id] = PendingResize(placement, old, ())
        elastic.last_s[job_id] = now
        self.dirty = True


def ranked(queue: Sequence[QueueEntry], rank: Mapping[str, int]) -> list[QueueEntry]:
    """A team's queue by the rank (its positions keep the priority classes apart)."""
    last = len(rank)
    return sorted(queue, key=lambda e: rank.get(e[1], last))

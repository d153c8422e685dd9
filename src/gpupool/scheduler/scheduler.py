"""The decision core: the only code in gpupool that decides.

It is fed events with their times (a job submitted, finished, vacated, lost; a node down
or up; measured progress; GPU temperatures; service demand) and returns commands
(Launch, Stop, Cancel, SetPowerCap, Burst, Reclaim, Defer). It never reads a clock, a
process or a database. The scenario simulator's world and the live service feed it the
same way, so the same events give the same decisions (tests/parity/test_parity_all.py).

The Scheduler wires its parts together: the fleet (nodes and pools), the job book (every
job and the moves of its lifecycle) and the cycle's stages (`cycle/`, in the order of
`cycle/order.py`). `observe` hands each event to the part it concerns; `cycle` runs the
stages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import assert_never

import numpy as np

from gpupool.domain.engine import DecisionLog, Engine
from gpupool.domain.lifecycle import TERMINAL, JobState, check_transition
from gpupool.domain.model import MILLI_PER_GPU, Cluster, JobKind, JobSpec, Placement
from gpupool.domain.quota import QuotaBook
from gpupool.domain.state import ClusterState
from gpupool.energy.tariff import Tariff
from gpupool.errors import SpecError
from gpupool.federation.topology import Topology
from gpupool.learning.colocation_admission import MeasuredPair, PairAdmissionPolicy
from gpupool.learning.demand import DemandStatus
from gpupool.learning.history import Outcome
from gpupool.learning.predictor import Predictor
from gpupool.policies.contract import CyclePolicy, CycleView, Reservation, cycle_policy
from gpupool.policies.cycle.ordered import OrderedPolicy
from gpupool.policies.placement.base import ScoringPolicy
from gpupool.policies.placement.best_fit import BestFitPolicy
from gpupool.policies.placement.consolidate import ConsolidatePolicy
from gpupool.policies.placement.coolest_first import CoolestFirstPolicy
from gpupool.policies.placement.fgd import LearnedFgdPolicy
from gpupool.policies.pool_choice import PoolLoad, PoolOption
from gpupool.policies.registry import cycle_names
from gpupool.scheduler.book import JobBook
from gpupool.scheduler.commands import Command, LearnGuard
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.cycle.autoscale import Backoff, ServiceAutoscale
from gpupool.scheduler.cycle.base import CycleContext, Published, Stage
from gpupool.scheduler.cycle.burst import CloudBurst
from gpupool.scheduler.cycle.deferral import PriceDeferral
from gpupool.scheduler.cycle.elastic import ElasticGrow, ElasticLend
from gpupool.scheduler.cycle.expire import ExpireOverdue
from gpupool.scheduler.cycle.housekeeping import (
    EstimateProgress,
    FairShareUsage,
    LearningTick,
    QuotaWindowStage,
    VictimsMature,
)
from gpupool.scheduler.cycle.order import EVERY_CALL, EVERY_CYCLE, in_order
from gpupool.scheduler.cycle.plan import PolicyPlan
from gpupool.scheduler.cycle.pool_choice import PoolChoice
from gpupool.scheduler.cycle.power_caps import PowerCaps
from gpupool.scheduler.cycle.ready_claims import ReadyClaims
from gpupool.scheduler.cycle.serving_clocks import ServingClocks
from gpupool.scheduler.cycle.sharing import UsageWindow
from gpupool.scheduler.cycle.wait_reasons import WaitReason, WaitReasons
from gpupool.scheduler.events import (
    Drain,
    Event,
    Finished,
    GpuDown,
    GpuTemps,
    GpuUp,
    GpuUsage,
    Hold,
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
from gpupool.scheduler.fleet import DOWN, STARTING, UP, Fleet
from gpupool.scheduler.jobs import WAITING, JobRecord, ServiceTemplate
from gpupool.scheduler.learners import Learners
from gpupool.scheduler.ordering import CoreLearning
from gpupool.scheduler.view import cycle_view
from gpupool.sizing.catalog import Catalog
from gpupool.sizing.planner import PlanRequest


def placement_policy(cfg: SchedulerConfig, models: Sequence[str]) -> ScoringPolicy:
    """The configured placement: consolidate (coolest-first when thermal-aware), best-fit
    or fgd (learning its typical tasks from the jobs submitted)."""
    name = cfg.placement.policy
    if cfg.energy.thermal.aware:
        if name != "consolidate":
            raise SpecError(
                f"thermal-aware placement is coolest-first; it replaces placement.policy "
                f"{name!r}: drop one of energy.thermal.aware and placement.policy"
            )
        return CoolestFirstPolicy(None)
    if name == "fgd":
        return LearnedFgdPolicy(models)
    if name == "best-fit":
        return BestFitPolicy()
    if name != "consolidate":
        raise SpecError(f"unknown placement.policy {name!r}; choose consolidate, best-fit or fgd")
    return ConsolidatePolicy()


class Scheduler:
    def __init__(
        self,
        cluster: Cluster,
        config: SchedulerConfig | None = None,
        *,
        node_pool: Sequence[str] | None = None,
        pool_price: Mapping[str, float] | None = None,
        topology: Topology | None = None,
        catalog: Catalog | None = None,
        tariffs: Mapping[str, Tariff | None] | None = None,
        cloud_nodes: Sequence[str] = (),
        services: Sequence[ServiceTemplate] = (),
        seed: int = 0,
        log: DecisionLog | None = None,
        replica_id: Callable[[str, int, int], str] | None = None,
        predictor: Predictor | None = None,
        colocation: PairAdmissionPolicy | None = None,
    ) -> None:
        """node_pool: each node's pool key (default: its GPU model, or site/model when the
        nodes are in several sites). tariffs: per site. cloud_nodes: nodes a Burst starts;
        they are out of the pool until they join (NodeUp). replica_id(service, seq,
        gpu_milli): the id of a new replica, given by the driver (the live service makes
        each replica a job row); default `<service>-r<seq>`. predictor: the learned
        policy's GPU-time predictor (default: scheduler.ordering.default_predictor).
        colocation: the admission a sharing job must also pass to join another's card
        (learning/colocation_admission.py; None: the hard rules alone, as before)."""
        cfg = config or SchedulerConfig()
        if cfg.policy not in cycle_names():
            raise SpecError(f"unknown policy {cfg.policy!r}; choose {', '.join(cycle_names())}")
        self.config = cfg
        self.cluster = cluster
        self.state = ClusterState(cluster)
        self.state.colocate = True
        self.state.share_cap = cfg.share_cap
        self.state.one_team_per_card = bool(cfg.sharing.one_team_per_card)
        self.state.set_topology(cfg.topology)
        self.colocation = colocation
        self.state.pair_admission = colocation
        self.rng = np.random.default_rng(seed)
        self.placement: ScoringPolicy = placement_policy(cfg, self.state.models)
        """Where a job goes inside its pool (`placement.policy`), for the cycle policy's
        plan and for a claimant whose victims left."""
        self.usage_window = UsageWindow(cfg.sharing)
        self.engine = Engine(self.state, self.placement, self.rng, log)
        policy = cycle_policy(cfg.policy)
        self.ordering: CoreLearning | None = None
        """The order of the ordered policies (las, gittins, learned); None for the others."""
        if isinstance(policy, OrderedPolicy):
            self.ordering = CoreLearning(
                cfg.learning, cfg.policy, policy.rule, policy.learned, predictor
            )
        elif cfg.learning.mode != "off":
            raise SpecError(
                f"learning.mode {cfg.learning.mode} runs the learned policy; set policy: "
                f"learned (with learning.rule: {cfg.learning.rule}) instead of policy: "
                f"{cfg.policy}"
            )
        self.fleet = fleet = Fleet(
            cluster, self.state, cfg, node_pool, pool_price, topology, catalog, tariffs
        )
        self.quotas = QuotaBook(cfg.teams, fleet.pool_gpus, cfg.windows)
        for template in services:
            fleet.online_seen(template.gpu_models)
        self.book = book = JobBook(
            cfg, self.engine, fleet, self.quotas, policy.queue_key, self.ordering
        )
        if cloud_nodes:
            fleet.add_cloud(cloud_nodes)
        self.published = Published()
        self.last_cycle_s: float | None = None
        self.cycle_due = False
        """A job that idle GPUs could hold arrived: the next call runs the stages
        (config.start_on_submit)."""

        # ---- the stages (their order is cycle/order.py's) ----------------------------------
        self.autoscale = ServiceAutoscale(cfg, book, services, self.submit_replica, replica_id)
        self.learners = Learners(book, self.ordering, self.autoscale, colocation)
        """Each learner's promotion and demotion (order, forecast, co-location)."""
        self.pool_choice = PoolChoice(
            cfg, book, fleet, self.quotas, self.engine, self.autoscale.services
        )
        self.wait_reasons = WaitReasons(cfg, book, fleet, self.ordering, self.published)
        self.plan = PolicyPlan(book, fleet, self.placement, self.rng, policy, self.ordering)
        self.quota_window = QuotaWindowStage(book, self.quotas)
        self.deferral = PriceDeferral(cfg, book, fleet) if cfg.energy.price_aware else None
        online_clocks = cfg.energy.online_clocks.enabled
        self.power_caps = (
            PowerCaps(cfg, book, fleet)
            if cfg.energy.power_capping or cfg.energy.thermal.aware or online_clocks
            else None
        )
        energy = cfg.energy
        rules = cfg.preemption
        built: list[Stage | None] = [
            ReadyClaims(book),
            FairShareUsage(book, self.quotas),
            LearningTick(book, self.ordering) if self.ordering is not None else None,
            VictimsMature(book) if rules.by_priority or rules.max_lost_work_s is not None else None,
            ExpireOverdue(book),
            EstimateProgress(book, self.pool_choice, energy.price_aware or energy.power_capping),
            self.quota_window,
            CloudBurst(book, fleet, self.engine, cfg.burst) if cloud_nodes else None,
            self.autoscale,
            self.pool_choice,
            ElasticLend(book, fleet, self.engine),
            self.deferral,
            self.plan,
            ElasticGrow(book, fleet),
            self.wait_reasons,
            ServingClocks(cfg, book, self.autoscale) if online_clocks else None,
            self.power_caps,
        ]
        stages: dict[type[Stage], Stage] = {type(s): s for s in built if s is not None}
        self.every_call = in_order(stages, EVERY_CALL)
        self.every_cycle = in_order(stages, EVERY_CYCLE)

    def judge_colocation(self, event: Progress) -> None:
        """The measured speeds of jobs sharing a card in pairs go to the admission's
        guard; a change of who decides goes to the decision log and replans."""
        assert self.colocation is not None
        state = self.state
        measured = []
        for ids in state.sharers.values():
            if len(ids) == 2 and ids[0] in event.jobs and ids[1] in event.jobs:
                a, b = state.jobs[ids[0]], state.jobs[ids[1]]
                measured.append(
                    MeasuredPair(a, b, event.jobs[ids[0]].speed, event.jobs[ids[1]].speed)
                )
        for change in self.colocation.observe(event.t_s, measured):
            self.engine.note("colocation", change.t_s, change.reason)
            self.book.dirty = True

    # ---- events -------------------------------------------------------------------------------
    def observe(self, event: Event) -> list[Command]:
        """Take one event; what it lets start right away (claimants of a vacated job)."""
        match event:
            case Submitted():
                self.submit(event.job, event.t_s, sized=event.sized)
            case Progress():
                book = self.book
                book.measured = True
                book.progress_s = event.t_s
                for job_id, p in event.jobs.items():
                    r = book.records[job_id]
                    r.done_s, r.saved_s, r.speed, r.overhead_s, r.cap_speed = p
                if self.colocation is not None:
                    self.judge_colocation(event)
            case Vacated():
                return self.book.vacated(event.job_id, event.t_s)
            case Resized():
                return self.book.resized(event.job_id, event.t_s)
            case Finished():
                return self.book.finished(event.job_id, event.t_s, event.state, event.reason)
            case Lost():
                return self.book.lost(event.job_id, event.t_s, event.reason)
            case GpuTemps():
                if self.power_caps is not None:
                    self.power_caps.observe(event)
                if isinstance(self.placement, CoolestFirstPolicy):
                    self.placement.temps_c = event.temps_c
            case GpuUsage():
                if self.usage_window.observe(self.state, event):
                    self.book.dirty = True
            case ServiceDemand():
                self.autoscale.observe_demand(event)
            case ServiceLoad():
                self.autoscale.observe_load(event)
            case ServiceRate():
                self.autoscale.observe_rate(event)
            case NodeDown():
                self.node_down(event.node, event.t_s, event.reason)
            case NodeUp():
                self.node_up(event.node, event.t_s)
            case GpuDown():
                self.gpu_down(event.node, event.gpu, event.t_s, event.reason)
            case GpuUp():
                self.gpu_up(event.node, event.gpu, event.t_s)
            case Hold():
                self.book.hold(event.job_id, event.t_s)
            case Release():
                self.book.release(event.job_id, event.t_s)
            case Requeue():
                return self.book.requeue(event.job_id, event.t_s, event.reason)
            case Drain():
                self.drain(event.node, event.t_s, event.undo)
            case _:
                assert_never(event)
        return []

    def submit(
        self,
        job: JobSpec,
        now: float,
        service: str | None = None,
        sized: PlanRequest | None = None,
    ) -> JobRecord:
        book, fleet = self.book, self.fleet
        if job.job_id in book.records:
            raise SpecError(f"job {job.job_id} was submitted already")
        if sized is not None:
            book.sized[job.job_id] = sized
        r = JobRecord(job, "", ready_s=job.submit_s if service is None else now, service=service)
        book.add(r, service)
        book.dirty = True
        if self.config.start_on_submit and not self.cycle_due and self.idle_could_hold(job):
            self.cycle_due = True
        r.options = self.pool_choice.options_for(job)
        if job.kind is JobKind.ONLINE:
            fleet.online_seen(job.gpu_models)
        option, why = self.pool_choice.at_submit(r, now)
        room = 0
        if option is not None:
            self.pool_choice.retarget(r, option)
            room = fleet.pool_gpus[option.pool]
            if fleet.team_nodes is not None:
                island = fleet.team_nodes[job.team] & fleet.pool_nodes[option.pool]
                room = int(self.state.gpu_count[island].sum())
        if option is None or r.spec.gpu_count > room:
            why = (
                f"needs {r.spec.gpu_count} GPUs, at most {room} usable"
                if option is not None
                else why or self.unplaceable_reason(job, r)
            )
            r.state = check_transition(job.job_id, r.state, JobState.UNPLACEABLE)
            r.end_s, r.end_reason = now, why
            self.engine.note(job.job_id, now, "unplaceable")
            del book.active[job.job_id]
            if service is not None:
                book.replicas[service].pop(job.job_id, None)
            return r
        book.queues.add(r)
        book.elastic.track(r.spec)
        if len(r.options) > 1:
            self.pool_choice.choosers[job.job_id] = r
        if isinstance(self.placement, LearnedFgdPolicy):
            self.placement.observe(r.spec)
        book.learn_submitted(r)
        return r

    def submit_replica(self, job: JobSpec, now: float, service: str) -> JobRecord:
        return self.submit(job, now, service=service)

    def unplaceable_reason(self, job: JobSpec, r: JobRecord) -> str:
        fleet = self.fleet
        if job.job_id in self.book.sized:
            return "its model fits no GPU type of this cluster within the GPU counts tried"
        if not r.options and job.gpu_mem_mib is not None:
            cards = {m: fleet.card_mem_mib(m) for m in set(fleet.pool_model.values())}
            known = {m: c for m, c in cards.items() if c is not None and job.allows_model(m)}
            if known:
                big = max(known, key=lambda m: (known[m], m))
                return (
                    f"asks for {job.gpu_mem_mib} MiB of one GPU; the largest card here is "
                    f"{big} with {known[big]} MiB"
                )
            return "asks for GPU memory, and no card it allows has a known memory size"
        if not r.options:
            fits = [n for k, n in fleet.pool_gpus.items() if job.allows_model(fleet.pool_model[k])]
            if fits:
                return f"needs {job.gpu_count} GPUs, at most {max(fits)} usable"
            have = ", ".join(sorted(set(fleet.pool_model.values())))
            return f"allows {sorted(job.gpu_models)}; no such pool (this cluster has {have})"
        return "no site meets its latency bound"

    def restore(
        self,
        job: JobSpec,
        state: JobState,
        placement: Placement | None,
        now: float,
        preemptions: int = 0,
        attempts: int = 0,
        service: str | None = None,
    ) -> None:
        """Rebuild a job after a restart, in the state the database holds (a service's
        replica joins its service again: adopted, not started twice)."""
        book, fleet = self.book, self.fleet
        book.timed = book.timed or job.time_limit_s is not None
        if service is not None:
            self.autoscale.known(service)
        r = JobRecord(
            job, "", ready_s=now, preemptions=preemptions, attempts=attempts, service=service
        )
        r.options = self.pool_choice.options_for(job)
        if job.kind is JobKind.ONLINE and state not in TERMINAL:
            fleet.online_seen(job.gpu_models)
        if placement is not None and placement.nodes:
            r.gpu_type = fleet.node_pool[placement.nodes[0]]
        elif r.options:
            r.gpu_type = r.options[0].pool
        else:
            raise SpecError(
                f"job {job.job_id} asks for {sorted(job.gpu_models)}; this cluster has "
                f"{', '.join(sorted(set(fleet.pool_model.values())))}"
            )
        milli = fleet.share_milli(job, fleet.pool_model[r.gpu_type])
        if milli is not None and milli != job.gpu_milli:  # a share given by GPU memory
            job = r.spec = replace(job, gpu_milli=milli)
        if job.elastic and placement is not None and state not in TERMINAL:
            job = r.spec = book.elastic.restored(job, placement.gpu_count)
        if placement is not None and any(s.gpu_milli != job.gpu_milli for s in placement.shares):
            placement = Placement(
                tuple(replace(s, gpu_milli=job.gpu_milli) for s in placement.shares)
            )
        if attempts:
            r.first_start_s = now
        book.add(r, service if state not in TERMINAL else None)
        if state in (JobState.RUNNING, JobState.PREEMPTING) and placement is not None:
            self.state.validate(job, placement)
            self.engine.apply(job, placement, now, "restore")
            r.state = state
            r.run_started_s = now
            book.running[job.job_id] = r
            if state is JobState.RUNNING:
                book.held[(job.team, r.gpu_type)] += job.gpu_count
            else:
                book.vacating.add(job.job_id)
        elif state in WAITING:
            r.state = state
            book.queues.add(r)
        else:
            r.state = state
            del book.active[job.job_id]
        if state not in TERMINAL:
            book.learn_submitted(r)
        book.dirty = True

    def recover_resize(self, job_id: str, placement: Placement, now: float) -> None:
        """A resize in flight when the driver restarted: carry on with it."""
        self.book.recover_resize(job_id, placement, now)

    def restored_run_start(self, job_id: str, started_s: float) -> None:
        """When a restored running job's run really started (its time limit counts from
        there), as the driver recorded it."""
        self.book.record(job_id).run_started_s = started_s

    def restored_expiry(self, job_id: str, why: str) -> None:
        """A restored job was being stopped for its time limit: it ends as failed (why)."""
        self.book.expiring[job_id] = why

    def users_used_before(self, used: Sequence[tuple[str, str, float, float]]) -> None:
        """Fair share inside a team after a restart: (team, user, GPU-seconds, ended at) of
        the runs that ended before it, charged as when they ended."""
        for team, user, gpu_s, at in used:
            self.book.shares.charge((team, user), gpu_s, at)

    def online_seen_before(self, gpu_models: frozenset[str]) -> None:
        """Online inference was submitted for these models (all when empty) before a
        restart: the online reserve that holds once online work was seen holds again."""
        self.fleet.online_seen(gpu_models)

    # ---- services -----------------------------------------------------------------------------
    def add_service(self, template: ServiceTemplate) -> None:
        """A new service, or new settings for one (its replicas stay; the next cycle scales
        them to the new bounds)."""
        self.autoscale.add(template)
        self.fleet.online_seen(template.gpu_models)
        self.book.dirty = True

    def restore_service(self, name: str, replicas_made: int) -> None:
        """After a restart: how many replicas the service made so far (new ids follow)."""
        self.autoscale.restore(name, replicas_made)

    def remove_service(
        self, name: str, now: float, reason: str = "service deleted"
    ) -> list[Command]:
        """The service is gone: its waiting replicas end, its running ones are cancelled
        (the driver stops them with their grace)."""
        return self.autoscale.remove(name, now, reason)

    # ---- what drivers report ------------------------------------------------------------------
    def finished(self, job_id: str, at: float, state: JobState, reason: str = "") -> list[Command]:
        """The job ended by itself (or was cancelled): its GPUs are free."""
        return self.book.finished(job_id, at, state, reason)

    def vacated(self, job_id: str, at: float) -> list[Command]:
        return self.book.vacated(job_id, at)

    def lost(self, job_id: str, at: float, reason: str) -> list[Command]:
        return self.book.lost(job_id, at, reason)

    def node_down(self, node: str, now: float, reason: str = "") -> list[str]:
        """A node died or turned unhealthy: nothing more goes there. Returns the jobs that
        ran on it (the driver stops them and reports each with Lost)."""
        fleet = self.fleet
        k = fleet.node(node)
        fleet.down_why[k] = reason or f"node {node} is down"
        cloud = fleet.is_cloud(k)
        was = DOWN
        if cloud:
            was = fleet.cloud_status[k]
            fleet.cloud_status[k] = DOWN  # it left, or never joined
        else:
            fleet.healthy[k] = False
        for mask in fleet.pool_nodes.values():
            mask[k] = False
        if not cloud or was == UP:
            self.engine.note(f"node:{node}", now, "node-lost")
        self.book.dirty = True
        records = self.book.records
        return sorted(
            job_id
            for job_id, p in self.state.placements.items()
            if k in p.nodes and records[job_id].state is JobState.RUNNING
        )

    def node_up(self, node: str, now: float) -> None:
        """A lost node is healthy again, or a started cloud node joined: it takes work."""
        fleet = self.fleet
        k = fleet.node(node)
        fleet.down_why.pop(k, None)
        if fleet.is_cloud(k):
            if fleet.cloud_status[k] == STARTING:
                fleet.cloud_status[k] = UP
                fleet.set_in_pool(k, True)
            if k in fleet.drained:
                fleet.set_in_pool(k, False)
            return
        if fleet.healthy[k]:
            return
        fleet.healthy[k] = True
        fleet.set_in_pool(k, k not in fleet.drained)
        self.engine.note(f"node:{node}", now, "node-restored")
        self.book.dirty = True

    def gpu_down(self, node: str, gpu: int, now: float, reason: str = "") -> list[str]:
        """GPU `gpu` (its index within the node) failed: nothing new goes to it; the node's
        other GPUs work on. Returns the running jobs that use it (the driver stops them and
        reports each with Lost)."""
        fleet = self.fleet
        k = fleet.node(node)
        fleet.gpu_down_why[(k, gpu)] = reason or f"GPU {gpu} of node {node} is down"
        if self.state.set_gpu_out(k, gpu, True):
            self.engine.note(f"gpu:{node}/{gpu}", now, "gpu-lost")
            self.book.dirty = True
        records = self.book.records
        return sorted(
            job_id
            for job_id, p in self.state.placements.items()
            if any(s.node == k and gpu in s.gpus for s in p.shares)
            and records[job_id].state is JobState.RUNNING
        )

    def gpu_up(self, node: str, gpu: int, now: float) -> None:
        """A GPU that was down is healthy again: it takes work."""
        fleet = self.fleet
        k = fleet.node(node)
        fleet.gpu_down_why.pop((k, gpu), None)
        if self.state.set_gpu_out(k, gpu, False):
            self.engine.note(f"gpu:{node}/{gpu}", now, "gpu-restored")
            self.book.dirty = True

    def hold(self, job_id: str, now: float) -> None:
        self.book.hold(job_id, now)

    def release(self, job_id: str, now: float) -> None:
        self.book.release(job_id, now)

    def requeue(
        self, job_id: str, now: float, reason: str = "requeued on request"
    ) -> list[Command]:
        return self.book.requeue(job_id, now, reason)

    def drain(self, node: str, now: float, undo: bool = False) -> None:
        """No new job goes to the node (running ones run on); undo: it takes work again
        (when it is up: a node that is down returns with NodeUp)."""
        fleet = self.fleet
        k = fleet.node(node)
        if undo:
            if k not in fleet.drained:
                return
            fleet.drained.discard(k)
            if fleet.is_up(k):
                fleet.set_in_pool(k, True)
            self.engine.note(f"node:{node}", now, "undrain")
        else:
            if k in fleet.drained:
                return
            fleet.drained.add(k)
            fleet.set_in_pool(k, False)
            self.engine.note(f"node:{node}", now, "drain")
        self.book.dirty = True

    def forget(self, job_id: str) -> None:
        """Drop an ended job's record (its driver deleted the job)."""
        self.book.forget(job_id)

    # ---- the cycle ----------------------------------------------------------------------------
    def cycle(self, now: float) -> list[Command]:
        """One scheduling cycle: every stage, in the order of cycle/order.py, and the
        commands they decided.

        Claimants whose victims ended start at any call; the stages run when `cycle_s` has
        passed since they last ran, or again at that same instant (several events at one
        time), never in between: a driver may call after every event and the same events
        still give the same decisions."""
        last = self.last_cycle_s
        ctx = CycleContext(now, last, [], self.published)
        for stage in self.every_call:
            ctx.out.extend(stage.run(ctx))
        between = last is not None and last < now < last + self.config.cycle_s - 1e-9
        if between and not self.cycle_due:
            return ctx.out  # the stages run once per cycle_s (again at the same instant)
        self.cycle_due = False
        self.last_cycle_s = now
        for stage in self.every_cycle:
            ctx.out.extend(stage.run(ctx))
        return ctx.out

    # ---- learning -----------------------------------------------------------------------------
    def set_learning_mode(self, mode: str, t_s: float, reason: str) -> LearnGuard:
        """Promote the learned order to active or demote it to shadow (the live
        `gpupool learn promote` and its automatic demotion); the next cycle plans anew."""
        return self.learners.set_mode("order", mode, t_s, reason)

    def learning_status(self) -> dict[str, object] | None:
        """The ordered policy's state (data seen, accuracy, guard, model, mode, shadow
        agreement); None when the policy is not las, gittins or learned."""
        return None if self.ordering is None else self.ordering.status()

    def demand_status(self) -> dict[str, DemandStatus]:
        """Each service's demand forecaster (`autoscale.demand: forecast`): history, accuracy
        against the simple opponents, guard state; empty under the other demand rules."""
        return self.autoscale.forecast_status()

    def learning_seed(self, outcomes: Sequence[Outcome]) -> int:
        """Preload finished jobs into the learned policy's history (a restarted service
        reads them from its database); returns how many were taken. Call before the
        first submit or restore."""
        if self.ordering is None:
            return 0
        taken = self.ordering.seed(outcomes)
        self.book.dirty = self.book.dirty or bool(taken)
        return taken

    # ---- queries for drivers ------------------------------------------------------------------
    @property
    def records(self) -> Mapping[str, JobRecord]:
        """Every job the core knows, by id (read only)."""
        return self.book.records

    @property
    def running(self) -> Mapping[str, JobRecord]:
        """Jobs holding GPUs: running, or preempted and still writing their checkpoint."""
        return self.book.running

    @property
    def reservations(self) -> Mapping[str, Reservation]:
        """The GPUs the last plan kept for waiting jobs, by job (config.reservations)."""
        return self.book.reservations

    @property
    def replicas(self) -> Mapping[str, Mapping[str, JobRecord]]:
        """Each service's replicas that have not ended."""
        return self.book.replicas

    @property
    def services(self) -> Mapping[str, ServiceTemplate]:
        return self.autoscale.services

    def service_backoff(self, name: str) -> Backoff | None:
        """Whether a service is backing off after replicas that failed in a row (the value
        is replaced whole: a reader needs no lock)."""
        return self.autoscale.backoff.get(name)

    @property
    def policy(self) -> CyclePolicy:
        """The cycle policy (its name: `config.policy`)."""
        return self.plan.policy

    @property
    def log(self) -> DecisionLog:
        return self.engine.log

    def job(self, job_id: str) -> JobRecord:
        """One job's record; NotFoundError when the core does not know it."""
        return self.book.record(job_id)

    def speed_of(self, r: JobRecord, cap_speed: float | None = None) -> float:
        """Work per second: the power cap's slowdown times co-location's on shared GPUs."""
        return self.book.speed_of(r, cap_speed)

    def time_limit_s(self, spec: JobSpec) -> float | None:
        """The job's own limit, else its kind's default (None: unlimited)."""
        return self.book.time_limit_s(spec)

    def usage(self, team: str, pool: str) -> int:
        return self.book.usage(team, pool)

    def pool_loads(self) -> dict[str, PoolLoad]:
        """Free GPUs and drain time of every pool."""
        return self.pool_choice.loads()

    def options(self, job: JobSpec) -> tuple[PoolOption, ...]:
        return self.pool_choice.options_for(job)

    def visible(self, now: float, rank: Mapping[str, int] | None = None) -> list[JobRecord]:
        """The waiting jobs a cycle's plan considers now."""
        return self.book.visible(now, self.published.deferred, rank)

    def view(self, now: float, rank: Mapping[str, int] | None = None) -> CycleView:
        """What the cycle policy would plan from now (the plan stage builds the same)."""
        return cycle_view(
            self.book, self.fleet, self.placement, self.rng, now, self.published.deferred, rank
        )

    def working(self) -> Iterator[tuple[JobRecord, Placement]]:
        """Running jobs (not those writing their checkpoint) with where they run."""
        return self.book.working()

    def explain_waits(self, now: float) -> dict[str, WaitReason]:
        """The reason of every waiting job, held ones included (reports and tests)."""
        return self.wait_reasons.explain_all(now)

    def room_inlet_c(self) -> np.ndarray:
        """Each node's inlet air as configured (a hot aisle's last nodes hotter)."""
        return self.fleet.room_inlet_c(self.config.energy.thermal, self.state.node_count)

    def idle_could_hold(self, job: JobSpec) -> bool:
        """Whether the fleet's idle GPUs (whole, or with room for a share) could hold the
        job: a cheap test of whether an early cycle may start it, not a placement."""
        if job.gpu_count == 0:
            return True
        if job.gpu_milli >= MILLI_PER_GPU:
            return int(self.state.whole_free.sum()) >= job.gpu_count
        return int((self.state.gpu_left >= job.gpu_milli).sum()) >= job.gpu_count

    def claim_eta_s(self, job_id: str) -> float | None:
        """When a job waiting for its victims should start (None: it waits for none)."""
        return self.book.claim_eta_s(job_id)

    def waiting(self) -> int:
        return len(self.book.queues)

    def placements(self) -> Mapping[str, Placement]:
        return self.state.placements

    def pool_of_node(self, k: int) -> str:
        return self.fleet.node_pool[k]

    def deferred_until(self, job_id: str) -> float | None:
        return None if self.deferral is None else self.deferral.deferred_until(job_id)

    def draining(self, node: str) -> str | None:
        """None (takes work), `draining` (jobs still run there) or `drained` (empty)."""
        k = self.fleet.node(node)
        if k not in self.fleet.drained:
            return None
        busy = any(k in p.nodes for p in self.state.placements.values())
        return "draining" if busy else "drained"

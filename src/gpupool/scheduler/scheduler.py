"""The decision core: the only code in gpupool that decides.

It is fed events with their times (a job submitted, finished, vacated, lost; a node down
or up; measured progress; GPU temperatures; service demand) and returns commands
(Launch, Stop, Cancel, SetPowerCap, Burst, Reclaim, Defer). It never reads a clock, a
process or a database. The scenario simulator's world and the live service feed it the
same way, so the same events give the same decisions (tests/test_parity_all.py).

The order of a cycle's stages lives in `cycle()` alone: fair-share usage of the last
interval, quota window, cloud burst, service replicas, pool choice, price deferral, the
cycle policy's plan (validated and applied), power caps.
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace

import numpy as np

from gpupool.domain.engine import DecisionLog, Engine
from gpupool.domain.lifecycle import TERMINAL, JobState, check_transition
from gpupool.domain.model import MILLI_PER_GPU, Cluster, JobKind, JobSpec, Node, Placement
from gpupool.domain.quota import QuotaBook, QuotaWindow
from gpupool.domain.state import BoolArray, ClusterState
from gpupool.energy.powercap import SetPowerCap
from gpupool.energy.tariff import Tariff
from gpupool.errors import ConflictError, NotFoundError, PlanRejected, SpecError
from gpupool.federation.topology import Topology
from gpupool.learning.history import JobFacts, Outcome
from gpupool.learning.predictor import Predictor
from gpupool.policies.contract import Claim, CycleView, PendingView, Preempt, Start, cycle_policy
from gpupool.policies.cycle.ordered import OrderedPolicy
from gpupool.policies.placement.base import ScoringPolicy
from gpupool.policies.placement.best_fit import BestFitPolicy
from gpupool.policies.placement.consolidate import ConsolidatePolicy
from gpupool.policies.placement.coolest_first import CoolestFirstPolicy
from gpupool.policies.placement.fgd import LearnedFgdPolicy
from gpupool.policies.pool_choice import (
    ClassRanking,
    PoolLoad,
    PoolOption,
    class_rankings,
    plan_text,
    pool_loads,
)
from gpupool.policies.registry import cycle_names
from gpupool.scheduler import running_view, stages, waiting
from gpupool.scheduler.commands import (
    Cancel,
    Command,
    Expire,
    Launch,
    LearnGuard,
    Scale,
    Stop,
    Wait,
)
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.elastic import Elastic
from gpupool.scheduler.events import (
    Drain,
    Event,
    Finished,
    GpuTemps,
    GpuUsage,
    Hold,
    Lost,
    NodeDown,
    Progress,
    Release,
    Requeue,
    Resized,
    ServiceDemand,
    ServiceLoad,
    Submitted,
    Vacated,
)
from gpupool.scheduler.jobs import WAITING, JobRecord, ServiceTemplate, TeamQueues
from gpupool.scheduler.ordering import CoreLearning
from gpupool.scheduler.running_view import RunningViews
from gpupool.sizing.catalog import Catalog
from gpupool.sizing.planner import PlanRequest, sized_options


def duration_text(seconds: float) -> str:
    """4h, 90m, 1h30m, 45s: how a time limit reads in a reason."""
    total = round(seconds)
    h, rest = divmod(total, 3600)
    m, sec = divmod(rest, 60)
    parts = [f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (sec, "s")) if v]
    return "".join(parts) or f"{seconds:g}s"


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


def pool_key(node: Node, multi_site: bool) -> str:
    """A pool is the nodes of one GPU model (of one site, when there are several)."""
    return f"{node.cluster}/{node.gpu_model}" if multi_site else node.gpu_model


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
    ) -> None:
        """node_pool: each node's pool key (default: its GPU model, or site/model when the
        nodes are in several sites). tariffs: per site. cloud_nodes: nodes a Burst starts;
        they are out of the pool until they join (NodeUp). replica_id(service, seq,
        gpu_milli): the id of a new replica, given by the driver (the live service makes
        each replica a job row); default `<service>-r<seq>`. predictor: the learned
        policy's GPU-time predictor (default: scheduler.learning.default_predictor)."""
        cfg = config or SchedulerConfig()
        if cfg.policy not in cycle_names():
            raise SpecError(f"unknown policy {cfg.policy!r}; choose {', '.join(cycle_names())}")
        self.config = cfg
        self.cluster = cluster
        self.state = ClusterState(cluster)
        self.state.colocate = True
        self.state.share_cap = cfg.share_cap
        self.state.one_team_per_card = bool(cfg.sharing.one_team_per_card)
        self.rng = np.random.default_rng(seed)
        self.thermal_aware = cfg.energy.thermal.aware
        self.placement: ScoringPolicy = placement_policy(cfg, self.state.models)
        """Where a job goes inside its pool (`placement.policy`), for the cycle policy's
        plan and for a claimant whose victims left."""
        self.gpu_usage = stages.UsageWindow(cfg.sharing)
        self.engine = Engine(self.state, self.placement, self.rng, log)
        self.policy = cycle_policy(cfg.policy)
        self.learning: CoreLearning | None = None
        """The order of the ordered policies (las, gittins, learned); None for the others."""
        if isinstance(self.policy, OrderedPolicy):
            self.learning = CoreLearning(
                cfg.learning, cfg.policy, self.policy.rule, self.policy.learned, predictor
            )
        elif cfg.learning.mode != "off":
            raise SpecError(
                f"learning.mode {cfg.learning.mode} runs the learned policy; set policy: "
                f"learned (with learning.rule: {cfg.learning.rule}) instead of policy: "
                f"{cfg.policy}"
            )
        self.progress_s = 0.0
        """When the driver last measured progress (Progress)."""
        self.rank: dict[str, int] | None = None
        """The order in use at the ordered policy's last plan (waiting jobs' reasons)."""
        multi_site = len({n.cluster for n in cluster.nodes}) > 1
        self.node_pool = (
            list(node_pool)
            if node_pool is not None
            else [pool_key(n, multi_site) for n in cluster.nodes]
        )
        if len(self.node_pool) != len(cluster.nodes):
            raise SpecError("node_pool must name one pool per node")
        order = list(dict.fromkeys(self.node_pool))
        self.pool_nodes: dict[str, BoolArray] = {
            key: np.array([k == key for k in self.node_pool], dtype=np.bool_) for key in order
        }
        self.pool_model = {
            k: n.gpu_model for k, n in zip(self.node_pool, cluster.nodes, strict=True)
        }
        self.pool_site = {k: n.cluster for k, n in zip(self.node_pool, cluster.nodes, strict=True)}
        self.pool_gpus = {
            key: int(self.state.gpu_count[mask].sum()) for key, mask in self.pool_nodes.items()
        }
        self.pool_price = dict(pool_price or {})
        self.type_rankings: dict[JobKind, ClassRanking] = class_rankings(
            list(self.pool_model.values()), catalog, cfg.placement.prefer
        )
        """Each job kind's GPU types, most preferred first (placement.gpu_type by-class)."""
        self.type_why: dict[str, str] = {}
        """Why a job that had a choice of GPU type (or named one) got its type: the
        launch carries it to the driver (`gpupool show`)."""
        self.node_index = {n.name: i for i, n in enumerate(cluster.nodes)}
        self.quotas = QuotaBook(cfg.teams, self.pool_gpus, cfg.windows)
        self.team_nodes = self._islands() if cfg.mode == "static" else None
        self.reserve = {t: math.ceil(cfg.online_reserve * n) for t, n in self.pool_gpus.items()}
        """The online reserve of each pool, in GPUs, once it applies there (online_pools)."""
        self.online_pools: set[str] = set()
        """Pools where online inference may run: the reserve applies in them when the
        config says `online_reserve_on: online-seen` (else in every pool from the start)."""
        for template in services:
            self._online_seen(template.gpu_models)
        self.topology = topology
        self.catalog = catalog
        self.tariffs: dict[str, Tariff | None] = dict(tariffs or {})
        self.node_site = tuple(n.cluster for n in cluster.nodes)
        self.tdp_w = np.array(
            [
                catalog[n.gpu_model].tdp_w
                if catalog is not None and n.gpu_model in catalog
                else 0.0
                for n in cluster.nodes
            ]
        )
        self.services = {s.name: s for s in services}
        self.demand: dict[str, float] = {}
        self.load: dict[str, ServiceLoad] = {}
        """Each service's last measured load (ServiceLoad): what the SLO rule reads."""
        self.below_since: dict[str, float] = {}
        """Since when each service's demand has been below its replicas (scale-down waits)."""
        self.slo_floor: dict[str, tuple[int, float]] = {}
        """Replicas the SLO rule added, and the rate that needed them: held until it falls."""
        self.scaled_at: dict[str, float] = {}
        """When each service's replica count last changed (the SLO rule waits a window)."""
        self.replica_seq: dict[str, int] = defaultdict(int)
        self.replica_id = replica_id
        self.records: dict[str, JobRecord] = {}
        self.active: dict[str, JobRecord] = {}
        """Records not in a terminal state."""
        self.running: dict[str, JobRecord] = {}
        """Records holding GPUs: running, or preempted and still writing their checkpoint."""
        self.replicas: dict[str, dict[str, JobRecord]] = defaultdict(dict)
        self.queues = TeamQueues(self.policy.queue_key)
        self.held: dict[tuple[str, str], int] = defaultdict(int)
        """GPUs each (team, pool) holds in running jobs; vacating ones excluded."""
        self.vacating: set[str] = set()
        """Running jobs writing their checkpoint before they leave (PREEMPTING)."""
        self.sized: dict[str, PlanRequest] = {}
        self.choosers: dict[str, JobRecord] = {}
        """Never-started jobs with more than one pool: each cycle points them at the best."""
        self.claims: dict[str, set[str]] = {}
        self.claim_grace: dict[str, float] = {}
        self.claim_nodes: dict[str, tuple[int, ...]] = {}
        self.room_since: dict[tuple[str, str], float] = {}
        """When each (team, pool) last got room under its guarantee (a job left)."""
        self.window_since = 0.0
        """When the current quota window began: new guarantees make room too."""
        self._window: QuotaWindow | str | None = "unset"
        self.dirty = True
        """Something the policy looks at changed since its last (empty) plan. Planning is
        pure, so an unchanged view gives the same empty plan: skip it."""
        self.ready_claims: list[str] = []
        """Claimants whose victims ended by themselves: the next cycle starts them first."""
        self.healthy = np.ones(len(cluster.nodes), dtype=np.bool_)
        self.measured = False
        """A driver reports progress (Progress); else the core estimates it."""
        self.last_cycle_s: float | None = None
        self.cycle_due = False
        """A job that idle GPUs could hold arrived: the next call runs the stages
        (config.start_on_submit)."""
        self.rejected_remote: set[str] = set()
        self.deferral = stages.Deferral()
        self.caps: dict[tuple[int, int], SetPowerCap] = {}
        """The power command each card carries out now (absent: the card's defaults)."""
        self.temps_c: np.ndarray | None = None
        self.inlet_c: np.ndarray | None = None
        self.cloud = stages.Cloud.of(self, cloud_nodes) if cloud_nodes else None
        self.on_hold: set[str] = set()
        """Jobs that start only once released (held while waiting, or once requeued)."""
        self.drained: set[int] = set()
        """Nodes that take no new job; their running jobs run on."""
        self.expiring: dict[str, str] = {}
        """Jobs stopped for running past their time limit: why, until the driver's Finished."""
        self.told_wait: dict[str, tuple[str, str, float]] = {}
        """The reason each waiting job was last given (Wait): code, sentence, when."""
        self.waits_due = True
        """Something changed since the waiting jobs' reasons were last worked out."""
        self.down_why: dict[int, str] = {}
        """Why each node that is down went down (shown in waiting jobs' reasons)."""
        self.wait_front: set[str] = set()
        """The jobs at the front of their queues when reasons were last worked out."""
        self.over_limit = False
        """The last plan started more of a team than its limits allow (the rest dropped)."""
        self.timed = bool(cfg.time_limit_s)
        """Some job may have a time limit (a kind's default, or its own)."""
        self.elastic = Elastic(cfg.elastic)
        """Elastic jobs: lent to online work and grown back (scheduler/elastic.py)."""

    def _islands(self) -> dict[str, BoolArray]:
        """Static partitions: each team owns whole nodes covering its guarantee."""
        nodes = self.cluster.nodes
        owned = {t.team: np.zeros(len(nodes), dtype=np.bool_) for t in self.config.teams}
        for key, mask in self.pool_nodes.items():
            idx = np.flatnonzero(mask).tolist()
            per_node = nodes[idx[0]].gpu_count
            cursor = 0
            for team in self.config.teams:
                gpus = team.guaranteed.get(key, 0)
                if gpus % per_node:
                    raise SpecError(
                        f"static mode gives teams whole nodes; team {team.team}'s guarantee "
                        f"of {gpus} {self.pool_model[key]} is not a multiple of {per_node}"
                    )
                count = gpus // per_node
                owned[team.team][idx[cursor : cursor + count]] = True
                cursor += count
        return owned

    # ---- events -------------------------------------------------------------------------------
    def observe(self, event: Event) -> list[Command]:
        """Take one event; what it lets start right away (claimants of a vacated job)."""
        if isinstance(event, Submitted):
            self.submit(event.job, event.t_s, sized=event.sized)
        elif isinstance(event, Progress):
            self.measured = True
            self.progress_s = event.t_s
            for job_id, p in event.jobs.items():
                r = self.records[job_id]
                r.done_s, r.saved_s, r.speed, r.overhead_s, r.cap_speed = p
        elif isinstance(event, Vacated):
            return self.vacated(event.job_id, event.t_s)
        elif isinstance(event, Resized):
            return self.elastic.resized(self, event.job_id, event.t_s)
        elif isinstance(event, Finished):
            return self.finished(event.job_id, event.t_s, event.state, event.reason)
        elif isinstance(event, Lost):
            return self.lost(event.job_id, event.t_s, event.reason)
        elif isinstance(event, GpuTemps):
            self.temps_c, self.inlet_c = event.temps_c, event.inlet_c
            if isinstance(self.placement, CoolestFirstPolicy):
                self.placement.temps_c = event.temps_c
        elif isinstance(event, GpuUsage):
            if self.gpu_usage.observe(self.state, event):
                self.dirty = True
        elif isinstance(event, ServiceDemand):
            if event.service not in self.services:
                raise NotFoundError(f"service {event.service} is not known to the scheduler")
            self.demand[event.service] = event.peak_rps
        elif isinstance(event, ServiceLoad):
            if event.service not in self.services:
                raise NotFoundError(f"service {event.service} is not known to the scheduler")
            self.load[event.service] = event
        elif isinstance(event, NodeDown):
            self.node_down(event.node, event.t_s, event.reason)
        elif isinstance(event, Hold):
            self.hold(event.job_id, event.t_s)
        elif isinstance(event, Release):
            self.release(event.job_id, event.t_s)
        elif isinstance(event, Requeue):
            return self.requeue(event.job_id, event.t_s, event.reason)
        elif isinstance(event, Drain):
            self.drain(event.node, event.t_s, event.undo)
        else:
            self.node_up(event.node, event.t_s)
        return []

    def submit(
        self,
        job: JobSpec,
        now: float,
        service: str | None = None,
        sized: PlanRequest | None = None,
    ) -> JobRecord:
        if job.job_id in self.records:
            raise SpecError(f"job {job.job_id} was submitted already")
        self.timed = self.timed or job.time_limit_s is not None
        if sized is not None:
            self.sized[job.job_id] = sized
        r = JobRecord(job, "", ready_s=job.submit_s if service is None else now, service=service)
        self.records[job.job_id] = r
        self.active[job.job_id] = r
        self.dirty = True
        if self.config.start_on_submit and not self.cycle_due and self._idle_could_hold(job):
            self.cycle_due = True
        if service is not None:
            self.replicas[service][job.job_id] = r
        r.options = stages.options_for(self, job)
        if job.kind is JobKind.ONLINE:
            self._online_seen(job.gpu_models)
        option = None
        why = ""
        if r.options:
            if len(r.options) > 1:
                option, why = stages.choose(self, r, self.pool_loads(), now)
                if option is not None:
                    self.engine.note(job.job_id, now, f"pool {option.pool}: {why}")
                    self.type_why[job.job_id] = why
            else:
                option = r.options[0]
                if job.gpu_models:
                    self.type_why[job.job_id] = (
                        f"GPU type {option.gpu_type}: pinned by the job (gpu_model)"
                    )
        room = 0
        if option is not None:
            stages.retarget(self, r, option)
            room = self.pool_gpus[option.pool]
            if self.team_nodes is not None:
                island = self.team_nodes[job.team] & self.pool_nodes[option.pool]
                room = int(self.state.gpu_count[island].sum())
        if option is None or r.spec.gpu_count > room:
            why = (
                f"needs {r.spec.gpu_count} GPUs, at most {room} usable"
                if option is not None
                else why or self._unplaceable_reason(job, r)
            )
            r.state = check_transition(job.job_id, r.state, JobState.UNPLACEABLE)
            r.end_s, r.end_reason = now, why
            self.engine.note(job.job_id, now, "unplaceable")
            del self.active[job.job_id]
            if service is not None:
                self.replicas[service].pop(job.job_id, None)
            return r
        self.queues.add(r)
        self.elastic.track(r.spec)
        if len(r.options) > 1:
            self.choosers[job.job_id] = r
        if isinstance(self.placement, LearnedFgdPolicy):
            self.placement.observe(r.spec)
        self._learn_submitted(r)
        return r

    def _learn_submitted(self, r: JobRecord) -> None:
        """Batch and training jobs are what the ordered policies order and learn from
        (online inference goes first anyway, and a replica never finishes by itself)."""
        if self.learning is None or r.service is not None or r.spec.kind is JobKind.ONLINE:
            return
        job = r.spec
        model = self.pool_model.get(r.gpu_type, r.gpu_type)
        self.learning.submitted(
            JobFacts(job.job_id, job.submit_s, job.gpu_count, job.team, model, job.name)
        )

    def _work_at(self, r: JobRecord, at: float) -> float:
        """Work a job has done by `at` (seconds at full speed): from the driver's last
        measurement, or from its last start."""
        if r.state is not JobState.RUNNING:
            return r.done_s
        if self.measured and self.progress_s >= r.run_started_s:
            base, since, overhead = r.done_s, self.progress_s, r.overhead_s
        else:
            base, since, overhead = r.start_done_s, r.run_started_s, r.start_overhead_s
        return base + max(0.0, at - since - overhead) * r.speed

    def _unplaceable_reason(self, job: JobSpec, r: JobRecord) -> str:
        if job.job_id in self.sized:
            return "its model fits no GPU type of this cluster within the GPU counts tried"
        if not r.options and job.gpu_mem_mib is not None:
            cards = {m: stages.card_mem_mib(self, m) for m in set(self.pool_model.values())}
            known = {m: c for m, c in cards.items() if c is not None and job.allows_model(m)}
            if known:
                big = max(known, key=lambda m: (known[m], m))
                return (
                    f"asks for {job.gpu_mem_mib} MiB of one GPU; the largest card here is "
                    f"{big} with {known[big]} MiB"
                )
            return "asks for GPU memory, and no card it allows has a known memory size"
        if not r.options:
            fits = [n for k, n in self.pool_gpus.items() if job.allows_model(self.pool_model[k])]
            if fits:
                return f"needs {job.gpu_count} GPUs, at most {max(fits)} usable"
            have = ", ".join(sorted(set(self.pool_model.values())))
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
        self.timed = self.timed or job.time_limit_s is not None
        if service is not None and service not in self.services:
            raise NotFoundError(f"service {service} is not known to the scheduler")
        r = JobRecord(
            job, "", ready_s=now, preemptions=preemptions, attempts=attempts, service=service
        )
        r.options = stages.options_for(self, job)
        if job.kind is JobKind.ONLINE and state not in TERMINAL:
            self._online_seen(job.gpu_models)
        if placement is not None and placement.nodes:
            r.gpu_type = self.node_pool[placement.nodes[0]]
        elif r.options:
            r.gpu_type = r.options[0].pool
        else:
            raise SpecError(
                f"job {job.job_id} asks for {sorted(job.gpu_models)}; this cluster has "
                f"{', '.join(sorted(set(self.pool_model.values())))}"
            )
        milli = stages.share_milli(self, job, self.pool_model[r.gpu_type])
        if milli is not None and milli != job.gpu_milli:  # a share given by GPU memory
            job = r.spec = replace(job, gpu_milli=milli)
        if job.elastic and placement is not None and state not in TERMINAL:
            job = r.spec = self.elastic.restored(job, placement.gpu_count)
        if placement is not None and any(s.gpu_milli != job.gpu_milli for s in placement.shares):
            placement = Placement(
                tuple(replace(s, gpu_milli=job.gpu_milli) for s in placement.shares)
            )
        if attempts:
            r.first_start_s = now
        self.records[job.job_id] = r
        self.active[job.job_id] = r
        if service is not None and state not in TERMINAL:
            self.replicas[service][job.job_id] = r
        if state in (JobState.RUNNING, JobState.PREEMPTING) and placement is not None:
            self.state.validate(job, placement)
            self.engine.apply(job, placement, now, "restore")
            r.state = state
            r.run_started_s = now
            self.running[job.job_id] = r
            if state is JobState.RUNNING:
                self.held[(job.team, r.gpu_type)] += job.gpu_count
            else:
                self.vacating.add(job.job_id)
        elif state in WAITING:
            r.state = state
            self.queues.add(r)
        else:
            r.state = state
            del self.active[job.job_id]
        if state not in TERMINAL:
            self._learn_submitted(r)
        self.dirty = True

    # ---- services -----------------------------------------------------------------------------
    def add_service(self, template: ServiceTemplate) -> None:
        """A new service, or new settings for one (its replicas stay; the next cycle scales
        them to the new bounds)."""
        self.services[template.name] = template
        self._online_seen(template.gpu_models)
        self.dirty = True

    def remove_service(
        self, name: str, now: float, reason: str = "service deleted"
    ) -> list[Command]:
        """The service is gone: its waiting replicas end, its running ones are cancelled
        (the driver stops them with their grace)."""
        if name not in self.services:
            raise NotFoundError(f"service {name} is not known to the scheduler")
        mine = list(self.replicas[name].values())
        out: list[Command] = []
        dropped = []
        for r in mine:
            holding = r.state is JobState.RUNNING
            self.claims.pop(r.job_id, None)
            self.finished(r.job_id, now, JobState.CANCELLED, reason)
            if holding:
                out.append(Cancel(r.job_id, reason))
            else:
                dropped.append(r.job_id)
        out.insert(0, Scale(name, len(mine), 0, reason, tuple(dropped)))
        del self.services[name]
        self.replicas.pop(name, None)
        for table in (self.demand, self.load, self.below_since, self.scaled_at, self.slo_floor):
            table.pop(name, None)
        self.dirty = True
        return out

    def finished(self, job_id: str, at: float, state: JobState, reason: str = "") -> list[Command]:
        """The job ended by itself (or was cancelled): its GPUs are free."""
        r = self._record(job_id)
        if r.state in TERMINAL:
            return []
        if self.learning is not None:
            if state is JobState.FINISHED:
                self.learning.finished(job_id, at, self._work_at(r, at) * r.spec.gpu_count)
            else:
                self.learning.forget(job_id)
        if r.state is JobState.RUNNING:
            self.held[(r.spec.team, r.gpu_type)] -= r.spec.gpu_count
            self.room_since[(r.spec.team, r.gpu_type)] = at
        elif r.state in WAITING:
            self.queues.remove(r)
        if r.state in (JobState.RUNNING, JobState.PREEMPTING):
            self.engine.release(job_id, at, "finish" if state is JobState.FINISHED else "stop")
        if r.state is JobState.PREEMPTING and state is JobState.CANCELLED:
            r.state = check_transition(job_id, r.state, JobState.SUSPENDED)
        r.state = check_transition(job_id, r.state, state)
        r.end_s, r.end_reason = at, reason
        self.dirty = True
        self.active.pop(job_id, None)
        self.running.pop(job_id, None)
        self.vacating.discard(job_id)
        self.claims.pop(job_id, None)
        self.choosers.pop(job_id, None)
        self.on_hold.discard(job_id)
        self.expiring.pop(job_id, None)
        self.told_wait.pop(job_id, None)
        self.elastic.ended(job_id)
        if r.service is not None:
            self.replicas[r.service].pop(job_id, None)
        self._release_claims(job_id)
        return []

    def vacated(self, job_id: str, at: float) -> list[Command]:
        """A preempted job has written its checkpoint and left: requeue it, and start the
        jobs that were waiting for its GPUs."""
        r = self._record(job_id)
        self.engine.release(job_id, at, "suspend")
        self.running.pop(job_id, None)
        self.vacating.discard(job_id)
        self.dirty = True
        r.state = check_transition(job_id, r.state, JobState.SUSPENDED)
        r.vacate_at = None
        r.ready_s = at
        self.elastic.full_size(r)
        self._enqueue(r)
        return self._wake_claims(job_id, at)

    def lost(self, job_id: str, at: float, reason: str) -> list[Command]:
        """The job died without finishing (crash, lost node): back to the queue, to
        resume from its last checkpoint."""
        r = self._record(job_id)
        if r.state is JobState.RUNNING:
            self.held[(r.spec.team, r.gpu_type)] -= r.spec.gpu_count
            self.room_since[(r.spec.team, r.gpu_type)] = at
        self.engine.release(job_id, at, f"lost ({reason})")
        self.running.pop(job_id, None)
        self.vacating.discard(job_id)
        r.state = check_transition(job_id, r.state, JobState.SUSPENDED)
        r.vacate_at = None
        r.ready_s = at
        r.done_s = r.saved_s
        self.expiring.pop(job_id, None)  # it died before its stop: it waits again
        self.elastic.ended(job_id)
        self.elastic.full_size(r)
        self._enqueue(r)
        self.dirty = True
        self._release_claims(job_id)
        return []

    def node_down(self, node: str, now: float, reason: str = "") -> list[str]:
        """A node died or turned unhealthy: nothing more goes there. Returns the jobs that
        ran on it (the driver stops them and reports each with Lost)."""
        k = self._node(node)
        self.down_why[k] = reason or f"node {node} is down"
        cloud = self.cloud is not None and k in self.cloud.status
        if self.cloud is not None and cloud:
            was = self.cloud.status[k]
            self.cloud.status[k] = stages.DOWN  # it left, or never joined
        else:
            self.healthy[k] = False
        for mask in self.pool_nodes.values():
            mask[k] = False
        if not cloud or was == stages.UP:
            self.engine.note(f"node:{node}", now, "node-lost")
        self.dirty = True
        return sorted(
            job_id
            for job_id, p in self.state.placements.items()
            if k in p.nodes and self.records[job_id].state is JobState.RUNNING
        )

    def node_up(self, node: str, now: float) -> None:
        """A lost node is healthy again, or a started cloud node joined: it takes work."""
        k = self._node(node)
        self.down_why.pop(k, None)
        if self.cloud is not None and k in self.cloud.status:
            self.cloud.joined(self, k)
            if k in self.drained:
                self.pool_nodes[self.node_pool[k]][k] = False
            return
        if self.healthy[k]:
            return
        self.healthy[k] = True
        self.pool_nodes[self.node_pool[k]][k] = k not in self.drained
        self.engine.note(f"node:{node}", now, "node-restored")
        self.dirty = True

    # ---- the cycle ----------------------------------------------------------------------------
    def cycle(self, now: float) -> list[Command]:
        """One scheduling cycle: every stage, in this order, and the commands it decided.

        Claimants whose victims ended start at any call; the stages run when `cycle_s` has
        passed since they last ran, or again at that same instant (several events at one
        time), never in between: a driver may call after every event and the same events
        still give the same decisions."""
        cfg = self.config
        out: list[Command] = []
        ready, self.ready_claims = self.ready_claims, []
        for claimant in ready:
            r = self.records[claimant]
            if r.state in WAITING:
                launch = self._start_anywhere(r, now, self.claim_nodes.pop(claimant, ()))
                if launch is not None:
                    out.append(launch)
        last = self.last_cycle_s
        if last is not None and last < now < last + cfg.cycle_s - 1e-9 and not self.cycle_due:
            return out  # the stages run once per cycle_s (again at the same instant)
        self.cycle_due = False
        if last is not None and now > last:
            usage: dict[str, float] = defaultdict(float)  # running and vacating GPUs
            for (team, _), gpus in self.held.items():
                usage[team] += gpus
            for job_id in self.vacating:
                usage[self.running[job_id].spec.team] += self.running[job_id].spec.gpu_count
            self.quotas.record_usage(usage, now - last)
        self.last_cycle_s = now
        if self.learning is not None:
            change, moved = self.learning.tick(now)
            if change is not None:
                out.append(change)
            if moved or now > self.learning.next_age_s:
                self.dirty = True  # a new model, another guard state, a job past its age
        rules = cfg.preemption
        if (rules.by_priority or rules.max_lost_work_s is not None) and self.queues.by_team:
            # A victim reaching its minimum runtime or its next checkpoint changes what
            # may be preempted without any event: plan again while jobs wait.
            self.dirty = self.dirty or len(self.queues) > 0
        if self.timed:
            out += self._expire(now)
        if not self.measured and (
            self.dirty or self.choosers or cfg.energy.price_aware or cfg.energy.power_capping
        ):
            self._estimate(now)
        window = self.quotas.window(now)
        if window is not self._window:
            self._window, self.window_since = window, now
            self.dirty = True
        if self.cloud is not None:
            out += self.cloud.tick(self, now)
        if self.services:
            out += stages.autoscale(self, now)
        stages.rechoose(self, now)
        if self.elastic.declared:  # lend before the policy would preempt for online work
            out += self.elastic.lend(self, now)
        if cfg.energy.price_aware:
            out += self.deferral.plan(self, now)
        self.waits_due = self.waits_due or self.dirty or bool(out)
        if self.dirty:
            self.dirty = False
            self._plan(now, out, shadow=True)
            if self.over_limit:  # once more, with the teams now at their limits hidden
                self.over_limit = self.dirty = False
                self._plan(now, out, shadow=False)
        if self.elastic.declared:
            out += self.elastic.grow(self, now)
        out += self._wait_reasons(now)
        if cfg.energy.power_capping or cfg.energy.thermal.aware:
            out += stages.power_caps(self, now)
        return out

    def _plan(self, now: float, out: list[Command], shadow: bool) -> None:
        """The policy's plan, validated and applied. An ordered policy plans with the
        order its LearnedOrdering gives now; in shadow mode the learned order plans on the
        same view too (a scratch copy, its own copy of the random state), and only the
        difference is recorded (LearnShadow): nothing of it is applied."""
        lg = self.learning
        if lg is None:
            self._apply(self.policy.plan(self.view(now)), now, out)
            return
        waiting = [self.records[job_id] for q in self.queues.by_team.values() for _, job_id in q]
        use, learned = lg.ranks(now, waiting)
        self.rank = use
        rng = copy.deepcopy(self.rng) if shadow and learned is not None else None
        plan = self.policy.plan(self.view(now, use))
        if rng is not None and learned is not None:
            view = self.view(now, learned)
            view.rng = rng
            record = lg.shadow(now, _starts(plan), _starts(self.policy.plan(view)))
            if record is not None:
                out.append(record)
        self._apply(plan, now, out)

    def set_learning_mode(self, mode: str, t_s: float, reason: str) -> LearnGuard:
        """Promote the learned policy to active or demote it to shadow (the live
        `gpupool learn promote` and its automatic demotion); the next cycle plans anew."""
        if self.learning is None:
            raise SpecError(
                f"the policy is {self.config.policy}; only policy learned has a shadow and an "
                "active mode: set policy: learned"
            )
        change = self.learning.set_mode(mode, t_s, reason)
        self.dirty = True
        return change

    def learning_status(self) -> dict[str, object] | None:
        """The ordered policy's state (data seen, accuracy, guard, model, mode, shadow
        agreement); None when the policy is not las, gittins or learned."""
        return None if self.learning is None else self.learning.status()

    def learning_seed(self, outcomes: Sequence[Outcome]) -> int:
        """Preload finished jobs into the learned policy's history (a restarted service
        reads them from its database); returns how many were taken. Call before the
        first submit or restore."""
        if self.learning is None:
            return 0
        taken = self.learning.seed(outcomes)
        self.dirty = self.dirty or bool(taken)
        return taken

    def _apply(
        self, commands: list[Start | Preempt | Claim], now: float, out: list[Command]
    ) -> None:
        starts = 0
        limit = self.config.max_starts_per_cycle
        if self.config.team_limits:
            commands = self._within_limits(commands)
        for c in commands:
            r = self.records.get(c.job_id)
            if r is None:
                raise PlanRejected(f"the plan names an unknown job {c.job_id}")
            if isinstance(c, Start):
                if limit is not None and starts >= limit:
                    self.dirty = True  # planned again next cycle
                    continue
                starts += 1
                if (
                    self.claims.pop(c.job_id, None) is not None
                ):  # GPUs freed before its victims left
                    self.claim_nodes.pop(c.job_id, None)
                    self.claim_grace.pop(c.job_id, None)
                out.append(self._start(r, c.placement, now))
            elif isinstance(c, Preempt):
                out.append(self._preempt(r, c, now))
            else:
                victims = {v for v in c.victims if self.records[v].state is JobState.PREEMPTING}
                if victims:
                    self.claims[c.job_id] = victims
                    self.claim_nodes[c.job_id] = c.nodes
                    self.claim_grace[c.job_id] = max(
                        self.config.checkpoint.write_s(self.records[v].spec.state_gib_per_gpu)
                        for v in victims
                    )
                else:
                    launch = self._start_anywhere(r, now)
                    if launch is not None:
                        out.append(launch)

    def _start_anywhere(
        self, r: JobRecord, now: float, nodes: tuple[int, ...] = ()
    ) -> Launch | None:
        """Start a claimant where the placement finds room, preferring the nodes held for it."""
        if r.job_id in self.on_hold or (
            self.config.team_limits and self._limit_reason(r, self._running_counts())
        ):
            return None
        if self._over_maximum(r, now):
            return None  # its team filled up while its victims vacated: it waits its turn
        allowed = self.pool_nodes[r.gpu_type].copy()
        if self.team_nodes is not None:
            allowed &= self.team_nodes[r.spec.team]
        placement = None
        if nodes:
            held = np.zeros_like(allowed)
            held[list(nodes)] = True
            placement = self.placement.place(self.state, r.spec, self.rng, allowed & held)
        if placement is None:
            placement = self.placement.place(self.state, r.spec, self.rng, allowed)
        if placement is None:
            return None
        return self._start(r, placement, now)

    def _over_maximum(self, r: JobRecord, now: float) -> bool:
        """Whether starting the job now would take its team past its maximum."""
        job = r.spec
        limit = self.quotas.maximum(job.team, r.gpu_type, now)
        if job.shares_gpu:
            return self._team_milli(job.team, r.gpu_type) + job.gpu_milli > limit * MILLI_PER_GPU
        return self.held[(job.team, r.gpu_type)] + job.gpu_count > limit

    def _start(self, r: JobRecord, placement: Placement, now: float) -> Launch:
        job = r.spec
        if self._over_maximum(r, now):
            raise PlanRejected(f"job {job.job_id}: team {job.team} would exceed its maximum")
        if not all(self.healthy[k] for k in placement.nodes):
            raise PlanRejected(f"job {job.job_id}: the plan uses a node that is down")
        if self.drained.intersection(placement.nodes):
            raise PlanRejected(f"job {job.job_id}: the plan uses a drained node")
        if job.job_id in self.on_hold:
            raise PlanRejected(f"job {job.job_id} is on hold")
        resumed = r.state is JobState.SUSPENDED
        self.engine.apply(job, placement, now, "resume" if resumed else "start")
        self.queues.remove(r)
        self.told_wait.pop(job.job_id, None)  # running: its Launch says so
        r.state = check_transition(job.job_id, r.state, JobState.RUNNING)
        self.held[(job.team, r.gpu_type)] += job.gpu_count
        self.running[job.job_id] = r
        self.dirty = True
        r.attempts += 1
        r.run_started_s = now
        ck = self.config.checkpoint
        r.overhead_s = ck.resume_s(job.state_gib_per_gpu) if resumed else ck.process_start_s
        if r.first_start_s is None:
            r.first_start_s = now
            r.overhead_s += stages.transfer_s(self, r)
            self.choosers.pop(job.job_id, None)
        r.speed = self.speed_of(r)
        r.start_done_s, r.start_overhead_s = r.done_s, r.overhead_s
        return Launch(job.job_id, placement, resumed, job, r.service, self.launch_note(r))

    def launch_note(self, r: JobRecord) -> str:
        """Which GPU type a job got and why, with a sized job's plan (its GPU count per
        type of the fleet); "" for a job that had no choice to make."""
        why = self.type_why.get(r.job_id, "")
        request = self.sized.get(r.job_id)
        if request is None or self.catalog is None:
            return why
        if r.attempts > 1:
            return why  # a resume: the note of its first start, plan included
        types = sorted({m for m in self.pool_model.values() if m in self.catalog})
        sized = sized_options(request, self.catalog, types)
        have: dict[str, int] = defaultdict(int)
        for key, gpus in self.pool_gpus.items():
            have[self.pool_model[key]] = max(have[self.pool_model[key]], gpus)
        entries = [(t, sized[t].count if t in sized else None, have[t]) for t in types]
        plan = f"plan {plan_text(entries, self.pool_model[r.gpu_type])}"
        self.type_why[r.job_id] = note = f"{why}; {plan}" if why else plan
        return note

    def _team_milli(self, team: str, pool: str) -> int:
        """GPU thousandths the team's running jobs hold in the pool: a share counts as its
        part of a GPU when a quota maximum is checked for a sharing job."""
        return sum(
            r.spec.total_gpu_milli
            for r in self.running.values()
            if r.spec.team == team and r.gpu_type == pool and r.state is JobState.RUNNING
        )

    def _preempt(self, r: JobRecord, c: Preempt, now: float) -> Stop:
        job = r.spec
        above = self.held[(job.team, r.gpu_type)] > self.quotas.guaranteed(
            job.team, r.gpu_type, now
        )
        claimant = None
        if c.for_job is not None:
            claimant = self._record(c.for_job).spec
            if self._record(c.for_job).state not in WAITING:
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
        r.state = check_transition(job.job_id, r.state, JobState.PREEMPTING)
        self.vacating.add(job.job_id)
        self.held[(job.team, r.gpu_type)] -= job.gpu_count
        self.room_since[(job.team, r.gpu_type)] = now
        self.dirty = True
        r.preemptions += 1
        lost = r.done_s - r.saved_s
        r.done_s = r.saved_s
        r.vacate_at = now + self.config.checkpoint.write_s(job.state_gib_per_gpu)
        self.engine.note(job.job_id, now, f"preempt ({c.reason}; loses {lost:.0f}s)")
        return Stop(job.job_id, c.reason)

    def _wake_claims(self, job_id: str, at: float) -> list[Command]:
        out: list[Command] = []
        for claimant, victims in list(self.claims.items()):
            victims.discard(job_id)
            if victims:
                continue
            del self.claims[claimant]
            r = self.records[claimant]
            if r.state in WAITING:
                launch = self._start_anywhere(r, at, self.claim_nodes.pop(claimant, ()))
                if launch is not None:
                    out.append(launch)
        return out

    def _release_claims(self, job_id: str) -> None:
        """A victim ended without vacating (it finished, failed or was lost): claimants
        left with no victim start at the next cycle's beginning."""
        for claimant, victims in list(self.claims.items()):
            victims.discard(job_id)
            if not victims:
                del self.claims[claimant]
                self.ready_claims.append(claimant)

    # ---- holds, requeues, drains, time and count limits ---------------------------------------
    def _enqueue(self, r: JobRecord) -> None:
        """Back in its team's queue, unless it is on hold (then it waits for release)."""
        if r.job_id not in self.on_hold:
            self.queues.add(r)

    def hold(self, job_id: str, now: float) -> None:
        """A waiting job starts only once released; a job being stopped (requeued) is
        held once it has left. A running job cannot be held: requeue it first."""
        r = self._record(job_id)
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
        self.choosers.pop(job_id, None)
        if self.claims.pop(job_id, None) is not None:  # its victims need not leave for it
            self.claim_nodes.pop(job_id, None)
            self.claim_grace.pop(job_id, None)
        self.told_wait.pop(job_id, None)
        self.engine.note(job_id, now, "hold")
        self.dirty = True

    def release(self, job_id: str, now: float) -> None:
        """A held job may start again, in its old place in the queue (its ready time)."""
        r = self._record(job_id)
        if job_id not in self.on_hold:
            raise ConflictError(f"job {job_id} is not on hold; nothing to release")
        self.on_hold.discard(job_id)
        if r.state in WAITING:
            self.queues.add(r)
            if len(r.options) > 1 and r.first_start_s is None:
                self.choosers[job_id] = r
        self.engine.note(job_id, now, "release")
        self.dirty = True

    def requeue(
        self, job_id: str, now: float, reason: str = "requeued on request"
    ) -> list[Command]:
        """Stop a running job as a preemption does (checkpoint, leave: Vacated), outside
        the preemption rules since someone asked; it then waits in the queue again."""
        r = self._record(job_id)
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
        r.state = check_transition(job_id, r.state, JobState.PREEMPTING)
        self.vacating.add(job_id)
        self.held[(job.team, r.gpu_type)] -= job.gpu_count
        self.room_since[(job.team, r.gpu_type)] = now
        self.dirty = True
        r.preemptions += 1
        r.done_s = r.saved_s
        r.vacate_at = now + self.config.checkpoint.write_s(job.state_gib_per_gpu)
        self.engine.note(job_id, now, f"requeue ({reason})")
        return [Stop(job_id, reason)]

    def drain(self, node: str, now: float, undo: bool = False) -> None:
        """No new job goes to the node (running ones run on); undo: it takes work again
        (when it is up: a node that is down returns with NodeUp)."""
        k = self._node(node)
        if undo:
            if k not in self.drained:
                return
            self.drained.discard(k)
            up = (
                self.cloud.status[k] == stages.UP
                if self.cloud is not None and k in self.cloud.status
                else bool(self.healthy[k])
            )
            if up:
                self.pool_nodes[self.node_pool[k]][k] = True
            self.engine.note(f"node:{node}", now, "undrain")
        else:
            if k in self.drained:
                return
            self.drained.add(k)
            self.pool_nodes[self.node_pool[k]][k] = False
            self.engine.note(f"node:{node}", now, "drain")
        self.dirty = True

    def forget(self, job_id: str) -> None:
        """Drop an ended job's record (its driver deleted the job)."""
        r = self.records.get(job_id)
        if r is not None and r.state in TERMINAL:
            del self.records[job_id]
            self.elastic.forget(job_id)
            self.sized.pop(job_id, None)
            self.type_why.pop(job_id, None)

    def draining(self, node: str) -> str | None:
        """None (takes work), `draining` (jobs still run there) or `drained` (empty)."""
        k = self._node(node)
        if k not in self.drained:
            return None
        busy = any(k in p.nodes for p in self.state.placements.values())
        return "draining" if busy else "drained"

    def time_limit_s(self, spec: JobSpec) -> float | None:
        """The job's own limit, else its kind's default (None: unlimited)."""
        if spec.time_limit_s is not None:
            return spec.time_limit_s
        return self.config.time_limit_s.get(spec.kind.value)

    def _expire(self, now: float) -> list[Command]:
        """Running jobs whose run (since their last start) reached its time limit: stop
        them; they end as failed once they have left (the driver's Finished)."""
        out: list[Command] = []
        for job_id, r in self.running.items():
            if r.state is not JobState.RUNNING or self.elastic.resizing(job_id):
                continue
            limit = self.time_limit_s(r.spec)
            if limit is None or now - r.run_started_s < limit - 1e-9:
                continue
            job = r.spec
            r.state = check_transition(job_id, r.state, JobState.PREEMPTING)
            self.vacating.add(job_id)
            self.held[(job.team, r.gpu_type)] -= job.gpu_count
            self.room_since[(job.team, r.gpu_type)] = now
            why = f"ran past its {duration_text(limit)} time limit"
            self.expiring[job_id] = why
            self.engine.note(job_id, now, f"time limit ({why})")
            out.append(Expire(job_id, why))
        if out:
            self.dirty = True
        return out

    def _running_counts(self) -> dict[str, tuple[int, int]]:
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

    def _limit_reason(
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

    def _under_limits(
        self,
        team: str,
        queue: list[tuple[tuple[object, ...], str]],
        counts: Mapping[str, tuple[int, int]],
    ) -> list[tuple[tuple[object, ...], str]]:
        """The part of a team's queue its limits let the policy see: nothing at the
        running limit, no CPU-only job at the CPU-only limit."""
        limits = self.config.team_limits[team]
        n, cpu = counts.get(team, (0, 0))
        if limits.max_running_jobs is not None and n >= limits.max_running_jobs:
            return []
        if limits.max_cpu_jobs is not None and cpu >= limits.max_cpu_jobs:
            return [e for e in queue if self.records[e[1]].spec.gpu_count > 0]
        return queue

    def _within_limits(
        self, commands: list[Start | Preempt | Claim]
    ) -> list[Start | Preempt | Claim]:
        """The plan less the starts and claims that would take a team past its limits,
        and less the preemptions made only for such claims (planned again next cycle)."""
        counts = self._running_counts()
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
            if self._limit_reason(r, counts, planned[team]):
                dropped.add(c.job_id)
                if isinstance(c, Claim):
                    dropped_victims.update(c.victims)
                continue
            n, cpu = planned[team]
            planned[team] = (n + 1, cpu + (r.spec.gpu_count == 0))
            if isinstance(c, Claim):
                kept_victims.update(c.victims)
        if not dropped:
            return commands
        self.dirty = self.over_limit = True
        idle = dropped_victims - kept_victims
        return [
            c
            for c in commands
            if not (isinstance(c, Preempt) and c.job_id in idle) and c.job_id not in dropped
        ]

    def _wait_reasons(self, now: float) -> list[Command]:
        """Wait for each waiting job whose reason changed (waiting.explain); a changed
        sentence under the same code at most once per waiting.REFRESH_S. Held jobs are
        not told: their hold says why."""
        if not self.waits_due:
            return []
        self.waits_due = False
        reasons = waiting.explain(self, now, self.wait_front)
        out: list[Command] = []
        told = self.told_wait
        for job_id, why in reasons.items():
            last = told.get(job_id)
            if last is not None and last[0] == why.code:
                if last[1] == why.sentence:
                    continue
                if now - last[2] < waiting.REFRESH_S - 1e-9:
                    self.waits_due = True  # its numbers moved: told once the refresh is due
                    continue
            out.append(Wait(job_id, why.sentence, why.code))
            told[job_id] = (why.code, why.sentence, now)
        if self.waits_due:  # a refresh is due: those jobs are looked at again then
            self.wait_front.update(j for j, w in reasons.items() if told[j][1] != w.sentence)
        return out

    # ---- progress -----------------------------------------------------------------------------
    def speed_of(self, r: JobRecord, cap_speed: float | None = None) -> float:
        """Work per second: the power cap's slowdown times co-location's on shared GPUs."""
        cap = r.cap_speed if cap_speed is None else cap_speed
        if self.elastic.declared:
            cap *= self.elastic.fraction(r)  # an elastic job below its size runs slower
        placement = self.state.placements.get(r.spec.job_id)
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

    def _estimate(self, now: float) -> None:
        """No driver measures progress: every running job's estimate (JobRecord.estimate)."""
        running = JobState.RUNNING
        for r in self.running.values():
            if r.state is running:
                r.estimate(now)

    # ---- views --------------------------------------------------------------------------------
    def usage(self, team: str, pool: str) -> int:
        return self.held.get((team, pool), 0)

    def pool_loads(self) -> dict[str, PoolLoad]:
        """Free GPUs and drain time of every pool, from one pass over the jobs."""
        work: dict[str, float] = defaultdict(float)
        for r in self.running.values():
            if r.spec.duration_s is not None:
                work[r.gpu_type] += r.spec.gpu_count * max(0.0, r.spec.duration_s - r.done_s)
        for q in self.queues.by_team.values():
            for _, job_id in q:
                r = self.records[job_id]
                if r.spec.duration_s is not None:
                    work[r.gpu_type] += r.spec.gpu_count * (r.spec.duration_s - r.done_s)
        return pool_loads(self.state, self.pool_nodes, work)

    def visible(self, now: float, rank: Mapping[str, int] | None = None) -> list[JobRecord]:
        """The waiting jobs a cycle considers: the head of each team's queue, plus (further
        back) jobs small enough for the room left under the team's guarantee, so that a
        queue headed by big borrowing jobs cannot hide what the team is owed. With a
        `rank` (an ordered policy's), each queue is taken in that order inside each
        priority class."""
        out: list[JobRecord] = []
        depth = self.config.queue_depth
        deferred = self.deferral.held
        limits = self.config.team_limits
        counts = self._running_counts() if limits else {}
        for team, queue in self.queues.by_team.items():
            if rank is not None:
                queue = self._ranked(queue, rank)
            if deferred:
                queue = [e for e in queue if e[1] not in deferred]
            if team in limits:
                queue = self._under_limits(team, queue, counts)
            out += [self.records[job_id] for _, job_id in queue[:depth]]
            if len(queue) <= depth:
                continue
            rooms = {
                pool: self.quotas.guaranteed(team, pool, now) - self.usage(team, pool)
                for pool in self.pool_nodes
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

    def _ranked(
        self, queue: list[tuple[tuple[object, ...], str]], rank: Mapping[str, int]
    ) -> list[tuple[tuple[object, ...], str]]:
        """A team's queue by the rank (its positions keep the priority classes apart)."""
        last = len(rank)
        return sorted(queue, key=lambda e: rank.get(e[1], last))

    def view(self, now: float, rank: Mapping[str, int] | None = None) -> CycleView:
        """What the policy plans from. Running jobs are seen through RunningViews (each
        made when the plan first reads it) and the totals the core keeps, so a cycle
        costs what the plan looks at, not one view per running job."""
        ck = self.config.checkpoint
        reserve = self.reserve_now()
        lent = self.elastic.hidden(self.claims) if self.elastic.claimants else set()
        pending = [
            PendingView(
                r.spec, r.gpu_type, r.ready_s, ck.write_s(r.spec.state_gib_per_gpu), r.preemptions
            )
            for r in self.visible(now, rank)
            if r.job_id not in lent
        ]
        return CycleView(
            now_s=now,
            cycle_s=self.config.cycle_s,
            state=self.state,
            running=RunningViews(self, now),
            pending=pending,
            claimed=frozenset(self.claims),
            vacating=frozenset(self.vacating),
            quotas=self.quotas,
            pool_nodes=self.pool_nodes,
            team_nodes=self.team_nodes,
            reserve=reserve,
            rules=self.config.preemption,
            rng=self.rng,
            placement=self.placement,
            claims={c: frozenset(v) for c, v in self.claims.items()},
            rank=rank,
            held=self.held,
            holders=running_view.reserve_holders(self, reserve),
        )

    def working(self) -> Iterator[tuple[JobRecord, Placement]]:
        """Running jobs (not those writing their checkpoint) with where they run."""
        for r in self.running.values():
            placement = self.state.placements.get(r.spec.job_id)
            if r.state is JobState.RUNNING and placement is not None:
                yield r, placement

    def room_inlet_c(self) -> np.ndarray:
        """Each node's inlet air as configured: `thermal.inlet_c`, and `hot_inlet_c` for
        the last `hot_nodes` on-premises nodes of each pool (a hot aisle)."""
        th = self.config.energy.thermal
        inlet = np.full(self.state.node_count, th.inlet_c)
        if th.hot_nodes:
            cloud = set(self.cloud.nodes) if self.cloud is not None else set()
            for key in self.pool_nodes:
                idx = [k for k, p in enumerate(self.node_pool) if p == key and k not in cloud]
                if idx:
                    inlet[idx[-th.hot_nodes :]] = th.hot_inlet_c
        return inlet

    def _idle_could_hold(self, job: JobSpec) -> bool:
        """Whether the fleet's idle GPUs (whole, or with room for a share) could hold the
        job: a cheap test of whether an early cycle may start it, not a placement."""
        if job.gpu_count == 0:
            return True
        if job.gpu_milli >= MILLI_PER_GPU:
            return int(self.state.whole_free.sum()) >= job.gpu_count
        return int((self.state.gpu_left >= job.gpu_milli).sum()) >= job.gpu_count

    def _online_seen(self, gpu_models: frozenset[str]) -> None:
        """Online inference may run in the pools of these models (all when empty)."""
        for key, model in self.pool_model.items():
            if not gpu_models or model in gpu_models:
                self.online_pools.add(key)

    def reserve_now(self) -> dict[str, int]:
        """The online reserve each pool keeps now: `online_reserve` of its GPUs, from the
        start (`online_reserve_on: always`) or once online inference was submitted for
        it or a service may place replicas there (`online-seen`)."""
        if self.config.online_reserve_on == "always":
            return self.reserve
        return {t: n if t in self.online_pools else 0 for t, n in self.reserve.items()}

    # ---- queries for drivers ------------------------------------------------------------------
    def claim_eta_s(self, job_id: str) -> float | None:
        """When a job waiting for its victims should start: the latest time its victims
        are expected to have written their checkpoints (None: it waits for no victim)."""
        victims = self.claims.get(job_id)
        if not victims:
            return None
        times = [self.records[v].vacate_at for v in victims]
        known = [t for t in times if t is not None]
        return max(known) if known else None

    @property
    def log(self) -> DecisionLog:
        return self.engine.log

    def waiting(self) -> int:
        return len(self.queues)

    def placements(self) -> Mapping[str, Placement]:
        return self.state.placements

    def pool_of_node(self, k: int) -> str:
        return self.node_pool[k]

    def deferred_until(self, job_id: str) -> float | None:
        return self.deferral.until.get(job_id) if job_id in self.deferral.held else None

    def _record(self, job_id: str) -> JobRecord:
        r = self.records.get(job_id)
        if r is None:
            raise NotFoundError(f"job {job_id} is not known to the scheduler")
        return r

    def _node(self, node: str) -> int:
        k = self.node_index.get(node)
        if k is None:
            raise NotFoundError(f"node {node} is not in this cluster")
        return k

    def options(self, job: JobSpec) -> tuple[PoolOption, ...]:
        return stages.options_for(self, job)


def _starts(plan: Sequence[Start | Preempt | Claim]) -> tuple[str, ...]:
    """The jobs a plan starts, now or once their victims left, in plan order."""
    return tuple(c.job_id for c in plan if not isinstance(c, Preempt))

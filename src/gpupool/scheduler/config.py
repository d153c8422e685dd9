"""What the decision core reads: one frozen configuration for every driver.

A scenario file and the live service's `--config` fill the same `SchedulerConfig`
(teams, windows, policy, preemption, reserve, sharing, placement, energy, burst), so a
policy proven in the simulator is the policy the service runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupool.domain.calibration import CheckpointModel, ColocationModel
from gpupool.domain.quota import QuotaWindow, TeamQuota
from gpupool.domain.topology import Topology
from gpupool.federation.burst import BurstRules
from gpupool.learning.colocation_config import PairAdmissionConfig
from gpupool.learning.config import LearningConfig
from gpupool.learning.demand import DemandForecastConfig
from gpupool.policies.preemption import PreemptionRules
from gpupool.policies.serving_clocks import OnlineClocks

MODES = ("pool", "static")
PLACEMENT_POLICIES = ("consolidate", "best-fit", "fgd")
TYPE_CHOICES = ("by-class", "first", "blind", "cost-aware")
SITE_CHOICES = ("blind", "locality-aware")
RESERVE_TRIGGERS = ("always", "online-seen")


@dataclass(frozen=True)
class TeamLimits:
    """A team's job-count limits (Slurm's MaxJobs per association). None: no limit.

    The core enforces the running limits: a team at `max_running_jobs` (or at
    `max_cpu_jobs` for jobs with no GPU) starts nothing more until one of its jobs ends.
    `submit_per_min` is the API's (a token bucket per team in the service)."""

    max_running_jobs: int | None = None
    max_cpu_jobs: int | None = None
    """Running jobs with `gpus: 0` at once."""
    submit_per_min: float | None = None


@dataclass(frozen=True)
class PlacementConfig:
    """How a job that could run on several pools gets one.

    gpu_type: `by-class` (the job kind's preferred type among those it can start on now,
    see `prefer`; it waits for its preferred type only when none is free), `first` (the
    first pool the job allows: one GPU type per job), `blind` (the pool with the most free
    GPUs, types treated alike) or `cost-aware` (the cheapest pool for the job's work that
    meets its deadline). site: `blind` (most free GPUs anywhere) or `locality-aware` (data
    transfer, queueing, latency and cost, see federation)."""

    gpu_type: str = "by-class"
    site: str = "blind"
    value_of_time_usd_per_h: float = 0.0
    """What an hour of a job's completion time is worth when it has no deadline."""
    prefer: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """by-class: per job kind, GPU types to prefer first, in order; the kind's rule over
    the catalogue (data/gpu_class_preferences.csv) orders the rest."""
    policy: str = "consolidate"
    """Which node and GPU a job gets inside its pool: `consolidate` (fewest free GPUs),
    `best-fit` (least CPU and GPU left) or `fgd` (least growth of fragmentation, measured
    against the task shapes the core has seen submitted)."""


@dataclass(frozen=True)
class ThermalConfig:
    aware: bool = False
    threshold_c: float = 83.0
    inlet_c: float = 30.0
    hot_nodes: int = 0
    """How many nodes (the last of each pool) sit in a hot aisle."""
    hot_inlet_c: float = 40.0


@dataclass(frozen=True)
class SharingConfig:
    """Measured state on shared GPUs (the driver sends GpuUsage; the core averages it).

    A card whose SM utilisation, averaged over the last `util_window_s`, is above
    `max_sm_util_pct` takes no new sharer even when its memory is free (None: no bound).
    A card whose measured free memory is less than a share asks takes none."""

    max_sm_util_pct: float | None = 90.0
    util_window_s: float = 60.0
    one_team_per_card: bool | None = None
    """Shares on one card come from one team. None: the live service decides (on where MPS
    enforces shares and teams run as their own users: MPS serves one user per card at a
    time, so another team's job would wait inside CUDA's start-up until the card's first
    user is gone); a replay takes None as off."""
    admission: PairAdmissionConfig = field(default_factory=PairAdmissionConfig)
    """Who else may refuse a sharing job a card: the utilisation-sum rule or the learned
    speed predictor (`sharing.admission`, learning/colocation_config.py); off by default."""


@dataclass(frozen=True)
class EnergyConfig:
    tariff: str | None = None
    """A shipped tariff name or a YAML file; None: no electricity price."""
    site_tariffs: Mapping[str, str] = field(default_factory=dict)
    pue: float = 1.5
    """Facility overhead (facts.md §4.3: 1.5 generic/colocation, 1.1-1.2 hyperscale)."""
    price_aware: bool = False
    """Defer deadline-bound work to cheap hours (never past its deadline)."""
    power_capping: bool = False
    deferral_slot_s: float = 900.0
    deferral_margin_s: float = 3600.0
    thermal: ThermalConfig = field(default_factory=ThermalConfig)
    online_clocks: OnlineClocks = field(default_factory=OnlineClocks)
    value_of_time: float | None = None
    """What an hour of one GPU's delay is worth, in the tariff's currency: price-aware
    deferral holds a job only where the electricity it saves is worth more than the delay
    (GPUs x hours held back), and a power cap is set only where its energy saving is worth
    more than the hours it adds. None: price alone decides (deferral to the cheapest
    window within the deadline; caps while power is dearer than the tariff's mean). The
    placement's value_of_time_usd_per_h prices an hour of a job's completion when choosing
    a pool; this one prices a GPU-hour of delay against electricity. They are separate
    because they weigh different things: a whole job's lateness against a pool's price,
    and a card's idle hours against its energy bill."""
    team_value_of_time: Mapping[str, float] = field(default_factory=dict)
    """Per team, overriding value_of_time (a team whose results are worth more waits less)."""
    kind_value_of_time: Mapping[str, float] = field(default_factory=dict)
    """Per job kind (training, batch, offline-inference), overriding value_of_time; a
    team's own value comes first."""

    def value_of_time_for(self, team: str, kind: str = "") -> float | None:
        """The value of a GPU-hour of delay for a job (None: price alone decides)."""
        if team in self.team_value_of_time:
            return self.team_value_of_time[team]
        return self.kind_value_of_time.get(kind, self.value_of_time)


@dataclass(frozen=True)
class ElasticConfig:
    """Borrowing from elastic jobs (`--gpus 2..4`) for online work.

    resize: the core may shrink them toward their minimum when an online job cannot be
    placed (before preempting anyone), and grow them back once GPUs are idle again (a
    driver whose executor cannot restart a job on other GPUs turns it off). grow_after_s:
    the hold-down between a job's last resize and its growing back, so it does not flap
    with the load."""

    resize: bool = True
    grow_after_s: float = 600.0


@dataclass(frozen=True)
class FairShareConfig:
    """Fair share inside a team (scheduler/user_shares.py): users: each team's queue is
    ordered by its users' GPU use, so one user's hundred jobs do not all go ahead of
    another's one; half_life_h: how fast past use is forgotten (Slurm's default week)."""

    users: bool = True
    half_life_h: float = 168.0


@dataclass(frozen=True)
class SchedulerConfig:
    """Every knob a decision depends on; the fleet and its prices come separately."""

    policy: str = "priority-quota"
    teams: tuple[TeamQuota, ...] = ()
    windows: tuple[QuotaWindow, ...] = ()
    mode: str = "pool"
    """`pool`: one shared pool; `static`: each team owns whole nodes (islands)."""
    cycle_s: float = 60.0
    """How often the periodic stages run; the policy compares checkpoint times to it."""
    start_on_submit: bool = True
    """A submitted job that idle GPUs could hold brings the next cycle forward to its
    arrival, so it starts at once instead of waiting out cycle_s; the cycle after that is
    due cycle_s later. False: cycles run only every cycle_s."""
    reservations: bool = False
    """Reservations of specific GPUs with backfill (policies/cycle/reservations.py): the
    first blocked job of each team's queue, and any job waiting a day, keeps the GPUs it
    will start on, and a job its team's limit cannot hold yet keeps the room its team frees.
    False: one EASY reservation per pool, counted in GPUs (wide jobs can starve)."""
    online_reserve: float = 0.2
    """Share of each pool (GPUs, rounded up) kept for online inference: idle, or held by
    training and batch work that vacates within preemption.reserve_vacate_s."""
    online_reserve_on: str = "always"
    """When the reserve applies in a pool: `always` (from the start), or `online-seen`
    (once an online job was submitted that may run there, or a service may place
    replicas there; the live default, so a fleet that never serves keeps every GPU)."""
    share_cap: int | None = 2
    """At most this many online replicas share one GPU; None: as many as their shares
    fit (the live service's default). Online replicas share only with online replicas
    either way."""
    sharing: SharingConfig = field(default_factory=SharingConfig)
    queue_depth: int = 32
    """The policy sees the first this-many waiting jobs of each team per cycle."""
    autoscale_lookahead_s: float = 600.0
    autoscale_headroom: float = 1.1
    autoscale_demand: str = "declared"
    """What a service's replicas follow: `declared`, the peak the driver declares
    (ServiceDemand: a scenario's load curve over the look-ahead); `reactive`, the highest
    rate measured over the last look-ahead (ServiceRate; the live default); `forecast`,
    the learned p90 of the coming peak while it beats the simple opponents, else reactive
    (gpupool.learning.demand)."""
    autoscale_forecast: DemandForecastConfig = field(default_factory=DemandForecastConfig)
    autoscale_down_stable_s: float = 0.0
    """A service scales down only once its demand has been below its replicas this long
    (the live service waits 5 minutes; 0: at once, as the scenarios always did)."""
    autoscale_load_window_s: float = 120.0
    """A measured load (ServiceLoad) older than this no longer counts for the SLO rule."""
    autoscale_restart_backoff_s: float = 10.0
    """A service whose replicas keep failing soon after they start gets its next replica
    this long after the latest failure, doubling with each failure in a row (a crash loop
    costs a job row per try, not one per cycle)."""
    autoscale_restart_backoff_max_s: float = 300.0
    """The longest wait between tries; a replica that fails after running this long starts
    the count again (it was healthy for a while)."""
    preemption: PreemptionRules = field(default_factory=PreemptionRules)
    checkpoint: CheckpointModel = field(default_factory=CheckpointModel.calibrated)
    colocation: ColocationModel = field(default_factory=ColocationModel.calibrated)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    energy: EnergyConfig = field(default_factory=EnergyConfig)
    burst: Mapping[str, Any] | BurstRules | None = None
    """Cloud burst and reclaim rules: a scenario's section (minutes) or the rules."""
    team_limits: Mapping[str, TeamLimits] = field(default_factory=dict)
    """Per team (teams[*].max_running_jobs, max_cpu_jobs, submit_per_min)."""
    time_limit_s: Mapping[str, float] = field(default_factory=dict)
    """The wall-time limit of one run of a job, per kind, for jobs that give none
    (`default_time_limit_h`); a kind absent here runs unlimited."""
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    fair_share: FairShareConfig = field(default_factory=FairShareConfig)
    priority_aging_h: float | None = None
    """Priority aging: a waiting batch or training job gains one priority point per this
    many hours of waiting, in the queue's order (not in preemption); None: none."""
    max_starts_per_cycle: int | None = None
    """Apply at most this many of a plan's starts; the rest are planned again next cycle
    (a live executor that takes long per launch keeps its loop responsive)."""
    topology: Topology = field(default_factory=Topology)
    """The fleet's network levels (node labels), whether placement keeps gangs inside
    them, and the cost model of a gang spanning them (domain/topology.py)."""
    learning: LearningConfig = field(default_factory=LearningConfig)
    """The ordered policies' order (`las`, `gittins`, `learned`): rule, model, guard, age
    bound; `mode` shadow or active goes with `policy: learned` (docs/learned-policy.md)."""

"""Domain values. Frozen, with units in names; GPU shares are in thousandths (milli)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from gpupool.errors import SpecError

MILLI_PER_GPU = 1000
"""One whole GPU, in thousandths: a job asking for 460 milli shares a GPU."""


class JobKind(StrEnum):
    """What a job promises. Online inference has a latency SLO and is never preempted;
    offline inference tolerates seconds and may be preempted; training checkpoints."""

    TRAINING = "training"
    ONLINE = "online-inference"
    OFFLINE = "offline-inference"
    BATCH = "batch"


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    gpu_model: str
    gpu_count: int
    cpu_milli: int
    mem_mib: int
    cluster: str = "default"
    labels: tuple[tuple[str, str], ...] = ()
    """(key, value) pairs, sorted by key: where the node sits in the network (`rack=r1`,
    domain/topology.py)."""

    def __post_init__(self) -> None:
        if self.gpu_count < 0 or self.cpu_milli < 0 or self.mem_mib < 0:
            raise SpecError(f"node {self.name}: counts must be >= 0")
        keys = [k for k, _ in self.labels]
        if keys != sorted(set(keys)):
            raise SpecError(f"node {self.name}: labels must be sorted by key, one value each")

    def label(self, key: str) -> str | None:
        """The node's value of label `key`; None when it has none."""
        for k, v in self.labels:
            if k == key:
                return v
        return None


@dataclass(frozen=True, slots=True)
class Cluster:
    name: str
    nodes: tuple[Node, ...]

    @property
    def gpu_count(self) -> int:
        return sum(n.gpu_count for n in self.nodes)

    @property
    def max_gpus_per_node(self) -> int:
        return max((n.gpu_count for n in self.nodes), default=0)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a job asks for. `gpu_milli` is the share of each of its `gpu_count` GPUs."""

    job_id: str
    gpu_count: int = 1
    gpu_milli: int = MILLI_PER_GPU
    cpu_milli: int = 0
    mem_mib: int = 0
    gpu_models: frozenset[str] = field(default_factory=frozenset)
    team: str = "default"
    priority: int = 0
    kind: JobKind = JobKind.TRAINING
    submit_s: float = 0.0
    duration_s: float | None = None
    """Run time at full speed on an unshared GPU (the work), when known."""
    checkpoint_interval_s: float = 3600.0
    """How often the job checkpoints itself while running; preemption loses at most this."""
    state_gib_per_gpu: float = 0.0
    """Checkpoint size per GPU process: what preemption writes and resume reads back."""
    deadline_s: float | None = None
    """When the job must be finished (scenario time); None: as soon as it can."""
    dataset: str | None = None
    """Where the job's input lives (a data location of the federation), if anywhere."""
    dataset_gb: float = 0.0
    user_region: str | None = None
    """Where an online job's users are (a region of the federation)."""
    latency_bound_ms: float | None = None
    """The most network latency an online job's users accept."""
    time_limit_s: float | None = None
    """Wall time one run may take (since its start or resume); None: its kind's default."""
    gpu_mem_mib: int | None = None
    """GPU memory a sharing job asks for (`--gpu-mem`); the core turns it into `gpu_milli`
    of the card it lands on (mem / card memory, rounded up). None: `gpu_milli` as given."""
    gpu_count_min: int | None = None
    """An elastic job (`--gpus 2..4`): it runs on any count from this to `gpu_count` and
    gives GPUs back (checkpoint, restart on fewer) while online work peaks. None: fixed."""
    name: str = ""
    """The job's name or model, where the submitter or the trace gives one: what a learned
    predictor of GPU-time may key on, and the key of its solo profile for a co-location
    admission (learning/colocation_admission.py). Decisions never depend on it otherwise."""
    user: str = ""
    """Who submitted it inside its team: fair share orders a team's queue by its users'
    use (scheduler/user_shares.py). "": the team's one anonymous user."""
    topology: str | None = None
    """A gang (wider than a node) must run inside one domain of this topology level
    (`--topology rack`): it waits for one rather than spread. None: anywhere."""
    topology_preferred: str | None = None
    """A gang runs inside one domain of this level when one has room, else anywhere its
    `topology` allows (`--topology-preferred rack`)."""

    def __post_init__(self) -> None:
        if self.gpu_mem_mib is not None and (self.gpu_mem_mib <= 0 or self.gpu_count != 1):
            raise SpecError(
                f"job {self.job_id}: gpu_mem_mib asks for part of one GPU; give it with "
                f"gpu_count 1 and more than 0 MiB (got {self.gpu_count} GPUs, "
                f"{self.gpu_mem_mib} MiB)"
            )
        if self.time_limit_s is not None and self.time_limit_s <= 0:
            raise SpecError(f"job {self.job_id}: time_limit_s must be > 0")
        if self.gpu_count < 0:
            raise SpecError(f"job {self.job_id}: gpu_count must be >= 0, got {self.gpu_count}")
        if self.gpu_count > 0 and not 0 < self.gpu_milli <= MILLI_PER_GPU:
            raise SpecError(
                f"job {self.job_id}: gpu_milli must be in 1..{MILLI_PER_GPU}, got {self.gpu_milli}"
            )
        if self.gpu_count > 1 and self.gpu_milli != MILLI_PER_GPU:
            raise SpecError(f"job {self.job_id}: only a single-GPU job may share a GPU")
        if self.cpu_milli < 0 or self.mem_mib < 0:
            raise SpecError(f"job {self.job_id}: cpu_milli and mem_mib must be >= 0")
        if self.duration_s is not None and self.duration_s < 0:
            raise SpecError(f"job {self.job_id}: duration_s must be >= 0")
        if self.dataset_gb < 0:
            raise SpecError(f"job {self.job_id}: dataset_gb must be >= 0")
        if self.deadline_s is not None and self.deadline_s < self.submit_s:
            raise SpecError(
                f"job {self.job_id}: deadline_s {self.deadline_s} is before its submit time"
            )
        if self.checkpoint_interval_s <= 0 or self.state_gib_per_gpu < 0:
            raise SpecError(
                f"job {self.job_id}: checkpoint_interval_s must be > 0 and state_gib_per_gpu >= 0"
            )
        if self.gpu_count_min is not None:
            check_elastic(self.job_id, self.kind, self.gpu_count_min, self.gpu_count)

    @property
    def preemptible(self) -> bool:
        return self.kind is not JobKind.ONLINE

    @property
    def total_gpu_milli(self) -> int:
        return self.gpu_count * self.gpu_milli if self.gpu_count else 0

    @property
    def shares_gpu(self) -> bool:
        return self.gpu_count == 1 and self.gpu_milli < MILLI_PER_GPU

    def allows_model(self, model: str) -> bool:
        return not self.gpu_models or model in self.gpu_models

    @property
    def elastic(self) -> bool:
        """It may run on fewer GPUs than it asks for (down to gpu_count_min)."""
        return self.gpu_count_min is not None and self.gpu_count_min < self.gpu_count


ELASTIC_KINDS = (JobKind.OFFLINE, JobKind.BATCH, JobKind.TRAINING)


def check_elastic(job: str, kind: JobKind, gpus_min: int, gpus: int) -> None:
    """An elastic range: whole GPUs, 1 <= min <= max, and work that may restart (online
    inference keeps its GPUs: it is what borrowing serves)."""
    if kind not in ELASTIC_KINDS:
        raise SpecError(
            f"job {job}: only offline-inference, batch and training jobs can be elastic "
            f"(--gpus MIN..MAX); an {kind.value} job asks for a fixed count"
        )
    if not 1 <= gpus_min <= gpus:
        raise SpecError(
            f"job {job}: an elastic range needs 1 <= min <= max whole GPUs, got {gpus_min}..{gpus}"
        )


@dataclass(frozen=True, slots=True)
class NodeShare:
    """The part of a job that sits on one node."""

    node: int
    gpus: tuple[int, ...]
    gpu_milli: int
    cpu_milli: int = 0
    mem_mib: int = 0


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a job runs: one share per node it spans."""

    shares: tuple[NodeShare, ...]

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(s.node for s in self.shares)

    @property
    def gpu_count(self) -> int:
        return sum(len(s.gpus) for s in self.shares)

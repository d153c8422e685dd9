"""What the simulated world measures on its cards: each job's use, each service's latency.

The decision core never reads any of this: a job's usage profile is the world's (what an
NVML reading would show), not an input to scheduling, so adding profiles or recording
them changes no decision. The scenario simulator records, only when asked for a review
(`ScenarioSim.recorder`), every interval a job held a card, the reason codes the core gave
waiting jobs, each card's energy and temperature, and per cycle each service's load,
capacity and p99; `gpupool.sim.scenario.review_source` turns that into `ReviewData`.

Default profiles by job kind (the scenario may override them per workload entry with
`usage: {sm_pct, mem_mib, mem_peak_mib}`), drawn per job from a generator seeded by the
scenario seed and the job id, so adding a job changes no other job's profile:

* training: mean SM 60..95 % (assumption: a training step keeps kernels running most of
  the time; NVML's "gpu" utilisation is the share of time a kernel ran, facts.md §2.3);
  peak memory 55..95 % of the card (assumption: the batch is sized to fill the card, the
  activations taking what weights and optimiser state leave), at least the CUDA context
  (615 MiB idle on the calibration H200) + 1.2 x its checkpoint state per GPU (facts.md
  §6), at most 95 %; mean memory 92 % of the peak (the allocator keeps what it took).
* offline inference: mean SM 40..90 %; memory 90 % of the card (vLLM's default
  `gpu_memory_utilization`, facts.md §6).
* online inference outside a service: mean SM 10..40 %, memory 90 % of the card.
* service replicas: memory 90 % of their share of the card; SM follows the load: 90 % at
  the replica's rated rps (assumption), in proportion below it.

An idle card reads the calibration card's idle memory share (615 of 143,771 MiB) and 0 % SM.
"""

from __future__ import annotations

import math
import zlib
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from gpupool.domain.model import JobKind, JobSpec, Placement
from gpupool.errors import SpecError

CONTEXT_MIB = 615.0
"""Memory a process's CUDA context takes (the calibration H200 idle: 615 MiB used)."""
IDLE_MEM_FRACTION = 615.0625 / 143_771.0
"""An idle card's used memory as a share of its total (calibration h200-colocation.json)."""
SERVING_MEM_FRACTION = 0.9
"""vLLM pre-allocates this share of the card (gpu_memory_utilization default)."""
RATED_SM_PCT = 90.0
"""SM utilisation of a replica serving its rated rps (assumption, see the module doc)."""


@dataclass(frozen=True)
class UsageProfile:
    """What one job measures on each card it holds while it runs (means over its run)."""

    sm_pct: float
    mem_mib: float
    mem_peak_mib: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.sm_pct <= 100.0:
            raise SpecError(f"usage: sm_pct must be in 0..100, got {self.sm_pct:g}")
        if self.mem_mib < 0 or self.mem_peak_mib < self.mem_mib:
            raise SpecError(
                f"usage: need 0 <= mem_mib <= mem_peak_mib, got {self.mem_mib:g} and "
                f"{self.mem_peak_mib:g}"
            )


@dataclass(frozen=True)
class UsageOverride:
    """A workload entry's `usage:`; keys left out keep the kind's default."""

    sm_pct: float | None = None
    mem_mib: float | None = None
    mem_peak_mib: float | None = None

    def apply(self, base: UsageProfile) -> UsageProfile:
        mem = base.mem_mib if self.mem_mib is None else self.mem_mib
        if self.mem_peak_mib is not None:
            peak = self.mem_peak_mib
        elif self.mem_mib is not None:
            peak = self.mem_mib
        else:
            peak = base.mem_peak_mib
        return UsageProfile(base.sm_pct if self.sm_pct is None else self.sm_pct, mem, peak)


@dataclass(frozen=True)
class LatencyUpdate:
    """A model update of a service: from `at_s` on, a replica's base p99 is this."""

    at_s: float
    base_p99_ms: float


def _number(raw: Mapping[str, object], key: str, where: str, lo: float = 0.0) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SpecError(f"{where}: {key} must be a number, got {value!r}")
    if value < lo:
        raise SpecError(f"{where}: {key} must be >= {lo:g}, got {value!r}")
    return float(value)


def parse_usage(raw: object, where: str) -> UsageOverride:
    """`usage: {sm_pct: 0, mem_mib: 200, mem_peak_mib: 250}` of a workload entry."""
    keys = {"sm_pct", "mem_mib", "mem_peak_mib"}
    if not isinstance(raw, Mapping):
        raise SpecError(f"{where}: usage must be a mapping with keys {', '.join(sorted(keys))}")
    bad = sorted(str(k) for k in raw if k not in keys)
    if bad:
        raise SpecError(
            f"{where}: unknown usage key(s) {', '.join(bad)}; allowed: {', '.join(sorted(keys))}"
        )
    over = UsageOverride(
        _number(raw, "sm_pct", where),
        _number(raw, "mem_mib", where),
        _number(raw, "mem_peak_mib", where),
    )
    if over.sm_pct is not None and over.sm_pct > 100:
        raise SpecError(f"{where}: usage sm_pct must be in 0..100, got {over.sm_pct:g}")
    if (
        over.mem_mib is not None
        and over.mem_peak_mib is not None
        and over.mem_peak_mib < over.mem_mib
    ):
        raise SpecError(f"{where}: usage mem_peak_mib must be >= mem_mib")
    return over


def parse_updates(raw: object, where: str) -> tuple[LatencyUpdate, ...]:
    """`update: {at_h: 400, base_p99_ms: 80}` (or a list of them) of a service entry."""
    items = raw if isinstance(raw, list) else [raw]
    out = []
    for k, item in enumerate(items):
        here = f"{where}: update[{k}]" if isinstance(raw, list) else f"{where}: update"
        if not isinstance(item, Mapping) or set(item) != {"at_h", "base_p99_ms"}:
            raise SpecError(
                f"{here}: give exactly at_h and base_p99_ms, e.g. {{at_h: 400, base_p99_ms: 80}}"
            )
        at_h = _number(item, "at_h", here)
        p99 = _number(item, "base_p99_ms", here)
        assert at_h is not None and p99 is not None
        if p99 <= 0:
            raise SpecError(f"{here}: base_p99_ms must be > 0")
        out.append(LatencyUpdate(at_h * 3600.0, p99))
    return tuple(sorted(out, key=lambda u: u.at_s))


def default_profile(spec: JobSpec, card_mib: float, seed: int) -> UsageProfile:
    """The kind's calibrated default for one job (see the module doc), seeded by job id."""
    rng = np.random.default_rng([int(seed), zlib.crc32(spec.job_id.encode())])
    share_mib = card_mib * spec.gpu_milli / 1000.0
    if spec.kind is JobKind.TRAINING:
        sm = float(rng.uniform(60.0, 95.0))
        state_mib = spec.state_gib_per_gpu * 1024.0
        filled = share_mib * float(rng.uniform(0.55, 0.95))
        peak = min(0.95 * share_mib, max(filled, CONTEXT_MIB + 1.2 * state_mib))
        return UsageProfile(round(sm, 2), round(0.92 * peak, 1), round(peak, 1))
    lo, hi = (40.0, 90.0) if spec.kind is JobKind.OFFLINE else (10.0, 40.0)
    sm = float(rng.uniform(lo, hi))
    mem = SERVING_MEM_FRACTION * share_mib
    return UsageProfile(round(sm, 2), round(mem, 1), round(mem, 1))


def base_p99_at(base_p99_ms: float, updates: tuple[LatencyUpdate, ...], t_s: float) -> float:
    """A replica's base p99 at t_s: the last update at or before it, else the declared one."""
    out = base_p99_ms
    for u in updates:
        if u.at_s <= t_s:
            out = u.base_p99_ms
    return out


@dataclass
class Held:
    """One job's open interval on one placement (extended while it keeps it)."""

    start_s: float
    end_s: float
    placement: Placement
    share_milli: int


@dataclass
class Recorder:
    """What the simulator writes down for a review while it runs (see the module doc).
    Bucketed arrays are [node, gpu index, bucket]."""

    nodes: int
    width: int
    horizon_s: float
    bucket_s: float = 3600.0
    held: list[tuple[str, Held]] = field(default_factory=list)
    open: dict[str, Held] = field(default_factory=dict)
    waits: dict[str, list[tuple[float, str]]] = field(default_factory=lambda: defaultdict(list))
    node_status: list[tuple[float, int, bool]] = field(default_factory=list)
    """(time, node, up) each time a cloud node left or joined the pool."""
    energy_j: np.ndarray = field(init=False)
    temp_cs: np.ndarray = field(init=False)
    temp_seen: bool = False
    serving: dict[str, np.ndarray] = field(default_factory=dict)
    """Per service, per bucket: requests, requests within capacity, capacity (requests),
    request-weighted p99 sum."""

    def __post_init__(self) -> None:
        self.buckets = max(1, math.ceil(self.horizon_s / self.bucket_s))
        self.energy_j = np.zeros((self.nodes, self.width, self.buckets))
        self.temp_cs = np.zeros((self.nodes, self.width, self.buckets))

    def bucket(self, t_s: float) -> int:
        return min(self.buckets - 1, max(0, int(t_s // self.bucket_s)))

    def hold(self, job_id: str, placement: Placement, share_milli: int, a: float, b: float) -> None:
        """The job held `placement` over [a, b) (clipped to the horizon by the caller)."""
        cur = self.open.get(job_id)
        if (
            cur is not None
            and abs(cur.end_s - a) < 1e-9
            and (cur.placement is placement or cur.placement == placement)
            and cur.share_milli == share_milli
        ):
            cur.end_s = b
            return
        if cur is not None:
            self.held.append((job_id, cur))
        self.open[job_id] = Held(a, b, placement, share_milli)

    def intervals(self) -> list[tuple[str, Held]]:
        """Every closed and open interval, in the order they began."""
        out = self.held + list(self.open.items())
        return sorted(out, key=lambda x: (x[1].start_s, x[0]))

    def wait(self, job_id: str, at: float, code: str) -> None:
        self.waits[job_id].append((at, code))

    def energy(self, node: int, gpus: tuple[int, ...], t_s: float, joules_each: float) -> None:
        if joules_each > 0:
            b = self.bucket(t_s)
            for g in gpus:  # item by item: far cheaper than a fancy index for a few cards
                self.energy_j[node, g, b] += joules_each

    def idle_energy(self, t_s: float, joules: np.ndarray) -> None:
        """Per card, the idle draw of its unheld part over one cycle."""
        self.energy_j[:, :, self.bucket(t_s)] += joules

    def temperature(self, t_s: float, temps_c: np.ndarray, dt_s: float) -> None:
        self.temp_seen = True
        self.temp_cs[:, :, self.bucket(t_s)] += temps_c * dt_s

    def served(
        self, service: str, t_s: float, dt_s: float, load_rps: float, capacity: float, p99: float
    ) -> None:
        """One cycle of a service: its load, what its replicas could serve within the SLO
        (requests), and the p99 its requests saw."""
        row = self.serving.get(service)
        if row is None:
            row = self.serving[service] = np.zeros((self.buckets, 4))
        b = self.bucket(t_s)
        requests = load_rps * dt_s
        row[b, 0] += requests
        row[b, 1] += min(requests, capacity)
        row[b, 2] += capacity
        row[b, 3] += requests * p99

"""The live service's telemetry history: what each card measured and each service served,
as per-bucket means (1 minute by default), kept 45 days and bounded on disk.

The monthly review ties what each job was given to what it used; the loop's samples
(every second) are far too many to keep, so `MinuteMeans` folds them into one mean per card
and bucket (with the count of samples it is of), and once a bucket has closed
`TelemetryHistory` writes every card's row and every service's p99 and rate for it in one
batch. Pruning deletes the oldest rows first: those older than the retention, then any
beyond the row cap (cards x buckets in the retention, never more than `max_rows`), a bounded
number per bucket so one prune is a short transaction.

A full or read-only disk, or a write that fails, costs the bucket being written and
nothing else: the loop goes on, the next bucket is written when the disk is back. The
history is written without the loop's database retries (a locked database must not hold
scheduling for telemetry).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpupool.domain.lifecycle import JobState
from gpupool.energy.tariff import load_tariff
from gpupool.errors import SpecError
from gpupool.ports.telemetry.base import GpuSample
from gpupool.server.loop.diskspace import DiskFloor, DiskProbe
from gpupool.server.store import FleetGpu, GpuMinute, ServiceMinute, Store
from gpupool.server.telemetry.replica_load import Measured
from gpupool.specfile import SpecReader, config_section

if TYPE_CHECKING:
    from gpupool.domain.model import Cluster
    from gpupool.ports.clock.base import Clock
    from gpupool.ports.telemetry.base import GpuInfo
    from gpupool.scheduler import Scheduler
    from gpupool.scheduler.config import SchedulerConfig
    from gpupool.server.telemetry.replica_load import Scraper

log = logging.getLogger("gpupool.server")

SECTION = "history"
"""The --config file's section for the history (beside the scheduling keys)."""
KEYS = frozenset({"bucket_s", "retention_days", "max_rows", "prune_batch"})
REVIEW_SETTING = "review"
"""The service_settings key under which the service stores what the review reads."""


@dataclass(frozen=True)
class HistoryConfig:
    """The `history:` section of `gpupool serve --config FILE` (docs/review-sources.md)."""

    bucket_s: float = 60.0
    """Samples are kept as means over buckets this long."""
    retention_days: float = 45.0
    """Buckets older than this are pruned."""
    max_rows: int = 5_000_000
    """Hard cap on each history table's rows, whatever the fleet's size (~100 bytes each)."""
    prune_batch: int = 5000
    """At most this many rows are deleted per table per bucket."""

    def __post_init__(self) -> None:
        if not self.bucket_s > 0 or not self.retention_days > 0:
            raise SpecError(
                f"history: bucket_s and retention_days must be positive, got {self.bucket_s} "
                f"and {self.retention_days}"
            )
        if self.max_rows < 1 or self.prune_batch < 1:
            raise SpecError(
                f"history: max_rows and prune_batch must be at least 1, got {self.max_rows} "
                f"and {self.prune_batch}"
            )

    @property
    def retention_s(self) -> float:
        return self.retention_days * 86_400.0

    def row_cap(self, series: int) -> int:
        """Rows `series` cards (or services) fill in the retention, plus one bucket each of
        slack, never above `max_rows`."""
        per = math.ceil(self.retention_s / self.bucket_s) + 1
        return max(1, min(self.max_rows, max(series, 1) * per))


def parse_history(raw: Any, path: str) -> HistoryConfig:
    if raw is None:
        return HistoryConfig()
    body = SpecReader(path).mapping(raw, SECTION, KEYS)
    try:
        return HistoryConfig(
            bucket_s=float(body.get("bucket_s", 60.0)),
            retention_days=float(body.get("retention_days", 45.0)),
            max_rows=int(body.get("max_rows", 5_000_000)),
            prune_batch=int(body.get("prune_batch", 5000)),
        )
    except (TypeError, ValueError) as err:
        raise SpecError(f"{path}: {SECTION}: {err}") from None


def load_history(path: Path | None) -> HistoryConfig:
    """The `history:` section of the --config file (defaults when absent)."""
    return parse_history(config_section(path, SECTION), str(path))


@dataclass
class _Sums:
    n: int = 0
    mem: float = 0.0
    sm: float = 0.0
    power: float = 0.0
    power_n: int = 0
    temp: float = 0.0
    temp_n: int = 0


@dataclass
class MinuteMeans:
    """Raw samples folded into per-card bucket means; fed times, it reads no clock."""

    bucket_s: float = 60.0
    open: dict[tuple[float, str], _Sums] = field(default_factory=dict)

    def bucket_of(self, t_s: float) -> float:
        return math.floor(t_s / self.bucket_s) * self.bucket_s

    def add(
        self,
        gpu_id: str,
        t_s: float,
        mem_used_mib: float,
        sm_util_pct: float,
        power_w: float | None = None,
        temp_c: float | None = None,
    ) -> None:
        acc = self.open.setdefault((self.bucket_of(t_s), gpu_id), _Sums())
        acc.n += 1
        acc.mem += mem_used_mib
        acc.sm += sm_util_pct
        if power_w is not None and math.isfinite(power_w):
            acc.power += power_w
            acc.power_n += 1
        if temp_c is not None and math.isfinite(temp_c):
            acc.temp += temp_c
            acc.temp_n += 1

    def closed(self, now_s: float) -> list[GpuMinute]:
        """The buckets that ended by `now_s`, oldest first (and forgotten here)."""
        done = sorted(k for k in self.open if k[0] + self.bucket_s <= now_s + 1e-9)
        out = []
        for key in done:
            acc = self.open.pop(key)
            out.append(
                GpuMinute(
                    gpu_id=key[1],
                    t_s=key[0],
                    period_s=self.bucket_s,
                    samples=acc.n,
                    mem_used_mib=acc.mem / acc.n,
                    sm_util_pct=acc.sm / acc.n,
                    power_w=acc.power / acc.power_n if acc.power_n else None,
                    temp_c=acc.temp / acc.temp_n if acc.temp_n else None,
                )
            )
        return out


Measure = Callable[[list[str], float, float], Measured]
"""(replica job ids, now, window) -> what they served over the window (the scraper's)."""


class TelemetryHistory:
    """Writes the history of one service: its cards' bucket means and its services' p99
    and rate, one batch per bucket, and prunes the oldest rows."""

    def __init__(
        self,
        config: HistoryConfig,
        store: Store,
        gpu_of: Mapping[int, str],
        disk: DiskProbe | None = None,
        floor: DiskFloor | None = None,
        measure: Measure | None = None,
        record: Callable[[float], None] | None = None,
    ) -> None:
        """`gpu_of`: telemetry index -> gpu_id ("node/index"); `store` without retries;
        `record(now)` stores the fleet and the review's settings: tried with the first
        bucket, and again with each next one until it succeeds (a full disk at start-up
        must not keep the service from starting)."""
        self.config = config
        self.store = store
        self.gpu_of = dict(gpu_of)
        self.disk = disk
        self.floor = floor or DiskFloor()
        self.measure = measure
        self.means = MinuteMeans(config.bucket_s)
        self.last_at: float | None = None
        self.next_close: float | None = None
        self.written = 0
        """Buckets written."""
        self.dropped = 0
        """Buckets lost to a full disk or a failed write."""
        self.error: str | None = None
        """Why the last bucket was dropped (None once one is written again)."""
        self.services = 1
        self.record = record

    def observe(self, samples: Sequence[GpuSample]) -> None:
        """A new set of samples (the loop's latest; a set seen before is skipped)."""
        if not samples:
            return
        at = max(s.at_s for s in samples)
        if self.last_at is not None and at <= self.last_at:
            return
        self.last_at = at
        for s in samples:
            gpu_id = self.gpu_of.get(s.index)
            if gpu_id is None or not s.healthy:
                continue
            self.means.add(gpu_id, s.at_s, s.mem_used_mib, s.util_pct, s.power_w, s.temp_c)

    def step(
        self, now_s: float, samples: Sequence[GpuSample], replicas: Mapping[str, list[str]]
    ) -> None:
        """Fold the samples in; once a bucket has closed, write it (and prune)."""
        self.observe(samples)
        bucket = self.config.bucket_s
        if self.next_close is None:
            self.next_close = self.means.bucket_of(now_s) + bucket
        if now_s + 1e-9 < self.next_close:
            return
        start = self.next_close - bucket
        self.next_close = self.means.bucket_of(now_s) + bucket
        rows = self.means.closed(now_s)
        served: list[ServiceMinute] = []
        if self.measure is not None:
            for name, ids in sorted(replicas.items()):
                load = self.measure(ids, now_s, bucket)
                if load.reporting and load.p99_ms is not None:
                    served.append(
                        ServiceMinute(name, start, bucket, load.p99_ms, load.rps, load.reporting)
                    )
        self.services = max(self.services, len(replicas))
        self.write(rows, served)

    def write(self, rows: Sequence[GpuMinute], served: Sequence[ServiceMinute]) -> bool:
        """One bucket's batch; False (and the bucket dropped) on a full disk or a failure."""
        if not rows and not served:
            return True
        problem = self.floor.problem(self.disk.space()) if self.disk is not None else None
        try:
            if problem is not None:
                raise OSError(problem)
            if self.record is not None:
                self.record(max([r.t_s for r in rows] + [r.t_s for r in served]))
                self.record = None
            self.store.history.add(rows, served)
        except Exception as err:  # the loop goes on; only this bucket is lost
            self.dropped += 1
            first = self.error is None
            self.error = f"telemetry history: bucket dropped: {type(err).__name__}: {err}"[:500]
            if first:
                log.warning("%s", self.error)
            return False
        self.written += 1
        self.error = None
        self.prune(max([r.t_s for r in rows] + [r.t_s for r in served]))
        return True

    def prune(self, now_s: float) -> None:
        cfg = self.config
        try:
            self.store.history.prune(
                now_s - cfg.retention_s,
                cfg.row_cap(len(self.gpu_of)),
                cfg.row_cap(self.services),
                cfg.prune_batch,
            )
        except Exception as err:  # pruned next bucket instead
            log.warning("telemetry history: prune failed: %s: %s", type(err).__name__, err)


class LiveSettings(Protocol):
    """The live service's configuration, as far as the history reads it."""

    @property
    def scheduling(self) -> SchedulerConfig: ...

    @property
    def history(self) -> HistoryConfig: ...

    @property
    def disk_floor(self) -> DiskFloor: ...


class LiveSource(Protocol):
    """What the history reads of the live service (`LiveService` is one), so that the
    history depends on these names and not on the driver: its fleet (cluster, devices,
    telemetry indices, GPU facts), its core (the catalogue), its settings, and where it
    writes (the store without retries, the disk, the clock, the replicas' scraper)."""

    @property
    def config(self) -> LiveSettings: ...

    @property
    def cluster(self) -> Cluster: ...

    @property
    def devices(self) -> Mapping[tuple[int, int], int]: ...

    @property
    def tele_index(self) -> Mapping[tuple[int, int], int]: ...

    @property
    def gpu_info(self) -> Mapping[int, GpuInfo]: ...

    @property
    def scheduler(self) -> Scheduler: ...

    @property
    def raw_store(self) -> Store: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def disk(self) -> DiskProbe: ...

    @property
    def scraper(self) -> Scraper: ...


def fleet_of(live: LiveSource) -> list[FleetGpu]:
    """The cards of a live service as the review names them (job rows' node and index)."""
    out = []
    for (k, g), dev in sorted(live.devices.items()):
        node = live.cluster.nodes[k]
        tele = live.tele_index.get((k, g))
        info = live.gpu_info.get(tele) if tele is not None else None
        mem = info.mem_total_mib if info is not None else 0
        gpu_id = f"{node.name}/{dev}"
        out.append(FleetGpu(gpu_id, node.name, dev, node.gpu_model, node.cluster, mem))
    return out


def review_settings(live: LiveSource) -> dict[str, Any]:
    """What the review needs of the service's configuration, stored beside the history."""
    sched = live.config.scheduling
    tariff: dict[str, Any] | None = None
    if sched.energy.tariff is not None:
        t = load_tariff(sched.energy.tariff)  # the service loaded it already: it exists
        tariff = {
            "name": t.name,
            "currency": t.currency,
            "price_per_kwh": list(t.price_per_kwh),
            "carbon_g_per_kwh": list(t.carbon_g_per_kwh or ()),
            "utc_offset_h": t.utc_offset_h,
        }
    catalog = live.scheduler.fleet.catalog
    models = {n.gpu_model for n in live.cluster.nodes}
    prices = {m: catalog[m].price_usd_per_hour for m in models if catalog and m in catalog}
    return {
        "teams": [
            {"team": t.team, "guaranteed": dict(t.guaranteed), "max": dict(t.maximum)}
            for t in sched.teams
        ],
        "tariff": tariff,
        "pue": sched.energy.pue,
        "gpu_price_per_hour": dict(sorted(prices.items())),
        "bucket_s": live.config.history.bucket_s,
    }


def attach(live: LiveSource) -> TelemetryHistory:
    """The history of `live`: its fleet and settings recorded now, its buckets as it runs."""
    fleet = fleet_of(live)
    settings = review_settings(live)

    def record(now_s: float) -> None:
        live.raw_store.nodes.record_fleet(fleet, now_s)
        live.raw_store.settings.put(REVIEW_SETTING, settings, now_s)

    pending: Callable[[float], None] | None = record
    try:
        record(live.clock.now())
        pending = None
    except Exception as err:  # a full disk at start-up: tried again with each bucket
        log.warning("telemetry history: fleet not recorded yet: %s: %s", type(err).__name__, err)
    gpu_of = {
        tele: f"{live.cluster.nodes[k].name}/{live.devices[(k, g)]}"
        for (k, g), tele in live.tele_index.items()
    }
    return TelemetryHistory(
        live.config.history,
        live.raw_store,
        gpu_of,
        live.disk,
        live.config.disk_floor,
        live.scraper.measure,
        pending,
    )


def running_replicas(scheduler: Scheduler, ports: Mapping[str, object]) -> dict[str, list[str]]:
    """Each service's running replicas that serve on a known port (what is scraped)."""
    return {
        name: [
            job_id
            for job_id, r in scheduler.replicas.get(name, {}).items()
            if r.state is JobState.RUNNING and job_id in ports
        ]
        for name in scheduler.services
    }

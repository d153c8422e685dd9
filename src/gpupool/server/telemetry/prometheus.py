"""/metrics through prometheus_client: what the live service knows, read at scrape time.

Every app has its own CollectorRegistry (several apps and servers share a test process, and
the global registry would mix them). One Collector turns the live views into metric
families when Prometheus scrapes: the per-GPU gauges under the DCGM exporter's names and
labels (so dashboards built for the exporter work unchanged), the jobs, queue, monitor
signals and nodes under gpupool_ names, and two histograms the service fills as jobs start:
how long each start waited in the queue, and how long a job took from submission to its
first start, both by job kind. The library writes HELP, TYPE and escaped labels.
The list of metrics, with types and labels, is docs/metrics.md.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpupool.errors import NotFoundError

if TYPE_CHECKING:
    from gpupool.server.store import Store

__all__ = [
    "CONTENT_TYPE_LATEST",
    "DCGM_LABELS",
    "DCGM_NAMES",
    "QUEUE_WAIT",
    "START_BUCKETS_S",
    "SUBMIT_TO_START",
    "MetricsSource",
    "ServiceCollector",
    "StartLatency",
    "dcgm_name",
    "metrics_registry",
    "render_metrics",
]

QUEUE_WAIT: Final = "gpupool_queue_wait_seconds"
SUBMIT_TO_START: Final = "gpupool_submit_to_start_seconds"
START_BUCKETS_S: Final = (
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 43200.0, 86400.0,
)  # fmt: skip
"""From a scheduler cycle (tens of ms) to a job that waited a day for its team's window."""

DCGM_LABELS: Final = ("gpu", "UUID", "modelName", "Hostname")
"""The DCGM exporter's labels on every per-GPU gauge, in its order."""

DCGM_NAMES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "mem_used_mib": "DCGM_FI_DEV_FB_USED",
        "mem_free_mib": "DCGM_FI_DEV_FB_FREE",
        "util_pct": "DCGM_FI_DEV_GPU_UTIL",
        "mem_util_pct": "DCGM_FI_DEV_MEM_COPY_UTIL",
        "temp_c": "DCGM_FI_DEV_GPU_TEMP",
        "power_w": "DCGM_FI_DEV_POWER_USAGE",
        "power_limit_w": "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        "sm_clock_mhz": "DCGM_FI_DEV_SM_CLOCK",
        "mem_clock_mhz": "DCGM_FI_DEV_MEM_CLOCK",
        "ecc_uncorrected": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    }
)
"""Sample field -> DCGM exporter metric (facts.md §2.6), in the exporter's units."""

_DCGM_ALIASES: Final = {"free": "mem_free_mib", "mem_free": "mem_free_mib"}


def dcgm_name(field: str) -> str:
    """The DCGM exporter name of a sample field, so /metrics matches existing dashboards."""
    key = _DCGM_ALIASES.get(field, field)
    try:
        return DCGM_NAMES[key]
    except KeyError:
        raise NotFoundError(
            f"no DCGM metric for field {field!r}; fields with one: {', '.join(DCGM_NAMES)}"
        ) from None


_GPU_GAUGES: Final = (
    ("mem_used_mib", "Framebuffer memory used (MiB)."),
    ("util_pct", "GPU utilisation (%)."),
    ("temp_c", "GPU temperature (C)."),
    ("power_w", "Power draw (W)."),
    ("power_limit_w", "Power management limit (W)."),
    ("sm_clock_mhz", "SM clock (MHz)."),
    ("mem_clock_mhz", "Memory clock (MHz)."),
    ("ecc_uncorrected", "Uncorrectable (double-bit) volatile ECC errors."),
)


class StartLatency:
    """The two start histograms, by job kind: filled by the live service as each job's
    process starts, read by every app's collector. Not registered anywhere itself."""

    def __init__(self) -> None:
        self.queue_wait = Histogram(
            QUEUE_WAIT,
            "Time a job waited in the queue before it started or resumed, by job kind.",
            ("kind",),
            registry=None,
            buckets=START_BUCKETS_S,
        )
        self.submit_to_start = Histogram(
            SUBMIT_TO_START,
            "Time from a job's submission to its first start, by job kind.",
            ("kind",),
            registry=None,
            buckets=START_BUCKETS_S,
        )

    def started(self, kind: str, waited_s: float, since_submit_s: float | None) -> None:
        """One start: `waited_s` since it (last) became runnable; `since_submit_s` since it
        was submitted, None for a resume (only a first start counts there)."""
        self.queue_wait.labels(kind).observe(max(0.0, waited_s))
        if since_submit_s is not None:
            self.submit_to_start.labels(kind).observe(max(0.0, since_submit_s))

    def collect(self) -> Iterator[Metric]:
        yield from self.queue_wait.collect()
        yield from self.submit_to_start.collect()


class MetricsSource(Protocol):
    """What /metrics reads of the live service (its `Views` are one), so that the
    exposition depends on these two names and not on the driver."""

    def cluster_view(self) -> dict[str, Any]:
        """The nodes, their GPUs' latest readings, the queue and the monitor's signals."""
        ...

    @property
    def start_latency(self) -> StartLatency: ...


class ServiceCollector(Collector):
    """The live service's state as metric families, computed at each scrape."""

    def __init__(self, service: MetricsSource, store: Store) -> None:
        self.service = service
        self.store = store

    def collect(self) -> Iterator[Metric]:
        view = self.service.cluster_view()
        yield from _gpu_gauges(view)
        jobs = GaugeMetricFamily(
            "gpupool_jobs", "Jobs by team, kind and state.", labels=("team", "kind", "state")
        )
        for (team, kind, state), n in sorted(self.store.jobs.counts().items()):
            jobs.add_metric((team, kind, state), n)
        yield jobs
        signals = view["signals"]
        yield GaugeMetricFamily(
            "gpupool_gpus_reclaimable",
            "GPUs the monitor finds idle enough to give back (its reclaimable signal).",
            value=len(signals["reclaimable"]),
        )
        yield GaugeMetricFamily(
            "gpupool_scale_out",
            "1 while the monitor asks for more GPUs (its scale-out signal), else 0.",
            value=int(signals["scale_out"]),
        )
        yield GaugeMetricFamily(
            "gpupool_queue_pending",
            "Jobs waiting in the queue (pending or suspended).",
            value=view["queue"]["pending"],
        )
        nodes = view["nodes"]
        yield GaugeMetricFamily(
            "gpupool_nodes_unhealthy",
            "Nodes lost or unhealthy now.",
            value=sum(1 for n in nodes if n["state"] in ("lost", "unhealthy")),
        )
        yield GaugeMetricFamily(
            "gpupool_gpus_out",
            "GPUs out of the pool as unhealthy (XID, ECC errors, lost) on nodes that work on.",
            value=sum(len(n.get("gpus_out") or []) for n in nodes),
        )
        up = GaugeMetricFamily(
            "gpupool_node_up",
            "1 while the node takes work (its state label says why not).",
            labels=("node", "site", "state"),
        )
        lost = CounterMetricFamily(
            "gpupool_node_lost",
            "Times the node left the cluster or lost its jobs.",
            labels=("node",),
        )
        for n in nodes:
            up.add_metric((n["name"], n["site"], n["state"]), int(n["state"] == "up"))
            lost.add_metric((n["name"],), n["lost_total"])
        yield up
        yield lost
        yield from self.service.start_latency.collect()


def _gpu_gauges(view: dict[str, Any]) -> Iterator[Metric]:
    """The DCGM exporter's per-GPU gauges; a GPU without a sample yet is left out."""
    gpus = [(node, g) for node in view["nodes"] for g in node["gpus"]]

    def labels(node: dict[str, Any], g: dict[str, Any]) -> tuple[str, ...]:
        return (str(g["index"]), g["uuid"] or "", str(g["model"]), node["name"])

    for field, doc in _GPU_GAUGES:
        family = GaugeMetricFamily(dcgm_name(field), doc, labels=DCGM_LABELS)
        for node, g in gpus:
            if g[field] is not None:
                family.add_metric(labels(node, g), float(g[field]))
        yield family
    free = GaugeMetricFamily(
        dcgm_name("mem_free_mib"), "Framebuffer memory free (MiB).", labels=DCGM_LABELS
    )
    for node, g in gpus:
        if g["mem_used_mib"] is not None and g["mem_total_mib"] is not None:
            free.add_metric(labels(node, g), g["mem_total_mib"] - g["mem_used_mib"])
    yield free


def metrics_registry(service: MetricsSource, store: Store) -> CollectorRegistry:
    """An app's own registry holding the service's collector (auto_describe off: nothing is
    collected until the first scrape)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServiceCollector(service, store))
    return registry


def render_metrics(registry: CollectorRegistry) -> bytes:
    """The Prometheus text exposition of a registry (content type CONTENT_TYPE_LATEST)."""
    return generate_latest(registry)

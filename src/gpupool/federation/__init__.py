"""Federation: several clusters in regions plus on-demand cloud capacity.

Pure logic only: the topology (sites, regions, data, links), where a job should run
(`choose_site`, and the locality-blind `blind_choice` baseline) and when to start or stop
cloud nodes (`BurstController`). The simulator drives them; see docs/federation.md.
"""

from gpupool.federation.burst import BURST, RECLAIM, BurstController, BurstEvent, BurstRules
from gpupool.federation.placement import (
    JOB_KINDS,
    FedJob,
    SiteDecision,
    SiteOption,
    blind_choice,
    choose_site,
    fmt_duration,
)
from gpupool.federation.topology import (
    DEFAULT_INTRA_REGION_LATENCY_MS,
    SITE_KINDS,
    TOPOLOGY_KEYS,
    DataLocation,
    Link,
    Site,
    Topology,
    parse_topology,
)

__all__ = [
    "BURST",
    "DEFAULT_INTRA_REGION_LATENCY_MS",
    "JOB_KINDS",
    "RECLAIM",
    "SITE_KINDS",
    "TOPOLOGY_KEYS",
    "BurstController",
    "BurstEvent",
    "BurstRules",
    "DataLocation",
    "FedJob",
    "Link",
    "Site",
    "SiteDecision",
    "SiteOption",
    "Topology",
    "blind_choice",
    "choose_site",
    "fmt_duration",
    "parse_topology",
]

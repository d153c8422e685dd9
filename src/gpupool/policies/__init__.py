"""Policies are small plug-ins that return plans; the core validates them.

Placement policies (`placement/`) decide where a job goes, queue policies (`queue.py`)
which waiting job a trace replay offers next, cycle policies (`cycle/`) what a scheduling
cycle starts and preempts. All register by name in one registry (registry.py); importing
this package imports every built-in plug-in, so the CLI, the simulators and the live
service look them up alike.
"""

# Each module registers itself; this order is the order `gpupool policies` lists them in.
from gpupool.policies.placement import random_fit  # noqa: F401, I001
from gpupool.policies.placement import dot_product  # noqa: F401
from gpupool.policies.placement import gpu_clustering  # noqa: F401
from gpupool.policies.placement import gpu_packing  # noqa: F401
from gpupool.policies.placement import best_fit  # noqa: F401
from gpupool.policies.placement import fgd  # noqa: F401
from gpupool.policies.placement import consolidate  # noqa: F401
from gpupool.policies.placement import coolest_first  # noqa: F401
from gpupool.policies import queue  # noqa: F401
from gpupool.policies.cycle import fifo  # noqa: F401
from gpupool.policies.cycle import backfill  # noqa: F401
from gpupool.policies.cycle import priority_quota  # noqa: F401
from gpupool.policies.cycle import ordered  # noqa: F401
from gpupool.policies.contract import cycle_policy
from gpupool.policies.queue import queue_policy
from gpupool.policies.registry import (
    PolicyContext,
    cycle_names,
    placement_names,
    placement_policy,
    queue_names,
)

__all__ = [
    "PolicyContext",
    "cycle_names",
    "cycle_policy",
    "placement_names",
    "placement_policy",
    "queue_names",
    "queue_policy",
]

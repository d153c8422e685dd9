"""Policies are small plug-ins that return plans; the core validates them.

Placement policies decide where a job goes, queue policies which waiting job a trace
replay offers next, cycle policies what a scheduling cycle starts and preempts. All
register by name in one registry (registry.py); importing this package imports every
built-in plug-in, so the CLI, the simulators and the live service look them up alike.
"""

# Each module registers itself; this order is the order `gpupool policies` lists them in.
from gpupool.policies import random_fit  # noqa: F401, I001
from gpupool.policies import dot_product  # noqa: F401
from gpupool.policies import gpu_clustering  # noqa: F401
from gpupool.policies import gpu_packing  # noqa: F401
from gpupool.policies import best_fit  # noqa: F401
from gpupool.policies import fgd  # noqa: F401
from gpupool.policies import consolidate  # noqa: F401
from gpupool.policies import thermal  # noqa: F401
from gpupool.policies import queueing  # noqa: F401
from gpupool.policies import cycle  # noqa: F401
from gpupool.policies import ordered  # noqa: F401
from gpupool.policies.registry import (
    PolicyContext,
    cycle_names,
    cycle_policy,
    placement_names,
    placement_policy,
    queue_names,
    queue_policy,
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

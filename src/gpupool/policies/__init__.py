"""Policies are small plug-ins that return plans; the core validates them.

Placement policies decide where a job goes; queue policies decide which waiting job goes
next. Both register by name, so the CLI, the simulator and the live service look them up
the same way.
"""

from gpupool.policies.registry import (
    PolicyContext,
    placement_names,
    placement_policy,
    queue_names,
    queue_policy,
)

__all__ = [
    "PolicyContext",
    "placement_names",
    "placement_policy",
    "queue_names",
    "queue_policy",
]

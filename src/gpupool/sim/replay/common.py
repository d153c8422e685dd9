"""What the replay loops share: their result, the queues the core's ordering ranks, the
progress callback and the homogeneous cluster they replay on.

Its own module so the FIFO/SJF/SRTF loop (run.py) and the ordered one (ordered.py) both
import it, and neither imports the other back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpupool.domain.engine import DecisionLog
from gpupool.domain.model import Cluster, Node
from gpupool.errors import SpecError
from gpupool.sim.replay.metrics import ReplayMetrics

if TYPE_CHECKING:
    from gpupool.learning.guard import GuardChange
    from gpupool.learning.predictor import ModelInfo

ProgressFn = Callable[[int, int], None]
"""Told (done, total) as a replay goes, for a progress bar."""

RULE_QUEUES = ("las", "gittins", "learned")
"""Queues ranked by the core's LearnedOrdering (preemptive; ordered.py)."""


@dataclass
class ReplayResult:
    name: str
    nodes: int
    gpus_per_node: int
    queue: str
    policy: str
    metrics: ReplayMetrics
    log: DecisionLog
    node_names: tuple[str, ...]
    wall_s: float
    guard_changes: tuple[GuardChange, ...] = ()
    """learned: each change of the guard (cold, trusted, fallback), in time order."""
    retrains: tuple[ModelInfo, ...] = ()
    """learned: each model the predictor trained, in time order."""
    reservations: dict[str, float] = field(default_factory=dict)
    """backfill: the first reservation (start time) each blocked head was given."""
    trusted_s: float = 0.0
    """learned: seconds of the replay during which the guard let the model order jobs."""


def homogeneous_cluster(name: str, nodes: int, gpus_per_node: int, model: str = "gpu") -> Cluster:
    if nodes <= 0:
        raise SpecError(f"--nodes must be at least 1, got {nodes}")
    width = len(str(nodes - 1))
    return Cluster(
        name,
        tuple(
            Node(f"{name}-n{i:0{width}d}", model, gpus_per_node, 0, 0, cluster=name)
            for i in range(nodes)
        ),
    )

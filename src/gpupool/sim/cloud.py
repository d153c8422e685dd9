"""Cloud nodes that join on demand: the simulator's side of burst and reclaim.

A cloud site's nodes exist in the cluster state from the start but are down: their pool
masks exclude them, so nothing is placed there. The federation's BurstController decides
when to start nodes (they are billed from the request, and usable after the site's
spin-up delay) and when to hand idle ones back; this class carries that out and keeps
the bill.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from gpupool.core.state import BoolArray, ClusterState
from gpupool.federation.burst import BurstController, BurstEvent

DOWN, STARTING, UP = 0, 1, 2


@dataclass
class CloudFleet:
    controller: BurstController
    nodes: tuple[int, ...]
    """Cloud node indices, in the order they are started."""
    pool_of: Mapping[int, str]
    spinup_s: float
    price_usd_per_gpu_hour: Mapping[int, float]
    status: dict[int, int] = field(default_factory=dict)
    ready_at: dict[int, float] = field(default_factory=dict)
    billed_usd: float = 0.0
    up_gpu_s: float = 0.0
    events: list[BurstEvent] = field(default_factory=list)

    def __post_init__(self) -> None:
        for n in self.nodes:
            self.status[n] = DOWN

    def mask_out(self, pool_nodes: Mapping[str, BoolArray]) -> None:
        for n in self.nodes:
            pool_nodes[self.pool_of[n]][n] = self.status[n] == UP

    def up_mask(self, size: int) -> BoolArray:
        """Nodes that draw power: everything not a cloud node, and cloud nodes not down."""
        mask = np.ones(size, dtype=np.bool_)
        for n in self.nodes:
            mask[n] = self.status[n] != DOWN
        return mask

    def tick(
        self,
        now_s: float,
        dt_s: float,
        state: ClusterState,
        pool_nodes: Mapping[str, BoolArray],
        onprem_util: float,
        pending_gpus: int,
    ) -> list[BurstEvent]:
        for n in self.nodes:  # nodes whose spin-up ended join their pool
            if self.status[n] == STARTING and self.ready_at[n] <= now_s:
                self.status[n] = UP
                pool_nodes[self.pool_of[n]][n] = True
        up = [n for n in self.nodes if self.status[n] == UP]
        starting = [n for n in self.nodes if self.status[n] == STARTING]
        idle = [n for n in up if state.whole_free[n] == state.gpu_count[n]]
        gpus_up = sum(int(state.gpu_count[n]) for n in up)
        used = sum(int(state.gpu_count[n] - state.whole_free[n]) for n in up)
        cloud_util = used / gpus_up if gpus_up else 0.0
        events = self.controller.observe(
            now_s, onprem_util, pending_gpus, len(up), len(starting), cloud_util, len(idle)
        )
        for ev in events:
            if ev.action == "burst":
                down = [n for n in self.nodes if self.status[n] == DOWN][: ev.nodes]
                for n in down:
                    self.status[n] = STARTING
                    self.ready_at[n] = now_s + self.spinup_s
            else:
                for n in idle[: ev.nodes]:
                    self.status[n] = DOWN
                    pool_nodes[self.pool_of[n]][n] = False
        self.events += events
        for n in self.nodes:  # billed from the start request until handed back
            if self.status[n] != DOWN:
                gpus = int(state.gpu_count[n])
                self.up_gpu_s += gpus * dt_s
                self.billed_usd += gpus * dt_s * self.price_usd_per_gpu_hour[n] / 3600.0
        return events

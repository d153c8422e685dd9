"""Cloud burst and reclaim: cloud nodes start (Burst) when on-premises capacity stays
full or jobs keep waiting, and are handed back (Reclaim) once idle. The driver starts and
stops them and reports joins (NodeUp) and departures (NodeDown); the fleet keeps each
cloud node's status."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from gpupool.domain.engine import Engine
from gpupool.federation.burst import BurstController, BurstRules
from gpupool.scheduler.book import JobBook
from gpupool.scheduler.commands import Burst, Command, Reclaim
from gpupool.scheduler.cycle.base import CycleContext
from gpupool.scheduler.fleet import DOWN, STARTING, STOPPING, UP, Fleet
from gpupool.scheduler.jobs import WAITING


def burst_rules(raw: Mapping[str, Any] | BurstRules | None, max_nodes: int) -> BurstRules:
    """The scheduling section's burst rules (durations in minutes) for `max_nodes` nodes."""
    if isinstance(raw, BurstRules):
        return replace(raw, max_cloud_nodes=max_nodes)
    given = dict(raw or {})
    d = BurstRules(max_cloud_nodes=max_nodes)
    return BurstRules(
        util_threshold=float(given.get("util_threshold", d.util_threshold)),
        sustain_s=60.0 * float(given.get("sustain_min", d.sustain_s / 60.0)),
        pending_gpu_threshold=int(given.get("pending_gpus", d.pending_gpu_threshold)),
        pending_sustain_s=60.0
        * float(given.get("pending_sustain_min", d.pending_sustain_s / 60.0)),
        reclaim_util=float(given.get("reclaim_util", d.reclaim_util)),
        reclaim_sustain_s=60.0
        * float(given.get("reclaim_sustain_min", d.reclaim_sustain_s / 60.0)),
        nodes_per_burst=int(given.get("nodes_per_burst", d.nodes_per_burst)),
        max_cloud_nodes=max_nodes,
    )


class CloudBurst:
    """Reads `published.deferred` of the previous cycle (PriceDeferral runs later): work
    held for a price is not demand for cloud nodes."""

    name: ClassVar[str] = "cloud-burst"

    def __init__(
        self,
        book: JobBook,
        fleet: Fleet,
        engine: Engine,
        rules: Mapping[str, Any] | BurstRules | None,
    ) -> None:
        self.book = book
        self.fleet = fleet
        self.engine = engine
        nodes = fleet.cloud_nodes
        self.controller = BurstController(burst_rules(rules, len(nodes)))
        self.pools = frozenset(fleet.node_pool[k] for k in nodes)

    def run(self, ctx: CycleContext) -> list[Command]:
        fleet, book = self.fleet, self.book
        nodes, status = fleet.cloud_nodes, fleet.cloud_status
        now = ctx.now_s
        state = book.state
        onprem = np.ones(state.node_count, dtype=np.bool_)
        onprem[list(nodes)] = False
        gpus = int(state.gpu_count[onprem].sum())
        free = int(state.whole_free[onprem].sum())
        util = (gpus - free) / gpus if gpus else 0.0
        deferred = ctx.published.deferred
        waiting = sum(
            r.spec.gpu_count
            for r in book.active.values()
            if r.state in WAITING and r.gpu_type not in self.pools and r.job_id not in deferred
        )
        pending = max(0, waiting - free)
        up = [n for n in nodes if status[n] == UP]
        starting = [n for n in nodes if status[n] == STARTING]
        idle = [n for n in up if state.whole_free[n] == state.gpu_count[n]]
        gpus_up = sum(int(state.gpu_count[n]) for n in up)
        used = sum(int(state.gpu_count[n] - state.whole_free[n]) for n in up)
        cloud_util = used / gpus_up if gpus_up else 0.0
        events = self.controller.observe(
            now, util, pending, len(up), len(starting), cloud_util, len(idle)
        )
        out: list[Command] = []
        names = [n.name for n in fleet.cluster.nodes]
        for ev in events:
            if ev.action == "burst":
                down = [n for n in nodes if status[n] == DOWN][: ev.nodes]
                for n in down:
                    status[n] = STARTING
                out.append(Burst(tuple(names[n] for n in down), ev.reason))
            else:
                gone = idle[: ev.nodes]
                for n in gone:
                    status[n] = STOPPING
                    fleet.set_in_pool(n, False)
                out.append(Reclaim(tuple(names[n] for n in gone), ev.reason))
            self.engine.note(
                f"cloud-{ev.action}", now, f"{ev.action} {ev.nodes} node(s): {ev.reason}"
            )
            book.dirty = True
        return out

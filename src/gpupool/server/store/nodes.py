"""Nodes: which an admin drained, and every card the service ran on (the fleet the
telemetry history and the review name)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select

from gpupool.server.store.base import Repository, transaction
from gpupool.server.store.events import insert_event
from gpupool.server.store.rows import FleetGpu
from gpupool.server.store.tables import FleetGpuModel, NodeDrainModel


@dataclass(frozen=True)
class Nodes(Repository):
    """Node drains and the fleet's cards."""

    @transaction
    def drains(self) -> dict[str, tuple[float, str, str]]:
        """Drained nodes: name -> (since, by whom, why)."""
        with self.db.read() as s:
            return {m.node: (m.since_s, m.by, m.reason) for m in s.scalars(select(NodeDrainModel))}

    @transaction
    def set_drain(self, node: str, drained: bool, now_s: float, by: str, reason: str) -> bool:
        """Record (or clear) a node's drain; False when it already was (or was not)."""
        with self.db.write() as s:
            found = s.get(NodeDrainModel, node)
            if (found is not None) == drained:
                return False
            if drained:
                s.add(NodeDrainModel(node=node, since_s=now_s, by=by, reason=reason))
            else:
                s.delete(found)
            s.flush()
            kind = "node-drain" if drained else "node-undrain"
            insert_event(self.db, s, kind, reason, now_s, None, {"node": node, "by": by})
            return True

    @transaction
    def record_fleet(self, gpus: Sequence[FleetGpu], now_s: float) -> None:
        """The cards the service runs on now: new ones added, known ones marked seen."""
        with self.db.write() as s:
            for g in gpus:
                found = s.get(FleetGpuModel, g.gpu_id)
                if found is None:
                    s.add(
                        FleetGpuModel(
                            **{**dataclasses.asdict(g), "first_seen_s": now_s, "last_seen_s": now_s}
                        )
                    )
                else:
                    found.node, found.gpu_index, found.gpu_type = g.node, g.gpu_index, g.gpu_type
                    found.site, found.mem_total_mib = g.site, g.mem_total_mib
                    found.last_seen_s = now_s

    @transaction
    def fleet(self) -> list[FleetGpu]:
        with self.db.read() as s:
            return [
                FleetGpu(
                    m.gpu_id,
                    m.node,
                    m.gpu_index,
                    m.gpu_type,
                    m.site,
                    m.mem_total_mib,
                    m.first_seen_s,
                    m.last_seen_s,
                )
                for m in s.scalars(select(FleetGpuModel).order_by(FleetGpuModel.gpu_id))
            ]

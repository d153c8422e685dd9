"""What runs where, told to a fake fleet's telemetry (one with `set_load`), so that its
readings follow the jobs: a whole card as busy as the job declares, a shared card as busy
as the shares placed on it. Real telemetry has no `set_load`: nothing happens."""

from __future__ import annotations

from collections.abc import Callable

from gpupool.ports.telemetry.base import Telemetry
from gpupool.ports.telemetry.fake import declared_use
from gpupool.scheduler import Scheduler
from gpupool.server.loop.config import FleetMap
from gpupool.server.store import JobRow


class FakeLoad:
    def __init__(self, telemetry: Telemetry, scheduler: Scheduler, fleet: FleetMap) -> None:
        self.telemetry = telemetry
        self.scheduler = scheduler
        self.fleet = fleet

    def load(self, devices: tuple[int, ...], row: JobRow) -> None:
        """Tell a fake fleet what runs where."""
        set_load = getattr(self.telemetry, "set_load", None)
        if set_load is None:
            return
        if row.gpu_milli < 1000 or row.gpu_mem_mib is not None:
            self._load_shared(set_load)
            return
        sm_pct, mem_mib = declared_use(row.env) or (100.0, 1024)
        for dev in devices:
            set_load(dev, sm_pct, mem_mib)

    def _load_shared(self, set_load: Callable[..., None], leaving: str | None = None) -> None:
        """A fake card that jobs share is as busy as the shares placed on it: SM
        utilisation their share of it, memory their memory (or share of the card's)."""
        state = self.scheduler.state
        for (k, g), tele in self.fleet.tele_index.items():
            if not 0 < int(state.gpu_left[k, g]) < 1000:
                continue
            info = self.fleet.gpu_info.get(tele)
            card = info.mem_total_mib if info is not None else 0
            used = mem = 0
            for job_id, placement in state.placements.items():
                job = state.jobs[job_id]
                if job_id != leaving and any(
                    sh.node == k and g in sh.gpus for sh in placement.shares
                ):
                    used += job.gpu_milli
                    mem += job.gpu_mem_mib or -(-card * job.gpu_milli // 1000)
            set_load(tele, min(100.0, used / 10.0), min(mem, card))

    def unload(self, row: JobRow) -> None:
        """The job's cards are idle again (a shared card: as busy as the other sharers)."""
        set_load = getattr(self.telemetry, "set_load", None)
        if set_load is not None:
            for name, dev in row.gpus:
                key = self.fleet.key_of.get((name, dev))
                index = self.fleet.tele_index.get(key) if key is not None else None
                if index is None and not self.fleet.declared:
                    index = dev
                if index is not None:
                    set_load(index, 0.0, 0)
        if set_load is not None and (row.gpu_milli < 1000 or row.gpu_mem_mib is not None):
            self._load_shared(set_load, str(row.id))  # the other sharers still run

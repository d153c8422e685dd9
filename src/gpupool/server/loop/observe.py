"""What happened, told to the core: processes that ended (reap), the telemetry's readings
(sample: health, monitor rule, temperatures, usage), work done (progress) and the jobs
submitted since the last step (ingest).

Each is a stage of the loop's step. One job's exit or one new job that cannot be read is
reported on its own (`Faults.report`), so the others are still handled."""

from __future__ import annotations

import numpy as np

from gpupool.domain.lifecycle import JobState
from gpupool.ports.executor.base import Executor, Exit
from gpupool.ports.telemetry.base import Telemetry
from gpupool.scheduler import GpuTemps, GpuUsage, Progress, Resized, Scheduler
from gpupool.server.loop.carry_out import CarryOut
from gpupool.server.loop.config import FleetMap, LiveConfig, spec_of
from gpupool.server.loop.fake_load import FakeLoad
from gpupool.server.loop.faults import Faults, describe
from gpupool.server.loop.nodes import Nodes
from gpupool.server.loop.state import LoopState
from gpupool.server.loop.transitions import transition
from gpupool.server.store import TERMINAL, JobRow, Store
from gpupool.server.telemetry.monitor import MonitorRule
from gpupool.sizing.request_json import plan_request_from

LOST_PREFIX = "lost: "
"""The reason of a requeue because the job was lost: counted against `lost_retries`."""

RESIZE_EXITS = ("preempted", "killed", "lost")
"""How a resizing job's processes may leave (checkpointed, killed after the grace, gone):
each is relaunched on the new GPUs, resuming from its checkpoint."""


class Observer:
    def __init__(
        self,
        state: LoopState,
        config: LiveConfig,
        fleet: FleetMap,
        scheduler: Scheduler,
        store: Store,
        raw_store: Store,
        executor: Executor,
        telemetry: Telemetry,
        nodes: Nodes,
        carry_out: CarryOut,
        fake_load: FakeLoad,
        faults: Faults,
    ) -> None:
        self.state = state
        self.config = config
        self.fleet = fleet
        self.scheduler = scheduler
        self.store = store
        self.raw_store = raw_store
        self.executor = executor
        self.telemetry = telemetry
        self.nodes = nodes
        self.carry_out = carry_out
        self.fake_load = fake_load
        self.faults = faults
        self.monitor = MonitorRule(every_s=config.monitor_s)

    # ---- exits ---------------------------------------------------------------------------
    def reap(self, now: float) -> None:
        for ex in self.executor.poll(now):
            try:
                self._exited(ex, now)
            except Exception as err:  # one job's end must not hide the others'
                self.faults.report("reap", err, int(ex.job_id) if ex.job_id.isdigit() else None)

    def _exited(self, ex: Exit, now: float) -> None:
        job_id = int(ex.job_id)
        self.state.endpoints.pop(ex.job_id, None)  # a replica's port is free again
        row = self.store.jobs.get(job_id)
        if row.state in TERMINAL:
            return
        key = ex.job_id
        evicting = self.state.evicting
        self.fake_load.unload(row)
        running = ("running", "preempting")
        if self._ended_by_time_limit(ex, row, now):
            return
        resizing = self.state.resizing.pop(key, None) is not None
        if resizing and ex.job_id not in evicting and ex.outcome in RESIZE_EXITS:
            # Its processes left for a resize: the core frees what it lent and relaunches
            # it on its new GPUs (its Launch); it stays running, no preemption counted.
            self.carry_out.run(self.scheduler.observe(Resized(now, key)), now)
            return
        if ex.job_id in evicting:
            why = evicting.pop(ex.job_id)
            self.scheduler.lost(key, now, why)
            self._transition(job_id, "suspended", now, running, reason=why, exit_code=ex.exit_code)
        elif ex.outcome == "succeeded":
            self.scheduler.finished(key, now, JobState.FINISHED)
            self._transition(
                job_id, "succeeded", now, running, reason=ex.reason, exit_code=0, ended_at=now
            )
        elif ex.outcome in ("preempted", "killed"):
            self._transition(
                job_id,
                "suspended",
                now,
                ("preempting",),
                reason=f"preempted: {ex.reason}; resumes from its checkpoint",
                exit_code=ex.exit_code,
            )
            self.carry_out.run(self.scheduler.vacated(key, now), now)
        elif ex.outcome == "cancelled":
            self.scheduler.finished(key, now, JobState.CANCELLED)
            why = self.state.cancel_why.pop(key, "cancelled on request")
            self._transition(job_id, "cancelled", now, running, reason=why, ended_at=now)
        elif ex.outcome == "lost":
            self._lost(ex, row, now)
        elif row.retries < row.max_retries:
            self.scheduler.lost(key, now, ex.reason)
            self._transition(
                job_id,
                "suspended",
                now,
                running,
                reason=f"{ex.outcome}: {ex.reason}; retry {row.retries + 1} of {row.max_retries}",
                exit_code=ex.exit_code,
                retries=row.retries + 1,
            )
        else:
            self.scheduler.finished(key, now, JobState.FAILED)
            self._transition(
                job_id,
                "failed",
                now,
                running,
                reason=f"{ex.outcome}: {ex.reason}",
                exit_code=ex.exit_code,
                ended_at=now,
            )

    def _lost(self, ex: Exit, row: JobRow, now: float) -> None:
        """A job whose processes vanished: requeued up to `lost_retries` times, then
        failed; its node is in doubt until the probe clears it."""
        job_id, key, running = row.id, ex.job_id, ("running", "preempting")
        lost = self.raw_store.events.count(job_id, "suspended", LOST_PREFIX)
        limit = self.config.lost_retries
        if lost >= limit:
            self.scheduler.finished(key, now, JobState.FAILED)
            self._transition(
                job_id,
                "failed",
                now,
                running,
                reason=(
                    f"lost {lost + 1} times, more than the limit of {limit} requeues "
                    f"(gpupool serve --lost-retries): {ex.reason}. A job lost again and "
                    "again may be crashing its node or filling the state disk: read its "
                    "logs and checkpoint directory, fix it, and submit it again"
                ),
                ended_at=now,
            )
        else:
            self.scheduler.lost(key, now, ex.reason)
            self._transition(
                job_id,
                "suspended",
                now,
                running,
                reason=f"{LOST_PREFIX}{ex.reason} (requeue {lost + 1} of {limit})",
            )
        alive = self.nodes.alive()
        where = ex.node or row.node  # a gang member's node, else the job's
        if alive is not None and where is not None and where in self.fleet.node_names():
            # Its node is in doubt: nothing goes there until the probe clears it.
            self.nodes.node_down(where, alive.get(where), now, f"node {where}: {ex.reason}")

    def _ended_by_time_limit(self, ex: Exit, row: JobRow, now: float) -> bool:
        """The exit of a job stopped at its time limit: failed with the reason (one that
        finished within its grace has succeeded, as usual)."""
        why = self.scheduler.book.expiring.get(ex.job_id)
        if why is None or ex.outcome == "succeeded":
            return False
        self.scheduler.finished(ex.job_id, now, JobState.FAILED, why)
        self._transition(
            row.id,
            "failed",
            now,
            ("running", "preempting"),
            reason=why,
            exit_code=ex.exit_code,
            ended_at=now,
        )
        return True

    def _transition(
        self, job_id: int, to: str, now: float, expect: tuple[str, ...], **fields: object
    ) -> None:
        transition(self.store, job_id, to, now, expect, **fields)

    # ---- measurements --------------------------------------------------------------------
    def sample_due(self, now: float) -> bool:
        return now - self.state.last_sample >= self.config.sample_s

    def sample(self, now: float) -> None:
        """The telemetry's readings: the monitor rule, the core's temperatures (where
        thermal-aware) and usage, and each node's GPU health."""
        state = self.state
        state.last_sample = now
        state.samples = self.telemetry.sample(now)
        self.monitor.observe(state.samples)
        if self.config.scheduling.energy.thermal.aware:
            self.scheduler.observe(self._temps(now))
        self.scheduler.observe(self._usage(now))
        if self.monitor.due(now):
            signals = state.signals = self.monitor.evaluate(now)
            state.signals_at = now
            if signals.reclaimable or signals.scale_out:
                self.store.events.add(
                    "monitor",
                    f"reclaimable GPUs {list(signals.reclaimable)}; "
                    f"scale-out {'yes' if signals.scale_out else 'no'} "
                    f"(mean utilisation {signals.mean_util_pct:.0f}%)",
                    now,
                )
        self.nodes.check_health(state.samples, now)

    def _temps(self, now: float) -> GpuTemps:
        """Each GPU's measured temperature, [node, gpu] as the core counts them, and each
        node's inlet air as configured (a GPU without a reading counts as that air)."""
        inlet = self.scheduler.room_inlet_c()
        width = max(n.gpu_count for n in self.fleet.cluster.nodes)
        temps = np.repeat(inlet[:, None], width, axis=1)
        by_index = {s.index: s for s in self.state.samples}
        for (k, g), tele in self.fleet.tele_index.items():
            sample = by_index.get(tele)
            if sample is not None:
                temps[k, g] = sample.temp_c
        return GpuTemps(now, temps, inlet)

    def _usage(self, now: float) -> GpuUsage:
        """Each card's measured SM utilisation and memory, [node, gpu] as the core counts
        them (NaN and -1 where the telemetry has no reading): what sharing decides by."""
        shape = self.scheduler.state.gpu_left.shape
        util = np.full(shape, np.nan)
        used = np.full(shape, -1, dtype=np.int64)
        total = np.zeros(shape, dtype=np.int64)
        by_index = {s.index: s for s in self.state.samples}
        for (k, g), tele in self.fleet.tele_index.items():
            sample = by_index.get(tele)
            if sample is not None and sample.healthy:
                util[k, g] = sample.util_pct
                used[k, g] = sample.mem_used_mib
                total[k, g] = sample.mem_total_mib
        return GpuUsage(now, util, used, total)

    def progress(self, now: float) -> None:
        """Work done by running jobs, where the executor can tell (else the core
        estimates it from their start times)."""
        measure = getattr(self.executor, "progress", None)
        if measure is not None:
            self.scheduler.observe(Progress(now, measure(now)))

    # ---- arrivals ------------------------------------------------------------------------
    def ingest(self, now: float) -> None:
        """The jobs submitted since the last step join the core (one that cannot be
        scheduled, or cannot be placed on this fleet at all, fails with the reason)."""
        state = self.state
        for row in self.store.jobs.list(state="pending", after_id=state.seen_id, limit=10_000):
            state.seen_id = max(state.seen_id, row.id)
            if str(row.id) not in self.scheduler.records:
                try:
                    sized = plan_request_from(row.sizing) if row.sizing is not None else None
                    record = self.scheduler.submit(spec_of(row), now, sized=sized)
                except Exception as err:  # this job cannot be scheduled; the others can
                    self.faults.report("ingest", err, row.id)
                    self._transition(
                        row.id,
                        "failed",
                        now,
                        ("pending",),
                        reason=f"cannot be scheduled: {describe(err)}",
                        ended_at=now,
                    )
                    continue
                if record.state is JobState.UNPLACEABLE:
                    self._transition(
                        row.id,
                        "failed",
                        now,
                        ("pending",),
                        reason=f"Unplaceable: cannot run here: {record.end_reason}",
                        ended_at=now,
                    )

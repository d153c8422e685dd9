"""Carrying out the core's commands: through the executor (stop, cancel, resize and, by
`Launcher`, launch), the telemetry (power caps), the sites' cloud commands and the
database (each job's state and reason, with its event); and the purge of old jobs.

The order of the commands is kept; the launches between two other commands go out
together, and the waiting reasons of a cycle are written in one transaction. One
command's failure is reported and costs only that command."""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Sequence

from gpupool.ports.executor.base import Executor
from gpupool.ports.telemetry.base import Telemetry
from gpupool.scheduler import (
    Burst,
    Cancel,
    Command,
    Defer,
    Expire,
    Launch,
    Reclaim,
    Resize,
    Resized,
    Scale,
    Scheduler,
    SetPowerCap,
    Stop,
    Wait,
)
from gpupool.scheduler.commands import LearnGuard, LearnShadow
from gpupool.server.fleet.sites import CloudNodes
from gpupool.server.loop.config import FleetMap, LiveConfig
from gpupool.server.loop.faults import Faults, job_number
from gpupool.server.loop.gate import LaunchGate
from gpupool.server.loop.launch import Launcher
from gpupool.server.loop.learning import ShadowTally
from gpupool.server.loop.nodes import Nodes
from gpupool.server.loop.record import DecisionRecord
from gpupool.server.loop.state import LoopState
from gpupool.server.loop.transitions import transition, update
from gpupool.server.store import Store


class CarryOut:
    def __init__(
        self,
        state: LoopState,
        config: LiveConfig,
        fleet: FleetMap,
        scheduler: Scheduler,
        store: Store,
        executor: Executor,
        telemetry: Telemetry,
        cloud: CloudNodes | None,
        nodes: Nodes,
        launcher: Launcher,
        gate: LaunchGate,
        faults: Faults,
        record: DecisionRecord,
        shadow: ShadowTally,
    ) -> None:
        self.state = state
        self.config = config
        self.fleet = fleet
        self.scheduler = scheduler
        self.store = store
        self.executor = executor
        self.telemetry = telemetry
        self.cloud = cloud
        self.nodes = nodes
        self.launcher = launcher
        self.gate = gate
        self.faults = faults
        self.record = record
        self.shadow = shadow
        """Shadow cycles of the learned policy since start (counts; events are bounded)."""

    def run(self, commands: Sequence[Command], now: float) -> None:
        """Launches between two other commands go out together (an executor with
        `launch_many` starts them in parallel); the order of the commands is kept."""
        if self.record.commands is not None:
            self.record.commands += [(now, c) for c in commands]
        batch: list[Launch] = []
        waits: list[Wait] = []
        for c in commands:
            if isinstance(c, Launch):
                batch.append(c)
                continue
            if isinstance(c, Wait):
                waits.append(c)  # told together: one commit for a cycle's reasons
                continue
            self.launcher.launch_all(batch, now)
            batch = []
            self._waiting_all(waits, now)
            waits = []
            job_id = getattr(c, "job_id", None)
            try:
                self._command(c, now)
            except Exception as err:  # one command's failure must not drop the others
                self.faults.report(type(c).__name__.lower(), err, job_number(job_id))
        self.launcher.launch_all(batch, now)
        self._waiting_all(waits, now)

    def _command(self, c: Command, now: float) -> None:
        if isinstance(c, Stop):
            row = self.store.jobs.get(int(c.job_id))
            transition(
                self.store,
                row.id,
                "preempting",
                now,
                ("running",),
                reason=c.reason,
                preemptions=row.preemptions + 1,
            )
            self.executor.preempt(c.job_id, row.grace_s, now)
            self.record.decided(now, "preempt", c.job_id)
        elif isinstance(c, Scale):
            self.store.events.add(
                "service-scaled",
                f"service {c.service}: {c.text}",
                now,
                data={
                    "service": c.service,
                    "from": c.from_replicas,
                    "to": c.to_replicas,
                    "reason": c.reason,
                },
            )
            for job_id in c.dropped:  # replicas that never ran: they end here
                transition(
                    self.store,
                    int(job_id),
                    "cancelled",
                    now,
                    ("pending", "suspended"),
                    reason=f"{c.reason}: not needed any more, ended before it started",
                    ended_at=now,
                )
        elif isinstance(c, Resize):
            self._resize(c, now)
        elif isinstance(c, Cancel):
            self.state.cancel_why[c.job_id] = c.reason
            if c.job_id in self.executor.handles():
                self.executor.cancel(c.job_id, self.store.jobs.get(int(c.job_id)).grace_s, now)
        elif isinstance(c, SetPowerCap):
            self._power_cap(c, now)
        elif isinstance(c, Defer):
            until = time.strftime("%H:%M", time.localtime(c.until_s))
            update(
                self.store,
                int(c.job_id),
                now,
                ("pending", "suspended"),
                "deferred",
                reason=f"deferred until {until} ({c.reason})",
            )
        elif isinstance(c, Expire):
            self._expire(c, now)
        elif isinstance(c, Wait):
            self._waiting_all([c], now)
        elif isinstance(c, Burst):
            assert self.cloud is not None
            for name in c.nodes:
                self.store.events.add("cloud-burst", self.cloud.start(name, c.reason, now), now)
        elif isinstance(c, Reclaim):
            assert self.cloud is not None
            for name in c.nodes:  # out of the pool already: nothing starts there
                self.nodes.reclaimed(name, now)
                self.store.events.add("cloud-reclaim", self.cloud.stop(name, c.reason, now), now)
        elif isinstance(c, LearnShadow):  # a record only: nothing is carried out
            due = self.shadow.record(c)
            if due is not None:
                self.store.events.add("learn-shadow", due[0], now, data=due[1])
        elif isinstance(c, LearnGuard):
            self.store.events.add(
                "learn-guard",
                c.text,
                now,
                data={"state": c.state, "reason": c.reason, "learner": c.learner},
            )

    def _resize(self, c: Resize, now: float) -> None:
        """Checkpoint and stop an elastic job's processes (SIGTERM, its grace) to restart
        it on the GPUs the core gives it; recorded first, so a restart finishes it."""
        row = self.store.jobs.get(int(c.job_id))
        gpus = [
            (self.fleet.cluster.nodes[s.node].name, self.fleet.devices[(s.node, g)])
            for s in c.placement.shares
            for g in s.gpus
        ]
        update(
            self.store,
            row.id,
            now,
            ("running",),
            "resizing",
            reason=f"resizing: {c.reason}",
            resize_gpus=gpus,
        )
        self.state.resizing[c.job_id] = c.placement
        self.record.decided(now, "resize", c.job_id)
        if c.job_id not in self.executor.handles():  # its process is gone already
            self.state.resizing.pop(c.job_id, None)
            self.run(self.scheduler.observe(Resized(now, c.job_id)), now)
            return
        self.executor.resize(c.job_id, row.grace_s, now)

    def _power_cap(self, c: SetPowerCap, now: float) -> None:
        """A SetPowerCap of the core on the node and GPU it names (a reset included)."""
        node = self.fleet.cluster.nodes[c.node].name
        tele = self.fleet.tele_index.get((c.node, c.gpu))
        if tele is None:
            message = "no telemetry for this GPU: skipped"
        else:
            device = dataclasses.replace(c, node=0, gpu=tele)
            result = self.telemetry.apply(device)
            message = f"{'applied' if result.ok else 'skipped'} ({result.message})"
        holder = next(
            (
                job_id
                for job_id, p in self.scheduler.placements().items()
                if any(s.node == c.node and c.gpu in s.gpus for s in p.shares)
            ),
            None,
        )
        self.store.events.add(
            "power-cap",
            f"node {node} GPU {self.fleet.devices[(c.node, c.gpu)]}: {c.reason}: {message}",
            now,
            job_id=int(holder) if holder is not None and holder.isdigit() else None,
        )

    def _waiting_all(self, waits: Sequence[Wait], now: float) -> None:
        """Store why waiting jobs do not start, as `Code: sentence` (an empty reason:
        nothing holds them back), in one transaction. A Deferred job keeps the reason its
        Defer wrote (in local time); while the launch gate is closed a job's reason says
        that, and this one is what it gets back once the gate opens."""
        told: list[tuple[int, str, str | None]] = []
        codes: dict[int, str] = {}
        wait_codes = self.state.wait_codes
        for c in waits:
            if c.code == "Deferred":
                continue
            text = c.text or "waiting for GPUs"
            job_id = int(c.job_id)
            if self.gate.defer_reason(job_id, text):
                continue
            event = (
                "limit"
                if c.code in ("JobLimit", "CpuJobLimit")
                else ("wait-reason" if wait_codes.get(job_id) != c.code else None)
            )
            told.append((job_id, text, event))
            codes[job_id] = c.code
        if not told:
            return
        left = self.store.jobs.set_reasons(told, now)
        if len(wait_codes) + len(codes) > 100_000:  # bounded: at worst told twice
            wait_codes.clear()
        for job_id, code in codes.items():
            if job_id not in left:
                wait_codes[job_id] = code  # a new code is an event: the review's waits
        for job_id, state in left.items():
            if state is None:
                continue  # gone: nothing to tell it
            self.store.events.add(
                "error",
                f"job {job_id} is {state}, not pending or suspended; it changed meanwhile: "
                "read it again and decide anew",
                now,
                job_id=job_id,
            )

    def _expire(self, c: Expire, now: float) -> None:
        """A job past its time limit: SIGTERM, its grace, SIGKILL; failed once it left."""
        row = self.store.jobs.get(int(c.job_id))
        transition(
            self.store, row.id, "preempting", now, ("running",), reason=f"{c.reason}; stopping"
        )
        if c.job_id in self.executor.handles():
            self.executor.cancel(c.job_id, row.grace_s, now)

    def purge(self, now: float) -> None:
        """Delete jobs that ended before the retention (with their events and job
        directories) and older job-less events: a small batch per step while there are
        more, then again after purge_every_s."""
        cfg = self.config
        if cfg.retention_s is None or now < self.state.next_purge:
            return
        purged = self.store.jobs.purge(now - cfg.retention_s, cfg.purge_batch)
        for job_id in purged.job_ids:
            shutil.rmtree(cfg.run_dir(job_id), ignore_errors=True)
            shared = cfg.storage.checkpoint_dir(job_id)
            if shared is not None:
                shutil.rmtree(shared, ignore_errors=True)
            self.scheduler.forget(str(job_id))
        self.state.next_purge = now if purged.more else now + cfg.purge_every_s

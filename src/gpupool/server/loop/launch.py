"""Launches: the core's `Launch` decisions become processes.

Each job is first recorded as running (so a restart finds it), then started through the
executor (the launches of one batch together where the executor has `launch_many`), and
its process handle recorded twice: in a file beside its logs and in the database. A
launch that fails for the job fails it with the reason; one that fails for the machine
requeues it and backs launches off (`LaunchGate.launch_trouble`)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpupool.domain.lifecycle import JobState
from gpupool.domain.model import JobSpec
from gpupool.errors import GpupoolError, SpecError, Unavailable
from gpupool.ports.executor.base import (
    MULTI_NODE_REFUSED,
    NO_LIMITS,
    Executor,
    Gang,
    GangMember,
    Handle,
    JobUser,
    LaunchSpec,
)
from gpupool.ports.telemetry.base import Telemetry
from gpupool.ports.telemetry.fake import FakeTelemetry
from gpupool.scheduler import Launch, Scheduler
from gpupool.server.executors.mps import Mps, MpsError, ShareRequest, share_env
from gpupool.server.loop.config import FleetMap, LiveConfig
from gpupool.server.loop.endpoints import HOST_ENV, ReplicaPorts, held_at, node_address
from gpupool.server.loop.fake_load import FakeLoad
from gpupool.server.loop.faults import Faults, describe, environmental, job_number
from gpupool.server.loop.gate import LaunchGate
from gpupool.server.loop.record import DecisionRecord
from gpupool.server.loop.services import Services
from gpupool.server.loop.state import LoopState
from gpupool.server.loop.transitions import requeue, transition, update
from gpupool.server.store import JobRow, Store
from gpupool.server.telemetry.prometheus import StartLatency
from gpupool.server.telemetry.replica_load import Endpoint


@dataclass(frozen=True)
class _Prepared:
    """A launch recorded as running, waiting for its process."""

    decision: Launch
    row: JobRow
    spec: LaunchSpec
    node: str


class Launcher:
    def __init__(
        self,
        state: LoopState,
        config: LiveConfig,
        fleet: FleetMap,
        scheduler: Scheduler,
        store: Store,
        executor: Executor,
        telemetry: Telemetry,
        mps: Mps,
        services: Services,
        gate: LaunchGate,
        faults: Faults,
        record: DecisionRecord,
        start_latency: StartLatency,
        fake_load: FakeLoad,
    ) -> None:
        self.state = state
        self.config = config
        self.fleet = fleet
        self.scheduler = scheduler
        self.store = store
        self.executor = executor
        self.telemetry = telemetry
        self.mps = mps
        self.services = services
        self.gate = gate
        self.faults = faults
        self.record = record
        self.start_latency = start_latency
        """Queue wait and submit-to-start histograms by kind, observed as processes start."""
        self.fake_load = fake_load
        self.ports = ReplicaPorts(config.network.replica_ports)
        """Chooses each new replica's port."""

    def launch_all(self, batch: Sequence[Launch], now: float) -> None:
        if not batch:
            return
        self.state.stage = "launch"
        gate = self.state.gate
        if gate is not None:  # e.g. a claimant of a vacated job: it waits too
            for d in batch:
                if self.store.jobs.get(int(d.job_id)).state == "running":  # a resized job
                    requeue(self.scheduler, self.store, int(d.job_id), now, gate)
                else:
                    self.scheduler.lost(d.job_id, now, gate)
            return
        ready = []
        for d in batch:
            try:
                p = self._prepare(d, now)
            except Exception as err:
                try:
                    self._unstarted(d, err, now)
                except Exception as worse:  # not even that: the core requeues it at least
                    self.faults.report("launch", worse, job_number(d.job_id))
                    with contextlib.suppress(Exception):
                        self.scheduler.lost(d.job_id, now, f"could not start: {describe(err)}")
                continue
            if p is not None:
                ready.append(p)
        if not ready:
            return
        many = getattr(self.executor, "launch_many", None)
        results: list[Handle | BaseException]
        if self.fleet.declared and many is not None:
            try:
                results = many([(p.spec, p.node) for p in ready], now)
            except Exception as err:
                results = [err] * len(ready)
        else:
            results = [self._launch_one(p, now) for p in ready]
        for p, result in zip(ready, results, strict=True):
            try:
                self._started(p, result, now)
            except Exception as err:
                self.faults.report("launch", err, p.row.id)

    def _prepare(self, d: Launch, now: float) -> _Prepared | None:
        """Record the job as running (before its process exists, so a restart finds it)
        and build what the executor needs."""
        row = self.store.jobs.get(int(d.job_id))
        self.state.wait_codes.pop(row.id, None)  # its next wait's first code is an event again
        nodes, devices_of = self.fleet.cluster.nodes, self.fleet.devices
        shares = d.placement.shares
        devices = tuple(devices_of[(s.node, g)] for s in shares for g in s.gpus)
        node = nodes[shares[0].node].name
        attempt = row.attempts + 1
        svc = self.services.rows.get(row.service) if row.service is not None else None
        endpoint = self._endpoint(node) if svc is not None else None
        port = endpoint.port if endpoint is not None else None
        gpus = [[nodes[s.node].name, devices_of[(s.node, g)]] for s in shares for g in s.gpus]
        if row.state == "running":  # an elastic job's relaunch after a resize
            update(
                self.store,
                row.id,
                now,
                ("running",),
                "resized",
                reason=f"{d.note}; resumed from its checkpoint" if d.note else "resized",
                gpus=gpus,
                node=node,
                attempts=attempt,
                pid=None,
                pgid=None,
                start_ticks=None,
                resize_gpus=None,
            )
        else:
            transition(
                self.store,
                row.id,
                "running",
                now,
                ("pending", "suspended"),
                reason=("resumed" if d.resume else "started") + (f": {d.note}" if d.note else ""),
                gpus=gpus,
                node=node,
                attempts=attempt,
                started_at=row.started_at if row.started_at is not None else now,
                pid=None,
                pgid=None,
                start_ticks=None,
                resize_gpus=None,  # a resize cut short (lost, cancelled) is over
                port=port,
            )
        run_dir = self.config.run_dir(row.id)
        run_dir.mkdir(parents=True, exist_ok=True)
        # Who it runs as and what it may use: the executor's isolation policy, if any.
        isolation = getattr(self.executor, "isolation", None)
        user: JobUser | None = None
        refused: GpupoolError | None = None
        limits = NO_LIMITS
        if isolation is not None:
            limits = isolation.limits_for(row.team, row.kind)
            try:
                user = isolation.user_for(row.team)
            except GpupoolError as err:
                refused = err
        # On a fake fleet the job gets no GPU at all (CUDA_VISIBLE_DEVICES empty), even on
        # a machine that has real ones; it learns its fake GPUs from GPUPOOL_FAKE_GPUS.
        fake = isinstance(self.telemetry, FakeTelemetry)
        env = dict(row.env)
        if svc is not None and endpoint is not None:
            env[svc.port_env] = str(endpoint.port)
            env[HOST_ENV] = endpoint.host
            self.state.endpoints[d.job_id] = endpoint
        if fake:
            env["GPUPOOL_FAKE_GPUS"] = ",".join(str(x) for x in devices)
        if row.gpu_count_min is not None:  # elastic: how many it got this time
            env["GPUPOOL_GPU_COUNT"] = str(len(devices))
        visible: str | None = None
        if d.spec is not None and d.spec.shares_gpu:
            shared = self._share_env(d.spec, shares[0].node, shares[0].gpus[0], row.id, now)
            visible = shared.pop("CUDA_VISIBLE_DEVICES", None)
            env.update(shared)
        spec = LaunchSpec(
            job_id=d.job_id,
            attempt=attempt,
            argv=tuple(row.command),
            env=env,
            gpu_indices=() if fake and not self.fleet.declared else devices,
            run_dir=run_dir,
            resume=d.resume or row.attempts > 0,
            cwd=Path(row.cwd) if row.cwd else None,
            user=user,
            limits=limits,
            visible_devices=visible if not fake else None,
            checkpoint_dir=self.config.storage.checkpoint_dir(row.id),
        )
        if self.fleet.declared and len({s.node for s in shares}) > 1:
            # Across nodes: a gang, one member per node, rank 0 on the first share's.
            members = tuple(
                GangMember(nodes[s.node].name, tuple(devices_of[(s.node, g)] for g in s.gpus))
                for s in shares
            )
            spec = dataclasses.replace(spec, gang=Gang(members, row.grace_s))
            if not getattr(self.executor, "runs_gangs", False):
                refused = refused or SpecError(
                    f"the core placed it on {len(shares)} nodes "
                    f"({', '.join(m.node for m in members)}); {MULTI_NODE_REFUSED}"
                )
        prepared = _Prepared(d, row, spec, node)
        if refused is not None:
            self._started(prepared, refused, now)
            return None
        return prepared

    def _endpoint(self, node: str) -> Endpoint:
        """Where a new replica on `node` listens: the node's address, and a port there
        that none of the server's running replicas holds (server/loop/endpoints.py)."""
        host = node_address(self.executor, node, self.config.network.node_address)
        return Endpoint(host, self.ports.choose(host, held_at(host, self.state.endpoints)))

    def _share_env(
        self, job: JobSpec, node: int, gpu: int, job_id: int, now: float
    ) -> dict[str, str]:
        """A sharing job's environment: its share, and MPS's limits where MPS runs (a
        daemon that will not start leaves the share advisory, said in the job's events)."""
        tele = self.fleet.tele_index.get((node, gpu))
        info = self.fleet.gpu_info.get(tele) if tele is not None else None
        card = info.mem_total_mib if info is not None and info.mem_total_mib > 0 else 0
        mem = job.gpu_mem_mib
        if mem is None:
            mem = -(-card * job.gpu_milli // 1000)
        share = ShareRequest(
            self.fleet.devices[(node, gpu)],
            info.uuid if info is not None else "",
            job.gpu_milli,
            mem,
        )
        try:
            return share_env(share, self.mps if info is not None and info.uuid else None)
        except MpsError as err:
            self.store.events.add(
                "mps", f"MPS not started ({err}); its GPU share is advisory", now, job_id=job_id
            )
            return share_env(share, None)

    def _launch_one(self, p: _Prepared, now: float) -> Handle | BaseException:
        launch_on = getattr(self.executor, "launch_on", None)
        try:
            if self.fleet.declared and launch_on is not None:
                handle: Handle = launch_on(p.spec, p.node, now)
                return handle
            return self.executor.launch(p.spec, now)
        except Exception as err:  # e.g. its working directory does not exist, or no fds
            return err

    def _unstarted(self, d: Launch, err: BaseException, now: float) -> None:
        """A launch that failed before any process started (recording it, its run
        directory): requeued when the machine is at fault, else failed with the reason."""
        job_id = int(d.job_id)
        self.state.endpoints.pop(d.job_id, None)
        self.faults.report("launch", err, job_id)
        row = self.store.jobs.get(job_id)
        if environmental(err) or row.state == "suspended":
            self.gate.launch_trouble(err)
            why = f"could not start: {describe(err)}; requeued, launches retry shortly"
            self.scheduler.lost(d.job_id, now, why)
            if row.state in ("running", "preempting"):
                transition(
                    self.store, job_id, "suspended", now, ("running", "preempting"), reason=why
                )
            else:
                update(self.store, job_id, now, ("pending", "suspended"), "waiting", reason=why)
            return
        self.scheduler.finished(d.job_id, now, JobState.FAILED)
        transition(
            self.store,
            job_id,
            "failed",
            now,
            ("running", "pending"),
            reason=f"could not start: {describe(err)}",
            ended_at=now,
        )

    def _started(self, p: _Prepared, result: Handle | BaseException, now: float) -> None:
        d, row = p.decision, p.row
        if isinstance(result, BaseException):  # no process: a replica's port is free
            self.state.endpoints.pop(d.job_id, None)
        if isinstance(result, Unavailable):  # e.g. a node's launcher did not answer
            requeue(self.scheduler, self.store, row.id, now, f"could not start yet: {result}")
            return
        if isinstance(result, BaseException):
            self.faults.report("launch", result, row.id)
            if environmental(result):  # the machine, not the job: it waits and runs later
                self.gate.launch_trouble(result)
                requeue(
                    self.scheduler,
                    self.store,
                    row.id,
                    now,
                    f"could not start: {describe(result)}; requeued, launches retry shortly",
                )
                return
            self.scheduler.finished(d.job_id, now, JobState.FAILED)
            transition(
                self.store,
                row.id,
                "failed",
                now,
                ("running",),
                reason=f"could not start: {describe(result)}",
                ended_at=now,
            )
            return
        handle = result
        self.gate.launched()
        try:  # a second record of the process, in case the database write below is lost
            (p.spec.run_dir / f"handle-{p.spec.attempt}.json").write_text(
                json.dumps(
                    {"pid": handle.pid, "pgid": handle.pgid, "start_ticks": handle.start_ticks}
                ),
                encoding="utf-8",
            )
        except OSError as err:  # a full or read-only disk: the database still records it
            self.faults.report("launch", err, row.id)
        self.store.jobs.set_process(row.id, handle.pid, handle.pgid, handle.start_ticks, now)
        shares = d.placement.shares
        tele_index = self.fleet.tele_index
        tele = tuple(
            tele_index[(s.node, g)] for s in shares for g in s.gpus if (s.node, g) in tele_index
        )
        self.fake_load.load(tele, row)
        action = "resume" if d.resume else "start"
        if row.state != "running":  # a start or resume, not an elastic job's relaunch
            record = self.scheduler.records.get(d.job_id)
            ready_s = record.ready_s if record is not None else row.submitted_at
            first = now - row.submitted_at if row.started_at is None else None
            self.start_latency.started(row.kind, now - ready_s, first)
        where = tuple(
            (self.fleet.cluster.nodes[s.node].name, self.fleet.devices[(s.node, g)])
            for s in shares
            for g in s.gpus
        )
        self.record.placed.append((now, action, d.job_id, where))
        self.record.decided(now, action, d.job_id)

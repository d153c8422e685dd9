"""Crash recovery: at start, the core is rebuilt from the database and the processes that
still run are re-adopted.

The database is the truth: a job is written running before its process starts, its
handle right after (and to a file beside its logs), and a launch intent before its shim
starts, so however far a launch had got, its processes are found (by pid, cgroup or
launch token) or reported ended. Services, drains, holds, time limits, a resize under
way and the learned policy's mode are restored too."""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from pathlib import Path

from gpupool.domain.lifecycle import JobState
from gpupool.domain.model import NodeShare, Placement
from gpupool.errors import GpupoolError
from gpupool.ports.clock.base import Clock
from gpupool.ports.executor.base import Executor, Handle
from gpupool.scheduler import Scheduler, ServiceRate
from gpupool.server.executors.files import launch_file
from gpupool.server.loop.carry_out import CarryOut
from gpupool.server.loop.config import FleetMap, LiveConfig, spec_of
from gpupool.server.loop.endpoints import node_address
from gpupool.server.loop.learning import outcomes_of
from gpupool.server.loop.operations import Operations
from gpupool.server.loop.services import Services
from gpupool.server.loop.state import LoopState
from gpupool.server.loop.transitions import requeue
from gpupool.server.store import JobRow, Store
from gpupool.server.telemetry.replica_load import Endpoint

TIME_LIMIT_REASON = "ran past its "
"""How the reason of a job stopped at its time limit begins (core: Expire)."""


class Recovery:
    def __init__(
        self,
        state: LoopState,
        config: LiveConfig,
        fleet: FleetMap,
        scheduler: Scheduler,
        store: Store,
        executor: Executor,
        clock: Clock,
        services: Services,
        carry_out: CarryOut,
        operations: Operations,
        learning: bool,
    ) -> None:
        self.state = state
        self.config = config
        self.fleet = fleet
        self.scheduler = scheduler
        self.store = store
        self.executor = executor
        self.clock = clock
        self.services = services
        self.carry_out = carry_out
        self.operations = operations
        self.learning = learning

    def run(self) -> None:
        """Everything, in order: the services, the learner's history, the jobs (and their
        processes), the jobs' lifecycle, the learned policy's mode; then the replicas of a
        service deleted while the server was down are cancelled."""
        for svc in self.store.services.list():
            self.services.load(svc)
            made = len(self.store.services.replicas(svc.name, False))
            self.scheduler.restore_service(svc.name, made)
        if self.scheduler.learners.mode("colocation") != "off":
            self.restore_learning_mode(self.clock.now(), "colocation")
        if self.scheduler.config.autoscale_demand == "forecast":
            self.restore_learning_mode(self.clock.now(), "forecast")
            self.seed_forecasters()
        for model in self.store.jobs.online_models():  # the reserve once online work was seen
            self.scheduler.online_seen_before(frozenset({model}) if model else frozenset())
        now = self.clock.now()
        fair = self.scheduler.config.fair_share
        if fair.users:  # each user's use, from the runs that ended within ten half-lives
            since = now - 10 * fair.half_life_h * 3600.0
            self.scheduler.users_used_before(self.store.history.users_use(since, now))
        if self.learning:  # what finished before this start is the learner's first history
            self.scheduler.learning_seed(outcomes_of(self.store.history.finished_runs(None, now)))
        self.recover()
        self.recover_lifecycle()
        if self.learning:
            self.restore_learning_mode(now)
        for row in self.store.jobs.active():  # replicas of a service deleted while we were down
            if row.service is not None and row.service not in self.services.rows:
                self.operations.cancel(row.id)

    def seed_forecasters(self) -> None:
        """Each service's rates from the telemetry history (a mean per minute, kept 45
        days), fed to the core in time order: a restart does not start a forecaster's
        cold start again. The steps the server was down repeat the last mean measured."""
        for row in self.store.history.service_minutes(None, self.clock.now()):
            if row.service in self.services.rows:
                self.scheduler.observe(ServiceRate(row.t_s, row.service, row.rps))

    def _endpoint(self, job_id: int, node: str, port: int) -> None:
        """A running replica's endpoint again; none where its node has no address now (a
        node that left: the replica is reported lost)."""
        try:
            host = node_address(self.executor, node, self.config.network.node_address)
        except GpupoolError:
            return
        self.state.endpoints[str(job_id)] = Endpoint(host, port)

    def recover(self) -> None:
        """Rebuild the scheduler from the database; re-adopt processes that still run."""
        now = self.clock.now()
        node_of = {n.name: i for i, n in enumerate(self.fleet.cluster.nodes)}
        for row in self.store.jobs.active():
            self.state.seen_id = max(self.state.seen_id, row.id)
            spec = spec_of(row)
            if row.state in ("running", "preempting"):
                placement = self._placement_of(row, node_of)
                state = JobState.RUNNING if row.state == "running" else JobState.PREEMPTING
                self.scheduler.restore(
                    spec, state, placement, now, row.preemptions, service=self.services.live(row)
                )
                if row.port is not None and row.service is not None and row.node is not None:
                    self._endpoint(row.id, row.node, row.port)
                handle = self._handle_of(row)
                # Found by its cgroup or launch token, however far its launch had got: a
                # job whose shim is gone is ended by the executor (and reported, "lost"
                # unless it left a record) before the core can place it again.
                adopted = handle is not None and self.executor.adopt(
                    handle, self.config.run_dir(row.id)
                )
                if adopted and handle is not None:
                    found = self.executor.handles().get(str(row.id), handle)
                    how = ""
                    if found.pid != handle.pid:  # the crash came before its pid was stored
                        how = " (found by its launch intent)"
                        self.store.jobs.set_process(
                            row.id, found.pid, found.pgid, found.start_ticks, now
                        )
                    self.store.events.add(
                        "adopted",
                        f"pid {found.pid} still runs: re-adopted{how}",
                        now,
                        job_id=row.id,
                    )
                if adopted and row.state == "preempting":
                    self.executor.preempt(str(row.id), row.grace_s, now)
                if row.state == "running" and row.resize_gpus is not None and handle is not None:
                    self._recover_resize(row, node_of, adopted, now)
                if handle is None:  # it never started: back in the queue
                    requeue(
                        self.scheduler,
                        self.store,
                        row.id,
                        now,
                        "the scheduler stopped before it started",
                    )
            elif row.state in ("pending", "suspended"):
                state = JobState.PENDING if row.state == "pending" else JobState.SUSPENDED
                self.scheduler.restore(
                    spec, state, None, now, row.preemptions, service=self.services.live(row)
                )

    def _recover_resize(
        self, row: JobRow, node_of: dict[str, int], adopted: bool, now: float
    ) -> None:
        """A resize was under way when the server stopped: the core resumes it, and the
        job's processes (asked again to leave, if they still run) are relaunched once,
        on the new GPUs, when they exit."""
        assert row.resize_gpus is not None
        target = self._placement_of(dataclasses.replace(row, gpus=row.resize_gpus), node_of)
        if target is None:
            return  # its GPUs are no longer in the fleet: it runs on where it is
        key = str(row.id)
        self.scheduler.recover_resize(key, target, now)
        self.state.resizing[key] = target
        self.store.events.add(
            "resizing", "the server restarted mid-resize: resuming the resize", now, job_id=row.id
        )
        if adopted:
            self.executor.resize(key, row.grace_s, now)

    def _placement_of(self, row: JobRow, node_of: dict[str, int]) -> Placement | None:
        fleet = self.fleet
        by_node: dict[int, list[int]] = defaultdict(list)
        index_of = {dev: key for key, dev in fleet.devices.items()} if not fleet.declared else {}
        for name, device in row.gpus:
            key = fleet.key_of.get((name, device)) or index_of.get(device)
            if key is None:
                return None
            by_node[key[0]].append(key[1])
        if not by_node and row.node is not None and row.node in node_of:
            by_node[node_of[row.node]] = []
        if not by_node:
            return None
        return Placement(
            tuple(NodeShare(n, tuple(sorted(g)), 1000) for n, g in sorted(by_node.items()))
        )

    def _handle_of(self, row: JobRow) -> Handle | None:
        """The attempt's handle: from the database, else the handle file written right
        after the launch, else the launch intent written before its shim started (pid 0:
        the executor finds the processes by its cgroup or token). None: never started."""
        run_dir = self.config.run_dir(row.id)
        intent = _read_intent(launch_file(run_dir, row.attempts))
        token, group = intent if intent is not None else ("", "")
        if row.pid is not None and row.pgid is not None and row.start_ticks is not None:
            return Handle(
                str(row.id), row.attempts, row.pid, row.pgid, row.start_ticks, token, group
            )
        path = run_dir / f"handle-{row.attempts}.json"
        if path.is_file():  # written right after launch, before the database heard of it
            try:
                d = json.loads(path.read_text(encoding="utf-8"))
                pid, pgid, ticks = int(d["pid"]), int(d["pgid"]), int(d["start_ticks"])
            except (OSError, ValueError, KeyError, TypeError):
                pass  # torn by the crash: the intent still finds it
            else:
                return Handle(str(row.id), row.attempts, pid, pgid, ticks, token, group)
        if intent is not None:
            return Handle(str(row.id), row.attempts, 0, 0, 0, token, group)
        return None

    def recover_lifecycle(self) -> None:
        """After recover(): drains, holds, stops at a time limit and run start times from
        the database, so a restart keeps them."""
        now = self.clock.now()
        for node in self.store.nodes.drains():
            if node in self.fleet.node_names():
                self.scheduler.drain(node, now)
        for row in self.store.jobs.active():
            key = str(row.id)
            r = self.scheduler.records.get(key)
            if r is None:
                continue
            if row.held and row.state != "running":
                self.scheduler.hold(key, now)
            if row.state == "preempting" and row.reason.startswith(TIME_LIMIT_REASON):
                self.scheduler.restored_expiry(key, row.reason)
            if row.state == "running":  # a time limit counts from the run's real start
                started = self.store.jobs.run_started_at(row.id)
                if started is not None:
                    self.scheduler.restored_run_start(key, started)

    def restore_learning_mode(self, now: float, learner: str = "order") -> None:
        """A promotion or demotion survives a restart: the mode it stored wins over the
        config's (until one was made, the config's mode applies)."""
        stored = self.store.settings.learning_mode(learner)
        if stored is None:
            return
        reason = f"restored at start: {stored.reason}"
        change = self.scheduler.learners.set_mode(learner, stored.mode, now, reason)
        self.carry_out.run([change], now)


def _read_intent(path: Path) -> tuple[str, str] | None:
    """(launch token, cgroup) of a launch intent; None if there is none, or it is torn
    (it is written to a temporary file and renamed, but not fsynced: only a crash of the
    machine can tear it, and then nothing of its attempt runs any more)."""
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(d, dict):
        return None
    return str(d.get("token") or ""), str(d.get("cgroup") or "")

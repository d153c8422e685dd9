"""What the API thread asks of the loop: cancel, hold, release, requeue, drain; create,
scale and delete services; promote and demote the learned policy; a fault on a fake GPU.

Each takes the loop's one lock (the step holds it while it runs), writes the database,
tells the core, and wakes the loop so the change is acted on at once; a request that
does not fit the job's state is refused with a ConflictError that says what would."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupool.domain.lifecycle import JobState
from gpupool.errors import ConflictError, NotFoundError
from gpupool.ports.clock.base import Clock
from gpupool.ports.executor.base import Executor
from gpupool.ports.telemetry.base import Telemetry
from gpupool.scheduler import Drain, Hold, Release, Requeue, Scheduler
from gpupool.server.loop.carry_out import CarryOut
from gpupool.server.loop.config import FleetMap, LiveConfig
from gpupool.server.loop.learning import Evidence, check_evidence, require_learning
from gpupool.server.loop.nodes import Nodes
from gpupool.server.loop.observe import Observer
from gpupool.server.loop.services import Services
from gpupool.server.loop.state import LoopState
from gpupool.server.loop.views import Views
from gpupool.server.store import JobRow, NewService, ServiceRow, Store


class Operations:
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
        nodes: Nodes,
        observer: Observer,
        carry_out: CarryOut,
        views: Views,
        learning: bool,
        telemetry: Telemetry,
    ) -> None:
        self.state = state
        self.config = config
        self.fleet = fleet
        self.scheduler = scheduler
        self.store = store
        self.executor = executor
        self.clock = clock
        self.services = services
        self.nodes = nodes
        self.observer = observer
        self.carry_out = carry_out
        self.views = views
        self.learning = learning
        """Whether the core runs the learned policy (shadow or active)."""
        self.telemetry = telemetry

    # ---- jobs ----------------------------------------------------------------------------
    def cancel(self, job_id: int) -> JobRow:
        """Called by the API: pending jobs end at once, running ones get SIGTERM + grace."""
        with self.state.lock:
            now = self.clock.now()
            row = self.store.jobs.request_cancel(job_id, now)
            key = str(job_id)
            record = self.scheduler.records.get(key)
            if row.state == "cancelled":
                if record is not None:
                    self.scheduler.finished(key, now, JobState.CANCELLED, "cancelled on request")
            elif row.state in ("running", "preempting") and key in self.executor.handles():
                self.executor.cancel(key, row.grace_s, now)
            self.state.wake.set()
            return row

    def hold(self, job_id: int, by: str) -> JobRow:
        """Called by the API: a waiting job starts only once released; one being stopped
        (preempted, requeued) is held once it has left."""
        with self.state.lock:
            now = self.clock.now()
            self.observer.ingest(now)  # a job submitted a moment ago is known to the core first
            row = self.store.jobs.get(job_id)
            if row.state in ("pending", "suspended") and str(job_id) not in self.scheduler.records:
                raise ConflictError(f"job {job_id} is not read in yet; hold it in a moment")
            if row.state == "running":
                raise ConflictError(
                    f"job {job_id} is running; `gpupool requeue {job_id} --hold` stops it "
                    "(with a checkpoint) and holds it"
                )
            if row.terminal:
                raise ConflictError(f"job {job_id} has ended ({row.state}); nothing to hold")
            row = self.store.jobs.set_held(
                job_id, True, now, f"held by {by}; `gpupool release {job_id}` lets it start"
            )
            self.scheduler.observe(Hold(now, str(job_id)))
            return row

    def release(self, job_id: int, by: str) -> JobRow:
        """Called by the API: a held job may start again, in its old place in the queue."""
        with self.state.lock:
            now = self.clock.now()
            row = self.store.jobs.get(job_id)
            if not row.held or row.terminal:
                raise ConflictError(
                    f"job {job_id} is not on hold ({row.state}); `gpupool hold {job_id}` holds it"
                )
            row = self.store.jobs.set_held(job_id, False, now, f"released by {by}")
            key = str(job_id)
            if key in self.scheduler.book.on_hold:
                self.scheduler.observe(Release(now, key))
            self.state.wake.set()
            return row

    def requeue(self, job_id: int, by: str, hold: bool = False) -> JobRow:
        """Called by the API: stop a running job as a preemption does (SIGTERM, its grace
        to checkpoint) and put it back in the queue; with hold, held once it has left."""
        with self.state.lock:
            now = self.clock.now()
            row = self.store.jobs.get(job_id)
            key = str(job_id)
            if row.state != "running":
                waits = f"it waits in the queue already (`gpupool hold {job_id}` holds it)"
                hint = {
                    "pending": waits,
                    "suspended": waits,
                    "preempting": "it is being stopped already",
                }.get(row.state, "it has ended; submit it again to rerun it")
                raise ConflictError(f"job {job_id} is {row.state}: {hint}")
            if key not in self.executor.handles():
                raise ConflictError(f"job {job_id} is still starting; requeue it in a moment")
            commands = self.scheduler.observe(Requeue(now, key, f"requeued by {by}"))
            self.carry_out.run(commands, now)
            if hold:
                self.store.jobs.set_held(
                    job_id, True, now, f"held by {by}; `gpupool release {job_id}` lets it start"
                )
                self.scheduler.observe(Hold(now, key))
            self.state.wake.set()
            return self.store.jobs.get(job_id)

    def drain(self, node: str, by: str, undo: bool = False, reason: str = "") -> dict[str, Any]:
        """Called by the API (admin): no new job goes to the node, its jobs run on; undo
        lets it take work again. Kept in the database across restarts."""
        with self.state.lock:
            if node not in self.fleet.node_names():
                have = ", ".join(sorted(self.fleet.node_names()))
                raise NotFoundError(f"node {node} is not in this cluster (it has {have})")
            now = self.clock.now()
            why = reason or (f"undrained by {by}" if undo else f"drained by {by}")
            changed = self.store.nodes.set_drain(node, not undo, now, by, why)
            self.scheduler.observe(Drain(now, node, undo))
            self.state.wake.set()
            return {"node": node, "state": self.nodes.state_of(node), "changed": changed}

    def fake_fault(
        self,
        gpu: int,
        fault: str,
        by: str,
        *,
        node: str | None = None,
        xid: int | None = None,
        count: int = 1,
        problem: str = "",
    ) -> dict[str, Any]:
        """Called by the API (admin): a fault on (or the repair of) a GPU of the fake fleet,
        as `gpupool nodes` numbers it (`node` where indices repeat). The next sample reads
        it and the health check acts as on a real fault. Real GPUs are refused."""
        inject = getattr(self.telemetry, "inject", None)
        if inject is None:
            raise ConflictError(
                "the GPUs are real: faults are injected only into the fake fleet of "
                "`gpupool serve --fake-gpus` (or of Ray nodes joined with --fake-gpus)"
            )
        with self.state.lock:
            keys = [
                key
                for key, dev in self.fleet.devices.items()
                if dev == gpu and (node is None or self.fleet.cluster.nodes[key[0]].name == node)
            ]
            where = f"GPU {gpu}" + (f" of node {node}" if node is not None else "")
            if not keys:
                raise NotFoundError(f"{where} is not in this fleet (`gpupool nodes` lists them)")
            if len(keys) > 1:
                raise ConflictError(f"{where} is on several nodes: name the node")
            k, g = keys[0]
            tele = self.fleet.tele_index.get((k, g))
            if tele is None:
                raise NotFoundError(f"{where}: the telemetry does not have it")
            done = inject(tele, fault, xid=xid, count=count, problem=problem)
            name = self.fleet.cluster.nodes[k].name
            now = self.clock.now()
            self.store.events.add(
                "fake-fault",
                f"fake fault on GPU {gpu} of node {name} by {by}: {done}",
                now,
                data={"node": name, "gpu": g, "device": gpu, "fault": fault},
            )
            self.state.wake.set()
            return {"node": name, "gpu": gpu, "fault": fault, "done": done}

    # ---- services ------------------------------------------------------------------------
    def create_service(self, svc: NewService) -> ServiceRow:
        """Called by the API: the service is stored and its replicas follow at once."""
        with self.state.lock:
            self.services.template(svc)  # refused before anything is stored
            row = self.store.services.create(svc, self.clock.now())
            self.services.load(row)
            made = len(self.store.services.replicas(row.name, False))
            self.scheduler.restore_service(row.name, made)
            self.state.wake.set()
            return row

    def scale_service(self, name: str, low: int, high: int) -> ServiceRow:
        with self.state.lock:
            row = self.store.services.scale(name, low, high, self.clock.now())
            self.services.load(row)
            self.state.wake.set()
            return row

    def delete_service(self, name: str) -> ServiceRow:
        """Called by the API: the service is gone; its replicas stop with their grace."""
        with self.state.lock:
            now = self.clock.now()
            row = self.store.services.delete(name, now)
            if name in self.scheduler.services:
                self.carry_out.run(self.scheduler.remove_service(name, now), now)
            self.services.forget(name)
            self.state.wake.set()
            return row

    # ---- the learned policy: promotion and demotion ------------------------------------
    def _learning_mode(self) -> str:
        """The mode the core runs the learned policy in now (shadow or active)."""
        status = self.scheduler.learning_status() or {}
        return str(status.get("mode", self.config.scheduling.learning.mode))

    def promote_learning(self, evidence: Mapping[str, Any], by: str) -> dict[str, Any]:
        """Make the learned policy active, if the replay evidence shows it wins here."""
        require_learning(self.learning, self.config.scheduling.policy)
        with self.state.lock:
            now = self.clock.now()
            if self._learning_mode() == "active":
                raise ConflictError(
                    "the learned policy is active already; `gpupool learn demote` returns it "
                    "to shadow"
                )
            ev = Evidence.of(evidence)
            cfg = self.config.scheduling.learning
            finished = len(self.store.history.finished_runs(now - ev.days * 86_400.0, now))
            check_evidence(ev, cfg.rule, cfg.guard.min_finished, finished)
            reason = (
                f"promoted by {by}: a replay of the last {ev.days:g} days ({ev.jobs} jobs) gave "
                f"a mean JCT of {ev.learned_mean_jct_s:.1f} s learned against "
                f"{ev.rule_mean_jct_s:.1f} s {ev.rule} ({ev.gain:.1%} less)"
            )
            self.store.settings.set_learning_mode(
                "active", now, reason, action="promote", by=by, evidence=evidence
            )
            self.carry_out.run([self.scheduler.set_learning_mode("active", now, reason)], now)
            self.state.wake.set()
        return self.views.learning_view()

    def promote_learner(self, learner: str, by: str) -> dict[str, Any]:
        """Make a guard-judged learner (the demand forecast, the co-location admission)
        active, if its own record carries it now: refused (409) with the figures that do
        not."""
        self._require_guarded(learner)
        with self.state.lock:
            now = self.clock.now()
            if self.scheduler.learners.mode(learner) == "active":
                raise ConflictError(
                    f"the {learner} learner is active already; `gpupool learn demote "
                    f"{learner}` returns it to shadow"
                )
            problem = self.scheduler.learners.promotion_problem(learner)
            if problem is not None:
                raise ConflictError(f"promotion of the {learner} learner refused: {problem}")
            evidence = self.scheduler.learners.evidence(learner)
            reason = f"promoted by {by}: {evidence['summary']}"
            self.store.settings.set_learning_mode(
                "active", now, reason, action="promote", by=by, evidence=evidence, learner=learner
            )
            change = self.scheduler.learners.set_mode(learner, "active", now, reason)
            self.carry_out.run([change], now)
            self.state.wake.set()
        return self.views.learning_view()

    def demote_learner(self, learner: str, by: str, why: str = "") -> dict[str, Any]:
        """A guard-judged learner back to shadow: judged still, never acted on."""
        self._require_guarded(learner)
        with self.state.lock:
            now = self.clock.now()
            if self.scheduler.learners.mode(learner) == "shadow":
                raise ConflictError(
                    f"the {learner} learner is in shadow already: nothing to demote"
                )
            reason = f"demoted by {by}" + (f": {why}" if why else "")
            self.store.settings.set_learning_mode(
                "shadow", now, reason, action="demote", by=by, learner=learner
            )
            change = self.scheduler.learners.set_mode(learner, "shadow", now, reason)
            self.carry_out.run([change], now)
            self.state.wake.set()
        return self.views.learning_view()

    def _require_guarded(self, learner: str) -> None:
        """404 for a learner this server does not run (its configuration says how to)."""
        if learner == "colocation" and self.scheduler.learners.mode("colocation") == "off":
            raise NotFoundError(
                "this server has no learned co-location admission to promote or demote; set "
                "`sharing: {admission: {decider: learned, profiles: ..., pairs: ...}}` in the "
                "--config file"
            )
        if learner == "forecast" and self.config.scheduling.autoscale_demand != "forecast":
            raise NotFoundError(
                f"this server's services scale on autoscale.demand "
                f"{self.config.scheduling.autoscale_demand!r}: there is no demand forecast to "
                "promote or demote; set `autoscale: {demand: forecast}` in the --config file"
            )

    def demote_learning(self, by: str, why: str = "") -> dict[str, Any]:
        """Back to shadow: the rules decide, the learned order is only recorded."""
        require_learning(self.learning, self.config.scheduling.policy)
        with self.state.lock:
            now = self.clock.now()
            if self._learning_mode() == "shadow":
                raise ConflictError("the learned policy is in shadow already: nothing to demote")
            reason = f"demoted by {by}" + (f": {why}" if why else "")
            self.store.settings.set_learning_mode("shadow", now, reason, action="demote", by=by)
            self.carry_out.run([self.scheduler.set_learning_mode("shadow", now, reason)], now)
            self.state.wake.set()
        return self.views.learning_view()

"""What the API shows of the loop, as JSON-ready dicts: the cluster (nodes, GPUs, queue,
signals), /healthz, a service with its replicas, the learned policy, and job logs.

A view that needs the core's state waits at most `VIEW_WAIT_S` for the loop's lock, then
answers that the loop is stuck (503) instead of hanging; the service view reads only
values the loop replaces whole, without the lock, because a load balancer polls it."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, TypeVar

from gpupool.errors import Unavailable
from gpupool.ports.clock.base import Clock
from gpupool.ports.executor.base import Executor
from gpupool.scheduler import Scheduler
from gpupool.server.ha.lease import Lease
from gpupool.server.loop.config import FleetMap, LiveConfig
from gpupool.server.loop.gate import LaunchGate
from gpupool.server.loop.health import LoopHealth
from gpupool.server.loop.learning import ShadowTally, require_learning
from gpupool.server.loop.nodes import Nodes
from gpupool.server.loop.services import Services
from gpupool.server.loop.state import LoopState
from gpupool.server.store import JobRow, ServiceRow, Store
from gpupool.server.telemetry.prometheus import StartLatency
from gpupool.server.telemetry.replica_load import Scraper


class Views:
    VIEW_WAIT_S = 5.0
    """How long a view waits for the loop's state before answering that the loop is stuck."""

    def __init__(
        self,
        state: LoopState,
        config: LiveConfig,
        fleet: FleetMap,
        scheduler: Scheduler,
        store: Store,
        executor: Executor,
        clock: Clock,
        health: LoopHealth,
        lease: Lease | None,
        gate: LaunchGate,
        nodes: Nodes,
        services: Services,
        scraper: Scraper,
        shadow: ShadowTally,
        start_latency: StartLatency,
        learning: bool,
    ) -> None:
        self.state = state
        self.config = config
        self.fleet = fleet
        self.scheduler = scheduler
        self.store = store
        self.executor = executor
        self.clock = clock
        self.health = health
        self.lease = lease
        self.gate = gate
        self.nodes = nodes
        self.services = services
        self.scraper = scraper
        self.shadow = shadow
        self.start_latency = start_latency
        """Queue wait and submit-to-start histograms (what /metrics exports with the view)."""
        self.learning = learning

    # ---- the cluster ---------------------------------------------------------------------
    def cluster_view(self) -> dict[str, Any]:
        lock = self.state.lock
        if not lock.acquire(timeout=self.VIEW_WAIT_S):
            raise Unavailable(
                f"the scheduler loop has held its state for over {self.VIEW_WAIT_S:g} s "
                f"(now in {self.state.stage}: {self.state.loop_error or 'no error yet'}); "
                "/healthz says more; retry shortly"
            )
        try:
            return self._cluster_view()
        finally:
            lock.release()

    def _cluster_view(self) -> dict[str, Any]:
        with self.state.lock:
            jobs_on: dict[tuple[int, int], str] = {}
            for job_id, p in self.scheduler.placements().items():
                for part in p.shares:
                    for g in part.gpus:
                        jobs_on[(part.node, g)] = job_id
            kept_for = {gpu: r for r in self.scheduler.reservations.values() for gpu in r.gpus}
            samples = {s.index: s for s in self.state.samples}
            sig = self.state.signals
            reclaimable = set(sig.reclaimable) if sig is not None else set()
            nodes = []
            for k, node in enumerate(self.fleet.cluster.nodes):
                gpus = []
                out = dict(self.nodes.gpus_out(node.name))
                for g in range(node.gpu_count):
                    dev = self.fleet.devices[(k, g)]
                    tele = self.fleet.tele_index.get((k, g))
                    info = self.fleet.gpu_info.get(tele) if tele is not None else None
                    s = samples.get(tele) if tele is not None else None
                    gpus.append(
                        {
                            "index": dev,
                            "uuid": info.uuid if info else None,
                            "model": info.model if info else node.gpu_model,
                            "mem_total_mib": info.mem_total_mib if info else None,
                            "mem_used_mib": s.mem_used_mib if s else None,
                            "util_pct": s.util_pct if s else None,
                            "temp_c": s.temp_c if s else None,
                            "power_w": s.power_w if s else None,
                            "power_limit_w": s.power_limit_w
                            if s
                            else (info.power_limit_w if info else None),
                            "sm_clock_mhz": s.sm_clock_mhz if s else None,
                            "mem_clock_mhz": s.mem_clock_mhz if s else None,
                            "ecc_uncorrected": s.ecc_uncorrected if s else None,
                            "healthy": s.healthy if s else True,
                            "problem": s.problem if s else "",
                            "job_id": int(jobs_on[(k, g)]) if (k, g) in jobs_on else None,
                            "reclaimable": tele in reclaimable,
                            "reserved_for": int(kept_for[(k, g)].job_id)
                            if (k, g) in kept_for
                            else None,
                            "reserved_from": kept_for[(k, g)].start_s
                            if (k, g) in kept_for
                            else None,
                            "out": g in out,
                            "out_reason": out.get(g, ""),
                        }
                    )
                nodes.append(
                    {
                        "name": node.name,
                        "gpu_model": node.gpu_model,
                        "site": node.cluster,
                        "labels": dict(node.labels),
                        "state": self.nodes.state_of(node.name),
                        "healthy": self.nodes.healthy(node.name),
                        "lost_total": self.nodes.lost_total(node.name),
                        "agent": self.nodes.agent_of(node.name),
                        "gpus_out": [
                            {"gpu": self.fleet.devices[(k, g)], "reason": why}
                            for g, why in out.items()
                        ],
                        "gpus": gpus,
                    }
                )
            return {
                "nodes": nodes,
                "signals": {
                    "reclaimable": sorted(reclaimable),
                    "scale_out": bool(sig.scale_out) if sig else False,
                    "mean_util_pct": sig.mean_util_pct if sig else None,
                    "window_s": sig.window_s if sig else self.config.monitor_s,
                    "evaluated_at": self.state.signals_at,
                },
                "queue": {
                    "pending": self.scheduler.waiting(),
                    "running": len(self.scheduler.placements()),
                },
                "scheduler_error": self.state.loop_error,
            }

    def health_view(self) -> dict[str, Any]:
        """/healthz: ok, the loop's last cycle, errors, role, and why launches wait."""
        loop = self.health.view(stopping=self.state.stopping.is_set())
        space = self.gate.disk_space
        return {
            "ok": loop["ok"],
            "scheduler_error": self.state.loop_error,
            "role": "active",
            "problem": loop["problem"],
            "loop": loop,
            "launches": {
                "waiting": self.state.gate,
                "disk": None
                if space is None
                else {
                    "path": space.path,
                    "free_mib": round(space.free_bytes / (1 << 20), 1),
                    "floor_mib": round(
                        self.config.disk_floor.floor_bytes(space.total_bytes) / (1 << 20), 1
                    ),
                    "read_only": space.read_only,
                },
            },
            "lease": None if self.lease is None else self.lease.where,
        }

    # ---- a service -----------------------------------------------------------------------
    def service_view(self, name: str) -> dict[str, Any]:
        """A service with its replicas and what they measured (GET /v1/services/NAME)."""
        row = self.store.services.get(name)
        replicas = self.store.services.replicas(name)
        # Without the loop's lock (a launch may hold it a while): a load balancer polls
        # this every second. Each read is of a value the loop replaces whole, or a copy.
        load = self.services.service_load.get(name)
        per = self.services.replica_load
        target = len(self.scheduler.replicas.get(name, {}))
        failures = _copy(self.scraper.failures)
        stopping = set(_copy(self.state.cancel_why))
        ready = self.scraper.seen()
        endpoints = _copy(self.state.endpoints)
        out = service_json(row)
        out["target_replicas"] = target
        out["rps"] = round(load.rps, 3) if load is not None else None
        out["p99_ms"] = _ms(load.p99_ms) if load is not None else None
        out["replicas_reporting"] = load.reporting if load is not None else 0
        backoff = self.scheduler.service_backoff(name)
        out["backoff"] = (
            {
                "failures": backoff.failures,
                "retry_at": backoff.retry_at_s,
                "last_reason": backoff.last_reason,
            }
            if backoff is not None
            else None
        )
        out["replicas"] = []
        for r in replicas:
            key = str(r.id)
            m = per.get(key)
            at = endpoints.get(key)
            serving = r.state == "running" and r.port is not None and at is not None
            out["replicas"].append(
                {
                    "job_id": r.id,
                    "name": r.name,
                    "state": _replica_state(r, key in ready, key in stopping),
                    "node": r.node,
                    "gpus": [{"node": n, "index": i} for n, i in r.gpus],
                    "port": r.port,
                    "address": at.host if at is not None else None,
                    "url": at.url if serving and at is not None else None,
                    "ready": serving and key in ready,
                    "rps": round(m.rps, 3) if m is not None and m.reporting else None,
                    "p99_ms": _ms(m.p99_ms) if m is not None and m.reporting else None,
                    "scrape_error": failures.get(key),
                    "reason": r.reason,
                }
            )
        out["events"] = [
            {"at": e.at_s, "kind": e.kind, "message": e.message}
            for e in self.store.services.events(name, limit=50)
        ]
        return out

    # ---- the learned policy --------------------------------------------------------------
    def learning_view(self) -> dict[str, Any]:
        """What GET /v1/learn shows: the core's status, the mode, the shadow record and the
        last promotion or demotion, and each service's demand forecaster. A server without
        the learned order shows only its forecasters (`order: false`)."""
        sched = self.config.scheduling
        if sched.autoscale_demand != "forecast" and self.scheduler.colocation is None:
            require_learning(self.learning, sched.policy)
        with self.state.lock:
            status = self.scheduler.learning_status() if self.learning else None
            shadow = self.shadow.view()
            forecasts = {
                name: dataclasses.asdict(s) for name, s in self.scheduler.demand_status().items()
            }
        cfg = self.config.scheduling.learning
        stored = self.store.settings.learning_mode()
        changes = self.store.settings.learning_changes(limit=1, learner="order")
        fc_stored = self.store.settings.learning_mode("forecast")
        fc_changes = self.store.settings.learning_changes(limit=1, learner="forecast")
        co_stored = self.store.settings.learning_mode("colocation")
        return {
            "policy": self.config.scheduling.policy,
            "mode": (status or {}).get("mode", cfg.mode),
            "mode_since_s": stored.set_at_s if stored is not None else None,
            "mode_reason": stored.reason if stored is not None else "the configured mode",
            "status": status,
            "shadow": shadow,
            "min_jobs": cfg.guard.min_finished,
            "config": dataclasses.asdict(cfg),
            "last_change": None if not changes else dataclasses.asdict(changes[0]),
            "order": self.learning,
            "demand": sched.autoscale_demand,
            "forecast_config": dataclasses.asdict(sched.autoscale_forecast),
            "forecast_mode": self.scheduler.learners.mode("forecast"),
            "forecast_mode_reason": fc_stored.reason
            if fc_stored is not None
            else "the configured mode",
            "forecast_last_change": None if not fc_changes else dataclasses.asdict(fc_changes[0]),
            "colocation_mode_reason": None if co_stored is None else co_stored.reason,
            "forecasts": forecasts,
            "colocation": self.colocation_view(),
        }

    def colocation_view(self) -> dict[str, Any] | None:
        """The co-location admission's status (`sharing.admission`); None while off."""
        if self.scheduler.colocation is None:
            return None
        with self.state.lock:
            return self.scheduler.colocation.status()

    def learning_history(self, days: float) -> dict[str, Any]:
        """The jobs that finished here in the last `days` and the fleet's size: what the
        CLI replays under the rule and the learned policy."""
        require_learning(self.learning, self.config.scheduling.policy)
        now = self.clock.now()
        since = now - days * 86_400.0
        runs = self.store.history.finished_runs(since, now)
        per_node = [n.gpu_count for n in self.fleet.cluster.nodes if n.gpu_count > 0]
        return {
            "now_s": now,
            "since_s": since,
            "days": days,
            "fleet": {"nodes": len(per_node), "gpus": sum(per_node), "gpus_per_node": per_node},
            "jobs": [
                {
                    "id": r.job_id,
                    "team": r.team,
                    "name": r.name,
                    "gpu_count": r.gpu_count,
                    "gpu_model": r.gpu_model,
                    "submit_s": r.submit_s,
                    "run_gpu_s": r.gpu_time_s,
                    "finish_s": r.finish_s,
                }
                for r in runs
            ],
        }

    # ---- logs ----------------------------------------------------------------------------
    def read_log(self, job_id: int, stream: str, offset: int, limit: int, rank: int = 0) -> bytes:
        """A job's log from `offset`: the node that runs it (through the executor, e.g. its
        Ray actor) while it runs, this host's copy otherwise (the executor copies the rest
        there when an attempt ends). `rank` > 0: that gang member's log (``rank-<k>/``)."""
        name = f"{stream}.log"
        remote = getattr(self.executor, "read_log", None)
        if remote is not None and str(job_id) in self.executor.handles():
            try:
                data: bytes = (
                    remote(str(job_id), name, offset, rank=rank)
                    if rank
                    else remote(str(job_id), name, offset)
                )
                return data[:limit]
            except Exception:  # it just ended, or its node is in doubt: what is here
                pass
        path = self.config.run_dir(job_id) / (f"rank-{rank}/{name}" if rank else name)
        if not path.is_file():
            return b""
        with path.open("rb") as f:
            size = f.seek(0, 2)
            if offset >= size:  # past the end (however far): an empty page
                return b""
            f.seek(offset)
            return f.read(limit)


_V = TypeVar("_V")


def _copy(table: dict[str, _V]) -> dict[str, _V]:
    """A copy of a dict another thread may change meanwhile (retried until it holds)."""
    for _ in range(100):
        try:
            return dict(table)
        except RuntimeError:  # changed size during the copy
            continue
    return {}


def _replica_state(row: JobRow, answered: bool, cancelled: bool) -> str:
    """A replica as a client sees it: `starting` until its /metrics answers, `running`,
    `stopping` once the scheduler let it go (still serving its drain), else its job state."""
    if row.state in ("running", "preempting"):
        if cancelled or row.state == "preempting":
            return "stopping"
        return "running" if answered and row.port is not None else "starting"
    return row.state


def _ms(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else round(value, 1)


def service_json(row: ServiceRow) -> dict[str, Any]:
    """A service's row as the API shows it."""
    return {
        "name": row.name,
        "team": row.team,
        "model": row.model,
        "gpu_model": row.gpu_model,
        "gpu_mem_mib": row.gpu_mem_mib,
        "gpu_milli": row.gpu_milli,
        "min_replicas": row.min_replicas,
        "max_replicas": row.max_replicas,
        "replica_rps": row.replica_rps,
        "slo_p99_ms": row.slo_p99_ms,
        "port_env": row.port_env,
        "command": list(row.command),
        "cwd": row.cwd,
        "grace_s": row.grace_s,
        "priority": row.priority,
        "created_at": row.created_at,
        "deleted_at": row.deleted_at,
    }
